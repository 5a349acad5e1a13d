"""Resuming from a checkpoint taken on an episode's last step, without walking that episode again.

Upstream's controllers (`PPOTrainer.fit`, `PPOTrainerAsync.fit`) start a resumed run in the
checkpoint's `episode` and load the prompt loader's saved state into it. When the loader ran dry
during the saved step, torchdata's `StatefulDataLoader` records its iterator as finished, and the
first iteration after loading such a state is the next epoch. Upstream then walks that epoch as the
saved episode and goes on to the last one: one episode more than asked for. The loader runs dry
inside a step under dynamic filtering (its replacement prompts draw until the loader is empty) and
on a last partial batch; a whole last batch leaves it unfinished, and that resume was right.

The one seam: `init_checkpoint_states`, which both controllers' `fit` read the start episode from
(the async one through its training actor), now returns the next episode for such a checkpoint.
The loader's state is left as saved: its next iteration is the next episode's, with the order an
uninterrupted run would have drawn. Checkpoints written before this change resume right too.

`ReplayControllerMixin` carries this for every replay run; with `--replay.mode none` the launcher
runs the resume-only classes below, upstream's in everything else (docs/METHOD.md section 7).
"""
from __future__ import annotations

import contextlib

import ray
from openrlhf.trainer import ppo_trainer_async as upstream_async
from openrlhf.trainer.ppo_trainer import PPOTrainer
from torchdata.stateful_dataloader.stateful_dataloader import _ITERATOR_FINISHED  # the key torchdata reads back

from openrlhf_replay.utils import undecorated


def resume_states(states: dict) -> dict:
    """The checkpoint states a resume should start from: `episode` moved to the next one when the
    saved prompt loader had run dry (its saved episode is complete)."""
    loader = states.get("data_loader_state_dict") or {}
    if states.get("global_step", 0) > 0 and loader.get(_ITERATOR_FINISHED):
        return {**states, "episode": states["episode"] + 1}
    return states


class EpisodeResume:
    """Mixed in before an upstream controller class that has `init_checkpoint_states`."""

    def init_checkpoint_states(self):
        return resume_states(super().init_checkpoint_states())


# Each class below enters every upstream method that calls zero-argument `super()` through one of
# its own: Ray ships an inherited upstream method by value, with a copy of its class in `super()`.

class _ResumePPOTrainer(EpisodeResume, undecorated(PPOTrainer)):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)


class _ResumeTrainingActor(EpisodeResume, undecorated(upstream_async.TrainingActor)):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

    def broadcast_to_vllm(self) -> None:
        super().broadcast_to_vllm()


ResumePPOTrainer = ray.remote(_ResumePPOTrainer)
ResumeTrainingActor = ray.remote(_ResumeTrainingActor)


class _ResumePPOTrainerAsync(undecorated(upstream_async.PPOTrainerAsync)):
    """Upstream's async controller with the resume's training actor. Upstream's `__init__` creates
    its actors from its module's names, in this Ray worker, so the names are swapped for the call."""

    # What upstream's __init__ creates by these module-level names (the rehearsal swaps in threads).
    actor_classes = {"VLLMLock": upstream_async.VLLMLock, "GenerateSamplesActor": upstream_async.GenerateSamplesActor,
                     "TrainingActor": ResumeTrainingActor}

    def __init__(self, pretrain, strategy, *args, **kwargs):
        with contextlib.ExitStack() as stack:
            for name, cls in self.actor_classes.items():
                stack.callback(setattr, upstream_async, name, getattr(upstream_async, name))
                setattr(upstream_async, name, cls)
            super().__init__(pretrain, strategy, *args, **kwargs)


ResumePPOTrainerAsync = ray.remote(_ResumePPOTrainerAsync)
