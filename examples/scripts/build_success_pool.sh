#!/usr/bin/env bash
# RLEP's offline pool for train_grpo_success_replay.sh: the comparison's own GRPO run (same MODEL,
# SEED, RUNS_DIR) decodes every training prompt GROUP_SIZE times from its checkpoint at POOL_STEP,
# math-verify grades each response, and the successes are written to
# $RUNS_DIR/<model>/success_pool_seed<SEED>.npz (`python -m openrlhf_replay.cli.build_success_pool`,
# one GPU, vLLM). Run it once train_grpo.sh has saved that checkpoint; RLEP can then start.
#
# Why the end of GRPO's first epoch (POOL_STEP, default the first checkpoint at or after it: step
# 60 at the defaults, 58 steps an epoch, a checkpoint every 20): RLEP's seed is a policy that has
# already been trained with RL on these very prompts (its "experience collection" phase); the first
# epoch is the earliest checkpoint that has seen every prompt once, and it leaves RLEP three
# epochs of its own to go beyond its seed. The final GRPO checkpoint would turn the comparison into
# replaying the baseline's own finished answers. What the pool costs is stated with the results:
# 60 GRPO steps (shared with the GRPO condition) and one decode of 7,424 x 8 rollouts, as many as
# one epoch generates (docs/METHOD.md section 3, RLEP).
#   POOL_STEP=<n>      another GRPO checkpoint ($RUNS_DIR/<model>/grpo_seed<SEED>/ckpt/global_step<n>_hf)
#   SEED_CHECKPOINT    any Hugging Face model folder instead
#   SUCCESS_POOL       where to write (default as above); an existing pool is kept unless OVERWRITE=1
# DRY_RUN=1: print the command and check its inputs, write nothing.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

require_ints 1 ROLLOUT_PROMPTS GROUP_SIZE PROMPT_MAX_LEN MAX_NEW_TOKENS SAVE_STEPS
require_ints 0 SEED
[[ $DATA != *,* ]] || die "DATA=$DATA: the pool is decoded from one prompt file; give the one GRPO trained on"
[[ -f $DATA ]] || die "no training prompts at $DATA: set DATA=<file> (the prompt file GRPO trained on), or SHARED_DIR"
DATA=$(abspath_if_local "$DATA")
POOL_STEP=${POOL_STEP:-$(default_pool_step)}
require_ints 1 POOL_STEP
SEED_CHECKPOINT=${SEED_CHECKPOINT:-$RUNS_DIR/$(model_tag "$MODEL")/grpo_seed$SEED/ckpt/global_step${POOL_STEP}_hf}
SUCCESS_POOL=$(realpath -m "${SUCCESS_POOL:-$(default_success_pool)}")
MAX_PROMPTS=${MAX_PROMPTS:-$("$PYTHON" -m openrlhf_replay.cli.prompts --batch "$ROLLOUT_PROMPTS" "$DATA")}
cmd=("$PYTHON" -m openrlhf_replay.cli.build_success_pool
  --model "$SEED_CHECKPOINT"
  --prompts "$DATA"
  --input-key "$INPUT_KEY"
  --label-key "$LABEL_KEY"
  --input-template "$PROMPT_TEMPLATE"
  ${MAX_PROMPTS:+--max-samples "$MAX_PROMPTS"}
  --samples-per-prompt "$GROUP_SIZE"
  --max-len $((PROMPT_MAX_LEN + MAX_NEW_TOKENS))
  --max-new-tokens "$MAX_NEW_TOKENS"
  --reward "$REPO_ROOT/evaluation/reward.py"
  --seed "$SEED"
  --out "$SUCCESS_POOL"
  "$@")
[[ ${OVERWRITE:-0} == 1 ]] && cmd+=(--overwrite)

describe_settings MODEL SEED POOL_STEP SEED_CHECKPOINT DATA SUCCESS_POOL
print_command "${cmd[@]}"
if [[ ! -d $SEED_CHECKPOINT ]]; then
  how="run train_grpo.sh (same MODEL, SEED, RUNS_DIR) to step $POOL_STEP at least (it saves every SAVE_STEPS=$SAVE_STEPS), or set SEED_CHECKPOINT=<model folder> or POOL_STEP"
  # A sweep's dry run comes before the GRPO run that saves it: named, and the dry run goes on.
  [[ $DRY_RUN == 1 ]] || die "no seed checkpoint at $SEED_CHECKPOINT: $how"
  echo "$SCRIPT_NAME: note: no seed checkpoint at $SEED_CHECKPOINT yet (train_grpo.sh saves it): $how"
fi
if [[ -f $SUCCESS_POOL && ${OVERWRITE:-0} != 1 ]]; then
  echo "$SCRIPT_NAME: $SUCCESS_POOL exists: kept (OVERWRITE=1 to rebuild it)"
  exit 0
fi
[[ $DRY_RUN == 1 ]] && exit 0
cd "$REPO_ROOT" || die "cannot cd to $REPO_ROOT"
"${cmd[@]}"
echo "$SCRIPT_NAME: pool: $SUCCESS_POOL (train_grpo_success_replay.sh replays it by default)"
