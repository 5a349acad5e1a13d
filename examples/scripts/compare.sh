#!/usr/bin/env bash
# The paper-style table (`python -m evaluation compare`): one row per evaluated model, one column
# per benchmark, the five-benchmark average, mean response tokens, and AES against GRPO
# (O1-Pruner: alpha 1, beta 3, gamma 5), written as compare.md, compare.csv and two plots.
#   BASELINE=<eval directory>    the AES reference; default the GRPO run's: $RUNS_DIR/<model>/eval/grpo_seed<SEED>
#   RUNS="<eval dir> ..."        the rows after it; default the base model's evaluation, then every
#                                replay condition's (<condition>_seed<SEED>), the finished ones only
#   OUTPUT_DIR                   default $RUNS_DIR/<model>/compare_seed<SEED>
# The evaluations come from eval.sh (same MODEL, SEED, RUNS_DIR). A table is a report, not a run:
# rerunning rewrites it (with the evaluations finished by then). DRY_RUN=1: check, print, write nothing.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

tag=$(model_tag "$MODEL")
eval_root=$RUNS_DIR/$tag/eval
BASELINE=$(realpath -m "${BASELINE:-$eval_root/grpo_seed$SEED}")
if [[ -n ${RUNS:-} ]]; then
  read -r -a wanted <<<"$RUNS"
else
  wanted=("$eval_root/$tag")
  for condition in "${CONDITIONS[@]:1}"; do
    wanted+=("$eval_root/${condition}_seed$SEED")
  done
fi
OUTPUT_DIR=$(realpath -m "${OUTPUT_DIR:-$RUNS_DIR/$tag/compare_seed$SEED}")

runs=()
for dir in "${wanted[@]}"; do
  if [[ -f $dir/summary.json ]]; then runs+=("$(realpath "$dir")"); else echo "$SCRIPT_NAME: not evaluated yet, left out: $dir" >&2; fi
done
if [[ ! -f $BASELINE/summary.json || ${#runs[@]} == 0 ]]; then
  [[ $DRY_RUN == 1 ]] || die "need a finished baseline evaluation ($BASELINE) and at least one other; run eval.sh first"
  echo "$SCRIPT_NAME: (dry run) nothing evaluated yet: checking the command with every default row" >&2
  runs=()
  for dir in "${wanted[@]}"; do runs+=("$(realpath -m "$dir")"); done
fi
cmd=("$PYTHON" -m evaluation compare --baseline "$BASELINE" --runs "${runs[@]}" --output "$OUTPUT_DIR" "$@")

describe_settings MODEL SEED RUNS_DIR BASELINE OUTPUT_DIR
print_command "${cmd[@]}"
if [[ $DRY_RUN == 1 ]]; then
  validate_command -- "${cmd[@]}"
  exit
fi
cd "$REPO_ROOT" || die "cannot cd to $REPO_ROOT"
"${cmd[@]}"
mkdir -p "$OUTPUT_DIR"
shell_words "${cmd[@]}" >"$OUTPUT_DIR/compare_command.sh"
echo "$SCRIPT_NAME: table: $OUTPUT_DIR/compare.md"
