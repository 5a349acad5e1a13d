#!/usr/bin/env bash
# Sample-efficiency lab (issues #7, #14): GRPO, the more-updates control and the replay conditions at
# the same generated rollouts, through the real CPU pipeline, on arithmetic of spread difficulty;
# held-out accuracy (overall and per band), paired differences over seeds, compute units, a summary
# JSON (last line printed), table.md and plots under the output dir.
#   bash examples/scripts/sample_efficiency.sh               # 10 conditions; 8 seeds of none / uniform / advantage, 3 of the rest
#   bash examples/scripts/sample_efficiency.sh --quick       # none, uniform, advantage x 1 seed, 10 steps
#   bash examples/scripts/sample_efficiency.sh --task add2   # the first edition (two-digit addition), as published
#   bash examples/scripts/sample_efficiency.sh --help        # every setting
# Rerunning the same command resumes: finished runs (DONE) are kept, unfinished ones redone.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-$REPO_ROOT/.venv/bin/python}
# Idle OpenMP threads sleep instead of spinning on a preempted peer (a shared CPU: see se_task.py).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$REPO_ROOT"
if [[ ${DRY_RUN:-0} == 1 ]]; then  # it trains on this CPU: a dry run parses its settings and runs nothing
  exec "$PYTHON" -c 'import sys; sys.path.insert(0, "benchmarks/lab"); from se_settings import parse_args
a = parse_args(sys.argv[1:]); print(f"sample_efficiency: dry run: settings OK (output {a.out_dir}); nothing run")' "$@"
fi
exec "$PYTHON" benchmarks/lab/sample_efficiency.py "$@"
