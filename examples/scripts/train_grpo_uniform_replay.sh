#!/usr/bin/env bash
# Ablation: the method without priority (docs/METHOD.md section 3): rollouts with A != 0, age limit
# tau_max = 10, drawn uniformly without replacement.
# Settings: environment variables, see common.sh; extra arguments are appended to the command.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

launch_training openrlhf_replay.cli.train_ppo_ray \
  --replay.mode uniform \
  --replay.max_age "$REPLAY_MAX_AGE" \
  "${REPLAY_ARGS[@]}" "$@"
