"""Metrics over graded samples: avg@n, unbiased pass@k, maj@n, AES, per-benchmark summaries,
and the statistics reports put on them: bootstrap CIs, the exact McNemar / sign test, Student-t
intervals over seeds.

Every sample counts in every denominator: unparseable and timed-out samples are wrong answers,
never dropped (docs/METHOD.md section 5).
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from evaluation.benchmarks import DEFAULT_BENCHMARKS
from evaluation.records import VERDICTS, SampleRecord

__all__ = ["SampleRecord", "pass_at_k", "avg_at_n", "maj_at_n", "aes", "summarize",
           "macro_average", "g_pass_at_k", "bootstrap_ci", "bootstrap_draws", "percentile_interval",
           "mcnemar_p", "student_t_quantile", "mean_t_interval"]

CHUNK_DRAWS = 2_000_000
"""Resampled items held in memory at once (a (resamples, items) index block of int64s)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the large binomials.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"pass_at_k: {name} must be an int, got {value!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; "
                         f"got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


G_PASS_TAUS = (0.5, 0.75, 1.0)
"""The thresholds `summarize` reports G-Pass@k at (LiveMathBench's)."""


def g_pass_at_k(n: int, c: int, k: int, tau: float) -> float:
    """G-Pass@k_tau (LiveMathBench): the chance that k of the n samples, drawn without
    replacement, hold at least ceil(tau * k) correct ones (at least one for tau = 0, where it
    is pass@k): sum_{j >= ceil(tau k)} C(c, j) C(n - c, k - j) / C(n, k). tau = 1 asks for k
    correct samples out of k, so it rewards a model that is right consistently."""
    pass_at_k(n, c, k)  # the same argument checks
    if not 0 <= tau <= 1:
        raise ValueError(f"g_pass_at_k needs 0 <= tau <= 1, got {tau}")
    need = max(1, math.ceil(tau * k - 1e-12))  # 1e-12: 0.75 * 4 is 3, not 3.0000000001
    hits = sum(math.comb(c, j) * math.comb(n - c, k - j) for j in range(need, min(c, k) + 1))
    return hits / math.comb(n, k)  # exact integers, one rounding


def avg_at_n(correct_flags: Sequence[bool]) -> float:
    """Mean accuracy over the n samples of one problem."""
    if len(correct_flags) == 0:
        raise ValueError("avg_at_n of no samples")
    return sum(bool(f) for f in correct_flags) / len(correct_flags)


def _vote_key(answer: str) -> str:
    return "".join(answer.split())


def maj_at_n(answers: Sequence[str | None], correct_flags: Sequence[bool]) -> float:
    """1.0 if the most frequent extracted answer is correct, else 0.0.

    Answers are compared after removing whitespace; None (nothing extracted) never wins. A tie
    goes to the answer that appeared first, and a group's correctness is that of its first
    sample. All None -> 0.0.
    """
    if len(answers) != len(correct_flags):
        raise ValueError(f"maj_at_n: {len(answers)} answers but {len(correct_flags)} flags")
    counts: Counter = Counter()
    first: dict[str, int] = {}
    for i, answer in enumerate(answers):
        if answer is not None:
            key = _vote_key(answer)
            counts[key] += 1
            first.setdefault(key, i)
    if not counts:
        return 0.0
    winner = max(counts, key=lambda key: (counts[key], -first[key]))
    return float(bool(correct_flags[first[winner]]))


def aes(acc: float, length: float, base_acc: float, base_length: float,
        alpha: float = 1.0, beta: float = 3.0, gamma: float = 5.0) -> float:
    """Accuracy-efficiency score against a baseline (O1-Pruner; docs/METHOD.md section 5).

    dLen = (base_length - length) / base_length; dAcc = (acc - base_acc) / base_acc (relative);
    AES = alpha * dLen + beta * |dAcc| if dAcc >= 0, else alpha * dLen - gamma * |dAcc|.
    """
    if base_acc <= 0 or base_length <= 0:
        raise ValueError(f"aes needs a baseline with accuracy > 0 and length > 0 (the deltas are "
                         f"relative to it); got base_acc={base_acc}, base_length={base_length}")
    if acc < 0 or length < 0:
        raise ValueError(f"aes needs acc >= 0 and length >= 0; got acc={acc}, length={length}")
    d_len = (base_length - length) / base_length
    d_acc = (acc - base_acc) / base_acc
    return alpha * d_len + (beta * abs(d_acc) if d_acc >= 0 else -gamma * abs(d_acc))


def _mean(values: list) -> float | None:
    return sum(values) / len(values) if values else None


def _summarize_one(records: list[SampleRecord]) -> dict:
    by_problem: dict[str, list[SampleRecord]] = defaultdict(list)
    for r in records:
        by_problem[r.problem_id].append(r)
    for pid, group in by_problem.items():
        indices = [r.sample_index for r in group]
        if len(set(indices)) != len(indices):
            raise ValueError(f"{records[0].benchmark}: problem {pid!r} has duplicate "
                             f"sample_index values {sorted(indices)}")
    groups = [sorted(g, key=lambda r: r.sample_index) for g in by_problem.values()]
    n_min = min(len(g) for g in groups)
    summary = {
        "n_problems": len(groups),
        "n_samples": len(records),
        "samples_per_problem": n_min,
        "accuracy": _mean([avg_at_n([r.correct for r in g]) for g in groups]),
    }
    k = 1
    while k <= n_min:  # pass@k for k = 1, 2, 4, ... up to the smallest n
        summary[f"pass@{k}"] = _mean([pass_at_k(len(g), sum(r.correct for r in g), k)
                                      for g in groups])
        k *= 2
    k //= 2  # the largest power of two <= n: G-Pass@k there, for sampled evaluations
    if k >= 2:
        for tau in G_PASS_TAUS:
            summary[f"g-pass@{k}_{tau}"] = _mean([
                g_pass_at_k(len(g), sum(r.correct for r in g), k, tau) for g in groups])
    summary["maj@n"] = _mean([maj_at_n([r.extracted for r in g], [r.correct for r in g])
                              for g in groups])
    summary["mean_response_tokens"] = _mean([r.response_tokens for r in records])
    summary["mean_response_tokens_correct"] = _mean(
        [r.response_tokens for r in records if r.correct])
    summary["mean_response_tokens_incorrect"] = _mean(
        [r.response_tokens for r in records if not r.correct])
    summary["truncation_rate"] = _mean([float(r.truncated) for r in records])
    counts = Counter(r.verdict for r in records)
    summary["verdicts"] = {v: counts.get(v, 0) for v in VERDICTS}
    return summary


def summarize(samples: Iterable[SampleRecord | Mapping]) -> dict[str, dict]:
    """Per-benchmark metrics from graded samples (SampleRecords or dicts with their fields).

    For each benchmark, keys:
    - n_problems, n_samples, samples_per_problem (the smallest n over its problems)
    - accuracy: avg@n, the mean over problems of each problem's fraction correct
    - pass@1, pass@2, pass@4, ...: unbiased pass@k, for powers of two up to samples_per_problem
    - g-pass@K_0.5, g-pass@K_0.75, g-pass@K_1.0: `g_pass_at_k` at the largest of those K,
      when K >= 2 (several samples per problem)
    - maj@n: the mean over problems of `maj_at_n` on the extracted answers
    - mean_response_tokens, and over correct / not-correct samples only (None if there are none)
    - truncation_rate: the fraction of samples cut at the token limit
    - verdicts: counts for each of correct, incorrect, unparseable, timeout
    Benchmarks appear in the order first seen.
    """
    by_benchmark: dict[str, list[SampleRecord]] = defaultdict(list)
    for s in samples:
        record = s if isinstance(s, SampleRecord) else SampleRecord.from_dict(s)
        by_benchmark[record.benchmark].append(record)
    return {name: _summarize_one(records) for name, records in by_benchmark.items()}


def macro_average(per_benchmark: Mapping[str, Mapping],
                  benchmarks: Sequence[str] = DEFAULT_BENCHMARKS,
                  metric: str = "accuracy") -> float:
    """Unweighted mean of `metric` over `benchmarks` (by default the five of docs/METHOD.md).

    Raises ValueError when a benchmark or its metric is missing: a partial average would not be
    comparable with a full one.
    """
    missing = [b for b in benchmarks if b not in per_benchmark or
               per_benchmark[b].get(metric) is None]
    if missing or not benchmarks:
        raise ValueError(f"macro_average of {metric!r} needs {list(benchmarks)}; missing "
                         f"{missing}; have {sorted(per_benchmark)}")
    return sum(per_benchmark[b][metric] for b in benchmarks) / len(benchmarks)


# ---- uncertainty ------------------------------------------------------------------------------

def bootstrap_draws(n_items: int, n_resamples: int, seed: int,
                    statistic: Callable[[np.ndarray, np.random.Generator], np.ndarray]
                    ) -> np.ndarray:
    """`statistic` over `n_resamples` resamples (with replacement) of `n_items` items.

    `statistic(idx, rng)` gets an (r, n_items) block of item indices and the generator (for any
    further randomness, e.g. resampling within items) and returns r values. Blocks are drawn
    from `np.random.default_rng(seed)` in a fixed order, so equal arguments give equal draws.
    """
    if n_items < 1 or n_resamples < 1:
        raise ValueError(f"bootstrap needs n_items >= 1 and n_resamples >= 1; got {n_items}, "
                         f"{n_resamples}")
    rng = np.random.default_rng(seed)
    block = max(1, CHUNK_DRAWS // n_items)
    out = []
    for start in range(0, n_resamples, block):
        idx = rng.integers(0, n_items, size=(min(block, n_resamples - start), n_items))
        out.append(np.asarray(statistic(idx, rng), dtype=float))
    return np.concatenate(out)


def percentile_interval(draws: Sequence[float] | np.ndarray,
                        level: float = 0.95) -> tuple[float, float]:
    """The central `level` interval of bootstrap draws, as two order statistics.

    No interpolation between draws, so a constant gives (c, c) exactly and an infinite draw
    (an undefined ratio) stays infinite instead of turning into nan.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    x = np.sort(np.asarray(draws, dtype=float))
    if x.size == 0 or np.isnan(x).any():
        raise ValueError("percentile_interval needs at least one draw and no nan")
    # the k-th smallest and k-th largest draws, k = floor((R + 1)(1 - level) / 2), at least 1
    k = max(1, math.floor((x.size + 1) * (1 - level) / 2))
    return float(x[k - 1]), float(x[x.size - k])


def bootstrap_ci(values: Sequence[float], n_resamples: int = 10000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval (lo, hi) for the mean of `values`.

    `values` are one number per independent unit (per-problem accuracies, or per-seed scores);
    they are resampled with replacement `n_resamples` times from `np.random.default_rng(seed)`.
    """
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"bootstrap_ci needs a non-empty 1-D sequence of finite numbers; got "
                         f"shape {x.shape}")
    return percentile_interval(bootstrap_draws(x.size, n_resamples, seed,
                                               lambda idx, _rng: x[idx].mean(axis=1)), level)


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for `b` and `c` discordant pairs.

    Under no difference each discordant pair goes either way with probability 1/2, so
    p = min(1, 2 * P(X <= min(b, c))) with X ~ Binomial(b + c, 1/2); 1.0 when b + c = 0. The same
    formula is the sign test: pass the counts of negative and positive differences.
    """
    for name, value in (("b", b), ("c", c)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"mcnemar_p: {name} must be an int >= 0, got {value!r}")
    n, k = int(b) + int(c), min(int(b), int(c))
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n  # exact ints, one rounding
    return min(1.0, 2 * tail)


def _t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer `df` (Abramowitz & Stegun 26.7.3 / 26.7.4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) * (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...), terms up to c^(df-2)
        term = total = 1.0
        for k in range(2, df, 2):
            term *= c2 * (k - 1) / k
            total += term
        return s * total
    if df == 1:
        return 2 * theta / math.pi
    term = total = math.cos(theta)  # c + 2/3 c^3 + 2*4/(3*5) c^5 + ..., up to c^(df-2)
    for k in range(3, df - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    return 2 / math.pi * (theta + s * total)


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t distribution with `df` (integer >= 1) degrees of freedom."""
    if not 0 < p < 1 or isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"student_t_quantile needs 0 < p < 1 and an int df >= 1; got p={p}, "
                         f"df={df}")
    if p == 0.5:
        return 0.0
    mass = abs(2 * p - 1)  # the two-sided mass inside |T| <= q
    lo, hi = 0.0, 1.0
    while _t_two_sided_mass(hi, df) < mass:
        hi *= 2
    for _ in range(200):  # bisection to float precision
        mid = (lo + hi) / 2
        if _t_two_sided_mass(mid, df) < mass:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    q = (lo + hi) / 2
    return q if p > 0.5 else -q


def mean_t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student-t confidence interval for the mean of a few independent values (e.g. one score
    per training seed): mean +- t * sd / sqrt(k). None for fewer than two values."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return None
    half = student_t_quantile(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)
