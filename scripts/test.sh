#!/usr/bin/env bash
# The whole test suite on CPU: sets up .venv/ if needed, then runs pytest (slow tests included)
# in two worker processes, each taking a test file at a time (tests/conftest.py sets the order);
# two measured faster than one or three on 2 cores (benchmarks/results/timings.md).
# PYTEST_WORKERS=N changes the count, 0 runs one process. Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -k replay -x`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup_env.sh"
cd "$root"
workers=${PYTEST_WORKERS:-2}
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
exec "${VENV:-$root/.venv}/bin/python" -m pytest "${parallel[@]}" "$@"
