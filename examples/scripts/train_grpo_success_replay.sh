#!/usr/bin/env bash
# Baseline: RLEP (arXiv 2507.07451; docs/METHOD.md section 3). Every verified-correct rollout
# (reward > 0.5) of a prompt is a candidate; after warm-up each of the step's 128 prompts gets
# min(2, its stored successes), drawn without replacement, in its group (G' = G + up to 2; at most
# 256 a step), the group advantages are recomputed over G', and pi_old of the replayed rows is
# recomputed by the current policy before the update, with no importance weight (success's
# default --replay.off_policy recompute). The rows are completed to a whole training batch by
# inert rows (no loss).
# Where the successes come from (SUCCESS_POOL):
# - unset (the default, and what the comparison runs): RLEP's offline pool, as the paper runs it,
#   $RUNS_DIR/<model>/success_pool_seed<SEED>.npz, which build_success_pool.sh decodes from the
#   comparison's own GRPO run at the end of its first epoch (step 60 at the defaults; why: that
#   script). Fixed during the run and replayed from the first step: the warm-up does not apply to
#   it. The launch stops with the command to build it when it is missing; a dry run (DRY_RUN=1)
#   names it and checks the rest; a rehearsal (REHEARSE=1) stands a pool in for it
#   (openrlhf_replay/rehearsal/pool.py).
# - SUCCESS_POOL=<file>: another offline pool (`python -m openrlhf_replay.cli.build_success_pool`).
# - SUCCESS_POOL=in-run: the run's own successes, kept with no age limit (a prompt returns once
#   per epoch), so replay starts in the second epoch. REPLAY_SUCCESS_CAPACITY bounds it (the
#   oldest go first): an epoch of 7,424 prompts x 8 stores ~30,000 successes at a 50% solve rate,
#   so the default keeps about four epochs' worth.
# Settings: environment variables, see common.sh; extra arguments are appended to the command.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SUCCESS_POOL=${SUCCESS_POOL:-$(default_success_pool)}
POOL_ARGS=()
if [[ $SUCCESS_POOL != in-run ]]; then
  POOL_ARGS=(--replay.success_pool "$(realpath -m "$SUCCESS_POOL")")
  if [[ ! -f $SUCCESS_POOL && $REHEARSE == 0 ]]; then
    how="RLEP replays a pool decoded from the GRPO run's checkpoint: run train_grpo.sh (to step $(default_pool_step) at least), then build_success_pool.sh, with the same MODEL and SEED"
    [[ $DRY_RUN == 1 ]] || die "no success pool at $SUCCESS_POOL. $how; or set SUCCESS_POOL=<pool file>, or SUCCESS_POOL=in-run for the run's own successes"
    # A sweep's dry run comes before the runs that make the pool: it is named, the rest is checked.
    echo "$SCRIPT_NAME: note: no success pool at $SUCCESS_POOL yet (build_success_pool.sh makes it): $how"
    VALIDATE_PENDING=(--pending "$(realpath -m "$SUCCESS_POOL")")
  fi
fi

launch_training openrlhf_replay.cli.train_ppo_ray \
  --replay.mode success \
  --replay.per_prompt 2 \
  --replay.success_threshold 0.5 \
  "${REPLAY_ARGS[@]}" \
  --replay.capacity "${REPLAY_SUCCESS_CAPACITY:-120000}" \
  "${POOL_ARGS[@]}" \
  "$@"
