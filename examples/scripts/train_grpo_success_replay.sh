#!/usr/bin/env bash
# Baseline: RLEP (arXiv 2507.07451; docs/METHOD.md section 3). Every verified-correct rollout
# (reward > 0.5) of a prompt is a candidate; after warm-up each of the step's 128 prompts gets
# min(2, its stored successes), drawn without replacement, in its group (G' = G + up to 2; at most
# 256 a step), the group advantages are recomputed over G', and pi_old of the replayed rows is
# recomputed by the current policy before the update, with no importance weight (success's
# default --replay.off_policy recompute). The rows are completed to a whole training batch by
# inert rows (no loss).
# Where the successes come from:
# - SUCCESS_POOL unset (the default, and what compare.sh runs): the in-run pool, the run's own
#   successes, kept with no age limit (a prompt returns once per epoch), so replay starts in
#   the second epoch. REPLAY_SUCCESS_CAPACITY bounds it (the oldest go first): an epoch of
#   7,424 prompts x 8 stores ~30,000 successes at a 50% solve rate, so the default keeps about
#   four epochs' worth.
# - SUCCESS_POOL=pool.npz: RLEP's offline pool, as the paper runs it: built before training by
#   `python -m openrlhf_replay.cli.build_success_pool` from a seed checkpoint (e.g. the GRPO
#   condition's last one) on the same prompts and template; fixed during the run, replayed from
#   the first step after the warm-up. The capacity must hold it (the launcher says so if not).
# Settings: environment variables, see common.sh; extra arguments are appended to the command.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

POOL_ARGS=()
if [[ -n ${SUCCESS_POOL:-} ]]; then
  POOL_ARGS=(--replay.success_pool "$SUCCESS_POOL")
fi

launch_training openrlhf_replay.cli.train_ppo_ray \
  --replay.mode success \
  --replay.per_prompt 2 \
  --replay.success_threshold 0.5 \
  "${REPLAY_ARGS[@]}" \
  --replay.capacity "${REPLAY_SUCCESS_CAPACITY:-120000}" \
  "${POOL_ARGS[@]}" \
  "$@"
