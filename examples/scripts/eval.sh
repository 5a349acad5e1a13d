#!/usr/bin/env bash
# Evaluate a model on the five benchmarks (MATH-500, AIME 2024, AMC 2023, Minerva Math,
# OlympiadBench) with `python -m evaluation run`, or every checkpoint of a training run with
# `python -m evaluation sweep`. What to evaluate (environment variables, first one set wins):
#   CHECKPOINT=<model directory or hub id>   that model
#   RUN_DIR=<training output directory>      its final model (<RUN_DIR>/model); SWEEP=1: every
#                                            checkpoint in <RUN_DIR>/ckpt (global_step<N>_hf)
#   CONDITION=<grpo|grpo_replay|...>         RUN_DIR = $RUNS_DIR/<model>/<CONDITION>_seed<SEED>
#   (none)                                   the base model MODEL (default Qwen/Qwen3-1.7B-Base)
# Output: OUTPUT_DIR, default $RUNS_DIR/<model>/eval/<label> (sweeps: .../sweep/<label>), where
# <label> (the row name in compare.sh's table) is <CONDITION>_seed<SEED> or the model's name.
# The evaluation resumes when rerun; a finished one (DONE) is never overwritten; other decoding
# settings need another OUTPUT_DIR (the evaluation refuses to mix them in one directory).
# Decoding: greedy by default; docs/METHOD.md's sampled setting is
#   N_SAMPLES=16 TEMPERATURE=0.6 TOP_P=0.95 bash examples/scripts/eval.sh
# The prompt is the raw completion template the training scripts use (--prompt-template plain).
# One GPU per evaluation (one vLLM engine): run several side by side with CUDA_VISIBLE_DEVICES=i.
# Extra arguments are appended to the command (e.g. --limit 20). DRY_RUN=1: check, print, write nothing.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

BENCHMARKS=${BENCHMARKS:-math500,aime24,amc23,minerva_math,olympiadbench}
BENCH_DIR=${BENCH_DIR:-$SHARED_DIR/data/benchmarks}
N_SAMPLES=${N_SAMPLES:-1}
TEMPERATURE=${TEMPERATURE:-0}
TOP_P=${TOP_P:-1.0}
EVAL_SEED=${EVAL_SEED:-0}
SWEEP=${SWEEP:-0}
require_ints 1 N_SAMPLES PROMPT_MAX_LEN MAX_NEW_TOKENS
require_ints 0 SEED EVAL_SEED

tag=$(model_tag "$MODEL")
if [[ -n ${CHECKPOINT:-} ]]; then
  [[ $SWEEP != 1 ]] || die "SWEEP=1 takes RUN_DIR or CONDITION (a training run), not CHECKPOINT"
  target=$(abspath_if_local "$CHECKPOINT")
  label=$(model_tag "$target")
  [[ $label != model ]] || label=$(model_tag "$(dirname "$target")")  # <run>/model: name it after the run
elif [[ -n ${RUN_DIR:-} || -n ${CONDITION:-} ]]; then
  RUN_DIR=$(realpath -m "${RUN_DIR:-$RUNS_DIR/$tag/${CONDITION}_seed$SEED}")
  label=$(basename "$RUN_DIR")
  if [[ $SWEEP == 1 ]]; then target=$RUN_DIR/ckpt; else target=$RUN_DIR/model; fi
else
  [[ $SWEEP != 1 ]] || die "SWEEP=1 takes RUN_DIR or CONDITION (a training run)"
  target=$(abspath_if_local "$MODEL")
  label=$tag
fi
if [[ $SWEEP == 1 ]]; then
  OUTPUT_DIR=$(realpath -m "${OUTPUT_DIR:-$RUNS_DIR/$tag/sweep/$label}")
  cmd=("$PYTHON" -m evaluation sweep --checkpoints "$target")
else
  OUTPUT_DIR=$(realpath -m "${OUTPUT_DIR:-$RUNS_DIR/$tag/eval/$label}")
  cmd=("$PYTHON" -m evaluation run --model "$target")
fi
cmd+=(
  --output-dir "$OUTPUT_DIR"
  --benchmarks "$BENCHMARKS"
  --backend vllm
  --n-samples "$N_SAMPLES"
  --temperature "$TEMPERATURE"
  --top-p "$TOP_P"
  --max-new-tokens "$MAX_NEW_TOKENS"
  --max-model-len $((PROMPT_MAX_LEN + MAX_NEW_TOKENS))
  --prompt-template plain
  --seed "$EVAL_SEED"
)
[[ ! -d $BENCH_DIR ]] || cmd+=(--data-dir "$(realpath "$BENCH_DIR")")
cmd+=("$@")

refuse_finished "$OUTPUT_DIR"
settings=(MODEL CHECKPOINT RUN_DIR CONDITION SEED SWEEP OUTPUT_DIR BENCHMARKS N_SAMPLES TEMPERATURE TOP_P EVAL_SEED
  MAX_NEW_TOKENS)
describe_settings "${settings[@]}"
print_command "${cmd[@]}"
if [[ $DRY_RUN == 1 ]]; then
  validate_command -- "${cmd[@]}"
  exit
fi
cd "$REPO_ROOT" || die "cannot cd to $REPO_ROOT"
"${cmd[@]}"
mkdir -p "$OUTPUT_DIR"
# Written after the run: `evaluation run` refuses to start in a non-empty directory it did not create.
shell_words "${cmd[@]}" >"$OUTPUT_DIR/eval_command.sh"
describe_settings "${settings[@]}" >"$OUTPUT_DIR/eval_settings.env"
if [[ $SWEEP == 1 && ! -e $RUN_DIR/DONE ]]; then
  echo "$SCRIPT_NAME: swept the checkpoints so far; $RUN_DIR is still training, so rerun to add the next ones"
else
  mark_done "$OUTPUT_DIR"
  echo "$SCRIPT_NAME: finished: $OUTPUT_DIR"
fi
