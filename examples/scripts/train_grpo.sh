#!/usr/bin/env bash
# The baseline: upstream OpenRLHF 0.11.2 GRPO (`python -m openrlhf.cli.train_ppo_ray`, none of
# this project's code in the run), with exactly the settings the replay conditions share.
# Settings: environment variables, see common.sh; extra arguments are appended to the command.
#   bash examples/scripts/train_grpo.sh                 # Qwen3-1.7B-Base, 8 GPUs, seed 42
#   DRY_RUN=1 MODEL=Qwen/Qwen3-4B-Base bash examples/scripts/train_grpo.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

launch_training openrlhf.cli.train_ppo_ray "$@"
