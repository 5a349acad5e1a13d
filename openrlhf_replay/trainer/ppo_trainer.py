"""The controller with a replay buffer: upstream's `PPOTrainer`, plus the store, its metrics and its
checkpoints.

The buffer lives here, in the controller process, next to the experience maker that feeds it.
Seams used (OpenRLHF 0.11.2): `BasePPOTrainer.__init__` builds `self.experience_maker` (replaced
by `ReplayExperienceMaker`), `train_step` (wrapped: sets the step, adds metrics),
`_compute_rollout_stats` (fresh rows only), `get_max_steps` (counts replay's optimizer steps),
`save_logs_and_checkpoints` and `init_checkpoint_states` (replay state beside each checkpoint).
"""
from __future__ import annotations

import os

import ray
import torch
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.utils.logging_utils import init_logger

from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from openrlhf_replay.utils import state_digest, undecorated
from replay import ReplayBuffer, ReplayCheckpointError, ReplayConfig

logger = init_logger(__name__)  # upstream's handler: a bare logger prints nothing inside a Ray actor

REPLAY_STATE_KEY = "replay_state"  # client_states key: the replay file saved with a checkpoint


def replay_per_step(config: ReplayConfig, args) -> int:
    """Replayed rollouts per step once the buffer is full enough: round(ratio * fresh) rounded to
    whole training batches, so every data-parallel rank runs the same number of optimizer steps."""
    fresh = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    unit = args.train.batch_size
    return int(round(config.ratio * fresh / unit)) * unit


def replay_state_dir(args) -> str:
    return os.path.join(args.ckpt.path, "_replay")


class _ReplayPPOTrainer(undecorated(PPOTrainer)):
    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, **generate_kwargs):
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)
        self.replay_config = ReplayConfig.from_namespace(self.args)
        self.replay = ReplayBuffer(self.replay_config)
        self.experience_maker = ReplayExperienceMaker(
            self.actor_model_group, self.critic_model_group, self.reward_model_group, self.reference_model_group,
            self.kl_ctl, self.strategy, self.tokenizer, replay_buffer=self.replay,
        )

    # ---------------------------------------------------------------- per step

    def train_step(self, rollout_samples, global_step):
        self.experience_maker.step = global_step
        status, next_step = super().train_step(rollout_samples, global_step)
        if self.replay_config.enabled:
            status.update(_split_loss_stats(status))
            status.update(self.replay.metrics())
            status["replay/overhead_s"] = self.experience_maker.replay_seconds
        return status, next_step

    def _compute_rollout_stats(self, experiences):
        """Upstream's rollout statistics (reward, length, ...) describe generation: fresh rows only."""
        if not self.replay_config.enabled:
            return super()._compute_rollout_stats(experiences)
        fresh = [e for e in experiences if not bool(e.info[REPLAYED_KEY].any())]
        return super()._compute_rollout_stats(fresh)

    def get_max_steps(self):
        """Upstream sizes the LR schedule from fresh rollouts; replay adds whole training batches."""
        max_steps = super().get_max_steps()
        if not self.replay_config.enabled:
            return max_steps
        args = self.args
        fresh_batches = args.rollout.batch_size * args.rollout.n_samples_per_prompt // args.train.batch_size
        steps = max_steps // max(fresh_batches * args.train.max_epochs, 1)  # rollout steps in the run
        replay_batches = replay_per_step(self.replay_config, args) // args.train.batch_size
        extra = max(steps - self.replay_config.warmup, 0) * replay_batches * args.train.max_epochs
        logger.info(f"replay: LR schedule over {max_steps} + {extra} optimizer steps (fresh + replayed)")
        return max_steps + extra

    # ---------------------------------------------------------------- checkpoints

    def save_logs_and_checkpoints(self, global_step, logs_dict=None, client_states=None):
        client_states = client_states if client_states is not None else {}
        if self.replay_config.enabled and global_step % self.args.ckpt.save_steps == 0:
            # Written before the model checkpoint that names it: a crash in between leaves the
            # previous checkpoint (and the replay file it names) as the one to resume from.
            client_states[REPLAY_STATE_KEY] = save_replay_state(self.replay, self.args, global_step)
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)

    def init_checkpoint_states(self):
        states = super().init_checkpoint_states()
        if self.replay_config.enabled and states.get("global_step", 0) > 0:
            self.replay = restore_replay_state(states, self.args, self.replay_config)
            self.experience_maker.replay = self.replay
        return states


def save_replay_state(replay: ReplayBuffer, args, global_step: int) -> str:
    """Save the buffer as `<ckpt.path>/_replay/global_step<N>.npz` (atomically) and keep as many
    replay files as upstream keeps model checkpoints (`--ckpt.max_num`). Returns the file name."""
    folder = replay_state_dir(args)
    name = f"global_step{global_step}.npz"
    replay.save(os.path.join(folder, name))
    logger.info(f"replay: saved {len(replay)} rollouts to {name} (state {state_digest(replay.state_dict())})")
    files = sorted((f for f in os.listdir(folder) if f.startswith("global_step") and f.endswith(".npz")),
                   key=lambda f: int(f[len("global_step"):-len(".npz")]))
    for old in files[: max(len(files) - args.ckpt.max_num, 0)]:
        if old != name:
            os.remove(os.path.join(folder, old))
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
        replay = ReplayBuffer.load(os.path.join(replay_state_dir(args), name), config)
    except ReplayCheckpointError as e:
        if not config.allow_empty_resume:
            raise ReplayCheckpointError(f"cannot resume the replay buffer: {e}. To resume with an empty buffer "
                                        "instead, pass --replay.allow_empty_resume") from e
        logger.warning(f"replay: resuming with an empty buffer ({e})")
        return ReplayBuffer(config)
    logger.info(f"replay: restored {len(replay)} rollouts from {name} (state {state_digest(replay.state_dict())})")
    return replay


def _split_loss_stats(status: dict) -> dict:
    """Clip fraction and ratio statistics of fresh vs replayed rows.

    The actors log per-row values multiplied by the row's replay flag (`*_replay_x`) or its
    complement (`*_fresh_x`); upstream averages them over all rows, so dividing by the replayed
    (fresh) fraction gives the mean over replayed (fresh) rows.
    """
    frac = status.get(REPLAYED_KEY)
    if frac is None:
        return {}
    out = {}
    for key in [k for k in status if k.endswith("_x")]:
        value = status.pop(key)
        share = frac if key.endswith("_replay_x") else 1.0 - frac
        if share > 0:
            out[key[: -len("_x")]] = value / share
    return out


ReplayPPOTrainer = ray.remote(_ReplayPPOTrainer)
