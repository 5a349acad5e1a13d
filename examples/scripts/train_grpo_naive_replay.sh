#!/usr/bin/env bash
# Baseline: naive replay (Arnal et al., arXiv 2604.08706; docs/METHOD.md section 3): whole groups in a
# FIFO buffer of REPLAY_CAPACITY rollouts, drawn uniformly with replacement, no age limit; the
# same ratio, warm-up and batch composition as the method.
# Settings: environment variables, see common.sh; extra arguments are appended to the command.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

launch_training openrlhf_replay.cli.train_ppo_ray \
  --replay.mode naive \
  "${REPLAY_ARGS[@]}" "$@"
