"""Samplers: which live rollouts to replay. All share one signature,

    sampler(view, k, step, rng, *, fresh_prompt_uids=None) -> Draw

and return indices into `view` (never data). Knobs (alpha, tau, ...) are keyword-only, without
defaults of their own: `sampler_from_config` binds the config's values (its `MODE_DEFAULTS` are
the one place defaults live). Randomness comes only from `rng`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

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


def freshness_priorities(advantages: np.ndarray, ages: np.ndarray, alpha: float, eps: float,
                         tau: float) -> np.ndarray:
    """(|A| + eps) ** alpha * exp(-age / tau), scaled so the largest is 1, (N,) float64.

    Computed in log space: with no age limit, exp(-age / tau) alone underflows to 0 for old
    rollouts, and the scale cancels in the sampling probabilities anyway.
    """
    log_p = alpha * np.log(np.abs(advantages.astype(np.float64)) + eps) - ages / tau
    if not len(log_p):
        return log_p
    return np.exp(log_p - log_p.max())


def effective_sample_size(p: np.ndarray) -> float:
    """Kish's (sum p)^2 / sum p^2 of unnormalised priorities: N when uniform, 1 when one dominates."""
    s = float(p.sum())
    return s * s / float(np.square(p).sum()) if s > 0 else 0.0


def beta_schedule(step: int, start: float, end: float, steps: int) -> float:
    """Importance-weight exponent: linear from `start` at step 0 to `end` at `steps`, then flat."""
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
              fresh_prompt_uids: np.ndarray | None = None, alpha: float, eps: float, tau: float, beta_start: float,
              beta_end: float, beta_steps: int, replacement: bool) -> Draw:
    """FreshPER: advantage priority decayed by exp(-age / tau), with annealed importance weights."""
    p = freshness_priorities(view.advantages, view.ages(step), alpha, eps, tau)
    idx = weighted_draw(p, k, rng, replacement)
    beta = beta_schedule(step, beta_start, beta_end, beta_steps)
    w = importance_weights(p, idx, beta)
    return Draw.of(idx, w, ess=effective_sample_size(p), candidates=len(view), is_beta=beta,
                   is_weight_mean=w.mean() if len(w) else 0.0, is_weight_max=w.max(initial=0.0))


def success(view: StoreView, k: int, step: int, rng: np.random.Generator, *,
            fresh_prompt_uids: np.ndarray | None = None, threshold: float) -> Draw:
    """RLEP: verified-correct rollouts (reward > threshold), without replacement. Given the step's
    fresh prompts, only their successes, as evenly over the prompts as those allow: one of each
    prompt that has one, then a second of each, and so on (at random within a prompt, and among
    the prompts of the last, partial round), so a cut of the draw's tail keeps it even."""
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
    evenest = np.lexsort((rng.random(len(cand)), rank))  # round by round, prompts at random within a round
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


SAMPLERS: dict[str, Callable[..., Draw]] = {
    "uniform": uniform,
    "advantage": advantage,
    "freshness": freshness,
    "success": success,
    "group": group,
}


def get_sampler(name: str) -> Callable[..., Draw]:
    """The registered sampler `name`, its knobs unbound (see `sampler_from_config`)."""
    try:
        return SAMPLERS[name]
    except KeyError:
        raise ValueError(f"unknown sampler {name!r}; valid: {', '.join(sorted(SAMPLERS))}") from None


def sampler_from_config(config: ReplayConfig) -> Sampler:
    """The config's sampler with its knobs bound, leaving the common signature."""
    name = config.sampler_name
    if name is None:
        raise ValueError(f"replay.mode={config.mode!r} samples nothing")
    knobs = {
        "uniform": dict(replacement=config.replacement),
        "advantage": dict(alpha=config.effective_alpha, eps=config.eps, replacement=config.replacement),
        "freshness": dict(alpha=config.effective_alpha, eps=config.eps, tau=config.tau,
                          beta_start=config.beta_start, beta_end=config.beta_end, beta_steps=config.beta_steps,
                          replacement=config.replacement),
        "success": dict(threshold=config.success_threshold),
        "group": {},
    }[name]
    return functools.partial(get_sampler(name), **knobs)
