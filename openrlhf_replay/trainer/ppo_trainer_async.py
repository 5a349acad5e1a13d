"""Replay in upstream's async training (`--train.async_enable`): the buffer in the `TrainingActor`.

Upstream's `PPOTrainerAsync` (a Ray actor) creates a `GenerateSamplesActor`, which generates rollout
batches ahead of training, and a `TrainingActor`, which runs the same `train_step` as the
synchronous controller on each batch it takes from a queue; `rollout_slots` bounds how far
generation runs ahead, and a `VLLMLock` keeps weight broadcasts apart from generation. This module
subclasses all four, and nothing else changes:

- `VersionedVLLMLock` also holds the policy version of the weights in vLLM: the training actor sets
  it while it holds the lock for a broadcast (`_VersionedBroadcast`), the generator reads it before
  each generation call (under the lock, unless partial rollouts are on) and stamps every sample
  with it (`_ReplayGenerateSamplesActor`).
- `_ReplayTrainingActor` is `ReplayControllerMixin` (the buffer, its metrics and checkpoints, as in
  the synchronous controller) over upstream's `TrainingActor`; its experience maker stores each
  fresh row with the version that generated it, so age = current version - that version, fresh
  rows included (docs/METHOD.md section 10).
- `_ReplayPPOTrainerAsync` builds them: upstream's `__init__` creates its actors from its module's
  names, in this Ray worker, so the names are swapped for the call (`resume.py:_ResumePPOTrainerAsync`,
  which replay's controller extends); then the buffer is set up from the generator's prompts.

Replay never touches `rollout_slots`, and a failure in replay raises in `train_step`, which
ends the training actor's `fit` and so the run, with its cause.
"""
from __future__ import annotations

import numpy as np
import ray
import torch
from openrlhf.trainer import ppo_trainer_async as upstream
from openrlhf.trainer.ppo_trainer import BasePPOTrainer

from openrlhf_replay.trainer.ppo_trainer import ReplayControllerMixin
from openrlhf_replay.trainer.ppo_utils.experience import AGE_KEY, set_row_flags
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from openrlhf_replay.trainer.ppo_utils.samples_generator import ReplaySamplesGenerator
from openrlhf_replay.trainer.resume import _ResumePPOTrainerAsync
from openrlhf_replay.trainer.ppo_utils.prompt_skip import install_skip
from openrlhf_replay.utils import undecorated
from replay import ReplayConfig
from replay.skip import SkipRule

VERSION_KEY = "replay/policy_version"  # sample info key: the version of the weights that generated it


class _VersionedVLLMLock(undecorated(upstream.VLLMLock)):
    """Upstream's vLLM lock, also holding the policy version of vLLM's weights (the number of
    training steps behind them): set under the lock by the broadcast that loads them."""

    def __init__(self):
        super().__init__()
        self._version = 0

    async def set_version(self, version: int) -> None:
        self._version = int(version)

    async def version(self) -> int:
        return self._version


VersionedVLLMLock = ray.remote(num_cpus=0)(_VersionedVLLMLock)


class _ReplayGenerateSamplesActor(undecorated(upstream.GenerateSamplesActor)):
    """Upstream's generator; every sample it generates carries `info[VERSION_KEY]`, and each batch
    the counts of the generation calls behind it (`ReplaySamplesGenerator`), for the training actor
    to log: this actor filters, so only it knows what was generated."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.adapt_samples_generator()

    def adapt_samples_generator(self) -> None:
        """Upstream's samples generator (built by upstream's `__init__`), counting its calls and
        stamping their versions."""
        self.samples_generator.__class__ = ReplaySamplesGenerator
        self.stamp_versions()
        config = ReplayConfig.from_namespace(self.args)
        if config.skip:  # the rule lives here, with the loader it skips from
            install_skip(self.samples_generator, SkipRule.from_config(config, len(self.prompts_dataloader),
                                                                      self.args.rollout.batch_size))

    def load_skip_state(self, state: dict) -> None:
        """The skip state of the checkpoint resumed from (called by the training actor before `fit`)."""
        self.samples_generator.skip_rule.load_state_dict(state)

    def stamp_versions(self) -> None:
        """Wrap the samples generator's vLLM call (as it is now) so its samples carry the version."""
        generate, lock = self.samples_generator._generate_vllm, self.vllm_lock

        def stamped(*call_args, **call_kwargs):
            # Read before generating: under the lock this is exact; with partial rollouts (no lock)
            # the weights may advance during the call, so it is the oldest version that took part.
            version = ray.get(lock.version.remote())
            experiences, consumed, exhausted = generate(*call_args, **call_kwargs)
            for exp in experiences:
                exp.info[VERSION_KEY] = torch.full((len(exp.sequences),), version, dtype=torch.long)
            return experiences, consumed, exhausted

        self.samples_generator._generate_vllm = stamped

    def replay_inputs(self) -> tuple[int, list]:
        """(prompts of one episode, their texts): what the training actor's buffer is sized from."""
        return len(self.prompts_dataloader), self.prompts_dataloader.dataset.prompts


class AsyncReplayExperienceMaker(ReplayExperienceMaker):
    """Stores each fresh row with the version of the weights that generated it, not the step."""

    recorded_versions = True
    generation_versions: np.ndarray | None = None  # (n_samples,) int64, in the step's sample order

    def fresh_rollouts(self, fresh, kl_coef: float, token_rewards=None):
        rollouts = super().fresh_rollouts(fresh, kl_coef, token_rewards)  # group ids from the step: unique per step
        rows = np.concatenate([np.asarray(exp.index, np.int64) for exp in fresh])  # sample of each row
        versions = self.generation_versions[rows]
        set_row_flags(fresh, AGE_KEY, self.step - versions)  # the actors log the rows' ages
        return rollouts.replace(versions=versions)


class _VersionedBroadcast(BasePPOTrainer):
    """Sits between upstream's `TrainingActor` and `BasePPOTrainer` in the MRO, so its
    `broadcast_to_vllm` runs inside the lock `TrainingActor.broadcast_to_vllm` holds: the version
    is published with the weights, before any generation can read it."""

    weights_version = 0  # training steps behind the actor's current weights

    def ppo_train(self, global_steps: int):
        status = super().ppo_train(global_steps)
        self.weights_version = global_steps + 1
        return status

    def broadcast_to_vllm(self) -> None:
        super().broadcast_to_vllm()
        ray.get(self.vllm_lock.set_version.remote(self.weights_version))


class _ReplayTrainingActor(ReplayControllerMixin, undecorated(upstream.TrainingActor), _VersionedBroadcast):
    experience_maker_class = AsyncReplayExperienceMaker

    # Ray copies every method of an actor class into the class it ships (wrapped for tracing), and
    # pickles an inherited upstream method by value: its zero-argument `super()` then names a copy of
    # its class, not the one this class derives from. So each upstream method that calls `super()`
    # is entered through one of ours (`reentered_super_methods` in the tests lists them).
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

    def broadcast_to_vllm(self) -> None:
        super().broadcast_to_vllm()

    def setup_replay(self, n_prompts: int, prompts, generator=None) -> None:
        self._setup_replay(n_prompts, prompts)
        self.skip_generator = generator  # --replay.skip: the actor that holds the rule

    def restore_skip(self, state: dict) -> None:
        # Called from `init_checkpoint_states`, before upstream starts the generator's `fit`: the
        # generator actor is idle and takes the call.
        ray.get(self.skip_generator.load_skip_state.remote(state))
        self.skip_state = state

    def train_step(self, rollout_samples, global_step):
        missing = [i for i, s in enumerate(rollout_samples) if VERSION_KEY not in s.info]
        if missing:
            raise RuntimeError(f"replay: {len(missing)} samples of step {global_step + 1} carry no policy version "
                               "(they were not generated by the replay generator actor)")
        versions = np.concatenate([s.info.pop(VERSION_KEY).numpy() for s in rollout_samples]).astype(np.int64)
        self.experience_maker.generation_versions = versions
        status, next_step = super().train_step(rollout_samples, global_step)
        if self.replay_config.enabled:
            ages = global_step - versions  # global_step: the version being trained
            status["replay/fresh_age_mean"] = float(ages.mean())
            status["replay/fresh_age_max"] = float(ages.max())
        return status, next_step

    def init_checkpoint_states(self):
        states = super().init_checkpoint_states()
        self.weights_version = states.get("global_step", 0)  # what the resume's first broadcast loads
        return states


ReplayTrainingActor = ray.remote(_ReplayTrainingActor)
ReplayGenerateSamplesActor = ray.remote(_ReplayGenerateSamplesActor)


class _ReplayPPOTrainerAsync(_ResumePPOTrainerAsync):
    # What upstream's __init__ creates by these module-level names, in this process (the rehearsal
    # runs them in threads instead: `openrlhf_replay/rehearsal/async_run.py`).
    actor_classes = {"VLLMLock": VersionedVLLMLock, "GenerateSamplesActor": ReplayGenerateSamplesActor,
                     "TrainingActor": ReplayTrainingActor}

    def __init__(self, pretrain, strategy, *args, **kwargs):
        super().__init__(pretrain, strategy, *args, **kwargs)  # builds the actors above
        inputs = ray.get(self.generator_actor.replay_inputs.remote())
        ray.get(self.trainer_actor.setup_replay.remote(*inputs, generator=self.generator_actor))


ReplayPPOTrainerAsync = ray.remote(_ReplayPPOTrainerAsync)
