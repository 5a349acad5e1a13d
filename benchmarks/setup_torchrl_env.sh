#!/usr/bin/env bash
# Build the benchmark-only TorchRL environment in .venv-torchrl/ (or $VENV), used by
# benchmarks/replay_core.py for its baseline side. Never touches the project's .venv/.
#
# Why a second environment: TorchRL's wheels carry a compiled extension (the priority sum tree)
# that fails to load beside the project's torch 2.13.0 (undefined symbol). torchrl 0.14.1 with
# tensordict 0.14.3 loads beside torch 2.14.1 (a CUDA build, ~5.5 GB, that runs on the CPU;
# pip takes it from the local wheel index). numpy is pinned to the project's version so both
# sides generate the identical synthetic workload.
#
# Idempotent: returns at once when this script has not changed since its last good run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${VENV:-$root/.venv-torchrl}
python=${PYTHON:-python3.11}
pins=(torch==2.14.1 torchrl==0.14.1 tensordict==0.14.3 numpy==2.3.5)

stamp="$venv/.setup-stamp"
want=$(cat "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
command -v "$python" >/dev/null || { echo "setup_torchrl_env: $python not found; set PYTHON=/path/to/python3.11" >&2; exit 1; }
echo "setup_torchrl_env: building $venv (several minutes the first time: torch 2.14.1 is ~5.5 GB)"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# (pip warns once per package that the local index has no folder for it: noise, filtered out.)
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" 2>&1 |
  { grep -v '^WARNING: Location .* is ignored' || true; }
# The check that matters: the compiled sum tree loads and a prioritized buffer works.
"$venv/bin/python" - <<'PY' || { echo "setup_torchrl_env: torchrl does not work in $venv; see above" >&2; exit 1; }
import torch
from torchrl.data import ListStorage, PrioritizedReplayBuffer
rb = PrioritizedReplayBuffer(alpha=0.5, beta=0.4, storage=ListStorage(4))
rb.extend([torch.zeros(1)] * 4)
rb.update_priority(torch.arange(4), torch.ones(4))
rb.sample(2)
print("torchrl ok, torch", torch.__version__)
PY
echo "$want" > "$stamp"
echo "setup_torchrl_env: ready ($venv)"
