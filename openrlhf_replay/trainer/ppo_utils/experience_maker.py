"""The experience maker that feeds the replay store and returns fresh + replayed experiences.

Upstream's `make_experience_batch` turns one step's rollouts into Experience micro-batches with
advantages. This subclass then (1) converts them into the replay core's records and lets the
buffer evict, draw and store (the draw sees only earlier steps), (2) turns the drawn rollouts
into Experience micro-batches shaped like the fresh ones (RLEP: plus rows without loss that complete
its exact count to whole training batches), (3) where the off-policy rule says so (`refresh`,
`recompute`, `m2po`) recomputes their old log-probs under the current weights, with a critic (`gae`)
recomputes their advantages and returns against the current critic (`critic.py`), and (4) orders the
list so that every data-parallel rank gets the same fresh/replay split, because upstream hands each rank one
contiguous chunk (`RayActorGroup.async_run_method_batch`).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from openrlhf_replay.trainer.ppo_utils.critic import GaeCall, Whitening, padded_token_rewards, recompute_gae
from openrlhf_replay.trainer.ppo_utils.experience import (
    INERT_KEY,
    IS_WEIGHT_KEY,
    REFILL_KEY,
    experiences_to_rollouts,
    mark_fresh,
    rollouts_to_experiences,
    select_rows,
    set_advantages,
    set_pace,
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
        self.refill_rows = 0  # rows dynamic filtering dropped this step, for replay to take (--replay.refill)
        self.skipped_rows = 0  # rollouts of refill calls before this step that kept no group (paced, not trained)
        self.inert_rows = 0  # rows without loss the last step added (all kinds)

    def make_experience_batch(self, rollout_samples) -> list[Experience]:
        """One replay step as the trainer runs it, top-down (docs/CODE.md, "One training step")."""
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
                                divide_by_std=args.algo.advantage.estimator != "dr_grpo", refill=self.refill_rows,
                                recorded_versions=self.recorded_versions)
        if comp.rewrite_fresh:  # the composer gave the fresh rows advantages of its own (RLEP's enlarged groups)
            set_advantages(fresh, comp.fresh.advantages)
        # 3. The replayed rows into the loss: micro-batches shaped like the fresh ones, per rank,
        # with their importance weights, and the inert rows that complete the step to whole training
        # batches (RLEP's count, a short fresh batch, refill's shortfall); pi_old as --replay.off_policy says.
        shares = share_for_ranks([len(e.sequences) for e in fresh], comp, data_parallel_ranks(args),
                                 args.train.batch_size, args.rollout.micro_batch_size, like=rollouts,
                                 refill=self.replay.config.refill, rebalanced=args.train.dynamic_batch_enable)
        per_rank, token_rewards = [], []
        for share in shares:
            part = []
            for lo, hi in share.parts:
                rows = share.rows.select(np.arange(lo, hi))
                part += rollouts_to_experiences(rows, fresh[0], hi - lo, self.tokenizer.pad_token_id, step=self.step,
                                                is_weights=share.weights[lo:hi], kl_coef=kl_coef)
                if critic:
                    token_rewards += padded_token_rewards(rows, hi - lo, self.tokenizer.pad_token_id)
            set_row_flags(part, INERT_KEY, share.inert)
            set_row_flags(part, REFILL_KEY, share.refill)
            per_rank.append(part)
        self.replay_seconds = time.perf_counter() - t0
        self.composition = comp
        self.inert_rows = sum(int(share.inert.sum()) for share in shares)
        replayed = [e for part in per_rank for e in part]
        if self.replay.config.off_policy_rule.recompute_old and len(comp.replayed):
            self._refresh_old_log_probs(replayed)
        if critic and replayed:  # against the current critic, whitened as the fresh rows (inert rows too:
            # the critic's loss reads every row's values and returns)
            self._critic_advantages(replayed, token_rewards,
                                    Whitening.of(gae_calls, args.algo.advantage.no_std_norm))
        # 4. Every rank's chunk holds the same rows and the same number of micro-batches. What is
        # logged comes after the update: `ppo_trainer.py:train_step` adds `self.replay.metrics()`,
        # the step's rollout accounting and per-kind statistics.
        batch = arrange_for_ranks(fresh, per_rank, [share.fresh for share in shares],
                                  equal=not args.train.dynamic_batch_enable,
                                  fresh_parts=[share.fresh_parts for share in shares])
        set_pace(batch, self.skipped_rows)  # what each row counts for in the actors' LR schedules
        dump_step(self.step, batch, comp)
        return batch

    def fresh_rollouts(self, fresh: list[Experience], kl_coef: float, token_rewards=None) -> RolloutBatch:
        """The step's fresh rows as rollouts of policy version `self.step` (the synchronous
        trainer generates them with the weights of that step)."""
        return experiences_to_rollouts(fresh, self.step, self.args.rollout.n_samples_per_prompt,
                                       token_columns=self.replay.token_columns, kl_coef=kl_coef,
                                       token_rewards=token_rewards)

    def split_rollout_samples(self, rollout_samples):
        """Upstream's micro-batches of the fresh samples, at `fresh_micro_batch_size` rows (smaller
        than --rollout.micro_batch_size only on a step too short for one a rank). Under dynamic
        batching upstream already makes at least one a rank."""
        micro = self.args.rollout.micro_batch_size
        size = micro if self.args.train.dynamic_batch_enable else \
            fresh_micro_batch_size(len(rollout_samples), micro, data_parallel_ranks(self.args))
        if size == micro:
            return super().split_rollout_samples(rollout_samples)
        rollout = self.args.rollout
        rollout.micro_batch_size = size  # upstream's split, at this size, this once
        try:
            return super().split_rollout_samples(rollout_samples)
        finally:
            rollout.micro_batch_size = micro

    def _refresh_old_log_probs(self, replayed: list[Experience]) -> None:
        """pi_old of replayed rows := the current policy's log-probs (the actor's forward, as upstream
        computes them for fresh rows), before the update.

        `refresh`: `rollout_log_probs` keeps the behaviour policy's, so upstream's IS correction
        (`--algo.advantage.is_correction_*`) weighs and truncates pi_old / pi_behaviour.
        `m2po` as `refresh`; the loss then masks the tokens of largest (log pi_old - log pi_behaviour)^2.
        `recompute` (RLEP): no importance weight; where upstream's IS correction is on for the fresh
        rows, `rollout_log_probs` takes the recomputed values too, so its weight is exactly 1 here.
        Which of these a rule does is its registry entry's (`replay/modes.py`)."""
        refs = self._dispatch_forward(
            self.actor_model_group,
            self.args.train.colocate_all or self.args.train.colocate_actor_ref,
            sequences=[e.sequences for e in replayed],
            action_mask=[e.action_mask for e in replayed],
            attention_mask=[e.attention_mask for e in replayed],
        )
        duplicate = self.args.ds.ring_attn_size * self.args.ds.tensor_parallel_size
        no_weight = not self.replay.config.off_policy_rule.behaviour_weight
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


@dataclass
class RankShare:
    """One data-parallel rank's part of a step: its fresh micro-batches (a slice of the fresh list,
    cut into `fresh_parts` micro-batches) and its replayed rows (RLEP's, refill's and completing
    inert rows among them, flagged), cut into micro-batches (`parts`, row ranges) so that every rank
    gets as many items as the others."""

    fresh: slice
    rows: RolloutBatch
    weights: np.ndarray  # (rows,) float32 importance weights, 0 on inert rows
    inert: np.ndarray  # (rows,) bool: rows without loss
    refill: np.ndarray  # (rows,) bool: rows that stand for filtered ones (--replay.refill; paces the LR as fresh)
    parts: list[tuple[int, int]]
    fresh_parts: int  # >= the slice's micro-batches: more when its replayed rows are too few to make up the count


def share_for_ranks(fresh_sizes: list[int], comp, ranks: int, batch_rows: int, micro: int, *,
                    like: RolloutBatch | None = None, refill: bool = False, rebalanced: bool = False
                    ) -> list[RankShare]:
    """The rule that keeps data-parallel ranks equal (docs/METHOD.md section 2, "Dynamic filtering"):
    the step trains fresh + replayed rows completed by inert rows to whole training batches of
    `batch_rows`, and every rank gets the same number of rows and of micro-batches.

    The fresh micro-batches (`fresh_sizes` rows each) go to the ranks in contiguous runs whose
    lengths differ by at most one; each rank's replayed rows fill it up to the step's rows / ranks.
    The micro-batch count a rank is the largest any rank needs with replayed micro-batches of at
    most `micro` rows. A full fresh batch (the launcher makes it split evenly) gives every rank the
    same fresh share and `micro`-row replayed micro-batches; a short one (the last step of an epoch
    under dynamic filtering, or refill's filtered groups) gives the ranks with fewer fresh rows more
    replayed or inert ones, and a rank whose replayed rows are too few to make up the count has its
    fresh micro-batches cut finer (`fresh_parts`, `arrange_for_ranks`). Inert rows are
    `inert_rollouts` of the replayed rows, else of `like` (the fresh rollouts). `refill`: the
    composition's inert rows are refill's shortfall. `rebalanced` (dynamic batching, whose
    `balance_experiences` deals every row over the ranks again by length): only the step's total
    must split evenly; the replayed rows are shared out evenly."""
    n_fresh = sum(fresh_sizes)
    base, more = divmod(len(fresh_sizes), ranks)
    bounds = np.cumsum([0] + [base + (r < more) for r in range(ranks)])
    fresh_rows = [sum(fresh_sizes[bounds[r]:bounds[r + 1]]) for r in range(ranks)]
    # A short step can leave one rank more fresh rows than the step's rows per rank (33 fresh
    # micro-batches over 32 ranks): inert training batches are added until every rank's fresh rows fit.
    at_least = 0 if rebalanced else max(fresh_rows) * ranks
    replayed, weights, is_inert, is_refill = _completed(comp, n_fresh, batch_rows, like, refill, at_least)
    total = n_fresh + len(replayed)
    if total % ranks:
        raise ValueError(f"{total} rows (fresh + replayed + inert) cannot be split evenly over {ranks} ranks")
    per_rank = total // ranks
    needs = [per_rank - f for f in fresh_rows]
    if rebalanced:
        needs = [len(replayed) // ranks + (r < len(replayed) % ranks) for r in range(ranks)]
    if min(needs) < 0:
        raise ValueError(f"a rank holds {max(fresh_rows)} fresh rows, more than its {per_rank} of the step's {total}")
    rows_of = _deal(needs, strided=len(replayed) > len(comp.replayed))
    fresh_items = [bounds[r + 1] - bounds[r] for r in range(ranks)]
    items = max(fresh_items[r] + -(-needs[r] // micro) for r in range(ranks))
    shares = []
    for r in range(ranks):
        idx = rows_of[r]
        # Every rank's chunk holds `items` micro-batches: its replayed rows make at most one a row,
        # its fresh rows the rest (always enough: items <= per_rank, its rows).
        parts_n = -(-len(idx) // micro) if rebalanced else min(items - fresh_items[r], len(idx))
        fresh_parts = fresh_items[r] if rebalanced else items - parts_n
        if fresh_parts > fresh_rows[r]:
            raise ValueError(f"rank {r}'s {fresh_rows[r]} fresh and {len(idx)} replayed rows cannot make "
                             f"{items} micro-batches")
        cuts = np.cumsum([0] + [len(idx) // parts_n + (i < len(idx) % parts_n) for i in range(parts_n)])
        shares.append(RankShare(slice(bounds[r], bounds[r + 1]), replayed.select(idx), weights[idx],
                                is_inert[idx], is_refill[idx], list(zip(cuts[:-1].tolist(), cuts[1:].tolist())),
                                fresh_parts))
    return shares


def _completed(comp, n_fresh: int, batch_rows: int, like: RolloutBatch | None, refill: bool, at_least: int = 0):
    """The composition's replayed rows followed by the inert rows that complete the step to whole
    training batches, at least `at_least` rows in all, with their weights (0 on inert rows) and
    inert and refill flags."""
    replayed, weights = comp.replayed, comp.weights
    inert_n = comp.inert + -(n_fresh + len(replayed) + comp.inert) % batch_rows
    inert_n += max(0, -(-(at_least - n_fresh - len(replayed) - inert_n) // batch_rows)) * batch_rows
    is_inert = np.r_[np.zeros(len(replayed), np.bool_), np.ones(inert_n, np.bool_)]
    is_refill = np.zeros(len(is_inert), np.bool_)
    is_refill[len(replayed) - comp.refilled:len(replayed) + (comp.inert if refill else 0)] = True
    if inert_n:
        source = replayed if len(replayed) else like
        if source is None or not len(source):
            raise ValueError(f"{inert_n} inert rows are needed, but there are no rows to shape them from")
        replayed = RolloutBatch.concat([replayed, inert_rollouts(source, inert_n)])
        weights = np.r_[weights, np.zeros(inert_n, np.float32)]
    return replayed, weights, is_inert, is_refill


def _deal(needs: list[int], strided: bool) -> list[np.ndarray]:
    """Row indices for each rank, needs[r] of them: contiguous runs, or (`strided`, so rows without
    loss at the end of the list are shared out) round-robin over the ranks that still need rows."""
    if not strided:
        ends = np.cumsum([0] + needs)
        return [np.arange(ends[r], ends[r + 1]) for r in range(len(needs))]
    out, left, row = [[] for _ in needs], list(needs), 0
    while any(left):
        for r in range(len(needs)):
            if left[r]:
                out[r].append(row)
                left[r] -= 1
                row += 1
    return [np.asarray(o, np.int64) for o in out]


def fresh_micro_batch_size(rows: int, micro: int, ranks: int) -> int:
    """Rows per fresh micro-batch: `micro`, or fewer when dynamic filtering left fewer rows than a
    micro-batch a data-parallel rank (refill's short steps, the last step of an epoch), since
    upstream's forward dispatch refuses fewer items than ranks. Fewer rows than ranks: an error."""
    if rows >= micro * ranks:
        return micro
    if rows < ranks:
        raise ValueError(f"dynamic filtering kept {rows} rollouts this step, fewer than the {ranks} data-parallel "
                         "ranks that each need one; widen --algo.dynamic_filtering_range or use fewer ranks")
    return rows // ranks


def inert_rollouts(like: RolloutBatch, n: int) -> RolloutBatch:
    """n rows that train nothing: the shortest prompt of `like` with its response's first token,
    action mask False (no loss, no token in the token-mean's count), advantage and reward 0.
    They fill the last training batch of a step so that every rank runs whole optimizer steps."""
    i = int(np.argmin(like.prompt_lengths + like.response_lengths))
    rows = RolloutBatch.from_lists(
        [like.prompt(i)] * n, [like.response(i)[:1]] * n, [[False]] * n, [[0.0]] * n, [0.0] * n, [0.0] * n,
        [int(like.prompt_uids[i])] * n, [int(like.group_ids[i])] * n, int(like.versions[i]))
    return rows.replace(**{c: np.zeros(n, np.float32) for c in like.token_columns})  # KL's columns, 0


def arrange_for_ranks(fresh: list[Experience], replayed_per_rank: list[list[Experience]],
                      fresh_per_rank: list[slice], equal: bool = True,
                      fresh_parts: list[int] | None = None, select=None) -> list[Experience]:
    """Rank r's contiguous chunk = its share of the fresh micro-batches (`fresh_per_rank[r]`, from
    `share_for_ranks`, cut into `fresh_parts[r]` micro-batches where given) + its replayed
    micro-batches. `equal=False` (dynamic batching, where upstream deals the rows again): the
    chunks may differ. `select(item, lo, hi)`: rows lo:hi of a micro-batch (`cut_finer`'s).

    Upstream cuts the list into `ranks` chunks of ceil(len / ranks): with the same number of items
    per rank, the cuts fall exactly on these boundaries.
    """
    parts = fresh_parts if fresh_parts is not None else [None] * len(fresh_per_rank)
    chunks = [cut_finer(fresh[cut], n, select) + list(replayed)
              for cut, n, replayed in zip(fresh_per_rank, parts, replayed_per_rank)]
    if equal and len({len(c) for c in chunks}) != 1:
        raise ValueError(f"the ranks would get {[len(c) for c in chunks]} micro-batches; upstream's chunking "
                         "needs the same number on every rank")
    return [e for chunk in chunks for e in chunk]


def cut_finer(items: list[Experience], parts: int | None, select=None) -> list[Experience]:
    """`items` (a rank's fresh micro-batches, in order) as `parts` micro-batches: the largest is
    halved until there are that many. Upstream's actor trains row by row, so only the count changes.
    `select(item, lo, hi)` takes rows lo:hi of an item (`select_rows`; the rehearsal's shadows
    pass their own, for micro-batches that carry only a row count)."""
    select = select or select_rows
    pieces = [(e, 0, len(e.sequences)) for e in items]
    while parts is not None and len(pieces) < parts:
        i = max(range(len(pieces)), key=lambda j: pieces[j][2] - pieces[j][1])
        e, lo, hi = pieces[i]
        if hi - lo < 2:
            raise ValueError(f"{sum(len(e.sequences) for e in items)} fresh rows cannot make {parts} micro-batches")
        pieces[i:i + 1] = [(e, lo, (lo + hi) // 2), (e, (lo + hi) // 2, hi)]
    return [e if hi - lo == len(e.sequences) else select(e, lo, hi) for e, lo, hi in pieces]
