"""Samplers: which live rollouts to replay. All share one signature,

    sampler(view, k, step, rng, *, fresh_prompt_uids=None) -> Draw

and return indices into `view` (never data). Knobs (alpha, tau, ...) are keyword-only, without
defaults of their own: `sampler_from_config` binds the config's values through the mode's registry
entry (`replay/modes.py`, the one place defaults live). Randomness comes only from `rng`. A mode's
entry holds its sampler itself, so a sampler may live here or in the mode's own module (ExGRPO's:
`replay/exgrpo.py`); nothing lists them by name.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from replay.store import StoreView

if TYPE_CHECKING:
    from replay.config import ReplayConfig


@dataclass(frozen=True, eq=False)
class Draw:
    """A sampler's answer: at most k indices, their importance weights and diagnostics."""

    indices: np.ndarray  # (m,) int64 into the view, m <= k (group: see `group`)
    weights: np.ndarray  # (m,) float32, ones where the sampler uses none
    info: dict[str, float] = field(default_factory=dict)  # e.g. ess, candidates

    @classmethod
    def of(cls, indices: np.ndarray, weights: np.ndarray | None = None, **info: float) -> Draw:
        indices = np.asarray(indices, np.int64)
        weights = np.ones(len(indices), np.float32) if weights is None else np.asarray(weights, np.float32)
        return cls(indices, weights, {k: float(v) for k, v in info.items()})


class Sampler(Protocol):
    def __call__(self, view: StoreView, k: int, step: int, rng: np.random.Generator, *,
                 fresh_prompt_uids: np.ndarray | None = None) -> Draw: ...


# -------------------------------------------------------------------- pure functions


def advantage_priorities(advantages: np.ndarray, alpha: float, eps: float) -> np.ndarray:
    """(|A| + eps) ** alpha, (N,) float64."""
    return (np.abs(advantages.astype(np.float64)) + eps) ** alpha


# FreshPER (Vision-CAIR/Freshness-Aware-PER, roll/agentic/replay_buffer/): the floor of a priority
# set after a draw (`update_priorities`) and of an age-decayed one (`refresh_all_age_decay`).
UPDATED_PRIORITY_FLOOR = 1e-6
DECAYED_PRIORITY_FLOOR = 1e-8


def reward_fresh_priorities(rewards: np.ndarray, eps: float) -> np.ndarray:
    """FreshPER's priority of a rollout as it is stored: `reward_fresh` at age 0, |reward| + eps,
    (N,) float64 (NaN stays NaN: the store refuses such rollouts)."""
    return np.abs(rewards.astype(np.float64)) + eps


def replayed_priorities(rewards: np.ndarray) -> np.ndarray:
    """FreshPER's priority of a rollout after it was drawn: the update metric of `reward_fresh` is
    the reward, max(|reward|, 1e-6), (N,) float64."""
    return np.maximum(np.abs(rewards.astype(np.float64)), UPDATED_PRIORITY_FLOOR)


def freshness_priorities(priorities: np.ndarray, ages: np.ndarray, newest: np.ndarray, max_priority: float,
                         alpha: float, tau: float) -> np.ndarray:
    """FreshPER's sampling priorities (its segment tree's leaves) at a draw, (N,) float64 > 0: the
    rollouts of the most recent insertion at max_priority ** alpha (a new entry enters at the
    running maximum), every other at max(priority * exp(-age / tau), 1e-8) ** alpha (the
    age-decay refresh that precedes each draw)."""
    decayed = np.maximum(priorities * np.exp(-ages / tau), DECAYED_PRIORITY_FLOOR)
    return np.where(newest, max_priority, decayed) ** alpha


def effective_sample_size(p: np.ndarray) -> float:
    """Kish's (sum p)^2 / sum p^2 of unnormalised priorities: N when uniform, 1 when one dominates."""
    s = float(p.sum())
    return s * s / float(np.square(p).sum()) if s > 0 else 0.0


def beta_schedule(step: int, start: float, end: float, steps: int | None) -> float:
    """Importance-weight exponent: linear from `start` at step 0 to `end` at `steps`, then flat;
    `start` throughout when the two are equal (`steps` may then be unset)."""
    if start == end:
        return start
    frac = 1.0 if steps == 0 else min(1.0, max(0.0, step / steps))
    return start + (end - start) * frac


def importance_weights(p: np.ndarray, drawn: np.ndarray, beta: float) -> np.ndarray:
    """(N P(i)) ** -beta normalised by its maximum over the buffer, i.e. (p_i / p_min) ** -beta,
    for the drawn i; (m,) float32 in (0, 1]."""
    if not len(drawn):
        return np.zeros(0, np.float32)
    p_min = p[p > 0].min()
    return ((p[drawn] / p_min) ** -beta).astype(np.float32)


def uniform_draw(n: int, k: int, rng: np.random.Generator, replacement: bool) -> np.ndarray:
    """k indices in [0, n) (without replacement: min(k, n) distinct), in draw order."""
    if k <= 0 or n == 0:
        return np.zeros(0, np.int64)
    if replacement:
        return rng.integers(0, n, size=k, dtype=np.int64)
    return rng.choice(n, size=min(k, n), replace=False).astype(np.int64)


def stratified_draw(p: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k indices by PER's proportional sampling, with replacement: the total of `p` (> 0) is cut
    into k equal segments and one point is drawn uniformly in each; index i is drawn where the
    point falls in [cumsum(p)[i - 1], cumsum(p)[i]). The same distribution as a sum segment tree's
    prefix-sum search, found here by a binary search of the cumulative sums. Each index is drawn
    k p_i / sum(p) times in expectation, with less spread than k independent draws."""
    if k <= 0 or not len(p):
        return np.zeros(0, np.int64)
    cdf = np.cumsum(p)
    points = (rng.random(k) + np.arange(k)) * (cdf[-1] / k)
    return np.minimum(np.searchsorted(cdf, points, side="left"), len(p) - 1).astype(np.int64)


def weighted_draw(p: np.ndarray, k: int, rng: np.random.Generator, replacement: bool) -> np.ndarray:
    """k indices drawn with probability proportional to `p` (>= 0; zero never drawn), in draw order.

    Without replacement this is successive sampling (draw, remove, renormalise), done in one pass
    with exponential keys (Efraimidis & Spirakis): the k smallest of Exp(1) / p_i, ascending.
    """
    pos = np.flatnonzero(p > 0)
    if k <= 0 or not len(pos):
        return np.zeros(0, np.int64)
    if replacement:
        cdf = np.cumsum(p)
        idx = np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right")
        return np.minimum(idx, pos[-1]).astype(np.int64)  # u * total may round up to the total
    k = min(k, len(pos))
    keys = rng.exponential(size=len(pos)) / p[pos]
    first = np.argpartition(keys, k - 1)[:k] if k < len(pos) else np.arange(len(pos))
    return pos[first[np.argsort(keys[first], kind="stable")]].astype(np.int64)


# -------------------------------------------------------------------- samplers


def uniform(view: StoreView, k: int, step: int, rng: np.random.Generator, *,
            fresh_prompt_uids: np.ndarray | None = None, replacement: bool) -> Draw:
    """Every live rollout equally likely (the ablation without priority)."""
    n = len(view)
    return Draw.of(uniform_draw(n, k, rng, replacement), ess=n, candidates=n)


def advantage(view: StoreView, k: int, step: int, rng: np.random.Generator, *,
              fresh_prompt_uids: np.ndarray | None = None, alpha: float, eps: float, replacement: bool) -> Draw:
    """P(i) proportional to (|A_i| + eps) ** alpha (the method)."""
    p = advantage_priorities(view.advantages, alpha, eps)
    return Draw.of(weighted_draw(p, k, rng, replacement), ess=effective_sample_size(p), candidates=len(view))


def freshness(view: StoreView, k: int, step: int, rng: np.random.Generator, *,
              fresh_prompt_uids: np.ndarray | None = None, alpha: float, tau: float, beta_start: float,
              beta_end: float, beta_steps: int) -> Draw:
    """FreshPER with its `reward_fresh` priority: stratified proportional sampling (with
    replacement) over `freshness_priorities` of the stored priorities, with importance weights
    annealed by `beta_schedule`. The buffer keeps the priorities: |reward| + eps on insertion,
    `replayed_priorities` after a draw."""
    p = freshness_priorities(view.priorities, view.ages(step), view.newest, view.max_priority, alpha, tau)
    idx = stratified_draw(p, k, rng)
    beta = beta_schedule(step, beta_start, beta_end, beta_steps)
    w = importance_weights(p, idx, beta)
    return Draw.of(idx, w, ess=effective_sample_size(p), candidates=len(view), is_beta=beta,
                   is_weight_mean=w.mean() if len(w) else 0.0, is_weight_max=w.max(initial=0.0),
                   at_max_priority=int(view.newest.sum()))


def success(view: StoreView, k: int, step: int, rng: np.random.Generator, *,
            fresh_prompt_uids: np.ndarray | None = None, threshold: float, per_prompt: int) -> Draw:
    """RLEP: verified-correct rollouts (reward > threshold), without replacement. Given the step's
    fresh prompts, each of them gets min(per_prompt, its stored successes), chosen at random among
    them (RLEP's `random.sample` per question), and at most k in all. The draw comes round by round:
    one of each prompt that has one, then a second of each, and so on (prompts at random within a
    round), so a cut of its tail keeps it even. Without fresh prompts: k successes at random."""
    cand = np.flatnonzero(view.rewards > threshold)
    if fresh_prompt_uids is None:
        pick = cand[uniform_draw(len(cand), k, rng, replacement=False)]
        return Draw.of(pick, ess=len(cand), candidates=len(cand))
    cand = cand[np.isin(view.prompt_uids[cand], fresh_prompt_uids)]
    uids = view.prompt_uids[cand]
    # Random order within each prompt, then each candidate's rank within its prompt (0, 1, ...).
    order = np.lexsort((rng.random(len(cand)), uids))
    sorted_uids = uids[order]
    run_start = np.flatnonzero(np.r_[True, sorted_uids[1:] != sorted_uids[:-1]]) if len(cand) else np.zeros(0, int)
    rank = np.arange(len(cand)) - np.repeat(run_start, np.diff(np.r_[run_start, len(cand)]))
    within = np.flatnonzero(rank < per_prompt)  # min(M, successes) of each prompt
    evenest = within[np.lexsort((rng.random(len(within)), rank[within]))]  # round by round
    pick = cand[order[evenest[:max(k, 0)]]]
    return Draw.of(pick, ess=len(cand), candidates=len(cand), prompts_with_success=len(run_start))


def group(view: StoreView, k: int, step: int, rng: np.random.Generator, *,
          fresh_prompt_uids: np.ndarray | None = None) -> Draw:
    """Naive replay: whole groups (a group = one fresh group id at one version), uniformly, with
    replacement. It draws m = max(1, round(k / mean live group size)) groups, a number fixed
    before drawing: stopping once k rollouts are reached would favour small groups. With full
    groups of G that is exactly k / G groups; otherwise the count is close to k."""
    if k <= 0 or not len(view):
        return Draw.of(np.zeros(0, np.int64))
    # Group ids need only be unique within a step: key groups by (version, group id).
    members = np.lexsort((view.group_ids, view.versions))  # view indices, grouped
    v, g = view.versions[members], view.group_ids[members]
    starts = np.flatnonzero(np.r_[True, (v[1:] != v[:-1]) | (g[1:] != g[:-1])])
    sizes = np.diff(np.r_[starts, len(view)])
    m = max(1, math.floor(k * len(starts) / len(view) + 0.5))
    chosen = rng.integers(0, len(starts), size=m)
    take = sizes[chosen]
    out_start = np.cumsum(take) - take
    pos = np.repeat(starts[chosen] - out_start, take) + np.arange(take.sum())
    return Draw.of(members[pos], ess=len(starts), candidates=len(starts), groups_drawn=m)


def sampler_from_config(config: ReplayConfig) -> Sampler | None:
    """The mode's sampler (its registry entry's, wherever it is defined) with its knobs bound by
    the entry, leaving the common signature; None for a mode whose composer draws nothing from the
    store (age0)."""
    entry = config.entry
    if entry is None:
        raise ValueError(f"replay.mode={config.mode!r} samples nothing")
    if entry.sampler is None:
        return None
    return functools.partial(entry.sampler, **entry.knobs(config))
