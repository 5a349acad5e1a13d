"""The rehearsal's controller: which class the launcher would start (`controller_class`), and for
async training (`--train.async_enable`) upstream's `PPOTrainerAsync` (or this project's replay
subclass) built and run in this process, its actors on threads.

The controller's own `__init__` and `fit` run unchanged: they create the generator and training
actors, the queue, the `rollout_slots` tokens and the vLLM lock by their module-level names, which
are pointed here at in-process forms for the call, and then run both actors' `fit` at once. Each
actor runs its methods one at a time on its own thread, as a Ray actor would, so generation runs
ahead of training by the queue's size exactly as on a cluster. A wait that sees no progress for
`timeout_s` (a deadlock) or another actor's failure stops with that cause instead of hanging.
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from openrlhf_replay.rehearsal.standins import _Local
from openrlhf_replay.utils import undecorated

ACTOR_NAMES = ("VLLMLock", "GenerateSamplesActor", "TrainingActor")


class Deadlock(RuntimeError):
    """A wait of the async run saw no progress for the watch's timeout."""


class _Watch:
    """Shared by every wait of one run: the first actor failure, and the time of the last progress."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s, self.error, self.progress = timeout_s, None, time.monotonic()

    def wait(self, attempt, what: str):
        """Call `attempt(poll_s)` until it returns (it raises `queue.Empty` / `TimeoutError` to go on)."""
        while True:
            if self.error is not None:
                raise RuntimeError(f"{what}: stopped, another actor failed ({type(self.error).__name__}: "
                                   f"{self.error})") from self.error
            try:
                result = attempt(0.05)
            except (queue.Empty, queue.Full, TimeoutError):
                if time.monotonic() - self.progress > self.timeout_s:
                    raise Deadlock(f"deadlock: {what} made no progress for {self.timeout_s:.0f} s") from None
                continue
            self.progress = time.monotonic()
            return result


class _Call:
    """What a `.remote()` call returns here; the in-process `ray.get` reads `.value`."""

    def __init__(self, future, watch: _Watch, what: str) -> None:
        self.future, self.watch, self.what = future, watch, what

    @property
    def value(self):
        return self.watch.wait(self.future.result, self.what)


class _ThreadActor:
    def __init__(self, instance, watch: _Watch) -> None:
        self.instance, self.watch = instance, watch
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=type(instance).__name__)

    def __getattr__(self, method: str):
        fn, name = getattr(self.instance, method), f"{type(self.instance).__name__}.{method}"

        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except BaseException as e:
                if self.watch.error is None:
                    self.watch.error = e
                raise

        return SimpleNamespace(remote=lambda *args, **kwargs: _Call(self.pool.submit(run, *args, **kwargs),
                                                                    self.watch, name))


class _ThreadActorClass:
    def __init__(self, cls, watch: _Watch) -> None:
        self.cls, self.watch = undecorated(cls), watch
        self.created: list[_ThreadActor] = []

    def options(self, **_):
        return self

    def remote(self, *args, **kwargs) -> _ThreadActor:
        actor = _ThreadActor(self.cls(*args, **kwargs), self.watch)
        self.created.append(actor)
        return actor


class _Lock:
    """Upstream's `VLLMLock` (and the policy version replay's lock carries) across threads."""

    def __init__(self, watch: _Watch) -> None:
        lock, self.version_now = threading.Lock(), 0

        def acquire():
            def attempt(poll_s):
                if not lock.acquire(timeout=poll_s):
                    raise TimeoutError
            return watch.wait(attempt, "VLLMLock.acquire")

        def set_version(version):
            self.version_now = int(version)

        for name, fn in (("acquire", acquire), ("release", lock.release), ("set_version", set_version),
                         ("version", lambda: self.version_now)):
            setattr(self, name, SimpleNamespace(remote=lambda *a, _fn=fn: _Local(_fn(*a))))


def _queue_class(watch: _Watch):
    class WatchedQueue(queue.Queue):
        """`ray.util.queue.Queue`'s blocking get / put, watched."""

        def get(self, block: bool = True, timeout=None):
            return watch.wait(lambda poll_s: super(WatchedQueue, self).get(True, poll_s), "queue get")

        def put(self, item, block: bool = True, timeout=None):
            return watch.wait(lambda poll_s: super(WatchedQueue, self).put(item, True, poll_s), "queue put")

    return WatchedQueue


def build_async(cls, ctor_args: tuple, ctor_kwargs: dict, timeout_s: float = 300.0):
    """The async controller `cls` (plain class) built here; returns (controller, its generator
    actor's instance, its training actor's instance)."""
    from openrlhf.trainer import ppo_trainer_async as upstream

    watch = _Watch(timeout_s)
    classes = getattr(cls, "actor_classes", None) or {name: getattr(upstream, name) for name in ACTOR_NAMES}
    local = {"VLLMLock": SimpleNamespace(remote=lambda: _Lock(watch)),
             "GenerateSamplesActor": _ThreadActorClass(classes["GenerateSamplesActor"], watch),
             "TrainingActor": _ThreadActorClass(classes["TrainingActor"], watch)}
    local_cls = type(cls.__name__, (cls,), {"actor_classes": local})  # replay's controller swaps these in
    with contextlib.ExitStack() as stack:
        for name, value in (*local.items(), ("Queue", _queue_class(watch))):
            stack.callback(setattr, upstream, name, getattr(upstream, name))
            setattr(upstream, name, value)
        controller = local_cls(*ctor_args, **ctor_kwargs)
    generator = local["GenerateSamplesActor"].created[0].instance
    training = local["TrainingActor"].created[0].instance
    controller.prompts_dataloader = generator.prompts_dataloader  # what the driver sizes its report from
    return controller, generator, training


def controller_class(launcher: str, async_enable: bool):
    """The controller the launcher would start, as a plain class: `launcher` is "upstream" (its own
    `PPOTrainer` or `PPOTrainerAsync`), "resume" (this project's launcher with replay off: upstream's
    with `resume.py`'s start episode) or "replay" (replay's subclass)."""
    from openrlhf.trainer.ppo_trainer import PPOTrainer
    from openrlhf.trainer.ppo_trainer_async import PPOTrainerAsync

    from openrlhf_replay.trainer.ppo_trainer import ReplayPPOTrainer
    from openrlhf_replay.trainer.ppo_trainer_async import ReplayPPOTrainerAsync
    from openrlhf_replay.trainer.resume import ResumePPOTrainer, ResumePPOTrainerAsync

    return undecorated({("upstream", False): PPOTrainer, ("upstream", True): PPOTrainerAsync,
                        ("resume", False): ResumePPOTrainer, ("resume", True): ResumePPOTrainerAsync,
                        ("replay", False): ReplayPPOTrainer, ("replay", True): ReplayPPOTrainerAsync}
                       [launcher, async_enable])


def build_controller(cls, args, ctor_args: tuple, ctor_kwargs: dict):
    """(controller, the object that generates, the object that trains): the synchronous trainer is
    all three; an async controller's are its generator and training actors (`build_async`)."""
    if args.train.async_enable:
        return build_async(cls, ctor_args, ctor_kwargs)
    trainer = cls(*ctor_args, **ctor_kwargs)
    return trainer, trainer, trainer


def install_generation(generator, dispatch) -> None:
    """The generation stand-in in place of vLLM's dispatch (`standins.Generation`), under upstream's
    own `_generate_vllm` loop; replay's async generator already stamps each sample's policy version
    around that loop."""
    generator.samples_generator._dispatch_prompts_to_vllm = dispatch
