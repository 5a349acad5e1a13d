"""The experience maker that feeds the replay store and returns fresh + replayed experiences.

Upstream's `make_experience_batch` turns one step's rollouts into Experience micro-batches with
advantages. This subclass then (1) converts them into the replay core's records and lets the
buffer evict, draw and store (the draw sees only earlier steps), (2) turns the drawn rollouts
into Experience micro-batches shaped like the fresh ones (RLEP: plus rows without loss that complete
its exact count to whole training batches), (3) with `--replay.off_policy refresh` or `recompute`
recomputes their old log-probs under the current weights, with a critic (`gae`) recomputes their
advantages and returns against the current critic (`critic.py`), and (4) orders the list so that every
data-parallel rank gets the same fresh/replay split, because upstream hands each rank one
contiguous chunk (`RayActorGroup.async_run_method_batch`).
"""
from __future__ import annotations

import logging
import time

import numpy as np
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from openrlhf_replay.trainer.ppo_utils.critic import GaeCall, Whitening, padded_token_rewards, recompute_gae
from openrlhf_replay.trainer.ppo_utils.experience import (
    INERT_KEY,
    IS_WEIGHT_KEY,
    experiences_to_rollouts,
    mark_fresh,
    rollouts_to_experiences,
    set_advantages,
    set_row_flags,
)
from openrlhf_replay.trainer.ppo_utils.debug_dump import dump_step
from openrlhf_replay.trainer.ppo_utils.reward_guard import guard_rewards
from openrlhf_replay.utils import data_parallel_ranks
from replay import ReplayBuffer, RolloutBatch

logger = logging.getLogger(__name__)


class ReplayExperienceMaker(RemoteExperienceMaker):
    """`RemoteExperienceMaker` whose batches are the step's fresh experiences plus replayed ones.

    `step` must be set to the global step before each `make_experience_batch` call (the trainer
    does this); it is the policy version of the fresh rollouts.
    """

    recorded_versions = False  # the fresh rows' version is the step (async: the generating policy's)

    def __init__(self, *args, replay_buffer: ReplayBuffer, **kwargs):
        super().__init__(*args, **kwargs)
        self.replay = replay_buffer
        self.step = 0
        self.replay_seconds = 0.0  # wall time of the replay work in the last step (conversion, store, draw)
        self.composition = None  # the last step's fresh + replayed rollouts (`replay.Composition`)
        self.reward_faults = None  # the last step's samples scored 0 for a failed reward (`RewardFaults`)
        self._gae_calls: list[GaeCall] | None = None  # upstream's GAE calls on the fresh rows, while recorded

    def make_experience_batch(self, rollout_samples) -> list[Experience]:
        """One replay step as the trainer runs it, top-down (README, "One training step")."""
        # 1. The fresh batch: upstream's micro-batches with their group advantages.
        if self.args.reward.remote_url:  # with a reward model instead, rewards come later
            self.reward_faults = guard_rewards(rollout_samples)
        critic = self.advantage_estimator == "gae" and self.replay.config.enabled
        self._gae_calls = [] if critic else None  # the fresh rows' per-token rewards (critic.py)
        fresh = super().make_experience_batch(rollout_samples)
        gae_calls, self._gae_calls = self._gae_calls, None
        if not self.replay.config.enabled:
            return fresh
        t0 = time.perf_counter()
        args = self.args
        mark_fresh(fresh)
        # 2. The buffer's step: evict by age, draw from earlier steps, store the fresh rollouts.
        kl_coef = self.kl_ctl.value
        rollouts = self.fresh_rollouts(fresh, kl_coef, [c.rewards for c in gae_calls] if critic else None)
        comp = self.replay.step(rollouts, self.step, multiple_of=args.train.batch_size,
                                divide_by_std=args.algo.advantage.estimator != "dr_grpo",
                                recorded_versions=self.recorded_versions)
        if self.replay.config.mode == "success":  # RLEP: enlarged groups got new advantages
            set_advantages(fresh, comp.fresh.advantages)
        # 3. The replayed rows into the loss: micro-batches shaped like the fresh ones, per rank,
        # with their importance weights (and RLEP's inert rows), pi_old as --replay.off_policy says.
        per_rank, token_rewards = [], []
        for rows, weights, inert in replayed_for_ranks(comp, data_parallel_ranks(args)):
            part = rollouts_to_experiences(rows, fresh[0], args.rollout.micro_batch_size,
                                           self.tokenizer.pad_token_id, step=self.step, is_weights=weights,
                                           kl_coef=kl_coef)
            set_row_flags(part, INERT_KEY, inert)
            per_rank.append(part)
            if critic:
                token_rewards += padded_token_rewards(rows, args.rollout.micro_batch_size, self.tokenizer.pad_token_id)
        self.replay_seconds = time.perf_counter() - t0
        self.composition = comp
        replayed = [e for part in per_rank for e in part]
        if self.replay.config.effective_off_policy in ("refresh", "recompute") and len(comp.replayed):
            self._refresh_old_log_probs(replayed)
        if critic and len(comp.replayed):  # against the current critic, whitened as the fresh rows
            self._critic_advantages(replayed, token_rewards,
                                    Whitening.of(gae_calls, args.algo.advantage.no_std_norm))
        # 4. Every rank's chunk holds the same fresh and replayed share. What is logged comes after
        # the update: `ppo_trainer.py:train_step` adds `self.replay.metrics()` and per-kind statistics.
        batch = arrange_for_ranks(fresh, per_rank)
        dump_step(self.step, batch, comp)
        return batch

    def fresh_rollouts(self, fresh: list[Experience], kl_coef: float, token_rewards=None) -> RolloutBatch:
        """The step's fresh rows as rollouts of policy version `self.step` (the synchronous
        trainer generates them with the weights of that step)."""
        return experiences_to_rollouts(fresh, self.step, self.args.rollout.n_samples_per_prompt,
                                       token_columns=self.replay.token_columns, kl_coef=kl_coef,
                                       token_rewards=token_rewards)

    def _refresh_old_log_probs(self, replayed: list[Experience]) -> None:
        """pi_old of replayed rows := the current policy's log-probs (the actor's forward, as upstream
        computes them for fresh rows), before the update.

        `refresh`: `rollout_log_probs` keeps the behaviour policy's, so upstream's IS correction
        (`--algo.advantage.is_correction_*`) weighs and truncates pi_old / pi_behaviour.
        `recompute` (RLEP): no importance weight; where upstream's IS correction is on for the fresh
        rows, `rollout_log_probs` takes the recomputed values too, so its weight is exactly 1 here."""
        refs = self._dispatch_forward(
            self.actor_model_group,
            self.args.train.colocate_all or self.args.train.colocate_actor_ref,
            sequences=[e.sequences for e in replayed],
            action_mask=[e.action_mask for e in replayed],
            attention_mask=[e.attention_mask for e in replayed],
        )
        duplicate = self.args.ds.ring_attn_size * self.args.ds.tensor_parallel_size
        no_weight = self.replay.config.effective_off_policy == "recompute"
        for exp, log_probs in zip(replayed, self._flatten_results(refs, duplicate)):
            exp.action_log_probs = log_probs.to(exp.action_log_probs.dtype)
            if no_weight and exp.rollout_log_probs is not None:
                exp.rollout_log_probs = exp.action_log_probs.clone()

    def _critic_advantages(self, replayed: list[Experience], token_rewards: list, whitening: Whitening) -> None:
        """Replayed rows' values := the current critic's (its forward, as upstream computes them for
        fresh rows); their advantages and returns := upstream's GAE on their stored per-token
        rewards and those values (`critic.py`)."""
        args = self.args
        refs = self._dispatch_forward(
            self.critic_model_group,
            args.train.colocate_all or args.train.colocate_critic_reward,
            sequences=[e.sequences for e in replayed],
            action_mask=[e.action_mask for e in replayed],
            attention_mask=[e.attention_mask for e in replayed],
        )
        values = self._flatten_results(refs, args.ds.ring_attn_size * args.ds.tensor_parallel_size)
        gamma, lambd = args.algo.advantage.gamma, args.algo.advantage.lambd

        def gae(value, reward, mask):
            return RemoteExperienceMaker.get_advantages_and_returns(self, value, reward, mask, gamma, lambd)

        recompute_gae(replayed, values, token_rewards, gae, whitening, IS_WEIGHT_KEY)

    def get_advantages_and_returns(self, values, rewards, action_mask, gamma, lambd):
        """Upstream's GAE; while the fresh batch is made, each call's per-token rewards and raw
        advantages are kept (`critic.py:GaeCall`): the store's rewards, the whitening's statistics."""
        advantages, returns = super().get_advantages_and_returns(values, rewards, action_mask, gamma, lambd)
        if self._gae_calls is not None:
            self._gae_calls.append(GaeCall(rewards.detach().cpu(), advantages.detach().cpu(), action_mask.cpu()))
        return advantages, returns


def replayed_for_ranks(comp, ranks: int) -> list[tuple[RolloutBatch, np.ndarray, np.ndarray]]:
    """Each rank's replayed rows, their importance weights and inert flags (bool): the step's
    replayed rollouts, plus the inert rows that complete RLEP's exact count to whole training
    batches (`comp.inert`), shared out every ranks-th row; without inert rows, contiguous slices."""
    replayed, weights, inert = comp.replayed, comp.weights, np.zeros(len(comp.replayed), np.bool_)
    if comp.inert:
        replayed = RolloutBatch.concat([replayed, inert_rollouts(replayed, comp.inert)])
        weights = np.r_[weights, np.zeros(comp.inert, np.float32)]
        inert = np.r_[inert, np.ones(comp.inert, np.bool_)]
    return [(replayed.select(idx), weights[idx], inert[idx])
            for idx in _rank_rows(len(replayed), ranks, strided=bool(comp.inert))]


def _rank_rows(n: int, ranks: int, strided: bool = False):
    """Each rank's row indices: `ranks` equal parts of n (the caller made n a multiple of `ranks`),
    contiguous, or every ranks-th row from the rank's own (so rows without loss at the end of the
    list are shared out evenly)."""
    if n % ranks:
        raise ValueError(f"{n} replayed rollouts cannot be split evenly over {ranks} ranks")
    size = n // ranks
    for r in range(ranks):
        yield np.arange(r, n, ranks) if strided else np.arange(r * size, (r + 1) * size)


def inert_rollouts(like: RolloutBatch, n: int) -> RolloutBatch:
    """n rows that train nothing: the shortest prompt of `like` with its response's first token,
    action mask False (no loss, no token in the token-mean's count), advantage and reward 0.
    They fill the last training batch of a step so that every rank runs whole optimizer steps."""
    i = int(np.argmin(like.prompt_lengths + like.response_lengths))
    rows = RolloutBatch.from_lists(
        [like.prompt(i)] * n, [like.response(i)[:1]] * n, [[False]] * n, [[0.0]] * n, [0.0] * n, [0.0] * n,
        [int(like.prompt_uids[i])] * n, [int(like.group_ids[i])] * n, int(like.versions[i]))
    return rows.replace(**{c: np.zeros(n, np.float32) for c in like.token_columns})  # KL's columns, 0


def arrange_for_ranks(fresh: list[Experience], replayed_per_rank: list[list[Experience]]) -> list[Experience]:
    """Rank r's contiguous chunk = its share of the fresh micro-batches + its replayed micro-batches.

    Upstream cuts the list into `ranks` chunks of ceil(len / ranks): with the same number of items
    per rank, the cuts fall exactly on these boundaries.
    """
    ranks = len(replayed_per_rank)
    if len(fresh) % ranks:
        raise ValueError(f"{len(fresh)} fresh micro-batches cannot be split evenly over {ranks} ranks")
    share = len(fresh) // ranks
    out = []
    for r, replayed in enumerate(replayed_per_rank):
        out.extend(fresh[r * share : (r + 1) * share])
        out.extend(replayed)
    return out
