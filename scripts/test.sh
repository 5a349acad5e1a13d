#!/usr/bin/env bash
# The whole test suite on CPU: sets up .venv/ if needed, then runs pytest (slow tests included)
# in two worker processes, a test file at a time each (see tests/conftest.py for the order).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k replay -x`, or `-p no:xdist`
# (with `-n` removed: `PYTEST_WORKERS=0`) for one process.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup_env.sh"
cd "$root"
workers=${PYTEST_WORKERS:-2}
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
exec "${VENV:-$root/.venv}/bin/python" -m pytest "${parallel[@]}" "$@"
