#!/usr/bin/env bash
# Sample-efficiency lab (issue #7): GRPO vs the replay conditions at the same number of generated
# rollouts, through the real CPU pipeline, several seeds each; held-out accuracy, training reward,
# compute units, a summary JSON (last line printed), curves.png and table.md under the output dir.
#   bash examples/scripts/sample_efficiency.sh            # 6 conditions x 3 seeds
#   bash examples/scripts/sample_efficiency.sh --quick    # none, naive, advantage x 1 seed, 6 steps
#   bash examples/scripts/sample_efficiency.sh --help     # every setting
# Rerunning the same command resumes: finished runs (DONE) are kept, unfinished ones redone.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-$REPO_ROOT/.venv/bin/python}
# Idle OpenMP threads sleep instead of spinning on a preempted peer (a shared CPU: see se_task.py).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$REPO_ROOT"
exec "$PYTHON" benchmarks/sample_efficiency.py "$@"
