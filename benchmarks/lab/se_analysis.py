"""Analysis of the sample-efficiency lab: pure functions over run records (no Ray, no torch).

A run record is a dict (the JSON `run.json` each finished run leaves):

    {"condition": "advantage", "seed": 1, "wall_s": 41.0, "eval_s": 22.5,
     "rollouts_per_step": 128,                 # fresh (generated) rollouts per training step
     "steps": [{"step": 1, "reward": 0.31, "response_tokens": 6.2, ...}, ...],  # se_costs's docstring
     "evals": [{"step": 0, "accuracy": 0.30, "accuracy_greedy": 0.41, "response_tokens": 6.0,
                "by_band": {"add 2d+1d": 0.9, ...}}, ...]}

What a run spends, on which axes (generated rollouts, compute units of this session's wall-clock,
and the machine-independent token cost), is `se_costs`; how much of the baseline's spending a
condition needs to reach the baseline's level, with its bootstrap interval and p, is `se_match`.

Held-out accuracy comes in two kinds per evaluation: `accuracy`, the primary metric, the mean
over k answers per problem sampled at the rollout temperature (avg@k: it sees RL sharpen the
sampling distribution, which greedy decoding barely shows), and `accuracy_greedy`. Per-seed
scores, the same rule for every condition (so no condition's checkpoint is picked in its
favour): `final_acc`, the accuracy of the last checkpoint; `best_acc`, the highest accuracy
among the checkpoints the run trained (step 0, the shared warm start, excluded); `auc`, the area
under held-out accuracy against generated rollouts divided by the run's rollouts (the curve's
mean height, in accuracy units: every condition generates the same rollouts). Each is computed
on the primary metric, and again on greedy accuracy under the same name with `_greedy` appended.
A condition's figure is the median of its per-seed scores.

Power: a pair's minimal detectable effect at 80% power and two-sided alpha 0.05 is
approximately (t(0.975, n-1) + t(0.80, n-1)) x sd(paired differences) / sqrt(n), from the
measured spread of its n seed-paired differences (`minimal_detectable_effect`). The positive
control (`POSITIVE_CONTROL`) is a pair whose sign is known before it runs: if the lab cannot
resolve it, a null result elsewhere says nothing.

Paired differences (condition A minus condition B, seed by seed: seed s of every condition has
the same prompt order and the same warm start): their mean, an interval (`interval`, its kind in
`interval_kind`), and the exact two-sided sign-flip permutation p-value of their mean (the sign
test's p and the median beside them). From `MIN_SEEDS_FOR_CI` (6) seeds the interval is the 95%
interval of the mean that inverts that test (the shifts it does not reject), so the interval
excludes 0 exactly when p < 0.05; below that it is the [min, max] of the differences, and called
so. With n seeds the smallest possible p is 2 / 2**n (0.25 at 3 seeds, 0.0078 at 8).

What is tested: the primary score, final_acc, of the pairs of the edition's pre-registered family
(`EDITIONS`), with Holm's adjustment over that family; a pair of it is resolved when its Holm p
< 0.05. The edition's primary question (the fifth's: rollouts-to-match of `PRIMARY_PAIR`) is one
test of its own. Every other score (best_acc, auc, the greedy ones) and every pair outside the
family is secondary: its p is given, uncorrected, and it is never called resolved.

Curves over seeds: at each x, the median and the 25th / 75th percentiles (numpy's linear
interpolation) of the runs that have a value there. Held-out evaluations happen at the same
steps in every run, so curves against steps and rollouts need no interpolation; against compute
units or tokens each run's curve is interpolated linearly onto a common grid, within its own
range only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from evaluation.metrics import aes
from se_costs import (condition_costs, cumulative_axes, eval_curve, generated_through,  # noqa: F401
                      has_zero_variance_counts, reward_curve, seconds_vs_baseline, unit_seconds,
                      zero_variance_share)
from se_match import (condition_to_match, first_reach, median_step_curve, primary_verdict,  # noqa: F401
                      to_match_bootstrap, to_match_ratio)
from se_stats import (ALPHA, INTERVAL_KINDS, MIN_SEEDS_FOR_CI, equivalence, holm,  # noqa: F401
                      minimal_detectable_effect, paired_difference, sign_flip_interval, sign_flip_p, verdict)

BASELINE = "none"
PRIMARY_SCORES = ("final_acc", "best_acc", "auc")
SCORES = PRIMARY_SCORES + tuple(f"{k}_greedy" for k in PRIMARY_SCORES)
KEY_PAIRS = (("uniform", "none"), ("uniform", "none_matched"), ("none_matched", "none"), ("uniform", "age0"),
             ("age0", "none"), ("uniform", "none_2epochs"))
"""Is replay more than extra updates? Uniform replay and GRPO, each against the two matched-update
controls (plan.md, question 1)."""
SELECTION_PAIRS = (("advantage_alpha1", "uniform"), ("advantage_alpha2", "uniform"), ("exgrpo", "uniform"))
"""Does any selection beat uniform? Each resolves or is tested for equivalence (question 2)."""
REFILL_PAIRS = (("refill", "none_df"), ("uniform_df", "none_df"), ("refill", "uniform_df"), ("none_df", "none"))
"""Refill against dynamic filtering, with and without replay, per generated rollout (question 3)."""
PREREGISTERED = KEY_PAIRS + SELECTION_PAIRS + REFILL_PAIRS
"""The fourth edition's family, Holm's adjustment runs over it: those of these pairs whose two
conditions the sweep plans (`summarize`'s `planned`), run or not (a pair not run counts as p = 1)."""
EQUIVALENCE_MARGIN = 0.005
"""+-0.5 points of the primary score: the margin of the selection pairs' equivalence tests."""
PAIRS = PREREGISTERED + (("advantage", "uniform"), ("advantage", "none_2epochs"), ("advantage", "none"),
                         ("none", "none_half_lr"))
"""Paired comparisons of the summary: (A, B) is reported as `A_vs_B`, differences A - B (the last
four: the third edition's, when their conditions are run)."""
POSITIVE_CONTROL = ("none", "none_half_prompts")
"""GRPO minus GRPO on half the prompts per step, at the same steps: positive, since the control
learns from half the rollouts with half the updates. (GRPO at half the LR, the first control,
was not resolved: see `sample_efficiency.LR_SCALE`.)"""
PRIMARY_PAIR = ("skip_refill", "none")
"""The fifth edition's primary question (issue #47): the rollouts skip + uniform replay + refill
needs to reach GRPO's level, over GRPO's own, with its interval and p (`se_match`)."""
FIFTH_PAIRS = (("skip_refill", "none"), ("uniform", "none"), ("skip", "none"), ("skip_uniform", "uniform"),
               ("skip_uniform", "skip"), ("skip_refill", "skip_uniform"))
"""The fifth edition's family on final_acc, Holm's adjustment runs over its 6 pairs: each method
against GRPO, what skipping adds to replay and replay to skipping, and what refill adds."""
FIFTH_SECONDARY = (("skip_refill", "uniform"), ("skip_uniform", "none"))
"""Reported beside the fifth edition's family, never tested."""


@dataclass(frozen=True)
class Edition:
    """What an edition of the lab reports and tests."""

    pairs: tuple[tuple[str, str], ...]
    """Every pair in the summary, (A, B) as `A_vs_B`, differences A - B."""
    family: tuple[tuple[str, str], ...]
    """The pre-registered pairs: Holm's family on final_acc; every other pair is secondary."""
    planned: tuple[str, ...] | None
    """The conditions whose family pairs count (a pair not run counts as p = 1); None: the call's
    own (`Args.holm_conditions`, which names the fourth edition's second regime's one pair)."""
    primary: tuple[str, str] | None
    """The pair whose rollouts-to-match is the primary question (its B the baseline), or None."""


EDITIONS = {
    4: Edition(pairs=PAIRS, family=PREREGISTERED, planned=None, primary=None),
    5: Edition(pairs=FIFTH_PAIRS + FIFTH_SECONDARY, family=FIFTH_PAIRS,
               planned=tuple(dict.fromkeys(c for pair in FIFTH_PAIRS for c in pair)), primary=PRIMARY_PAIR),
}


def quantile_band(values_per_run: Sequence[Sequence[float]]) -> dict[str, np.ndarray]:
    """Median and IQR over runs, pointwise. Input (R, X) with NaN where a run has no value.

    Returns {"median", "q25", "q75", "n"}: arrays of length X (NaN where no run has a value).
    """
    arr = np.asarray(values_per_run, dtype=float)
    if arr.ndim != 2:
        raise ValueError(f"expected (runs, points), got shape {arr.shape}")
    n = np.sum(~np.isnan(arr), axis=0)
    out = {k: np.full(arr.shape[1], np.nan) for k in ("median", "q25", "q75")}
    for j in np.flatnonzero(n):
        col = arr[~np.isnan(arr[:, j]), j]
        out["q25"][j], out["median"][j], out["q75"][j] = np.percentile(col, [25, 50, 75])
    out["n"] = n
    return out


def interpolate_onto(x: Sequence[float], y: Sequence[float], grid: Sequence[float]) -> np.ndarray:
    """y(x) linearly interpolated at `grid`; NaN outside [min(x), max(x)] (no extrapolation)."""
    x, y, grid = (np.asarray(v, dtype=float) for v in (x, y, grid))
    if len(x) == 0:
        return np.full(len(grid), np.nan)
    if np.any(np.diff(x) < 0):
        raise ValueError("x must be non-decreasing")
    out = np.interp(grid, x, y)
    out[(grid < x[0]) | (grid > x[-1])] = np.nan
    return out


def trailing_mean(y: Sequence[float], window: int) -> np.ndarray:
    """Mean of the last `window` values at each point (fewer at the start): smooths a per-step
    training reward, which is noisy (128 binary rewards per step), for plotting only."""
    y = np.asarray(y, dtype=float)
    if window < 1:
        raise ValueError(f"window={window}: must be >= 1")
    csum = np.concatenate([[0.0], np.cumsum(y)])
    idx = np.arange(1, len(y) + 1)
    start = np.maximum(idx - window, 0)
    return (csum[idx] - csum[start]) / (idx - start)


def aggregate(curves: Sequence[tuple[np.ndarray, np.ndarray]], grid: np.ndarray | None = None) -> dict:
    """Median / IQR over runs' (x, y) curves: on their shared x when all x are equal, else on `grid`
    (default: 50 points from 0 to the smallest run's last x, so every run covers the grid)."""
    xs = [np.asarray(x, dtype=float) for x, _ in curves]
    if grid is None and all(len(x) == len(xs[0]) and np.allclose(x, xs[0]) for x in xs):
        grid = xs[0]
        values = [np.asarray(y, dtype=float) for _, y in curves]
    else:
        if grid is None:
            grid = np.linspace(0.0, min(x[-1] for x in xs), 50)
        values = [interpolate_onto(x, y, grid) for x, y in curves]
    return {"x": np.asarray(grid, dtype=float), **quantile_band(values)}


# ------------------------------------------------------------------------- per-seed statistics

def auc_over_rollouts(rollouts: Sequence[float], accuracy: Sequence[float]) -> float:
    """Trapezoid area under accuracy against rollouts, over the rollouts spanned: the mean
    height of the piecewise-linear curve, in accuracy units."""
    x, y = np.asarray(rollouts, dtype=float), np.asarray(accuracy, dtype=float)
    if len(x) < 2 or x[-1] <= x[0] or np.any(np.diff(x) < 0):
        raise ValueError(f"need at least two increasing x values, got {x.tolist()}")
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0]))


def seed_scores(run: Mapping) -> dict[str, float]:
    """One run's `final_acc`, `best_acc` (checkpoints after step 0) and `auc` on the primary
    metric, and the same on greedy accuracy with `_greedy` appended (module docstring)."""
    evals = sorted(run["evals"], key=lambda e: e["step"])
    if not any(e["step"] > 0 for e in evals):
        raise ValueError(f"run {run.get('condition')}/{run.get('seed')} has no evaluation after step 0")
    generated = generated_through(run)
    x = [generated[e["step"]] if e["step"] < len(generated) else e["step"] * run["rollouts_per_step"] for e in evals]
    scores = {}
    for field, suffix in (("accuracy", ""), ("accuracy_greedy", "_greedy")):
        y = [e[field] for e in evals]
        scores |= {f"final_acc{suffix}": float(y[-1]),
                   f"best_acc{suffix}": float(max(v for v, e in zip(y, evals) if e["step"] > 0)),
                   f"auc{suffix}": auc_over_rollouts(x, y)}
    return scores


# ----------------------------------------------------------------------------------- summary

def summarize(runs: Sequence[Mapping], baseline: str = BASELINE, match_fraction: float = 0.98,
              edition: Edition = EDITIONS[4], planned: Sequence[str] | None = None) -> dict:
    """The sweep's summary: per condition (figures in the module docstring) and per pair.

    {"conditions": {name: {"seeds": n, "best_acc", "final_acc", "auc", ..., the to-match ratios
                           (se_match.condition_to_match) and costs (se_costs.condition_costs)}},
     "pairs": {"A_vs_B": {"final_acc": paired_difference + "mde", "best_acc": ..., "auc": ...,
                          "final_acc_greedy": ..., ...}},
     "family": the names of the edition's pre-registered pairs,
     "primary": the edition's primary question (None when it has none),
     "grpo_gain": the baseline's final_acc minus its step-0 accuracy, paired by seed,
     "positive_control": POSITIVE_CONTROL's final_acc difference (None when it did not run), ...}
    Pairs whose conditions are not both present are left out. Each family pair's final_acc also
    has `p_holm` (Holm over the family's pairs of the `planned` conditions: by default the
    edition's, else the runs' own) and `resolved_holm`; a selection pair's has `equivalence`
    (`EQUIVALENCE_MARGIN`).
    """
    by_condition: dict[str, list[Mapping]] = {}
    for run in runs:
        by_condition.setdefault(run["condition"], []).append(run)
    if baseline not in by_condition:
        raise ValueError(f"no run of the baseline condition {baseline!r}; have {sorted(by_condition)}")
    unit_s = unit_seconds(by_condition[baseline])
    baseline_curve = median_step_curve(by_condition[baseline], unit_s, "rollouts")
    scores = {c: {r["seed"]: seed_scores(r) for r in rs} for c, rs in by_condition.items()}
    conditions = {c: _condition(rs, scores[c], by_condition[baseline], unit_s, match_fraction)
                  for c, rs in by_condition.items()}
    for s in conditions.values():
        s["aes_vs_grpo"] = _aes(s, conditions[baseline])
    pair_stats = {f"{a}_vs_{b}": _pair(scores[a], scores[b]) for a, b in edition.pairs if a in scores and b in scores}
    family = _family_tests(pair_stats, edition.family, planned or edition.planned or list(by_condition))
    start = {r["seed"]: min(r["evals"], key=lambda e: e["step"])["accuracy"] for r in by_condition[baseline]}
    gain = paired_difference({s: v["final_acc"] for s, v in scores[baseline].items()}, start)
    return {"baseline": baseline, "unit_s": unit_s, "match_fraction": match_fraction,
            "match_threshold": match_fraction * float(np.nanmax(baseline_curve["median"])),
            "family": family, "primary": _primary(edition.primary, conditions, baseline),
            "grpo_gain": {k: gain[k] for k in ("n", "mean", "median", "interval", "interval_kind", "p", "resolved")},
            "positive_control": _positive_control(scores), "conditions": conditions, "pairs": pair_stats}


def _condition(rs: Sequence[Mapping], per_seed: Mapping[int, Mapping[str, float]], baseline_runs: Sequence[Mapping],
               unit_s: float, match_fraction: float) -> dict:
    """One condition's figures: its scores (median over seeds, and per seed), its to-match ratios
    against the baseline, and its costs."""
    last = [max(r["evals"], key=lambda e: e["step"]) for r in rs]
    bands = list(last[0].get("by_band", {}))
    return {
        "seeds": len(rs),
        "seed_ids": sorted(per_seed),
        **{k: float(np.median([s[k] for s in per_seed.values()])) for k in SCORES},
        "per_seed": {k: {seed: s[k] for seed, s in sorted(per_seed.items())} for k in SCORES},
        "final_acc_iqr": np.percentile([s["final_acc"] for s in per_seed.values()], [25, 75]).tolist(),
        "final_acc_by_band": {b: float(np.median([e["by_band"][b] for e in last])) for b in bands},
        "median_curve": median_curve(rs),
        **condition_to_match(rs, baseline_runs, unit_s, match_fraction),
        "mean_response_tokens": float(np.mean([e["response_tokens"] for e in last])),
        **condition_costs(rs, unit_s),
        "seconds_vs_baseline": seconds_vs_baseline(rs, baseline_runs),
    }


def median_curve(rs: Sequence[Mapping]) -> dict[int, float] | None:
    """The median over seeds of held-out accuracy at each checkpoint step; None when the runs were
    evaluated at different steps (a run that ended early)."""
    steps = [tuple(e["step"] for e in r["evals"]) for r in rs]
    if len(set(steps)) != 1:
        return None
    return {step: float(np.median([r["evals"][i]["accuracy"] for r in rs])) for i, step in enumerate(steps[0])}


def _aes(condition: Mapping, baseline: Mapping) -> float | None:
    """AES of a condition's final accuracy and response length against the baseline's; None when
    the baseline's accuracy is 0 (AES undefined)."""
    try:
        return aes(condition["final_acc"], condition["mean_response_tokens"], baseline["final_acc"],
                   baseline["mean_response_tokens"])
    except ValueError:
        return None


def _family_tests(pair_stats: dict, family: Sequence[tuple[str, str]], planned: Sequence[str]) -> list[str]:
    """Holm-adjusted p and verdict on final_acc for the family's pairs of the planned conditions,
    and the selection pairs' equivalence tests, added to `pair_stats` in place. Returns the
    family's pair names."""
    names = [f"{a}_vs_{b}" for a, b in family if a in planned and b in planned]
    adjusted = holm({name: pair_stats[name]["final_acc"]["p"] if name in pair_stats else 1.0 for name in names})
    for name in names:
        if name in pair_stats:
            stat = pair_stats[name]["final_acc"]
            stat |= {"p_holm": adjusted[name], "holm_family": len(names),
                     "resolved_holm": bool(stat["resolved"] and adjusted[name] < ALPHA)}
    for a, b in SELECTION_PAIRS:
        if f"{a}_vs_{b}" in pair_stats:
            stat = pair_stats[f"{a}_vs_{b}"]["final_acc"]
            stat["equivalence"] = equivalence(stat["diffs"], EQUIVALENCE_MARGIN)
    return names


def _primary(pair: tuple[str, str] | None, conditions: Mapping[str, Mapping], baseline: str) -> dict | None:
    """The edition's primary question: rollouts-to-match of A against the baseline B, its interval,
    p and verdict (`se_match.primary_verdict`); None for an edition without one."""
    if pair is None:
        return None
    a, b = pair
    if b != baseline:
        raise ValueError(f"the primary pair {pair} is read against the baseline, {baseline!r}")
    out = {"pair": f"{a}_vs_{b}", "score": "rollouts to match"}
    if a not in conditions:
        return out | {"n": 0, "ratio": None, "interval": [None, None], "interval_kind": "not run", "p": None,
                      "verdict": "not run"}
    s = conditions[a]
    interval = s["rollouts_to_match_interval"] or [None, None]  # None: runs that end at different steps
    return out | {"n": len(set(s["seed_ids"]) & set(conditions[b]["seed_ids"])),
                  "ratio": s["rollouts_to_match_ratio"], "interval": interval,
                  "interval_kind": s["rollouts_to_match_interval_kind"], "p": s["rollouts_to_match_p"],
                  "verdict": primary_verdict(s["rollouts_to_match_ratio"], interval, s["rollouts_to_match_p"])}


def _positive_control(scores: Mapping) -> dict | None:
    """POSITIVE_CONTROL's final_acc difference, paired by seed; None when it did not run."""
    a, b = POSITIVE_CONTROL
    if a not in scores or b not in scores:
        return None
    stat = _pair(scores[a], scores[b])["final_acc"]
    return {"pair": f"{a}_vs_{b}", **{k: stat[k] for k in ("n", "mean", "median", "interval", "interval_kind", "p",
                                                            "resolved", "mde")}}


def _pair(a: Mapping[int, Mapping[str, float]], b: Mapping[int, Mapping[str, float]]) -> dict:
    """Every score's paired difference A - B (seed -> scores), with the MDE beside final_acc's."""
    stats = {k: paired_difference({s: v[k] for s, v in a.items()}, {s: v[k] for s, v in b.items()})
             for k in SCORES}
    stats["final_acc"]["mde"] = minimal_detectable_effect(stats["final_acc"]["diffs"])
    return stats
