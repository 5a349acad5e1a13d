"""Metrics over graded samples: avg@n, unbiased pass@k, maj@n, AES, per-benchmark summaries.

Every sample counts in every denominator: unparseable and timed-out samples are wrong answers,
never dropped (METHOD.md section 5).
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Iterable, Mapping, Sequence

from evaluation.benchmarks import DEFAULT_BENCHMARKS
from evaluation.records import VERDICTS, SampleRecord

__all__ = ["SampleRecord", "pass_at_k", "avg_at_n", "maj_at_n", "aes", "summarize",
           "macro_average"]


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
    """Accuracy-efficiency score against a baseline (O1-Pruner; METHOD.md section 5).

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
    """Unweighted mean of `metric` over `benchmarks` (by default the five of METHOD.md).

    Raises ValueError when a benchmark or its metric is missing: a partial average would not be
    comparable with a full one.
    """
    missing = [b for b in benchmarks if b not in per_benchmark or
               per_benchmark[b].get(metric) is None]
    if missing or not benchmarks:
        raise ValueError(f"macro_average of {metric!r} needs {list(benchmarks)}; missing "
                         f"{missing}; have {sorted(per_benchmark)}")
    return sum(per_benchmark[b][metric] for b in benchmarks) / len(benchmarks)
