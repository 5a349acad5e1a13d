"""Analysis of the sample-efficiency lab: pure functions over run records (no Ray, no torch).

A run record is a dict (the JSON `run.json` each finished run leaves):

    {"condition": "advantage", "seed": 1,
     "rollouts_per_step": 128,                 # fresh (generated) rollouts per training step
     "steps": [{"step": 1, "reward": 0.31, "response_tokens": 6.2,
                "generation_s": 1.9, "make_experience_s": 0.8, "ppo_train_s": 1.1,
                "broadcast_s": 0.2, "optimizer_steps": 2, "replayed_rollouts": 64,
                "train_tokens": 1344}, ...],
     "evals": [{"step": 0, "accuracy": 0.30, "accuracy_greedy": 0.41, "response_tokens": 6.0,
                "by_band": {"add 2d+1d": 0.9, ...}}, ...]}

Compute units (docs/METHOD.md section 4, after Arnal et al.): one optimizer step of the GRPO baseline
costs 1. Its price in seconds, `unit_s`, is measured: the baseline runs' total `ppo_train_s`
divided by their total optimizer steps. A step's cost is then

    training units   = (ppo_train_s + broadcast_s) / unit_s      (updates, incl. replayed ones,
                                                                  and the weight sync they need)
    generation units = (generation_s + make_experience_s) / unit_s  (sampling, reward grading,
                                                                  log-probs of fresh rollouts)

and a run's cost at step t is the sum over its steps 1..t. Replay adds training units without
adding generation units; the plots show both axes.

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
the same prompt order and the same warm start): their mean, an interval (`interval`, its kind
in `interval_kind`), and the exact two-sided sign-flip permutation p-value of their mean (the
sign test's p beside it). From `MIN_SEEDS_FOR_CI` (6) seeds the interval is the 95% interval of
the mean that inverts that test (the shifts it does not reject), so the interval excludes 0
exactly when p < 0.05; below that it is the [min, max] of the differences, and called so. A
difference is "resolved" when p < 0.05; with n seeds the smallest possible p is 2 / 2**n (0.25
at 3 seeds, 0.0078 at 8).

Curves over seeds: at each x, the median and the 25th / 75th percentiles (numpy's linear
interpolation) of the runs that have a value there. Held-out evaluations happen at the same
steps in every run, so curves against steps and rollouts need no interpolation; against compute
units each run's curve is interpolated linearly onto a common grid, within its own range only.

`rollouts_to_match_ratio` / `compute_to_match_ratio`: the threshold is `match_fraction` (0.98)
x the maximum of the baseline's median curve (a level the baseline's median curve does reach).
For a condition, the rollouts (compute units) at which its median curve first reaches the
threshold, over the same for the baseline's median curve over the same seeds (so a condition run
at 3 seeds is compared with the baseline's runs at those 3 seeds); None when its median curve
never reaches it. The compute median curve pairs, at each evaluated step, the median over seeds
of the compute spent with the median accuracy.
Their `_interval` is over the same seeds: from 6 seeds a percentile-bootstrap 95% interval (the
seeds are resampled together, seed s of the condition with seed s of the baseline, both median
curves and the threshold recomputed); below 6 the [min, max] of the seeds' own ratios (seed s's
curve against the baseline's seed s). A condition that never reaches the threshold counts as an
infinite ratio (an upper bound of None means "may never match").
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np

from evaluation.metrics import aes
from se_stats import (ALPHA, INTERVAL_KINDS, MIN_SEEDS_FOR_CI, equivalence, holm,  # noqa: F401
                      minimal_detectable_effect, paired_difference, sign_flip_p, verdict)

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
"""The family Holm's adjustment runs over: those of these pairs whose two conditions the sweep
plans (`summarize`'s `planned`), run or not (a pair not run counts as p = 1)."""
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


def unit_seconds(baseline_runs: Iterable[Mapping]) -> float:
    """Seconds of one baseline optimizer step: total ppo_train_s / total optimizer steps."""
    seconds = steps = 0.0
    for run in baseline_runs:
        for s in run["steps"]:
            seconds += s["ppo_train_s"]
            steps += s["optimizer_steps"]
    if steps <= 0 or seconds <= 0:
        raise ValueError("no baseline optimizer steps with a measured time: cannot price a compute unit")
    return seconds / steps


def generated_through(run: Mapping) -> np.ndarray:
    """(T + 1,) rollouts generated by the end of each step (index 0: none): each step's own count
    where it logged one (dynamic filtering generates the groups it drops too), else the run's
    rollouts per step."""
    steps = sorted(run["steps"], key=lambda s: s["step"])
    per_step = [s.get("generated_rollouts", run["rollouts_per_step"]) for s in steps]
    return np.concatenate([np.zeros(1), np.cumsum(np.asarray(per_step, dtype=float))])


def cumulative_axes(run: Mapping, unit_s: float) -> dict[str, np.ndarray]:
    """Per training step (1..T): step, cumulative generated rollouts and compute units.

    Index 0 is the start (step 0: nothing generated, nothing spent), so arrays have T + 1 entries.
    """
    steps = sorted(run["steps"], key=lambda s: s["step"])
    if [s["step"] for s in steps] != list(range(1, len(steps) + 1)):
        raise ValueError(f"run {run.get('condition')}/{run.get('seed')}: steps are not 1..{len(steps)}")
    train_u = np.array([(s["ppo_train_s"] + s["broadcast_s"]) / unit_s for s in steps])
    gen_u = np.array([(s["generation_s"] + s["make_experience_s"]) / unit_s for s in steps])
    zero = np.zeros(1)
    return {
        "step": np.arange(len(steps) + 1, dtype=float),
        "rollouts": generated_through(run),
        "train_units": np.concatenate([zero, np.cumsum(train_u)]),
        "generation_units": np.concatenate([zero, np.cumsum(gen_u)]),
        "compute_units": np.concatenate([zero, np.cumsum(train_u + gen_u)]),
    }


def eval_curve(run: Mapping, unit_s: float, axis: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, held-out accuracy) at the run's evaluated steps, x on `axis` (see cumulative_axes)."""
    axes = cumulative_axes(run, unit_s)
    evals = sorted(run["evals"], key=lambda e: e["step"])
    x = np.array([axes[axis][e["step"]] for e in evals])
    return x, np.array([e["accuracy"] for e in evals], dtype=float)


def reward_curve(run: Mapping, unit_s: float, axis: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, training reward of the fresh rollouts) per step, x = the axis value after that step."""
    axes = cumulative_axes(run, unit_s)
    steps = sorted(run["steps"], key=lambda s: s["step"])
    return axes[axis][1:], np.array([s["reward"] for s in steps], dtype=float)


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


def median_step_curve(runs: Sequence[Mapping], unit_s: float, axis: str) -> dict:
    """At each evaluated step (the same in every run): x = the median over runs of `axis` there,
    median = the median accuracy. Against steps or rollouts this is `aggregate`'s median curve;
    against compute units it needs no interpolation, so a first-reach reads off a checkpoint."""
    curves = [eval_curve(r, unit_s, axis) for r in runs]
    if any(len(x) != len(curves[0][0]) for x, _ in curves):
        raise ValueError("runs were evaluated at different steps")
    return {"x": np.median([x for x, _ in curves], axis=0), "median": np.median([y for _, y in curves], axis=0)}


def first_reach(x: Sequence[float], y: Sequence[float], threshold: float) -> float | None:
    """The first x whose y >= threshold (a small tolerance for float noise); None if never."""
    for xi, yi in zip(x, y):
        if not math.isnan(yi) and yi >= threshold - 1e-12:
            return float(xi)
    return None


def to_match_ratio(condition_curve: dict, baseline_curve: dict, match_fraction: float = 0.98) -> float | None:
    """x (rollouts, compute units) for the condition's median curve to reach match_fraction x the
    maximum of the baseline's median curve, over the x the baseline's own median curve needs;
    None when the condition never does."""
    threshold = match_fraction * float(np.nanmax(baseline_curve["median"]))
    base = first_reach(baseline_curve["x"], baseline_curve["median"], threshold)
    mine = first_reach(condition_curve["x"], condition_curve["median"], threshold)
    if mine is None or base is None:
        return None
    if base == 0:  # the baseline's threshold was met before any rollout (by the start model)
        return 1.0 if mine == 0 else math.inf
    return mine / base


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


def to_match_interval(runs: Sequence[Mapping], baseline_runs: Sequence[Mapping], unit_s: float, axis: str,
                      match_fraction: float = 0.98, n_resamples: int = 2000, seed: int = 0) -> tuple[list, str]:
    """(interval, its kind) of `to_match_ratio` over the seeds both conditions have (module
    docstring); inf (never reaches the threshold) is reported as None."""
    by_seed = {r["seed"]: r for r in runs}
    base_by_seed = {r["seed"]: r for r in baseline_runs}
    seeds = sorted(set(by_seed) & set(base_by_seed))
    if not seeds:
        raise ValueError("no seed in common with the baseline")
    curves = [[eval_curve(group[s], unit_s, axis) for s in seeds] for group in (by_seed, base_by_seed)]
    (x, y), (bx, by) = ((np.array([c[0] for c in cs]), np.array([c[1] for c in cs])) for cs in curves)
    enough = len(seeds) >= MIN_SEEDS_FOR_CI
    if not enough:  # each seed's own ratio, as its [min, max]
        idx = np.arange(len(seeds))[:, None]
        n_resamples = len(seeds)
    else:
        idx = np.random.default_rng(seed).integers(0, len(seeds), size=(n_resamples, len(seeds)))
    med = {k: np.median(v[idx], axis=1) for k, v in {"x": x, "y": y, "bx": bx, "by": by}.items()}  # (R, E)
    ratios = [to_match_ratio({"x": med["x"][i], "median": med["y"][i]},
                             {"x": med["bx"][i], "median": med["by"][i]}, match_fraction) for i in range(n_resamples)]
    ratios = np.array([math.inf if r is None else r for r in ratios])
    if enough:
        lo, hi = np.quantile(ratios, [0.025, 0.975], method="inverted_cdf")  # sample values, so inf survives
    else:
        lo, hi = ratios.min(), ratios.max()
    kind = "95% percentile bootstrap" if enough else "min-max"
    return [None if math.isinf(v) else float(v) for v in (lo, hi)], kind


# ----------------------------------------------------------------------------------- summary

def summarize(runs: Sequence[Mapping], baseline: str = BASELINE, match_fraction: float = 0.98,
              pairs: Sequence[tuple[str, str]] = PAIRS, planned: Sequence[str] | None = None) -> dict:
    """The sweep's summary: per condition (figures in the module docstring) and per pair.

    {"conditions": {name: {"seeds": n, "best_acc", "final_acc", "auc", ...}},
     "pairs": {"A_vs_B": {"final_acc": paired_difference + "mde", "best_acc": ..., "auc": ...,
                          "final_acc_greedy": ..., ...}},
     "grpo_gain": the baseline's final_acc minus its step-0 accuracy, paired by seed,
     "positive_control": POSITIVE_CONTROL's final_acc difference (None when it did not run), ...}
    Pairs whose conditions are not both present are left out. Each pre-registered pair's final_acc
    also has `p_holm` (Holm over the pre-registered pairs of the `planned` conditions, default the
    runs' own) and `resolved_holm`; a selection pair's has `equivalence` (`EQUIVALENCE_MARGIN`).
    """
    by_condition: dict[str, list[Mapping]] = {}
    for run in runs:
        by_condition.setdefault(run["condition"], []).append(run)
    if baseline not in by_condition:
        raise ValueError(f"no run of the baseline condition {baseline!r}; have {sorted(by_condition)}")
    unit_s = unit_seconds(by_condition[baseline])
    baseline_curve = median_step_curve(by_condition[baseline], unit_s, "rollouts")
    scores = {c: {r["seed"]: seed_scores(r) for r in rs} for c, rs in by_condition.items()}
    final = {}
    for c, rs in by_condition.items():
        last = [max(r["evals"], key=lambda e: e["step"]) for r in rs]
        final[c] = {"accuracy": float(np.median([e["accuracy"] for e in last])),
                    "response_tokens": float(np.mean([e["response_tokens"] for e in last])), "evals": last}
    conditions = {}
    for c, rs in by_condition.items():
        try:
            aes_value = aes(final[c]["accuracy"], final[c]["response_tokens"], final[baseline]["accuracy"],
                            final[baseline]["response_tokens"])
        except ValueError:  # baseline accuracy 0: AES undefined
            aes_value = None
        per_seed = scores[c]
        bands = list(final[c]["evals"][0].get("by_band", {}))
        conditions[c] = {
            "seeds": len(rs),
            "seed_ids": sorted(per_seed),
            **{k: float(np.median([s[k] for s in per_seed.values()])) for k in SCORES},
            "per_seed": {k: {seed: s[k] for seed, s in sorted(per_seed.items())} for k in SCORES},
            "final_acc_iqr": np.percentile([s["final_acc"] for s in per_seed.values()], [25, 75]).tolist(),
            "final_acc_by_band": {b: float(np.median([e["by_band"][b] for e in final[c]["evals"]])) for b in bands},
            **_to_match(rs, by_condition[baseline], unit_s, match_fraction),
            "mean_response_tokens": final[c]["response_tokens"],
            "aes_vs_grpo": aes_value,
            **_costs(rs, unit_s),
        }
    pair_stats = {f"{a}_vs_{b}": _pair(scores[a], scores[b]) for a, b in pairs if a in scores and b in scores}
    _preregistered_tests(pair_stats, planned if planned is not None else list(by_condition))
    start = {r["seed"]: min(r["evals"], key=lambda e: e["step"])["accuracy"] for r in by_condition[baseline]}
    gain = paired_difference({s: v["final_acc"] for s, v in scores[baseline].items()}, start)
    control = _positive_control(scores)
    return {"baseline": baseline, "unit_s": unit_s, "match_fraction": match_fraction,
            "match_threshold": match_fraction * float(np.nanmax(baseline_curve["median"])),
            "grpo_gain": {k: gain[k] for k in ("n", "median", "interval", "interval_kind", "p", "resolved")},
            "positive_control": control, "conditions": conditions, "pairs": pair_stats}


def _preregistered_tests(pair_stats: dict, planned: Sequence[str]) -> None:
    """Holm-adjusted p and verdict on final_acc for the pre-registered pairs, and the selection
    pairs' equivalence tests, added to `pair_stats` in place."""
    family = [f"{a}_vs_{b}" for a, b in PREREGISTERED if a in planned and b in planned]
    adjusted = holm({name: pair_stats[name]["final_acc"]["p"] if name in pair_stats else 1.0 for name in family})
    for name in family:
        if name in pair_stats:
            stat = pair_stats[name]["final_acc"]
            stat |= {"p_holm": adjusted[name], "holm_family": len(family),
                     "resolved_holm": bool(stat["resolved"] and adjusted[name] < ALPHA)}
    for a, b in SELECTION_PAIRS:
        if f"{a}_vs_{b}" in pair_stats:
            stat = pair_stats[f"{a}_vs_{b}"]["final_acc"]
            stat["equivalence"] = equivalence(stat["diffs"], EQUIVALENCE_MARGIN)


def _to_match(rs: Sequence[Mapping], baseline_runs: Sequence[Mapping], unit_s: float, match_fraction: float) -> dict:
    """Rollouts- and compute-to-match: the point estimate and its interval on the same seeds, the
    condition's and the baseline's runs of the seeds both have (module docstring). None for runs
    evaluated at different steps (they ended with the pool at different steps): their median
    curve has no common points to read off."""
    if len({tuple(e["step"] for e in r["evals"]) for r in list(rs) + list(baseline_runs)}) > 1:
        return {f"{name}_to_match_{k}": None for name in ("rollouts", "compute") for k in ("ratio", "interval")} | {
            f"{name}_to_match_interval_kind": "n/a: runs end at different steps" for name in ("rollouts", "compute")}
    seeds = {r["seed"] for r in rs}
    matched = [r for r in baseline_runs if r["seed"] in seeds]
    out = {}
    for name, axis in (("rollouts", "rollouts"), ("compute", "compute_units")):
        ratio = to_match_ratio(median_step_curve(rs, unit_s, axis), median_step_curve(matched, unit_s, axis),
                               match_fraction)
        interval, kind = to_match_interval(rs, baseline_runs, unit_s, axis, match_fraction)
        out |= {f"{name}_to_match_ratio": ratio, f"{name}_to_match_interval": interval,
                f"{name}_to_match_interval_kind": kind}
    return out


def _costs(rs: Sequence[Mapping], unit_s: float) -> dict:
    """What a condition's runs cost, median over seeds: per step (tokens trained, optimizer steps,
    replayed rollouts), over the run (rollouts, compute units), and the training reward at its end."""
    axes = [cumulative_axes(r, unit_s) for r in rs]
    return {
        "train_tokens_per_step": float(np.median([np.mean([s["train_tokens"] for s in r["steps"]])
                                                  for r in rs])),
        "optimizer_steps_per_step": float(np.median([np.mean([s["optimizer_steps"] for s in r["steps"]])
                                                     for r in rs])),
        "replayed_per_step": float(np.median([np.mean([s["replayed_rollouts"] for s in r["steps"]])
                                              for r in rs])),
        "total_rollouts": float(np.median([a["rollouts"][-1] for a in axes])),
        "compute_units": float(np.median([a["compute_units"][-1] for a in axes])),
        "train_units": float(np.median([a["train_units"][-1] for a in axes])),
        "generation_units": float(np.median([a["generation_units"][-1] for a in axes])),
        "final_train_reward": float(np.median([np.mean([s["reward"] for s in r["steps"][-3:]]) for r in rs])),
    }


def _positive_control(scores: Mapping) -> dict | None:
    """POSITIVE_CONTROL's final_acc difference, paired by seed; None when it did not run."""
    a, b = POSITIVE_CONTROL
    if a not in scores or b not in scores:
        return None
    stat = _pair(scores[a], scores[b])["final_acc"]
    return {"pair": f"{a}_vs_{b}", **{k: stat[k] for k in ("n", "median", "interval", "interval_kind", "p",
                                                            "resolved", "mde")}}


def _pair(a: Mapping[int, Mapping[str, float]], b: Mapping[int, Mapping[str, float]]) -> dict:
    """Every score's paired difference A - B (seed -> scores), with the MDE beside final_acc's."""
    stats = {k: paired_difference({s: v[k] for s, v in a.items()}, {s: v[k] for s, v in b.items()})
             for k in SCORES}
    stats["final_acc"]["mde"] = minimal_detectable_effect(stats["final_acc"]["diffs"])
    return stats
