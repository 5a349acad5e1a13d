#!/usr/bin/env bash
# Baseline: FreshPER (arXiv 2604.16918; docs/METHOD.md section 3), as its reference code runs a
# critic-free method: every rollout in a FIFO buffer of REPLAY_CAPACITY, PER by reward with
# priority ((|reward| + eps) x exp(-age / 500)) ** 0.6, new rollouts entering at the running maximum
# priority and drawn ones updated from their reward, stratified draws with replacement, importance
# weights (N P(i)) ** -beta / max with beta fixed at 0.4, as the reference code computes them
# (`--replay.beta_end 1.0` anneals beta to 1.0 over the run's own steps, as PER prescribes).
# Settings: environment variables, see common.sh; extra arguments are appended to the command.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

launch_training openrlhf_replay.cli.train_ppo_ray \
  --replay.mode freshness \
  --replay.alpha 0.6 \
  --replay.tau 500 \
  --replay.beta_start 0.4 \
  --replay.beta_end 0.4 \
  "${REPLAY_ARGS[@]}" "$@"
