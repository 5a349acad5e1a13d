#!/usr/bin/env bash
# The paper-style table (`python -m evaluation compare`): one row per evaluated model, one column
# per benchmark, the five-benchmark average, mean response tokens, and AES against GRPO
# (O1-Pruner: alpha 1, beta 3, gamma 5), each with its 95% bootstrap CI; then every model's paired
# difference from GRPO (matched by problem id: CI, exact McNemar test, the problems that flipped,
# resolved or not at 95%), median / IQR / CI over seeds when OUTPUT_DIR's runs include several
# <condition>_seed<N> (set RUNS to them), breakdowns (MATH-500 level and subject, OlympiadBench
# subfield, response length, truncation) and each run's provenance. compare.md opens with a
# warning when the runs differ in more than the model (data, decoding, versions, hardware).
# Written as compare.md, compare.csv, compare_paired.csv, compare_breakdown.csv,
# compare_provenance.json and plots with error bars. Then each run's optimizer steps per rollout
# step (and replayed rollouts per step, and how replayed rows' pi_old is taken), from its
# rehearsal's report, beside its average accuracy, tokens and AES: compare_steps.md / .csv, also
# appended to compare.md (`python -m openrlhf_replay.rehearsal.report beside`). Equal rollout
# steps are not equal training: replay trains on more rows per step.
#   BASELINE=<eval directory>    the AES reference; default the GRPO run's: $RUNS_DIR/<model>/eval/grpo_seed<SEED>
#   RUNS="<eval dir> ..."        the rows after it; default the base model's evaluation, then every
#                                replay condition's (<condition>_seed<SEED>), the finished ones only
#   SEEDS="1 2 3"                several training seeds (default: SEED alone): the default baseline
#                                is GRPO's first seed and the rows hold every condition at every seed,
#                                so compare.md also shows each condition's spread over seeds
#   OUTPUT_DIR                   default $RUNS_DIR/<model>/compare_seed<SEED> (compare_seeds<1-2-3>)
#   REHEARSALS=<dir>             the rehearsal reports, <run>.json per row; default $RUNS_DIR/<model>/rehearsal,
#                                where `REHEARSE=1 bash examples/scripts/train_<condition>.sh` writes them
#                                (a row without one says so and how to make it)
# The evaluations come from eval.sh (same MODEL, SEED, RUNS_DIR). A table is a report, not a run:
# rerunning rewrites it (with the evaluations finished by then). DRY_RUN=1: check, print, write nothing.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

read -r -a seeds <<<"${SEEDS:-$SEED}"
for s in "${seeds[@]}"; do
  [[ $s =~ ^[0-9]+$ ]] || die "SEEDS must be whole numbers separated by spaces, got '${SEEDS:-}'"
done
[[ ${#seeds[@]} -gt 0 ]] || die "SEEDS is empty: give one or more seeds, e.g. SEEDS=\"1 2 3\""
tag=$(model_tag "$MODEL")
eval_root=$RUNS_DIR/$tag/eval
BASELINE=$(realpath -m "${BASELINE:-$eval_root/grpo_seed${seeds[0]}}")
if [[ -n ${RUNS:-} ]]; then
  read -r -a wanted <<<"$RUNS"
else
  wanted=("$eval_root/$tag")
  for condition in "${CONDITIONS[@]}"; do
    for s in "${seeds[@]}"; do
      [[ $condition == grpo && $s == "${seeds[0]}" ]] || wanted+=("$eval_root/${condition}_seed$s")
    done
  done
fi
if [[ ${#seeds[@]} == 1 ]]; then default_output=compare_seed${seeds[0]}; else default_output=compare_seeds$(IFS=-; echo "${seeds[*]}"); fi
OUTPUT_DIR=$(realpath -m "${OUTPUT_DIR:-$RUNS_DIR/$tag/$default_output}")
REHEARSALS=$(realpath -m "${REHEARSALS:-$RUNS_DIR/$tag/rehearsal}")

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
steps_cmd=("$PYTHON" -m openrlhf_replay.rehearsal.report beside --compare "$OUTPUT_DIR" --rehearsals "$REHEARSALS")

describe_settings MODEL SEED SEEDS RUNS_DIR BASELINE OUTPUT_DIR REHEARSALS
print_command "${cmd[@]}"
print_command "${steps_cmd[@]}"
if [[ $DRY_RUN == 1 ]]; then
  validate_command -- "${cmd[@]}"
  exit
fi
cd "$REPO_ROOT" || die "cannot cd to $REPO_ROOT"
"${cmd[@]}"
"${steps_cmd[@]}"
mkdir -p "$OUTPUT_DIR"
printf '%s\n%s\n' "$(shell_words "${cmd[@]}")" "$(shell_words "${steps_cmd[@]}")" >"$OUTPUT_DIR/compare_command.sh"
echo "$SCRIPT_NAME: table: $OUTPUT_DIR/compare.md (optimizer steps per rollout step: $OUTPUT_DIR/compare_steps.md)"
