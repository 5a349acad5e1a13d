#!/usr/bin/env bash
# Baseline: RLEP (arXiv 2507.07451; docs/METHOD.md section 3): every verified-correct rollout (reward >
# 0.5) is kept, with no age limit (a prompt returns once per epoch, so its successes must outlive
# an epoch); after warm-up, 2 stored successes per fresh prompt on average join their prompt's
# group (G' = G + 2; 2 x 128 = 256 per step, one training batch, spread over the step's prompts
# as evenly as their successes allow) and the group advantages are recomputed over G'. Replay
# starts once the step's prompts have 256 successes stored: from the second epoch on.
# REPLAY_SUCCESS_CAPACITY bounds the pool (the oldest go first): an epoch of 7,424 prompts x 8
# stores ~30,000 successes at a 50% solve rate, so the default keeps about four epochs' worth.
# Settings: environment variables, see common.sh; extra arguments are appended to the command.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

launch_training openrlhf_replay.cli.train_ppo_ray \
  --replay.mode success \
  --replay.per_prompt 2 \
  --replay.success_threshold 0.5 \
  "${REPLAY_ARGS[@]}" \
  --replay.capacity "${REPLAY_SUCCESS_CAPACITY:-120000}" \
  "$@"
