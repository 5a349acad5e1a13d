"""The lab's paired statistics over seeds: the sign-flip permutation test, the paired difference
with its interval (a 95% percentile bootstrap from `MIN_SEEDS_FOR_CI` seeds, else the [min, max]),
its verdict in words, and the minimal detectable effect. The rules are `se_analysis`'s docstring."""
from __future__ import annotations

import itertools
import math
from typing import Mapping, Sequence

import numpy as np

from evaluation.metrics import bootstrap_draws, mcnemar_p, percentile_interval, student_t_quantile

ALPHA = 0.05
MIN_SEEDS_FOR_CI = 6
"""Fewest paired seeds for a 95% interval; below, intervals are the [min, max] over seeds."""
INTERVAL_KINDS = {True: "95% percentile bootstrap", False: "min-max"}
POWER = 0.80


def minimal_detectable_effect(diffs: Sequence[float], power: float = POWER, alpha: float = ALPHA) -> float | None:
    """Approximate smallest true mean difference that a paired t-test over these seeds would
    detect with probability `power` at two-sided level `alpha`: (t(1 - alpha/2, n-1) + t(power,
    n-1)) x sd / sqrt(n), sd the sample standard deviation of the differences. None below 2 seeds."""
    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return None
    t = student_t_quantile(1 - alpha / 2, d.size - 1) + student_t_quantile(power, d.size - 1)
    return float(t * d.std(ddof=1) / math.sqrt(d.size))


def sign_flip_p(diffs: Sequence[float], n_resamples: int = 100_000, seed: int = 0, side: str = "two") -> float:
    """p-value of the paired permutation test: under no difference each paired difference is as
    likely to have the opposite sign, so p = the share of the 2**n sign assignments whose mean is
    at least as extreme as the observed one: |mean| (`side` "two"), or mean itself ("greater": the
    alternative is a positive mean). Exact up to n = 16 differences, else `n_resamples` random
    assignments (the observed one counted in). 1.0 for no differences."""
    if side not in ("two", "greater"):
        raise ValueError(f"side={side!r}: use 'two' or 'greater' (for 'less', negate the differences)")
    d = np.asarray(diffs, dtype=float)
    if d.size == 0:
        return 1.0
    stat = np.abs if side == "two" else (lambda m: m)
    observed = stat(d.mean()) - 1e-12  # a tie with the observed statistic counts as extreme
    if d.size <= 16:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))  # (2**n, n)
        return float(np.mean(stat(signs @ d / d.size) >= observed))
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(n_resamples, d.size))
    return float((np.sum(stat(signs @ d / d.size) >= observed) + 1) / (n_resamples + 1))


def holm(p: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of a family of p-values (name -> p): the i-th smallest becomes
    max over j <= i of min(1, (m - j + 1) p_(j)), so that rejecting where it is < alpha keeps the
    family-wise error rate at alpha."""
    order = sorted(p, key=p.get)
    out, running = {}, 0.0
    for j, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - j) * p[name]))
        out[name] = running
    return out


def equivalence(diffs: Sequence[float], margin: float) -> dict:
    """Two one-sided tests of |mean difference| < `margin`: the sign-flip test of d + margin > 0
    and of margin - d > 0. Equivalent within the margin when the larger p is below ALPHA."""
    d = np.asarray(diffs, dtype=float)
    p = max(sign_flip_p(d + margin, side="greater"), sign_flip_p(margin - d, side="greater"))
    return {"margin": margin, "p": p, "equivalent": bool(p < ALPHA)}


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], n_resamples: int = 10000,
                      seed: int = 0) -> dict:
    """A - B over the seeds both have (seed -> score): n, the differences, their median with an
    interval over seeds (percentile-bootstrap 95% from MIN_SEEDS_FOR_CI seeds, else [min, max];
    `interval_kind` says which), their mean, the sign-flip permutation p and the sign test's p,
    and whether the difference is resolved (interval excludes 0, p < 0.05)."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError(f"no seed in common: {sorted(a)} vs {sorted(b)}")
    d = np.array([a[s] - b[s] for s in seeds], dtype=float)
    enough = d.size >= MIN_SEEDS_FOR_CI
    if enough:
        draws = bootstrap_draws(d.size, n_resamples, seed, lambda idx, _rng: np.median(d[idx], axis=1))
        lo, hi = percentile_interval(draws, 0.95)
    else:
        lo, hi = float(d.min()), float(d.max())
    p = sign_flip_p(d)
    return {"n": int(d.size), "seeds": seeds, "diffs": d.tolist(), "median": float(np.median(d)),
            "interval": [lo, hi], "interval_kind": INTERVAL_KINDS[enough], "mean": float(d.mean()), "p": p,
            "sign_p": mcnemar_p(int(np.sum(d < 0)), int(np.sum(d > 0))),
            "resolved": bool(p < ALPHA and (lo > 0 or hi < 0))}


def verdict(stat: Mapping) -> str:
    """Plain words for a `paired_difference`: which way, and whether it is resolved."""
    if stat["resolved"]:
        return "resolved: A higher" if stat["median"] > 0 else "resolved: A lower"
    return "not resolved"
