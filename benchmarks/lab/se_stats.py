"""The lab's paired statistics over seeds: the sign-flip permutation test, the paired difference
with its interval (from `MIN_SEEDS_FOR_CI` seeds the 95% interval of the mean obtained by
inverting that test, else the [min, max]), its verdict in words, and the minimal detectable
effect. The rules are `se_analysis`'s docstring."""
from __future__ import annotations

import functools
import itertools
import math
from typing import Mapping, Sequence

import numpy as np

from evaluation.metrics import mcnemar_p, student_t_quantile

ALPHA = 0.05
MIN_SEEDS_FOR_CI = 6
"""Fewest paired seeds for a 95% interval; below, intervals are the [min, max] over seeds (and no
sign-flip test of 5 or fewer seeds reaches p < 0.05: its smallest p is 2 / 2**5 = 0.0625)."""
INTERVAL_KINDS = {True: "95% sign-flip inversion, mean", False: "min-max"}
POWER = 0.80
EXACT_UP_TO = 16
"""Seeds up to which the sign-flip test enumerates every sign assignment (2**16 = 65,536)."""


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
    return _ShiftTest(d, n_resamples, seed, side).p(0.0)


class _ShiftTest:
    """The sign-flip test of d - delta for any shift delta, from one pass over the assignments:
    an assignment s gives mean(s * (d - delta)) = (s @ d - delta * sum(s)) / n."""

    def __init__(self, d: np.ndarray, n_resamples: int, seed: int, side: str):
        signs = _sign_assignments(d.size, n_resamples, seed)  # (2**n or n_resamples, n)
        self.d, self.side, self.n_resamples = d, side, n_resamples
        self.projections, self.sign_sums = signs @ d, signs.sum(axis=1)

    def p(self, delta: float) -> float:
        stat = np.abs if self.side == "two" else (lambda m: m)
        observed = stat(self.d.mean() - delta) - 1e-12  # a tie with the observed statistic counts as extreme
        extreme = np.sum(stat((self.projections - delta * self.sign_sums) / self.d.size) >= observed)
        if self.d.size <= EXACT_UP_TO:
            return float(extreme / len(self.projections))
        return float((extreme + 1) / (self.n_resamples + 1))


@functools.lru_cache(maxsize=16)  # 16 seeds: 8 MiB; a sampled set of 100,000 x n, n x 0.8 MiB
def _sign_assignments(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """Every sign assignment of n differences (n <= EXACT_UP_TO), else `n_resamples` random ones
    from `seed`. Cached and read-only: a summary tests many vectors of the same length."""
    if n <= EXACT_UP_TO:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    else:
        signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(n_resamples, n))
    signs.setflags(write=False)
    return signs


def sign_flip_interval(diffs: Sequence[float], alpha: float = ALPHA) -> tuple[float, float]:
    """The 1 - alpha interval of the mean difference that inverts `sign_flip_p`: the shifts delta
    for which the two-sided test of d - delta has p >= alpha.

    Each sign assignment counts as extreme for the shifts on one side of a cut-off (the larger of
    the means of the differences it keeps and of those it flips, above the mean; mirrored below),
    so p falls monotonically as delta leaves the mean, and the set is an interval. Its ends are
    found by bisection from the mean outwards. The tested shift, 0, is put into the bracket as
    what the test says it is (kept when p >= alpha, rejected otherwise), so the interval excludes
    0 exactly when `sign_flip_p(diffs) < alpha`. Needs at least `MIN_SEEDS_FOR_CI` differences:
    with fewer, no shift is rejected."""
    d = np.asarray(diffs, dtype=float)
    if d.size < MIN_SEEDS_FOR_CI:
        raise ValueError(f"{d.size} differences: a sign-flip interval needs {MIN_SEEDS_FOR_CI} or more")
    centre, spread = float(d.mean()), float(d.max() - d.min())
    if spread == 0:  # every shift but the common value leaves only the all-same-sign assignments
        return centre, centre
    test = _ShiftTest(d, 100_000, 0, "two")  # sign_flip_p's assignments
    null_kept = test.p(0.0) >= alpha
    ends = []
    for direction in (-1.0, 1.0):
        kept, rejected = centre, centre + direction * 2 * spread  # beyond every difference: p = 2 / 2**n
        if (0.0 - kept) * direction > 0 and (rejected - 0.0) * direction > 0:
            kept, rejected = (0.0, rejected) if null_kept else (kept, 0.0)
        while abs(rejected - kept) > 1e-6 * spread:
            middle = (kept + rejected) / 2
            if middle in (kept, rejected):  # as close as floats get (differences equal but for rounding)
                break
            if test.p(middle) >= alpha:
                kept = middle
            else:
                rejected = middle
        ends.append(kept)
    return ends[0], ends[1]


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


def paired_difference(a: Mapping[int, float], b: Mapping[int, float]) -> dict:
    """A - B over the seeds both have (seed -> score): n, the differences, their mean (the
    estimate) with its interval (from MIN_SEEDS_FOR_CI seeds the 95% interval that inverts the
    sign-flip test, `sign_flip_interval`, else their [min, max]; `interval_kind` says which), their
    median (descriptive), the sign-flip permutation p and the sign test's p, and `resolved`:
    p < 0.05, which from MIN_SEEDS_FOR_CI seeds is the same as the interval excluding 0. The
    p is uncorrected: a score or pair outside a planned family is not called resolved by it."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError(f"no seed in common: {sorted(a)} vs {sorted(b)}")
    d = np.array([a[s] - b[s] for s in seeds], dtype=float)
    enough = d.size >= MIN_SEEDS_FOR_CI
    lo, hi = sign_flip_interval(d) if enough else (float(d.min()), float(d.max()))
    p = sign_flip_p(d)
    return {"n": int(d.size), "seeds": seeds, "diffs": d.tolist(), "mean": float(d.mean()),
            "interval": [lo, hi], "interval_kind": INTERVAL_KINDS[enough], "median": float(np.median(d)), "p": p,
            "sign_p": mcnemar_p(int(np.sum(d < 0)), int(np.sum(d > 0))), "resolved": bool(p < ALPHA)}


def verdict(stat: Mapping) -> str:
    """Plain words for a `paired_difference` tested on its own (no family): which way, and
    whether it is resolved."""
    if stat["resolved"]:
        return "resolved: A higher" if stat["mean"] > 0 else "resolved: A lower"
    return "not resolved"
