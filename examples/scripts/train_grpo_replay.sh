#!/usr/bin/env bash
# The method: GRPO + rollout-level, advantage-prioritised replay (docs/METHOD.md section 2): rollouts
# with A != 0 kept for tau_max = 10 steps, k = 0.5 x fresh replayed per step after 20 warm-up
# steps, drawn with probability ~ (|A| + 1e-6) ** 0.5 without replacement, stale-anchor ratio.
# Settings: environment variables, see common.sh; extra arguments are appended to the command.
#   bash examples/scripts/train_grpo_replay.sh          # Qwen3-1.7B-Base, 8 GPUs, seed 42
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

launch_training openrlhf_replay.cli.train_ppo_ray \
  --replay.mode advantage \
  --replay.max_age "$REPLAY_MAX_AGE" \
  --replay.alpha "$REPLAY_ALPHA" \
  --replay.off_policy stale \
  "${REPLAY_ARGS[@]}" "$@"
