"""The replay metrics of docs/METHOD.md section 4 that the core can know, as pure functions.

Keys are returned without the `replay/` prefix; `ReplayBuffer.metrics` adds it. Per-step
statistics of the replayed part read 0 when nothing was replayed (see `replayed`).
"""
from __future__ import annotations

import numpy as np

from replay.composer import Composition
from replay.record import RolloutBatch
from replay.store import RolloutStore

# Lower bounds of the age-histogram buckets (powers of two); age 0 would mean a step replays its
# own fresh rollouts, which the buffer never does, so a non-zero "0" bucket flags a bug.
AGE_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64)


def age_bucket_labels() -> list[str]:
    """'0', '1', '2-3', '4-7', ..., '64+'."""
    labels = []
    for lo, hi in zip(AGE_BUCKETS, AGE_BUCKETS[1:]):
        labels.append(str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}")
    return labels + [f"{AGE_BUCKETS[-1]}+"]


def age_histogram(ages: np.ndarray) -> dict[str, float]:
    """Fraction of `ages` in each bucket (all 0 when empty). Negative ages count as 0."""
    bucket = np.searchsorted(AGE_BUCKETS, np.maximum(ages, 0), side="right") - 1
    counts = np.bincount(bucket, minlength=len(AGE_BUCKETS))
    fracs = counts / max(len(ages), 1)
    return {f"age_hist/{label}": float(f) for label, f in zip(age_bucket_labels(), fracs)}


def zero_variance_group_fraction(rewards: np.ndarray, group_ids: np.ndarray) -> float:
    """Fraction of groups whose rewards are all equal (they carry no GRPO gradient)."""
    if not len(rewards):
        return 0.0
    _, group = np.unique(group_ids, return_inverse=True)
    n = group.max() + 1
    hi = np.full(n, -np.inf)
    lo = np.full(n, np.inf)
    np.maximum.at(hi, group, rewards)
    np.minimum.at(lo, group, rewards)
    return float(np.mean(hi == lo))


def replayed_ages(replayed: RolloutBatch, step: int) -> np.ndarray:
    """(m,) int64: each replayed rollout's age at `step`, in steps since the policy version that
    generated it (an offline pool's rollouts, version -1, are step + 1 old)."""
    return step - replayed.versions


def replayed_uses(replayed: RolloutBatch) -> np.ndarray:
    """(m,) int64: how often each replayed rollout has been trained on as replay, this use included
    (the buffer counts the draw only after composing the step, so the stored count is one short)."""
    return replayed.reuse_counts.astype(np.int64) + 1


def composition_histograms(comp: Composition, step: int) -> dict[str, np.ndarray]:
    """Per-step value arrays for histograms (one value per replayed rollout; empty when nothing was
    replayed). Keys without the `replay/` prefix, as `composition_metrics`'."""
    return {"replayed_age": replayed_ages(comp.replayed, step), "replayed_uses": replayed_uses(comp.replayed)}


def composition_metrics(comp: Composition, step: int) -> dict[str, float]:
    """Per-step statistics of what was replayed into this step's batch."""
    rep, n_fresh = comp.replayed, len(comp.fresh)
    ages, uses = replayed_ages(rep, step), replayed_uses(rep)
    out = {
        "fresh": float(n_fresh),
        "replayed": float(len(rep)),
        "replayed_fraction": len(rep) / max(n_fresh + len(rep), 1),
        "unique_replayed": float(len(np.unique(comp.indices))),
        "age_mean": float(ages.mean()) if len(rep) else 0.0,
        "age_max": float(ages.max(initial=0)),
        "reuse_mean": float(uses.mean()) if len(rep) else 0.0,
        "reuse_max": float(uses.max(initial=0)),
        "zero_variance_group_fraction": zero_variance_group_fraction(comp.fresh.rewards, comp.fresh.group_ids),
        "ess": 0.0,  # replaced by the sampler's value whenever it drew
        "candidates": 0.0,
    }
    out.update(age_histogram(ages))
    out.update(comp.info)  # sampler diagnostics: ess, candidates, is_weight_mean / max where used
    return out


def store_metrics(store: RolloutStore) -> dict[str, float]:
    """Size, bytes and the cumulative counters (inserted, skipped, refused/<reason>, evicted_*)."""
    n_tokens = store.n_tokens
    out = {"size": float(len(store)), "tokens": float(n_tokens), "nbytes": float(store.nbytes),
           "bytes_per_token": store.nbytes / n_tokens if n_tokens else 0.0}
    out.update({k: float(v) for k, v in store.counters.items()})
    return out
