"""Uncertainty and paired comparisons over per-problem outcomes.

- `problem_outcomes`: each benchmark's problems with their correct / total sample counts.
- `run_intervals`: bootstrap 95% CIs of a run's accuracy per benchmark and of its macro average.
  Problems are resampled with replacement; with n > 1 samples per problem the samples are
  resampled too (within each drawn problem: Binomial(n, c/n) correct, the exact equivalent of
  drawing n of its graded samples with replacement).
- `paired_comparison`: a run against the baseline on the problems both answered, matched by
  problem id: the difference, its paired bootstrap CI (the same problems drawn for both), an
  exact test, the problems that flipped, and AES with its CI.
- `seed_groups` / `seed_comparison`: runs named `<condition>_seed<N>` grouped by condition:
  median, IQR and a Student-t CI over seeds, and a sign test over seeds paired by seed number.

Tests, all two-sided, "resolved" = p < 1 - level:
- a benchmark: the exact McNemar test on the problems that flipped (one sample per problem), or,
  with several samples, the sign test on per-problem accuracy differences (the same formula);
- the macro average: a paired sign-flip randomisation test on the per-problem differences,
  weighted as the macro average weights them (1 / (benchmarks x problems));
- across seeds: the sign test on per-seed differences.
Every random draw is seeded from the run's `seed` and the benchmark name, so reports are
reproducible and a benchmark's interval does not depend on which others are compared.
"""
from __future__ import annotations

import hashlib
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from evaluation.metrics import (CHUNK_DRAWS, aes, bootstrap_draws, mcnemar_p,
                                mean_t_interval, percentile_interval)
from evaluation.records import SampleRecord

N_RESAMPLES = 10_000
LEVEL = 0.95
SEED_NAME = re.compile(r"^(?P<condition>.+)_seed(?P<seed>\d+)$")


def stream_seed(seed: int, *keys: object) -> int:
    """A stable 63-bit seed for one random stream (e.g. one benchmark) under a base seed."""
    digest = hashlib.sha256("\0".join(map(str, (seed, *keys))).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class ProblemOutcomes:
    """One run's per-problem results on one benchmark, in the run's problem order."""

    benchmark: str
    problem_ids: tuple[str, ...]
    n_correct: np.ndarray
    """(P,) correct samples of each problem."""
    n_samples: np.ndarray
    """(P,) graded samples of each problem."""
    mean_tokens: np.ndarray
    """(P,) mean response tokens of each problem's samples."""

    @property
    def per_problem(self) -> np.ndarray:
        """(P,) fraction of each problem's samples that are correct."""
        return self.n_correct / self.n_samples

    @property
    def accuracy(self) -> float:
        """avg@n: the mean over problems of their fraction correct (as `metrics.summarize`)."""
        return float(self.per_problem.mean())

    @property
    def single_sample(self) -> bool:
        return bool((self.n_samples == 1).all())

    def take(self, ids: Sequence[str]) -> "ProblemOutcomes":
        """The outcomes of `ids` (each must be present), in that order."""
        where = {pid: i for i, pid in enumerate(self.problem_ids)}
        idx = np.array([where[pid] for pid in ids], dtype=int)
        return ProblemOutcomes(self.benchmark, tuple(ids), self.n_correct[idx],
                               self.n_samples[idx], self.mean_tokens[idx])


def problem_outcomes(samples: Iterable[SampleRecord | Mapping]) -> dict[str, ProblemOutcomes]:
    """Per-benchmark `ProblemOutcomes` from graded samples, benchmarks and problems in the order
    first seen."""
    grouped: dict[str, dict[str, list[SampleRecord]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        r = s if isinstance(s, SampleRecord) else SampleRecord.from_dict(s)
        grouped[r.benchmark][r.problem_id].append(r)
    out = {}
    for bench, problems in grouped.items():
        groups = list(problems.values())
        out[bench] = ProblemOutcomes(
            bench, tuple(problems),
            np.array([sum(r.correct for r in g) for g in groups], dtype=np.int64),
            np.array([len(g) for g in groups], dtype=np.int64),
            np.array([sum(r.response_tokens for r in g) / len(g) for g in groups], dtype=float))
    return out


def _resampled_accuracy(o: ProblemOutcomes, idx: np.ndarray, rng: np.random.Generator
                        ) -> np.ndarray:
    """(r,) accuracies of the problem resamples `idx` (r, P); samples within a problem are
    resampled too when it has more than one."""
    if o.single_sample:
        return o.per_problem[idx].mean(axis=1)
    n = o.n_samples[idx]
    return (rng.binomial(n, o.per_problem[idx]) / n).mean(axis=1)


def accuracy_draws(o: ProblemOutcomes, seed: int = 0,
                   n_resamples: int = N_RESAMPLES) -> np.ndarray:
    """(R,) bootstrap draws of one run's accuracy on one benchmark."""
    return bootstrap_draws(len(o.problem_ids), n_resamples, stream_seed(seed, o.benchmark),
                           lambda idx, rng: _resampled_accuracy(o, idx, rng))


def run_intervals(outcomes: Mapping[str, ProblemOutcomes], averaged: Sequence[str],
                  seed: int = 0, level: float = LEVEL,
                  n_resamples: int = N_RESAMPLES) -> dict[str, tuple[float, float]]:
    """{benchmark: (lo, hi)} accuracy CIs, plus "avg": the CI of the macro average over
    `averaged` (benchmarks are independent problem sets, so their draws are averaged)."""
    draws = {b: accuracy_draws(o, seed, n_resamples) for b, o in outcomes.items()}
    out = {b: percentile_interval(d, level) for b, d in draws.items()}
    if averaged and all(b in draws for b in averaged):
        out["avg"] = percentile_interval(np.mean([draws[b] for b in averaged], axis=0), level)
    return out


@dataclass(frozen=True)
class PairedDifference:
    """A run minus the baseline on one benchmark (or "avg"), over the problems both have."""

    benchmark: str
    n_shared: int
    """Problems in both runs (the pairs)."""
    diff: float
    """Run accuracy minus baseline accuracy on the shared problems (a fraction, not %)."""
    ci: tuple[float, float]
    p_value: float
    test: str
    """"McNemar", "sign test" (several samples per problem) or "sign-flip" (the average)."""
    resolved: bool
    """p < 1 - level: the difference is resolved at that level."""
    gained: tuple[str, ...]
    """Ids of problems the run does better on (for one sample: baseline wrong, run right)."""
    lost: tuple[str, ...]
    """Ids of problems the run does worse on."""


@dataclass(frozen=True)
class PairedComparison:
    """Everything `compare` reports for one run against the baseline."""

    per_benchmark: dict[str, PairedDifference]
    average: PairedDifference | None
    """Over the averaged benchmarks; None when the run lacks one of them."""
    aes_ci: tuple[float, float] | None
    """CI of AES on the shared problems of the averaged benchmarks (its upper end is infinite
    when over 2.5% of the draws give the baseline no correct answer); None without an average
    or when the baseline gets none of them right (AES is then undefined)."""


def _paired_draws(base: ProblemOutcomes, run: ProblemOutcomes, seed: int,
                  n_resamples: int) -> np.ndarray:
    """(R, 4) draws of (base acc, run acc, base tokens, run tokens), the same problems drawn
    for both runs (`base` and `run` hold the same problem ids in the same order)."""
    def stat(idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.stack([_resampled_accuracy(base, idx, rng), _resampled_accuracy(run, idx, rng),
                         base.mean_tokens[idx].mean(axis=1), run.mean_tokens[idx].mean(axis=1)],
                        axis=1)
    draws = bootstrap_draws(len(base.problem_ids), n_resamples,
                            stream_seed(seed, "paired", base.benchmark), stat)
    return draws.reshape(-1, 4)


def _sign_flip_p(diffs: Sequence[np.ndarray], seed: int, n_resamples: int) -> float:
    """Two-sided randomisation p-value of the macro mean of per-problem differences: each
    problem's difference keeps or flips its sign at random (exchangeable under no effect)."""
    weights = np.concatenate([np.full(len(d), 1 / (len(d) * len(diffs))) for d in diffs])
    wd = weights * np.concatenate(diffs)
    observed = abs(wd.sum())
    if observed == 0:
        return 1.0
    rng = np.random.default_rng(stream_seed(seed, "sign-flip"))
    hits, block = 0, max(1, CHUNK_DRAWS // len(wd))
    for start in range(0, n_resamples, block):
        signs = rng.integers(0, 2, size=(min(block, n_resamples - start), len(wd))) * 2 - 1
        hits += int((np.abs(signs @ wd) >= observed * (1 - 1e-12)).sum())
    return (hits + 1) / (n_resamples + 1)  # the observed labelling counts as one


def paired_comparison(base: Mapping[str, ProblemOutcomes], run: Mapping[str, ProblemOutcomes],
                      averaged: Sequence[str], seed: int = 0, level: float = LEVEL,
                      n_resamples: int = N_RESAMPLES) -> PairedComparison:
    """`run` against `base`, per benchmark both have and over `averaged` (see the module doc)."""
    per, draws, diffs, base_acc = {}, {}, {}, {}
    for bench in [b for b in base if b in run]:
        wanted = set(run[bench].problem_ids)
        shared = [pid for pid in base[bench].problem_ids if pid in wanted]
        if not shared:
            continue
        b, r = base[bench].take(shared), run[bench].take(shared)
        d = r.per_problem - b.per_problem
        gained = tuple(pid for pid, x in zip(shared, d) if x > 0)
        lost = tuple(pid for pid, x in zip(shared, d) if x < 0)
        p = mcnemar_p(len(lost), len(gained))
        draws[bench] = _paired_draws(b, r, seed, n_resamples)
        diffs[bench], base_acc[bench] = d, b.accuracy
        per[bench] = PairedDifference(
            bench, len(shared), float(d.mean()),
            percentile_interval(draws[bench][:, 1] - draws[bench][:, 0], level), p,
            "McNemar" if b.single_sample and r.single_sample else "sign test",
            p < 1 - level, gained, lost)
    if not averaged or not all(b in per for b in averaged):
        return PairedComparison(per, None, None)
    mean = np.mean([draws[b] for b in averaged], axis=0)  # (R, 4) macro averages
    p = _sign_flip_p([diffs[b] for b in averaged], seed, n_resamples)
    average = PairedDifference(
        "avg", sum(per[b].n_shared for b in averaged),
        float(np.mean([per[b].diff for b in averaged])),
        percentile_interval(mean[:, 1] - mean[:, 0], level), p, "sign-flip", p < 1 - level,
        tuple(f"{b}/{pid}" for b in averaged for pid in per[b].gained),
        tuple(f"{b}/{pid}" for b in averaged for pid in per[b].lost))
    aes_ci = None
    if np.mean([base_acc[b] for b in averaged]) > 0 and (mean[:, 2] > 0).all():  # else no AES
        aes_ci = percentile_interval([_aes_draw(*row) for row in mean], level)
    return PairedComparison(per, average, aes_ci)


def _aes_draw(base_acc: float, acc: float, base_tok: float, tok: float) -> float:
    """AES of one bootstrap draw. AES measures accuracy relative to the baseline's, so a draw
    where the baseline gets nothing right has an infinite gain (any accuracy > 0), or no
    accuracy change at all (both 0): then only the length term is left."""
    if base_acc > 0:
        return aes(acc, tok, base_acc, base_tok)
    if acc > 0:
        return math.inf
    return aes(1.0, tok, 1.0, base_tok)  # equal accuracies: AES = alpha * dLen


# ---- seeds ------------------------------------------------------------------------------------

def split_seed(label: str) -> tuple[str, int | None]:
    """`grpo_replay_seed42` -> ("grpo_replay", 42); a label without `_seed<N>` -> (label, None)."""
    match = SEED_NAME.match(label)
    return (match["condition"], int(match["seed"])) if match else (label, None)


@dataclass(frozen=True)
class SeedGroup:
    """The runs of one condition with different seeds, and their spread per column."""

    condition: str
    seeds: tuple[int, ...]
    labels: tuple[str, ...]
    values: dict[str, tuple[float | None, ...]]
    """{column: one value per seed} (accuracy fractions; None where a run lacks the column)."""

    def stats(self, column: str, level: float = LEVEL) -> dict | None:
        """median, q1, q3 (IQR = q3 - q1), mean and a Student-t CI of the mean over seeds."""
        xs = [v for v in self.values[column] if v is not None]
        if len(xs) < 2:
            return None
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        return {"n": len(xs), "median": statistics.median(xs), "q1": q1, "q3": q3,
                "mean": statistics.fmean(xs), "ci": mean_t_interval(xs, level)}


def seed_groups(rows: Sequence[tuple[str, Mapping[str, float | None]]]) -> list[SeedGroup]:
    """Group (label, {column: value}) rows by condition; only conditions with >= 2 seeds."""
    found: dict[str, list[tuple[int, str, Mapping]]] = defaultdict(list)
    for label, values in rows:
        condition, seed = split_seed(label)
        if seed is not None:
            found[condition].append((seed, label, values))
    groups = []
    for condition, members in found.items():
        if len({seed for seed, _, _ in members}) < 2:
            continue
        members.sort(key=lambda m: m[0])
        columns = list(dict.fromkeys(c for _, _, v in members for c in v))
        groups.append(SeedGroup(condition, tuple(m[0] for m in members),
                                tuple(m[1] for m in members),
                                {c: tuple(v.get(c) for _, _, v in members) for c in columns}))
    return groups


def seed_comparison(base: SeedGroup, group: SeedGroup, column: str,
                    level: float = LEVEL) -> dict | None:
    """`group` minus `base` on `column` over the seeds both have (paired by seed number):
    median difference, positive / negative counts and the sign test's p. None without pairs."""
    b = dict(zip(base.seeds, base.values.get(column, ())))
    pairs = [(v - b[s]) for s, v in zip(group.seeds, group.values.get(column, ()))
             if s in b and v is not None and b[s] is not None]
    if not pairs:
        return None
    pos, neg = sum(d > 0 for d in pairs), sum(d < 0 for d in pairs)
    p = mcnemar_p(neg, pos)
    return {"n": len(pairs), "median_diff": statistics.median(pairs), "positive": pos,
            "negative": neg, "p_value": p, "resolved": p < 1 - level,
            "min_p": mcnemar_p(0, len(pairs))}
