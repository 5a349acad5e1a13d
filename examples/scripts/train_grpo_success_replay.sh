#!/usr/bin/env bash
# Baseline: RLEP (arXiv 2507.07451; METHOD.md section 3): verified-correct rollouts (reward > 0.5)
# kept for tau_max = 10 steps; after warm-up each fresh prompt's group gains up to 2 of its
# replayed successes (G' = G + 2) and the group advantages are recomputed over G'.
# Settings: environment variables, see common.sh; extra arguments are appended to the command.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

launch_training openrlhf_replay.cli.train_ppo_ray \
  --replay.mode success \
  --replay.per_prompt 2 \
  --replay.max_age "$REPLAY_MAX_AGE" \
  --replay.success_threshold 0.5 \
  "${REPLAY_ARGS[@]}" "$@"
