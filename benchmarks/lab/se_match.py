"""To-match ratios: how much of the baseline's spending (rollouts, compute units, token cost) a
condition needs to reach the baseline's level, with a paired bootstrap interval and p.

The threshold is `match_fraction` (0.98) x the maximum of the baseline's median curve (a level
that curve does reach). A median curve pairs, at each evaluated step (the same in every run), the
median over seeds of the x spent with the median accuracy. Its first crossing of the threshold
is read by linear interpolation between the two evaluated checkpoints around it: the x where the
segment from the last checkpoint below the threshold to the first at or above it reaches it (the
first checkpoint's x when that one already does). The ratio is the condition's crossing over the
baseline's, both over the seeds the two have in common (a condition run at 3 seeds is compared
with the baseline's runs of those 3 seeds); never crossing counts as an infinite ratio.

From `MIN_SEEDS_FOR_CI` seeds: a paired percentile bootstrap over seeds (seed s of the condition
resampled with seed s of the baseline, both median curves and the threshold recomputed;
`N_RESAMPLES`, seeded), its 95% interval, and from the same resamples the two-sided p of ratio 1:
p = min(1, 2 x min(share of ratios >= 1, share of ratios <= 1)). The interval's ends are the
order statistics that make "the interval excludes 1" and "p < 0.05" the same statement. Below
that, the [min, max] of the seeds' own ratios (seed s's curve against the baseline's seed s), and
no p. An end that is infinite is reported as None ("may never match").
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from se_costs import eval_curve
from se_stats import ALPHA, MIN_SEEDS_FOR_CI

N_RESAMPLES = 4000
RATIO_INTERVAL_KINDS = {True: "95% paired percentile bootstrap", False: "min-max"}
AXES = {"rollouts": "rollouts", "compute": "compute_units", "cost": "token_cost"}
"""Name in the summary (`<name>_to_match_ratio`, ...) -> the cumulative axis it is read on:
generated rollouts, compute units (this session's wall-clock) and token cost (se_costs)."""


def median_step_curve(runs: Sequence[Mapping], unit_s: float, axis: str) -> dict:
    """At each evaluated step (the same in every run): x = the median over runs of `axis` there,
    median = the median accuracy."""
    curves = [eval_curve(r, unit_s, axis) for r in runs]
    if any(len(x) != len(curves[0][0]) for x, _ in curves):
        raise ValueError("runs were evaluated at different steps")
    return {"x": np.median([x for x, _ in curves], axis=0), "median": np.median([y for _, y in curves], axis=0)}


def first_crossings(x: np.ndarray, y: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """(R,) the first x at which each row's piecewise-linear curve reaches its threshold (a small
    tolerance for float noise); inf where it never does. x, y: (R, E) without NaN, threshold (R,)."""
    x, y = np.atleast_2d(np.asarray(x, dtype=float)), np.atleast_2d(np.asarray(y, dtype=float))
    thr = np.broadcast_to(np.asarray(threshold, dtype=float), (len(y),))
    reached = y >= thr[:, None] - 1e-12  # (R, E)
    first = reached.argmax(axis=1)
    rows, before = np.arange(len(y)), np.maximum(first - 1, 0)
    rise = y[rows, first] - y[rows, before]  # > 0 where first > 0: below, then at or above
    frac = np.divide(thr - y[rows, before], rise, out=np.ones(len(y)), where=first > 0)
    out = x[rows, before] + np.clip(frac, 0.0, 1.0) * (x[rows, first] - x[rows, before])
    out[~reached.any(axis=1)] = math.inf
    return out


def first_reach(x: Sequence[float], y: Sequence[float], threshold: float) -> float | None:
    """The first x where the piecewise-linear curve through the (x, y) without NaN reaches the
    threshold; None if it never does."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = ~np.isnan(y)
    if not keep.any():
        return None
    crossing = float(first_crossings(x[keep], y[keep], np.array([threshold]))[0])
    return None if math.isinf(crossing) else crossing


def _ratios(x: np.ndarray, y: np.ndarray, bx: np.ndarray, by: np.ndarray, match_fraction: float) -> np.ndarray:
    """(R,) to-match ratios of R pairs of median curves, condition (x, y) and baseline (bx, by),
    each (R, E); inf where the condition never reaches the threshold."""
    threshold = match_fraction * by.max(axis=1)
    mine, base = first_crossings(x, y, threshold), first_crossings(bx, by, threshold)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = mine / base
    # the baseline's threshold met before anything was spent (by the start model)
    return np.where(base == 0, np.where(mine == 0, 1.0, math.inf), ratio)


def to_match_ratio(condition_curve: dict, baseline_curve: dict, match_fraction: float = 0.98) -> float | None:
    """x (rollouts, compute units, token cost) for the condition's median curve to reach
    match_fraction x the maximum of the baseline's median curve, over the x the baseline's own
    median curve needs; None when the condition never does."""
    def row(curve: dict, key: str) -> np.ndarray:  # (1, E): one "resample"
        return np.atleast_2d(np.asarray(curve[key], dtype=float))

    ratio = _ratios(row(condition_curve, "x"), row(condition_curve, "median"), row(baseline_curve, "x"),
                    row(baseline_curve, "median"), match_fraction)[0]
    return None if math.isinf(ratio) else float(ratio)


def ratio_interval_and_p(ratios: Sequence[float], alpha: float = ALPHA) -> tuple[float, float, float]:
    """(lo, hi, p) of bootstrap ratios: p = min(1, 2 x min(share >= 1, share <= 1)), and the
    central 1 - alpha interval as the k-th smallest and k-th largest ratio, k the fewest ratios
    whose two-sided share 2k / R reaches alpha. So lo > 1 exactly when fewer than k ratios are
    <= 1, which is exactly when that side's p is < alpha (and likewise hi < 1): the interval
    excludes 1 if and only if p < alpha. Sample values, so an infinite ratio stays infinite."""
    r = np.sort(np.asarray(ratios, dtype=float))
    if r.size == 0 or np.isnan(r).any():
        raise ValueError("need at least one ratio and no NaN")
    n = r.size

    def two_sided(count: int) -> float:
        return min(1.0, 2 * count / n)

    k = next(k for k in range(1, n + 1) if two_sided(k) >= alpha)
    p = two_sided(min(int(np.sum(r >= 1.0)), int(np.sum(r <= 1.0))))
    return float(r[k - 1]), float(r[n - k]), p


def to_match_bootstrap(runs: Sequence[Mapping], baseline_runs: Sequence[Mapping], unit_s: float, axis: str,
                       match_fraction: float = 0.98, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """`to_match_ratio` over the seeds both conditions have, with its interval and p (module
    docstring): {"ratio", "interval", "interval_kind", "p"}; None for an infinite ratio or end,
    and for p below MIN_SEEDS_FOR_CI seeds."""
    by_seed = {r["seed"]: r for r in runs}
    base_by_seed = {r["seed"]: r for r in baseline_runs}
    seeds = sorted(set(by_seed) & set(base_by_seed))
    if not seeds:
        raise ValueError("no seed in common with the baseline")
    curves = [[eval_curve(group[s], unit_s, axis) for s in seeds] for group in (by_seed, base_by_seed)]
    (x, y), (bx, by) = ((np.array([c[0] for c in cs]), np.array([c[1] for c in cs])) for cs in curves)  # (S, E)

    def ratios(idx: np.ndarray) -> np.ndarray:  # idx (R, S'): the seeds of each resample
        return _ratios(*(np.median(v[idx], axis=1) for v in (x, y, bx, by)), match_fraction)

    ratio = float(ratios(np.arange(len(seeds))[None, :])[0])
    enough = len(seeds) >= MIN_SEEDS_FOR_CI
    if enough:
        drawn = ratios(np.random.default_rng(seed).integers(0, len(seeds), size=(n_resamples, len(seeds))))
        lo, hi, p = ratio_interval_and_p(drawn)
    else:  # each seed's own ratio, as its [min, max]
        own = ratios(np.arange(len(seeds))[:, None])
        lo, hi, p = float(own.min()), float(own.max()), None
    return {"ratio": None if math.isinf(ratio) else ratio, "interval": [None if math.isinf(v) else v for v in (lo, hi)],
            "interval_kind": RATIO_INTERVAL_KINDS[enough], "p": p}


def condition_to_match(rs: Sequence[Mapping], baseline_runs: Sequence[Mapping], unit_s: float,
                       match_fraction: float) -> dict:
    """`<name>_to_match_{ratio, interval, interval_kind, p}` for every name of AXES, on the seeds
    the condition and the baseline both have. None for runs evaluated at different steps (they
    ended with the pool at different steps): their median curve has no common points to read off."""
    if len({tuple(e["step"] for e in r["evals"]) for r in list(rs) + list(baseline_runs)}) > 1:
        return {f"{name}_to_match_{k}": None for name in AXES for k in ("ratio", "interval", "p")} | {
            f"{name}_to_match_interval_kind": "n/a: runs end at different steps" for name in AXES}
    out = {}
    for name, axis in AXES.items():
        out |= {f"{name}_to_match_{k}": v
                for k, v in to_match_bootstrap(rs, baseline_runs, unit_s, axis, match_fraction).items()}
    return out


def primary_verdict(ratio: float | None, interval: Sequence[float | None], p: float | None) -> str:
    """The fifth edition's rule for rollouts-to-match of its primary pair: "reaches the 0.5 mark"
    when the estimate is <= 0.5 and the interval's upper end < 1, "saves rollouts" when the upper
    end < 1, else "not resolved" (so too below MIN_SEEDS_FOR_CI seeds, which have no p)."""
    hi = interval[1]
    if p is None or hi is None or hi >= 1:
        return "not resolved"
    return "reaches the 0.5 mark" if ratio is not None and ratio <= 0.5 else "saves rollouts"
