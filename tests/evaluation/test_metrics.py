"""Metrics against hand-computed values."""
import math
from fractions import Fraction

import pytest

from evaluation.grader import Verdict
from evaluation.metrics import (SampleRecord, aes, avg_at_n, macro_average, maj_at_n, pass_at_k,
                                summarize)


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
