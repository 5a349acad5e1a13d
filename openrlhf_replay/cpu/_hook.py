"""Post-import hooks: adapt an upstream module right after it is first imported, in any process.

A `.pth` file in the environment (written by `scripts/setup_env.sh`) calls `install_if_active()`
at interpreter start-up, so the driver, Ray's workers and vLLM's subprocesses all get the hooks.
When `OPENRLHF_REPLAY_DEVICE` is not `cpu` nothing is installed. This module imports only the
standard library; the patches themselves (`patches.py`) are imported when a watched module is.
"""
from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import threading

from openrlhf_replay.cpu import DEVICE_ENV

# module name -> name of the function in openrlhf_replay.cpu.patches that adapts it
WATCHED = {
    "torch": "patch_torch",
    "deepspeed.comm.torch": "patch_deepspeed_comm",
    "ray": "patch_ray",
    "openrlhf.utils.utils": "patch_utils",
    "openrlhf.utils.distributed_util": "patch_distributed_util",
    "openrlhf.utils.deepspeed.deepspeed": "patch_deepspeed_strategy",
    "openrlhf.trainer.ppo_utils.replay_buffer": "patch_replay_buffer",
    "openrlhf.trainer.ray.vllm_worker_wrap": "patch_vllm_worker_wrap",
    "openrlhf.trainer.ray": "patch_trainer_ray",
    "openrlhf.trainer.ray.launcher": "patch_ray_launcher",
    "vllm.model_executor.layers.utils": "patch_vllm_layer_utils",
}
_MARK = "__openrlhf_replay_cpu_patched__"


def _apply(name: str, module) -> None:
    if getattr(module, _MARK, False):
        return
    from openrlhf_replay.cpu import patches

    try:
        getattr(patches, WATCHED[name])(module)
    except Exception as e:  # a seam that moved must stop the run here, not hang it later
        raise ImportError(f"openrlhf_replay CPU platform: cannot adapt {name} for CPU: {e}") from e
    setattr(module, _MARK, True)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds watched modules with the other finders and runs their patch after `exec_module`."""

    def __init__(self) -> None:
        self._resolving = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED or getattr(self._resolving, fullname.replace(".", "_"), False):
            return None
        setattr(self._resolving, fullname.replace(".", "_"), True)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            setattr(self._resolving, fullname.replace(".", "_"), False)
        loader = getattr(spec, "loader", None)
        # Only per-module loader instances (source files): a class-level loader is shared.
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _apply(fullname, module)

        loader.exec_module = exec_module
        return spec


_installed = False


def install() -> None:
    """Install the hooks in this process (idempotent) and adapt watched modules already imported."""
    global _installed
    if not _installed:
        sys.meta_path.insert(0, _PostImportFinder())
        _installed = True
    for name in WATCHED:
        module = sys.modules.get(name)
        if module is not None:
            _apply(name, module)


def _die_with_parent() -> None:
    """In a `multiprocessing` spawn child (vLLM's engine core and workers; the evaluation's graders
    set their own), ask Linux to kill this process when its parent dies: a run stopped abruptly
    otherwise leaves vLLM workers running on their own. Linux signals when the *thread* that
    started the child ends, which for vLLM is its long-lived main thread."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            if b"multiprocessing.spawn" not in f.read():
                return
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() == 1:  # the parent died before the request took effect
            os._exit(1)
    except OSError:  # not Linux: nothing to ask for
        pass


def install_if_active() -> None:
    """The `.pth` entry point: install the hooks only in processes of a CPU run."""
    if os.environ.get(DEVICE_ENV, "").strip().lower() == "cpu":
        _die_with_parent()
        install()
