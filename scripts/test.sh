#!/usr/bin/env bash
# The whole test suite on CPU: sets up .venv/ if needed, then runs pytest (slow tests included).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k replay -x`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup_env.sh"
cd "$root"
exec "${VENV:-$root/.venv}/bin/python" -m pytest "$@"
