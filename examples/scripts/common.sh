# shellcheck shell=bash
# Shared settings and launch steps of the scripts in this folder: sourced, never run.
#
# Every setting below is an environment variable with a default; the training defaults are
# docs/METHOD.md sections 2-3, identical for every condition and every GPU count. Arguments given to
# a training script are appended to its command (argparse: the last value wins), e.g.
#   NUM_GPUS=4 SEED=1 bash examples/scripts/train_grpo_replay.sh --replay.ratio 0.25
# DRY_RUN=1 builds the exact command, checks every flag against the installed parser (and the
# replay rules) without starting Ray or loading a model, prints it, and writes nothing.
# REHEARSE=1 also walks every step of every episode of that command on this CPU (the real
# controller, data path, replay buffer and rank chunking; stand-ins for generation, log-probs,
# rewards and the optimizer): minutes, no GPU; the last line is a JSON report, also written to
# $RUNS_DIR/<model>/rehearsal/<condition>_seed<SEED>.json (compare.sh puts its optimizer steps per
# rollout step beside that run's results); nothing else is written.
#
# How batches follow the GPU count (GPUS = NUM_NODES x NUM_GPUS):
# - per step ROLLOUT_PROMPTS (128) prompts x GROUP_SIZE (8) = 1,024 fresh rollouts, and a
#   training batch of TRAIN_BATCH (256) rollouts: 4 optimizer steps per step on fresh rollouts
#   (+2 with replay ratio 0.5). These are the experiment and never change with the GPU count;
# - each GPU holds one DeepSpeed rank and, colocated (--train.colocate_all, sleep mode on both
#   sides), one vLLM engine: vLLM engines = GPUS / VLLM_TP;
# - micro-batches are per GPU and set by memory, i.e. by model size (0.6B: 8 train / 16
#   rollout-forward, 1.7B: 4 / 8, 4B: 2 / 4), capped at the GPU's share of the batch;
#   gradient accumulation = TRAIN_BATCH / (micro x GPUS);
# - so GPUS must divide TRAIN_BATCH / micro (DeepSpeed) and 1,024 / rollout micro (replay):
#   1, 2, 4, 8, 16, 32 GPUs work; the dry run names the rule a count breaks.
# - with --train.async_enable among the arguments, generation overlaps training: half of each
#   node's GPUs hold the DeepSpeed ranks and half the vLLM engines (no colocation, no sleep mode).

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPTS_DIR/../.." && pwd)
SHARED_DIR=${SHARED_DIR:-$REPO_ROOT/../shared}
SCRIPT_NAME=$(basename "$0" .sh)

# ---- what, where, how many
MODEL=${MODEL:-Qwen/Qwen3-1.7B-Base}             # Qwen/Qwen3-{0.6B,1.7B,4B}-Base or a local directory
NUM_NODES=${NUM_NODES:-1}
NUM_GPUS=${NUM_GPUS:-8}                          # per node
DEFAULT_DATA=$SHARED_DIR/data/train/deepscaler_math_train.json  # DeepScaleR's MATH training set (docs/METHOD.md section 8)
DATA=${DATA:-$DEFAULT_DATA}                      # JSON/JSONL file(s), comma-separated
INPUT_KEY=${INPUT_KEY:-problem}
LABEL_KEY=${LABEL_KEY:-answer}
SEED=${SEED:-42}
RUNS_DIR=${RUNS_DIR:-$REPO_ROOT/runs}            # default output: $RUNS_DIR/<model>/<condition>_seed<SEED>
PYTHON=${PYTHON:-python}
if [[ $PYTHON == */* ]]; then  # a relative path would break once a run changes directory (no realpath: keep a venv's link)
  PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")
fi
DRY_RUN=${DRY_RUN:-0}
REHEARSE=${REHEARSE:-0}                          # 1: walk the whole run on this CPU (openrlhf_replay/rehearsal/); all: at every scale and GPU count too
# Inputs of the command that an earlier script makes, missing at a dry run (`--pending PATH` words
# for the validator, which then checks the rest): a condition script fills it.
VALIDATE_PENDING=()
REHEARSE_SOLVE_RATE=${REHEARSE_SOLVE_RATE:-}     # the rehearsal's mean P(correct) over prompts (unset: its default, 0.4; see python -m openrlhf_replay.rehearsal --help)

# ---- the algorithm (docs/METHOD.md sections 2-3)
ROLLOUT_PROMPTS=${ROLLOUT_PROMPTS:-128}
GROUP_SIZE=${GROUP_SIZE:-8}
TRAIN_BATCH=${TRAIN_BATCH:-256}
EPISODES=${EPISODES:-4}                          # passes over the prompts: the first 7,424 of the 7,474 DeepScaleR-MATH prompts = 58 steps each
PROMPT_MAX_LEN=${PROMPT_MAX_LEN:-1024}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-3072}
LR=${LR:-1e-6}
# ---- replay (docs/METHOD.md section 2): tau_max, ratio, alpha, warm-up, capacity
REPLAY_MAX_AGE=${REPLAY_MAX_AGE:-10}
REPLAY_RATIO=${REPLAY_RATIO:-0.5}
REPLAY_ALPHA=${REPLAY_ALPHA:-0.5}
REPLAY_WARMUP=${REPLAY_WARMUP:-20}
REPLAY_CAPACITY=${REPLAY_CAPACITY:-30000}
# M2PO=1 (or --replay.off_policy m2po among a script's arguments): replayed rows take M2PO's rule
# (docs/METHOD.md section 3), with AReaL's behaviour-weight cap (upstream's token-level IS mask,
# weights above 5 dropped); M2_THRESHOLD, when set, is its --replay.m2_threshold (default 0.04).
M2PO=${M2PO:-0}
M2_THRESHOLD=${M2_THRESHOLD:-}
# SKIP=1 (or --replay.skip among a script's arguments): pre-rollout skipping, GRESO's rule
# (docs/METHOD.md, "Pre-rollout skipping"). With train_grpo.sh it is the GRESO baseline (this
# project's launcher with --replay.mode none); with a replay script, skipping and replay together.
SKIP=${SKIP:-0}
# What every replay condition shares; each condition script adds its mode and that mode's knobs.
# shellcheck disable=SC2034  # used by the scripts that source this file
REPLAY_ARGS=(
  --replay.ratio "$REPLAY_RATIO"
  --replay.warmup "$REPLAY_WARMUP"
  --replay.capacity "$REPLAY_CAPACITY"
  --replay.seed "$SEED"
)
# ---- systems
ZERO_STAGE=${ZERO_STAGE:-2}
VLLM_TP=${VLLM_TP:-1}
VLLM_GPU_UTIL=${VLLM_GPU_UTIL:-0.6}
SAVE_STEPS=${SAVE_STEPS:-20}                     # DeepSpeed + HF checkpoint every N steps (resume, sweeps)

# The training conditions, baseline first: train_<condition>.sh writes <condition>_seed<SEED>/.
# shellcheck disable=SC2034  # used by eval.sh and compare.sh
CONDITIONS=(grpo grpo_replay grpo_naive_replay grpo_uniform_replay grpo_freshness_replay grpo_success_replay grpo_exgrpo_replay)

# The raw completion prompt for base models; with `{}` the problem and `{{}}` a literal `{}`, it
# renders exactly as evaluation's `--prompt-template plain` (evaluation/prompting.py).
PROMPT_TEMPLATE=$'Question: {}\nPlease reason step by step, and put your final answer within \\boxed{{}}.\nAnswer: Let\'s think step by step.'

die() {
  echo "$SCRIPT_NAME: $*" >&2
  exit 1
}

require_ints() {  # <minimum: 0 or 1> <variable names...>
  local low=$1 name
  shift
  for name in "$@"; do
    if [[ ! ${!name} =~ ^[0-9]+$ ]] || ((10#${!name} < low)); then
      die "$name=${!name}: must be an integer >= $low"
    fi
  done
}

model_tag() {  # Qwen/Qwen3-1.7B-Base -> Qwen3-1.7B-Base
  basename "${1%/}"
}

# RLEP's offline pool (train_grpo_success_replay.sh replays it, build_success_pool.sh writes it),
# decoded from the comparison's own GRPO run (same MODEL, SEED) at POOL_STEP.
default_success_pool() {
  echo "$RUNS_DIR/$(model_tag "$MODEL")/success_pool_seed$SEED.npz"
}

default_pool_step() {  # the first GRPO checkpoint at or after one epoch: ceil(steps / SAVE_STEPS) x SAVE_STEPS
  local prompts steps
  prompts=$("$PYTHON" -m openrlhf_replay.cli.prompts --batch "$ROLLOUT_PROMPTS" "$DATA")
  [[ -n $prompts ]] || die "cannot count the prompts of DATA=$DATA to find the end of GRPO's first epoch: set POOL_STEP"
  steps=$(((prompts + ROLLOUT_PROMPTS - 1) / ROLLOUT_PROMPTS))
  echo $(((steps + SAVE_STEPS - 1) / SAVE_STEPS * SAVE_STEPS))
}

# Per-GPU micro-batches (train, rollout forward) by model size: memory, not the experiment.
scale_micro_batches() {  # <model>
  case "${1,,}" in
    *0.6b*) echo "8 16" ;;
    *4b*) echo "2 4" ;;
    *) echo "4 8" ;;
  esac
}

min() { echo $(($1 < $2 ? $1 : $2)); }
max() { echo $(($1 > $2 ? $1 : $2)); }

abspath_if_local() {  # a path that exists becomes absolute (runs start from the repository root); a hub id stays
  if [[ -e $1 ]]; then realpath "$1"; else echo "$1"; fi
}

# Per-GPU micro-batches (train, rollout forward) for a model on a number of GPUs: the scale's,
# capped at each GPU's share of the batch; MICRO_TRAIN_BATCH / MICRO_ROLLOUT_BATCH win if set.
USER_MICRO_TRAIN_BATCH=${MICRO_TRAIN_BATCH:-}
USER_MICRO_ROLLOUT_BATCH=${MICRO_ROLLOUT_BATCH:-}
micro_batches() {  # <model> <gpus in all>
  local scale_train scale_rollout
  read -r scale_train scale_rollout <<<"$(scale_micro_batches "$1")"
  echo "${USER_MICRO_TRAIN_BATCH:-$(max 1 "$(min "$scale_train" $((TRAIN_BATCH / $2)))")}" \
    "${USER_MICRO_ROLLOUT_BATCH:-$(max 1 "$(min "$scale_rollout" $((ROLLOUT_PROMPTS * GROUP_SIZE / $2)))")}"
}

# The flags that change with the model scale and the GPU count (8 per node beyond 8 GPUs):
# what REHEARSE=all adds as shadow shapes of a run. Async training (ASYNC=1) splits each node's
# GPUs as training_settings does: half DeepSpeed ranks, half vLLM engines.
shape_flags() {  # <model> <gpus in all>
  local nodes=$((($2 + 7) / 8)) per_node=$(($2 < 8 ? $2 : 8)) train rollout
  local actors=$per_node engines=$(($2 / VLLM_TP))
  if [[ ${ASYNC:-0} == 1 ]]; then
    actors=$((per_node / 2))
    engines=$((nodes * (per_node - actors) / VLLM_TP))
  fi
  read -r train rollout <<<"$(micro_batches "$1" $((nodes * actors)))"
  echo "--actor.model_name_or_path $1 --actor.num_nodes $nodes --actor.num_gpus_per_node $actors" \
    "--vllm.num_engines $engines --train.micro_batch_size $train --rollout.micro_batch_size $rollout"
}

# Fills GPUS_TOTAL, FRESH_ROLLOUTS, MICRO_TRAIN_BATCH, MICRO_ROLLOUT_BATCH, VLLM_ENGINES and
# the TRAIN_ARGS array shared by every training condition (the baseline included).
training_settings() {
  require_ints 1 NUM_NODES NUM_GPUS ROLLOUT_PROMPTS GROUP_SIZE TRAIN_BATCH EPISODES PROMPT_MAX_LEN MAX_NEW_TOKENS \
    VLLM_TP SAVE_STEPS
  require_ints 0 SEED ZERO_STAGE
  if [[ $DATA == "$DEFAULT_DATA" && ! -f $DATA ]]; then  # a clone without the data folder beside it
    die "no training prompts at $DATA (DeepScaleR's MATH training set: deepscaler/data/train/math.json of github.com/agentica-project/deepscaler; no hub dataset holds these rows). Set DATA=<file>: a JSON array or JSON lines, one object per prompt with the keys INPUT_KEY=$INPUT_KEY and LABEL_KEY=$LABEL_KEY; or SHARED_DIR=<folder holding data/train/deepscaler_math_train.json>"
  fi
  GPUS_TOTAL=$((NUM_NODES * NUM_GPUS))
  # Async training generates while it trains, so the two cannot take turns on the same GPUs
  # (colocation and sleep mode): half of each node's GPUs hold the DeepSpeed ranks, half the engines.
  ACTOR_GPUS=$NUM_GPUS
  local colocate=(--train.colocate_all) vllm_sleep=(--vllm.enable_sleep) ds_sleep=(--ds.enable_sleep)
  if [[ ${ASYNC:-0} == 1 ]]; then
    (( NUM_GPUS >= 2 && NUM_GPUS % 2 == 0 )) || die "--train.async_enable splits each node's GPUs in two halves (DeepSpeed ranks, vLLM engines): NUM_GPUS=$NUM_GPUS must be even"
    ACTOR_GPUS=$((NUM_GPUS / 2))
    colocate=() vllm_sleep=() ds_sleep=()
  fi
  # shellcheck disable=SC2034  # recorded by describe_settings
  FRESH_ROLLOUTS=$((ROLLOUT_PROMPTS * GROUP_SIZE))
  read -r MICRO_TRAIN_BATCH MICRO_ROLLOUT_BATCH <<<"$(micro_batches "$MODEL" $((NUM_NODES * ACTOR_GPUS)))"
  VLLM_ENGINES=$((NUM_NODES * (NUM_GPUS - ACTOR_GPUS) / VLLM_TP))
  [[ ${ASYNC:-0} == 1 ]] || VLLM_ENGINES=$((GPUS_TOTAL / VLLM_TP))
  MODEL=$(abspath_if_local "$MODEL")
  local data_files=() file
  IFS=, read -r -a data_files <<<"$DATA"
  DATA=$(for file in "${data_files[@]}"; do abspath_if_local "$file"; done | paste -sd,)
  # Whole rollout batches only, in every condition: a partial last batch of an episode would not
  # split evenly over the GPUs (openrlhf_replay/cli/prompts.py). Empty when DATA cannot be counted.
  MAX_PROMPTS=${MAX_PROMPTS:-$("$PYTHON" -m openrlhf_replay.cli.prompts --batch "$ROLLOUT_PROMPTS" "$DATA")}
  TRAIN_ARGS=(
    --actor.model_name_or_path "$MODEL"
    --data.prompt_dataset "$DATA"
    --data.input_key "$INPUT_KEY"
    --data.label_key "$LABEL_KEY"
    --data.input_template "$PROMPT_TEMPLATE"
    --data.max_len $((PROMPT_MAX_LEN + MAX_NEW_TOKENS))
    ${MAX_PROMPTS:+--data.max_samples "$MAX_PROMPTS"}
    --rollout.max_new_tokens "$MAX_NEW_TOKENS"
    --reward.remote_url "$REPO_ROOT/evaluation/reward.py"
    --algo.advantage.estimator group_norm
    --rollout.n_samples_per_prompt "$GROUP_SIZE"
    --rollout.batch_size "$ROLLOUT_PROMPTS"
    --rollout.micro_batch_size "$MICRO_ROLLOUT_BATCH"
    --rollout.temperature 1.0
    --rollout.top_p 1.0
    --train.batch_size "$TRAIN_BATCH"
    --train.micro_batch_size "$MICRO_TRAIN_BATCH"
    --train.max_epochs 1
    --train.num_episodes "$EPISODES"
    --train.seed "$SEED"
    --actor.policy_loss_type ppo
    --actor.eps_clip_low_high 0.2 0.28
    --actor.dual_clip 10
    --actor.loss_agg_mode token-mean
    --actor.adam.lr "$LR"
    --actor.adam.weight_decay 0.01
    --actor.max_norm 1.0
    --actor.lr_scheduler constant_with_warmup
    --actor.lr_warmup_ratio 0.03
    --algo.kl.init_coef 0
    --actor.num_nodes "$NUM_NODES"
    --actor.num_gpus_per_node "$ACTOR_GPUS"
    "${colocate[@]}"
    --vllm.num_engines "$VLLM_ENGINES"
    --vllm.tensor_parallel_size "$VLLM_TP"
    --vllm.gpu_memory_utilization "$VLLM_GPU_UTIL"
    "${vllm_sleep[@]}"
    --vllm.enable_prefix_caching
    "${ds_sleep[@]}"
    --ds.zero_stage "$ZERO_STAGE"
    --ds.param_dtype bf16
    --actor.gradient_checkpointing_enable
    --ckpt.output_dir "$OUTPUT_DIR/model"
    --ckpt.path "$OUTPUT_DIR/ckpt"
    --ckpt.save_steps "$SAVE_STEPS"
    --ckpt.save_hf
    --ckpt.max_num 2
    --ckpt.load_enable
    --logger.logging_steps 1
    --logger.tensorboard_dir "$OUTPUT_DIR/tensorboard"
  )
}

# The settings a run was launched with, as `KEY=value` lines a shell can source.
describe_settings() {
  local name
  for name in "$@"; do
    echo "$name=$(shell_words "${!name-}")"
  done
}

# The words as one shell line that reproduces them, quoting only the words that need it.
shell_words() {
  local word out=()
  for word in "$@"; do
    if [[ $word =~ ^[[:alnum:]_./,:=@%+-]+$ ]]; then out+=("$word"); else out+=("${word@Q}"); fi
  done
  echo "${out[*]}"
}

print_command() {
  echo "$SCRIPT_NAME: command: $(shell_words "$@")"
}

# `python -m openrlhf_replay.cli.validate [options] -- <command>`: exit status 0 when it would run.
validate_command() {
  local options=()
  while [[ ${1-} != -- ]]; do
    options+=("$1")
    shift
  done
  "$PYTHON" -m openrlhf_replay.cli.validate "${options[@]}" "$@"
}

refuse_finished() {  # <dir>: a finished run is never overwritten
  [[ ! -e $1/DONE ]] || die "$1 holds a finished run (DONE: $(head -n 1 "$1/DONE")); choose another OUTPUT_DIR, or delete $1 to redo it"
}

mark_done() {
  date -u +%Y-%m-%dT%H:%M:%SZ >"$1/DONE"
}

# Launch a training condition: `launch_training <module> <condition flags...>`. OUTPUT_DIR
# (default $RUNS_DIR/<model>/<condition>_seed<SEED>) receives command.sh, settings.env,
# resolved_args.json (the arguments after upstream's own rewrites), train.log, ckpt/ (resumable:
# rerun the same command), tensorboard/, model/ (the final weights) and DONE at the end.
# The flags M2PO=1 appends after a script's own (so they win over its --replay.off_policy).
m2po_args() {  # <module> <the script's arguments...>
  local module=$1 prev='' arg asked=$M2PO
  shift
  for arg in "$@"; do
    [[ $prev == --replay.off_policy && $arg == m2po ]] && asked=1
    prev=$arg
  done
  [[ $asked == 1 ]] || return 0
  [[ $module == openrlhf_replay.cli.train_ppo_ray ]] || die "M2PO=1 is an off-policy rule of replayed rows: use a replay script"
  echo --replay.off_policy m2po ${M2_THRESHOLD:+--replay.m2_threshold "$M2_THRESHOLD"} \
    --algo.advantage.is_correction_level token --algo.advantage.is_correction_mode mask \
    --algo.advantage.is_correction_gating ratio --algo.advantage.is_correction_threshold 5.0
}

launch_training() {
  local module=$1
  shift
  local condition=${SCRIPT_NAME#train_} m2po word skip=''
  m2po=$(m2po_args "$module" "$@") || exit 1
  [[ -z $m2po ]] || condition+=_m2po  # its own output folder: another condition
  [[ $SKIP == 1 ]] && skip=--replay.skip
  for word in "$@"; do [[ $word == --replay.skip ]] && skip=--replay.skip; done
  if [[ -n $skip ]]; then  # its own output folder too; upstream's launcher has no skipping: ours, replay off
    condition+=_skip
    module=openrlhf_replay.cli.train_ppo_ray
  fi
  ASYNC=0
  for word in "$@"; do [[ $word == --train.async_enable ]] && ASYNC=1; done
  OUTPUT_DIR=$(realpath -m "${OUTPUT_DIR:-$RUNS_DIR/$(model_tag "$MODEL")/${condition}_seed$SEED}")
  training_settings
  # shellcheck disable=SC2206  # m2po_args prints flags and numbers, no spaces within a word
  local cmd=("$PYTHON" -m "$module" "${TRAIN_ARGS[@]}" "$@" ${m2po} ${skip})
  local settings
  settings=$(describe_settings MODEL NUM_NODES NUM_GPUS GPUS_TOTAL DATA INPUT_KEY LABEL_KEY SEED OUTPUT_DIR \
    MAX_PROMPTS ROLLOUT_PROMPTS GROUP_SIZE FRESH_ROLLOUTS TRAIN_BATCH MICRO_TRAIN_BATCH MICRO_ROLLOUT_BATCH EPISODES \
    PROMPT_MAX_LEN MAX_NEW_TOKENS LR ZERO_STAGE VLLM_ENGINES VLLM_TP VLLM_GPU_UTIL SAVE_STEPS)
  refuse_finished "$OUTPUT_DIR"
  local script
  script=$(printf '#!/usr/bin/env bash\n# %s: rerun to resume from the last checkpoint\ncd %s\n%s\n' \
    "$SCRIPT_NAME" "$(shell_words "$REPO_ROOT")" "$(shell_words "${cmd[@]}")")
  if [[ -f $OUTPUT_DIR/command.sh ]] && [[ $(<"$OUTPUT_DIR/command.sh") != "$script" ]]; then
    die "$OUTPUT_DIR holds an unfinished run of another command (see its command.sh); rerun that command to resume it, or choose another OUTPUT_DIR"
  fi
  echo "$settings"
  print_command "${cmd[@]}"
  if [[ $DRY_RUN == 1 ]]; then
    validate_command "${VALIDATE_PENDING[@]}" -- "${cmd[@]}"
    return
  fi
  if [[ $REHEARSE == 1 || $REHEARSE == all ]]; then  # every step of every episode, stand-ins for the GPU work
    local shapes=() model gpus
    if [[ $REHEARSE == all ]]; then  # and, alongside, every model scale at every supported GPU count
      for model in Qwen/Qwen3-0.6B-Base Qwen/Qwen3-1.7B-Base Qwen/Qwen3-4B-Base; do
        for gpus in 1 2 4 8 16 32; do
          ((ASYNC == 0 || gpus >= 2)) || continue  # async needs a GPU for each half
          shapes+=(--shape "$(shape_flags "$model" "$gpus")")
        done
      done
    fi
    # The report is also kept where compare.sh looks for it, named after the run it rehearses.
    "$PYTHON" -m openrlhf_replay.rehearsal "${shapes[@]}" ${REHEARSE_SOLVE_RATE:+--solve-rate "$REHEARSE_SOLVE_RATE"} \
      --report "$RUNS_DIR/$(model_tag "$MODEL")/rehearsal/$(basename "$OUTPUT_DIR").json" -- "${cmd[@]}"
    return
  fi
  cd "$REPO_ROOT" || die "cannot cd to $REPO_ROOT"
  mkdir -p "$OUTPUT_DIR"
  echo "$script" >"$OUTPUT_DIR/command.sh"
  { echo "$settings"; describe_settings RAY_ADDRESS; printf 'GIT_COMMIT=%s\n' "$(git -C "$REPO_ROOT" rev-parse HEAD 2>/dev/null || echo "${OPENRLHF_REPLAY_COMMIT:-unknown}")"; } >"$OUTPUT_DIR/settings.env"
  validate_command --resolved-json "$OUTPUT_DIR/resolved_args.json" -- "${cmd[@]}"
  "${cmd[@]}" 2>&1 | tee -a "$OUTPUT_DIR/train.log"
  mark_done "$OUTPUT_DIR"
  echo "$SCRIPT_NAME: finished: $OUTPUT_DIR"
}
