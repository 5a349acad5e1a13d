"""The controller with a replay buffer: upstream's `PPOTrainer`, plus the store, its metrics and its
checkpoints.

The buffer lives here, in the controller process, next to the experience maker that feeds it.
Seams used (OpenRLHF 0.11.2): `BasePPOTrainer.__init__` builds `self.experience_maker` (replaced
by `ReplayExperienceMaker`), `train_step` (wrapped: sets the step, adds metrics), `ppo_train`
(wrapped: per-kind means, before upstream's KL controller reads `kl`),
`_compute_rollout_stats` (fresh rows only), `save_logs_and_checkpoints` and
`init_checkpoint_states` (replay state beside each checkpoint; the start episode, `resume.py`),
and the `tensorboard_logger` it builds (switched to `HistogramTensorboardLogger`: the step's
histograms). `get_max_steps` is upstream's: the LR schedule is sized from the fresh batches in
every condition, and the policy actor paces it by rollout steps
(`openrlhf_replay/trainer/lr_schedule.py`), so every condition warms up over the same rollout
steps and ends its schedule at its last optimizer step, whatever replay adds.
"""
from __future__ import annotations

import os

import ray
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.utils.logging_utils import TensorboardLogger, init_logger

from openrlhf_replay.logging_utils import HistogramTensorboardLogger
from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY, split_by_row_kind, stored_token_columns
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from openrlhf_replay.trainer.ppo_utils.prompt_skip import (SKIP_CKPT_KEY, install_skip, load_skip_state, pop_skip_info,
                                                            save_skip_state)
from openrlhf_replay.trainer.ppo_utils.samples_generator import (GenerationCounts, ReplaySamplesGenerator,
                                                                  take_generation_counts)
from openrlhf_replay.trainer.ppo_utils.success_pool import check_success_pool, max_prompt_len
from openrlhf_replay.trainer.resume import EpisodeResume
from openrlhf_replay.utils import undecorated
from replay import ReplayBuffer, ReplayCheckpointError, ReplayConfig
from replay.checkpoint import prune_states, state_digest
from replay.skip import SkipRule

logger = init_logger(__name__)  # upstream's handler: a bare logger prints nothing inside a Ray actor

REPLAY_STATE_KEY = "replay_state"  # client_states key: the replay file saved with a checkpoint


def rollout_steps(args, n_prompts: int) -> int:
    """Rollout steps in the whole run: a step per rollout batch of prompts, every episode."""
    return -(-n_prompts // args.rollout.batch_size) * args.train.num_episodes


def replay_state_dir(args) -> str:
    return os.path.join(args.ckpt.path, "_replay")


class ReplayControllerMixin(EpisodeResume):
    """What replay adds to a controller that runs upstream's `train_step`: the buffer, its
    experience maker, its metrics and its checkpoints (and, as with replay off, a resume that does
    not walk a finished episode again: `resume.py`). Mixed into the synchronous `PPOTrainer`
    (below) and the async `TrainingActor` (`ppo_trainer_async.py`), before the upstream class."""

    experience_maker_class = ReplayExperienceMaker
    skip_state = None  # --replay.skip: the rule's state as of the latest batch trained (what a checkpoint saves)

    def _setup_replay(self, n_prompts: int, prompts) -> None:
        """Build the buffer and the experience maker that feeds it (after upstream's `__init__`).
        `n_prompts`: the prompts of one episode; `prompts`: their texts (RLEP's pool check)."""
        run_steps = rollout_steps(self.args, n_prompts)
        self.replay_config = ReplayConfig.from_namespace(self.args).for_run(
            run_steps, group_size=self.args.rollout.n_samples_per_prompt)  # what derives from the run
        self.replay = ReplayBuffer(self.replay_config, stored_token_columns(self.args))
        if self.replay.pool is not None:
            check_success_pool(self.replay.pool, self.tokenizer, prompts,
                               max_prompt_len(self.args.data.max_len, self.args.rollout.max_new_tokens))
        self.experience_maker = self.experience_maker_class(
            self.actor_model_group, self.critic_model_group, self.reward_model_group, self.reference_model_group,
            self.kl_ctl, self.strategy, self.tokenizer, replay_buffer=self.replay,
        )
        if isinstance(self.tensorboard_logger, TensorboardLogger):  # upstream's, when --logger.tensorboard_dir is set
            self.tensorboard_logger.__class__ = HistogramTensorboardLogger  # draws `step_histograms` too

    # ---------------------------------------------------------------- per step

    def train_step(self, rollout_samples, global_step):
        self.experience_maker.step = global_step
        calls = take_generation_counts(rollout_samples)  # counted where they ran, sync or async
        refill = bool(calls) and self.replay_config.refill
        # Refill: no prompt replaced the groups its own call filtered, so replay stands in for their
        # rows, and this step paces the LR for the rollouts of earlier calls that kept no group.
        self.experience_maker.refill_rows = calls[-1].filtered if refill else 0
        self.experience_maker.skipped_rows = skipped_rollouts(calls) if refill else 0
        skip_metrics, skip_state = pop_skip_info(rollout_samples)  # before upstream reads the samples' info
        self.skip_state = skip_state if skip_state is not None else self.skip_state
        status, next_step = super().train_step(rollout_samples, global_step)
        status.update(skip_metrics)
        faults = self.experience_maker.reward_faults
        if faults is not None:
            status.update(faults.metrics())
            if faults.total:
                logger.warning(f"reward: step {next_step}: the reward function raised for {faults.failed} and "
                               f"returned NaN / inf for {faults.non_finite} of {len(rollout_samples)} samples; "
                               f"scored 0 (the first ends {faults.example!r}); the run goes on")
        if self.replay_config.enabled:
            status.update(self.replay.metrics())
            status["replay/overhead_s"] = self.experience_maker.replay_seconds
            status.update(rollout_accounting(len(rollout_samples), sum(calls, GenerationCounts()),
                                             self.experience_maker))
        if isinstance(self.tensorboard_logger, HistogramTensorboardLogger):
            self.tensorboard_logger.stage(self.step_histograms())
        return status, next_step

    def ppo_train(self, global_steps):
        status = super().ppo_train(global_steps)
        if self.replay_config.enabled:
            # The actors log per-row statistics by kind (`kl@fresh`, ...); their means are made here,
            # before upstream's `train_step` reads `status["kl"]` for its KL controller: with KL in
            # the reward, that is then the fresh rows' KL, as upstream measures it without replay.
            status.update(split_by_row_kind(status))
        return status

    def step_histograms(self) -> dict:
        """The step's arrays that TensorBoard draws as histograms, beside the status's scalars (kept out
        of the status, which upstream also prints and sends to wandb): `replay/...` keys to 1-D arrays,
        one value per item counted. Empty with replay off."""
        return self.replay.histograms() if self.replay_config.enabled else {}

    def _compute_rollout_stats(self, experiences):
        """Upstream's rollout statistics (reward, length, ...) describe generation: fresh rows only."""
        if not self.replay_config.enabled:
            return super()._compute_rollout_stats(experiences)
        fresh = [e for e in experiences if not bool(e.info[REPLAYED_KEY].any())]
        return super()._compute_rollout_stats(fresh)

    # ---------------------------------------------------------------- checkpoints

    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
        client_states = client_states if client_states is not None else {}
        if self.replay_config.enabled and global_step % self.args.ckpt.save_steps == 0:
            # Written before the model checkpoint that names it: a crash in between leaves the
            # previous checkpoint (and the replay file it names) as the one to resume from.
            client_states[REPLAY_STATE_KEY] = save_replay_state(self.replay, self.args, global_step)
        if self.replay_config.skip and self.skip_state is not None and global_step % self.args.ckpt.save_steps == 0:
            client_states[SKIP_CKPT_KEY] = save_skip_state(self.skip_state, replay_state_dir(self.args), global_step,
                                                           self.args.ckpt.max_num)
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)

    def init_checkpoint_states(self):
        states = super().init_checkpoint_states()
        if self.replay_config.enabled and states.get("global_step", 0) > 0:
            self.replay = restore_replay_state(states, self.args, self.replay_config)
            self.experience_maker.replay = self.replay
        if self.replay_config.skip and states.get("global_step", 0) > 0:
            state = load_skip_state(states, replay_state_dir(self.args), self.replay_config.allow_empty_resume)
            if state is not None:
                self.restore_skip(state)
        return states

    def restore_skip(self, state: dict) -> None:
        """Hand the saved skip state to the rule (here the controller's own samples generator)."""
        self.samples_generator.skip_rule.load_state_dict(state)
        self.skip_state = state


def skipped_rollouts(calls: list[GenerationCounts]) -> int:
    """Rollouts of the refill calls before this step's own whose groups were all dropped: upstream's
    `fit` loop gives an empty generation no step, so the step after it paces the LR for them
    (`experience.py:set_pace`), and the schedule still ends at the run's last optimizer step."""
    return sum(c.generated for c in calls[:-1])


def rollout_accounting(fresh: int, counts: GenerationCounts, maker) -> dict[str, float]:
    """The step's rollouts, honestly counted: what the generation calls behind its batch generated
    and filtered (`counts`), and with refill the rows replay took in place of the filtered ones
    (`refilled_rows`, and their share of the rows trained) and the inert rows of the step."""
    comp = maker.composition
    refilled = comp.refilled if comp is not None else 0
    trained = fresh + (len(comp.replayed) if comp is not None else 0) + maker.inert_rows
    return counts.metrics() | {"replay/refilled_rows": float(refilled),
                               "replay/refilled_share": refilled / max(trained, 1),
                               "replay/inert_rows": float(maker.inert_rows)}


class _ReplayPPOTrainer(ReplayControllerMixin, undecorated(PPOTrainer)):
    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, **generate_kwargs):
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)
        # The prompt loader's batch size is 1 prompt.
        self._setup_replay(len(self.prompts_dataloader), self.prompts_dataloader.dataset.prompts)
        # Counts what it generates, for train_step to log; with refill, replaces no dropped group.
        self.samples_generator.__class__ = ReplaySamplesGenerator
        if self.replay_config.skip:
            install_skip(self.samples_generator, SkipRule.from_config(self.replay_config, len(self.prompts_dataloader),
                                                                      self.args.rollout.batch_size))


def save_replay_state(replay: ReplayBuffer, args, global_step: int) -> str:
    """Save the buffer as `<ckpt.path>/_replay/global_step<N>.npz` (atomically) and keep as many
    replay files as upstream keeps model checkpoints (`--ckpt.max_num`). Returns the file name."""
    folder = replay_state_dir(args)
    name = f"global_step{global_step}.npz"
    replay.save(os.path.join(folder, name))
    logger.info(f"replay: saved {len(replay)} rollouts to {name} (state {state_digest(replay.state_dict())})")
    prune_states(folder, "global_step", args.ckpt.max_num)
    return name


def restore_replay_state(states: dict, args, config: ReplayConfig) -> ReplayBuffer:
    """The buffer saved with the checkpoint whose client states are `states`.

    A missing, corrupt or incompatible file is an error naming it, unless the user asked for an
    empty buffer (`--replay.allow_empty_resume`).
    """
    name = states.get(REPLAY_STATE_KEY)
    try:
        if name is None:
            raise ReplayCheckpointError(f"the checkpoint at global step {states.get('global_step')} names no replay "
                                        f"state in {replay_state_dir(args)} (was it saved with replay off?)")
        replay = ReplayBuffer.load(os.path.join(replay_state_dir(args), name), config, stored_token_columns(args))
    except ReplayCheckpointError as e:
        if not config.allow_empty_resume:
            raise ReplayCheckpointError(f"cannot resume the replay buffer: {e}. To resume with an empty buffer "
                                        "instead, pass --replay.allow_empty_resume") from e
        logger.warning(f"replay: resuming with an empty buffer ({e})")
        return ReplayBuffer(config, stored_token_columns(args))
    logger.info(f"replay: restored {len(replay)} rollouts from {name} (state {state_digest(replay.state_dict())})")
    return replay


ReplayPPOTrainer = ray.remote(_ReplayPPOTrainer)
