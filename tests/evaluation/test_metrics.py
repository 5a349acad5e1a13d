"""Metrics and statistics against hand-computed values."""
import math
from fractions import Fraction

import numpy as np
import pytest

from evaluation.verify import Verdict
from evaluation.metrics import (SampleRecord, aes, avg_at_n, bootstrap_ci, g_pass_at_k,
                                macro_average, maj_at_n, mcnemar_p, mean_t_interval, pass_at_k,
                                percentile_interval, student_t_quantile, summarize)


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 0.4),               # 1 - C(3,1)/C(5,1) = 1 - 3/5
    (5, 2, 2, 0.7),               # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 2, 4, 1.0),               # C(3,4) = 0: every 4-subset holds a correct sample
    (10, 3, 5, 11 / 12),          # 1 - C(7,5)/C(10,5) = 1 - 21/252
    (4, 0, 2, 0.0),
    (4, 4, 1, 1.0),
    (1, 1, 1, 1.0),
    (1000, 1, 1, 0.001),
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_large_n_matches_exact_binomials():
    # The product form must agree with exact rational arithmetic where C(n, k) has ~60 digits.
    n, c, k = 200, 17, 64
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(4, 1, 5), (4, 5, 1), (0, 0, 1), (4, 1, 0), (4, -1, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_pass_at_k_rejects_non_integers():
    with pytest.raises(TypeError):
        pass_at_k(4.0, 1, 1)


def test_avg_at_n():
    assert avg_at_n([True, False, True, True]) == 0.75
    with pytest.raises(ValueError):
        avg_at_n([])


def test_maj_at_n():
    # Majority "0.5" (2 votes) beats "1/2" and "\frac{1}{2}" (1 each; strings are not unified).
    assert maj_at_n(["1/2", r"\frac{1}{2}", "0.5", "0.5", None], [0, 0, 1, 1, 0]) == 1.0
    # Ties go to the answer seen first.
    assert maj_at_n(["3", "4", "4", "3"], [1, 0, 0, 1]) == 1.0
    assert maj_at_n(["4", "3", "3", "4"], [0, 1, 1, 0]) == 0.0
    # Whitespace does not split a vote; None never votes.
    assert maj_at_n(["x + 1", "x+1", "2", None, None, None], [1, 1, 0, 0, 0, 0]) == 1.0
    assert maj_at_n([None, None], [False, False]) == 0.0
    with pytest.raises(ValueError):
        maj_at_n(["1"], [True, False])


def test_aes_both_branches():
    # Accuracy up: dLen = (1000-800)/1000 = 0.2, dAcc = (0.6-0.5)/0.5 = 0.2 -> 0.2 + 3*0.2
    assert aes(0.6, 800, 0.5, 1000) == pytest.approx(0.8)
    # Accuracy down: dLen = 0.5, dAcc = -0.2 -> 0.5 - 5*0.2 (O1-Pruner's table would add 3*0.2)
    assert aes(0.4, 500, 0.5, 1000) == pytest.approx(-0.5)
    assert aes(0.5, 1000, 0.5, 1000) == 0.0
    # Custom weights: dLen = -0.2, dAcc = -0.1 -> 2*(-0.2) - 10*0.1
    assert aes(0.45, 1200, 0.5, 1000, alpha=2.0, gamma=10.0) == pytest.approx(-1.4)


@pytest.mark.parametrize("base_acc, base_length", [(0.0, 1000), (0.5, 0)])
def test_aes_rejects_zero_baseline(base_acc, base_length):
    with pytest.raises(ValueError, match="baseline"):
        aes(0.5, 900, base_acc, base_length)


def record(benchmark, pid, i, verdict, extracted, tokens, truncated=False):
    return SampleRecord(benchmark=benchmark, problem_id=pid, sample_index=i, prompt="q",
                        response="r", response_tokens=tokens, truncated=truncated,
                        verdict=verdict, extracted=extracted, gold="5")


SAMPLES = [
    record("aime24", "p1", 0, "correct", "5", 100),
    record("aime24", "p1", 1, "incorrect", "6", 200),
    record("aime24", "p1", 2, "correct", "5", 300),
    record("aime24", "p1", 3, "unparseable", None, 400, truncated=True),
    record("aime24", "p2", 0, "incorrect", "7", 50),
    record("aime24", "p2", 1, "incorrect", "7", 50),
    record("aime24", "p2", 2, "timeout", None, 50),
    record("aime24", "p2", 3, "incorrect", "8", 50),
    record("amc23", "q1", 0, "correct", "27", 10),
]


def test_summarize_hand_made_samples():
    summary = summarize(SAMPLES)
    assert list(summary) == ["aime24", "amc23"]
    aime = summary["aime24"]
    assert aime["n_problems"] == 2 and aime["n_samples"] == 8 and aime["samples_per_problem"] == 4
    assert aime["accuracy"] == pytest.approx((2 / 4 + 0) / 2)          # unparseable/timeout count
    assert aime["pass@1"] == pytest.approx(0.25)
    assert aime["pass@2"] == pytest.approx((1 - 1 / 6 + 0) / 2)       # p1: 1 - C(2,2)/C(4,2)
    assert aime["pass@4"] == pytest.approx((1 + 0) / 2)
    assert "pass@8" not in aime
    assert aime["maj@n"] == pytest.approx((1 + 0) / 2)                # p1 "5" wins, p2 "7" wins
    assert aime["mean_response_tokens"] == pytest.approx(1200 / 8)
    assert aime["mean_response_tokens_correct"] == pytest.approx(200)
    assert aime["mean_response_tokens_incorrect"] == pytest.approx(800 / 6)
    assert aime["truncation_rate"] == pytest.approx(1 / 8)
    assert aime["verdicts"] == {"correct": 2, "incorrect": 4, "unparseable": 1, "timeout": 1}
    amc = summary["amc23"]
    assert amc["accuracy"] == 1.0 and amc["pass@1"] == 1.0 and "pass@2" not in amc
    assert amc["mean_response_tokens_incorrect"] is None


def test_summarize_accepts_dicts_and_rejects_duplicates():
    assert summarize([r.to_dict() | {"extra": 1} for r in SAMPLES]) == summarize(SAMPLES)
    with pytest.raises(ValueError, match="duplicate sample_index"):
        summarize(SAMPLES + [record("amc23", "q1", 0, "incorrect", "3", 10)])


def test_macro_average():
    summary = summarize(SAMPLES)
    assert macro_average(summary, ("aime24", "amc23")) == pytest.approx((0.25 + 1.0) / 2)
    assert macro_average(summary, ("aime24", "amc23"), metric="maj@n") == pytest.approx(0.75)
    with pytest.raises(ValueError, match="math500"):
        macro_average(summary)  # the default five are not all there


def test_sample_record_checks_fields():
    r = record("aime24", "p1", 0, Verdict.CORRECT, "5", 1)
    assert r.verdict == "correct" and type(r.verdict) is str and r.correct
    assert SampleRecord.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError, match="verdict"):
        record("aime24", "p1", 0, "right", "5", 1)
    with pytest.raises(ValueError, match="response_tokens"):
        record("aime24", "p1", 0, "correct", "5", -1)
    with pytest.raises(ValueError, match="lacks field"):
        SampleRecord.from_dict({"benchmark": "aime24"})


# ---- uncertainty ------------------------------------------------------------------------------

@pytest.mark.parametrize("b, c, expected", [
    (0, 5, 0.0625),            # 2 * C(5,0) / 2^5 = 2/32
    (5, 0, 0.0625),
    (3, 3, 1.0),               # 2 * (1+3+3+1)... the tail holds more than half: capped at 1
    (0, 0, 1.0),               # no discordant pair: no evidence either way
    (1, 9, 22 / 1024),         # 2 * (C(10,0) + C(10,1)) / 2^10
    (2, 10, 2 * (1 + 12 + 66) / 4096),
])
def test_mcnemar_p_hand_values(b, c, expected):
    assert mcnemar_p(b, c) == pytest.approx(expected, abs=1e-15)


def test_mcnemar_p_large_counts_and_bad_input():
    # 2^1020 overflows a float; the exact integer sum must not.
    p = mcnemar_p(500, 520)
    assert 0.5 < p < 1.0
    assert mcnemar_p(0, 1000) < 1e-290
    for bad in ((-1, 2), (1.0, 2), (True, 2)):
        with pytest.raises(ValueError, match="mcnemar_p"):
            mcnemar_p(*bad)


def test_bootstrap_ci_of_a_constant_is_that_constant():
    assert bootstrap_ci([0.25] * 25) == (0.25, 0.25)  # exact: sums of 0.25 are exact floats
    assert bootstrap_ci([0.4] * 25) == pytest.approx((0.4, 0.4), abs=1e-15)
    assert bootstrap_ci([1.0]) == (1.0, 1.0)


def test_bootstrap_ci_is_seeded_and_sized_by_level():
    values = [0, 1] * 50
    lo, hi = bootstrap_ci(values)
    assert lo < 0.5 < hi and bootstrap_ci(values) == (lo, hi)
    assert 0.17 < hi - lo < 0.23            # normal approximation: 2 x 1.96 x sqrt(.25 / 100)
    skewed = np.linspace(0, 1, 37) ** 2  # continuous values: another seed, other draws
    assert bootstrap_ci(skewed, seed=1) != bootstrap_ci(skewed, seed=0)
    lo50, hi50 = bootstrap_ci(values, level=0.5)
    assert lo < lo50 < hi50 < hi
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([0.1, float("nan")])
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci(values, level=95)


def test_bootstrap_ci_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(123)
    hits = 0
    for i in range(200):
        data = rng.random(100) < 0.3
        lo, hi = bootstrap_ci(data, n_resamples=2000, seed=i)
        hits += lo <= 0.3 <= hi
    assert 0.88 <= hits / 200 <= 0.99


def test_percentile_interval_takes_order_statistics():
    draws = np.arange(1, 10001)  # 1..10000: the 250th smallest and the 250th largest
    assert percentile_interval(draws, 0.95) == (250.0, 9751.0)
    assert percentile_interval([1.0, 2.0, float("inf")] * 10, 0.95)[1] == float("inf")
    assert percentile_interval([3.0], 0.95) == (3.0, 3.0)


@pytest.mark.parametrize("df, q975", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764),
                                      (5, 2.5706), (10, 2.2281), (30, 2.0423)])
def test_student_t_quantile_matches_tables(df, q975):
    assert student_t_quantile(0.975, df) == pytest.approx(q975, abs=1e-4)
    assert student_t_quantile(0.025, df) == pytest.approx(-q975, abs=1e-4)


def test_student_t_quantile_cauchy_and_bad_input():
    assert student_t_quantile(0.9, 1) == pytest.approx(math.tan(math.pi * 0.4), rel=1e-10)
    assert student_t_quantile(0.5, 7) == 0.0
    for p, df in ((0.0, 3), (1.0, 3), (0.9, 0), (0.9, 2.5)):
        with pytest.raises(ValueError):
            student_t_quantile(p, df)


def test_mean_t_interval_hand_value():
    lo, hi = mean_t_interval([0.2, 0.3, 0.4])  # mean 0.3, sd 0.1, t(0.975, 2) = 4.3027
    half = 4.302652729749464 * 0.1 / math.sqrt(3)
    assert (lo, hi) == pytest.approx((0.3 - half, 0.3 + half), abs=1e-9)
    assert mean_t_interval([0.5]) is None


def test_sample_record_metadata_is_optional():
    old = record("aime24", "p1", 0, "correct", "5", 1).to_dict()
    assert "level" not in old  # lines of benchmarks without metadata stay as they were
    assert SampleRecord.from_dict(old).level is None  # a record written before the fields
    new = SampleRecord.from_dict({**old, "level": "3", "subject": "Algebra"})
    assert new.level == "3" and new.to_dict()["subject"] == "Algebra"
    assert "subfield" not in new.to_dict()
    with pytest.raises(TypeError, match="level"):
        SampleRecord.from_dict({**old, "level": 3})


@pytest.mark.parametrize("n, c, k, tau, expected", [
    (4, 2, 2, 0.5, 5 / 6),       # at least 1 of 2: 1 - C(2,2)/C(4,2)
    (4, 2, 2, 0.75, 1 / 6),      # ceil(1.5) = 2 of 2: C(2,2)/C(4,2)
    (4, 2, 2, 1.0, 1 / 6),
    (4, 3, 4, 0.75, 1.0),        # all 4 drawn: 3 correct >= ceil(3)
    (4, 3, 4, 1.0, 0.0),
    (8, 4, 4, 0.5, (6 * 6 + 4 * 4 + 1) / 70),  # j = 2, 3, 4: C(4,j) C(4,4-j) / C(8,4)
    (5, 2, 1, 0.0, 0.4),         # tau 0 is pass@k
])
def test_g_pass_at_k_hand_values(n, c, k, tau, expected):
    assert g_pass_at_k(n, c, k, tau) == pytest.approx(expected, abs=1e-12)


def test_g_pass_at_k_in_summaries():
    aime = summarize(SAMPLES)["aime24"]  # p1: 2 of 4 correct, p2: 0 of 4; K = 4
    assert aime["g-pass@4_0.5"] == pytest.approx((1 + 0) / 2)       # 2 of 4 >= ceil(2)
    assert aime["g-pass@4_0.75"] == 0 and aime["g-pass@4_1.0"] == 0
    assert "g-pass@1_0.5" not in summarize(SAMPLES)["amc23"]         # one sample: none
    with pytest.raises(ValueError, match="tau"):
        g_pass_at_k(4, 2, 2, 1.5)
