"""Analysis of the sample-efficiency lab: pure functions over run records (no Ray, no torch).

A run record is a dict (the JSON `run.json` each finished run leaves):

    {"condition": "advantage", "seed": 1,
     "rollouts_per_step": 128,                 # fresh (generated) rollouts per training step
     "steps": [{"step": 1, "reward": 0.31, "response_tokens": 6.2,
                "generation_s": 1.9, "make_experience_s": 0.8, "ppo_train_s": 1.1,
                "broadcast_s": 0.2, "optimizer_steps": 2}, ...],
     "evals": [{"step": 0, "accuracy": 0.30, "response_tokens": 6.0}, ...]}

Compute units (docs/METHOD.md section 4, after Arnal et al.): one optimizer step of the GRPO baseline
costs 1. Its price in seconds, `unit_s`, is measured: the baseline runs' total `ppo_train_s`
divided by their total optimizer steps. A step's cost is then

    training units   = (ppo_train_s + broadcast_s) / unit_s      (updates, incl. replayed ones,
                                                                  and the weight sync they need)
    generation units = (generation_s + make_experience_s) / unit_s  (sampling, reward grading,
                                                                  log-probs of fresh rollouts)

and a run's cost at step t is the sum over its steps 1..t. Replay adds training units without
adding generation units; the plots show both axes.

Curves over seeds: at each x, the median and the 25th / 75th percentiles (numpy's linear
interpolation) of the runs that have a value there. Held-out evaluations happen at the same
steps in every run, so curves against steps and rollouts need no interpolation; against compute
units each run's curve is interpolated linearly onto a common grid, within its own range only.

`rollouts_to_match_ratio`: the threshold is `match_fraction` (0.98) x the baseline's best
accuracy, where "best" is the maximum over checkpoints of the baseline's median-over-seeds
held-out accuracy. For a condition, the rollouts at which its median curve first reaches the
threshold, divided by the same for the baseline; None when its median curve never reaches it.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np

BASELINE = "none"


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
        "rollouts": np.arange(len(steps) + 1, dtype=float) * run["rollouts_per_step"],
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


def first_reach(x: Sequence[float], y: Sequence[float], threshold: float) -> float | None:
    """The first x whose y >= threshold (a small tolerance for float noise); None if never."""
    for xi, yi in zip(x, y):
        if not math.isnan(yi) and yi >= threshold - 1e-12:
            return float(xi)
    return None


def rollouts_to_match_ratio(condition_curve: dict, baseline_curve: dict,
                            match_fraction: float = 0.98) -> float | None:
    """Rollouts for the condition's median curve to reach match_fraction x the baseline's best,
    over the rollouts the baseline's median curve needs; None when the condition never does."""
    threshold = match_fraction * float(np.nanmax(baseline_curve["median"]))
    base = first_reach(baseline_curve["x"], baseline_curve["median"], threshold)
    mine = first_reach(condition_curve["x"], condition_curve["median"], threshold)
    if mine is None or base is None:
        return None
    if base == 0:  # the baseline's threshold was met before any rollout (by the start model)
        return 1.0 if mine == 0 else math.inf
    return mine / base


def summarize(runs: Sequence[Mapping], baseline: str = BASELINE, match_fraction: float = 0.98) -> dict:
    """The per-condition summary of a sweep (see the module docstring for each figure)."""
    from evaluation.metrics import aes

    by_condition: dict[str, list[Mapping]] = {}
    for run in runs:
        by_condition.setdefault(run["condition"], []).append(run)
    if baseline not in by_condition:
        raise ValueError(f"no run of the baseline condition {baseline!r}; have {sorted(by_condition)}")
    unit_s = unit_seconds(by_condition[baseline])
    curves = {c: aggregate([eval_curve(r, unit_s, "rollouts") for r in rs]) for c, rs in by_condition.items()}
    final = {}
    for c, rs in by_condition.items():
        last = [max(r["evals"], key=lambda e: e["step"]) for r in rs]
        final[c] = {"accuracy": float(np.median([e["accuracy"] for e in last])),
                    "response_tokens": float(np.mean([e["response_tokens"] for e in last]))}
    base = final[baseline]
    summary = {"conditions": list(by_condition), "baseline": baseline, "unit_s": unit_s,
               "match_fraction": match_fraction,
               "baseline_best_acc": float(np.nanmax(curves[baseline]["median"]))}
    for c, rs in by_condition.items():
        axes = [cumulative_axes(r, unit_s) for r in rs]
        try:
            aes_value = aes(final[c]["accuracy"], final[c]["response_tokens"], base["accuracy"],
                            base["response_tokens"])
        except ValueError:  # baseline accuracy 0: AES undefined
            aes_value = None
        best = int(np.nanargmax(curves[c]["median"]))
        summary[c] = {
            "seeds": sorted(r["seed"] for r in rs),
            "best_acc": float(curves[c]["median"][best]),
            "best_acc_rollouts": float(curves[c]["x"][best]),
            "best_acc_per_seed": [max(e["accuracy"] for e in r["evals"]) for r in rs],
            "final_acc": final[c]["accuracy"],
            "rollouts_to_match_ratio": rollouts_to_match_ratio(curves[c], curves[baseline], match_fraction),
            "mean_response_tokens": final[c]["response_tokens"],
            "aes_vs_grpo": aes_value,
            "total_rollouts": float(np.median([a["rollouts"][-1] for a in axes])),
            "compute_units": float(np.median([a["compute_units"][-1] for a in axes])),
            "train_units": float(np.median([a["train_units"][-1] for a in axes])),
            "generation_units": float(np.median([a["generation_units"][-1] for a in axes])),
            "final_train_reward": float(np.median([np.mean([s["reward"] for s in r["steps"][-3:]])
                                                   for r in rs])),
        }
    return summary
