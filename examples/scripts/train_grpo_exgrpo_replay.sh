#!/usr/bin/env bash
# Baseline: ExGRPO (arXiv 2510.02245, ICLR 2026; docs/METHOD.md section 3), as its reference code
# (ElliottYan/LUFFY, ExGRPO/) runs it, through the replay registry's `exgrpo` entry:
# - stored: the successes (reward > 0.5) of prompts whose group of GROUP_SIZE had 0 < k < K
#   correct, FIFO at REPLAY_CAPACITY, no age limit; a prompt whose group is all correct is retired;
# - drawn: after warm-up, --replay.ratio x the fresh rollouts, one per question, questions by
#   bucket (its latest success count k, weight N(k; K/2, 1): medium difficulty first), and of each
#   question its stored success of lowest perplexity under the policy that generated it;
# - trained: each replayed row with its mixed group's advantage (the question's latest k/K as
#   the fresh rollouts' success rate) on the shaped objective -A w / (w + 0.1), unclipped
#   (exgrpo's default --replay.off_policy exgrpo); fresh rows keep GRPO's loss.
# K is --rollout.n_samples_per_prompt (GROUP_SIZE); every other setting is the other conditions'.
# Settings: environment variables, see common.sh; extra arguments are appended to the command.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

launch_training openrlhf_replay.cli.train_ppo_ray \
  --replay.mode exgrpo \
  --replay.success_threshold 0.5 \
  "${REPLAY_ARGS[@]}" "$@"
