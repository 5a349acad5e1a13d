"""Per-run CIs, paired comparisons and seed statistics on hand-built sample records."""
import math

import numpy as np
import pytest

from evaluation import analysis
from evaluation.metrics import aes, bootstrap_ci, mcnemar_p


def records(bench: str, correct: dict[str, list[bool]], tokens: int = 100) -> list[dict]:
    """Sample records: `correct[pid]` lists the verdicts of that problem's samples."""
    return [dict(benchmark=bench, problem_id=pid, sample_index=j, prompt="q", response="r",
                 response_tokens=tokens, truncated=False, extracted="1", gold="1",
                 verdict="correct" if ok else "incorrect")
            for pid, flags in correct.items() for j, ok in enumerate(flags)]


def one_sample(bench: str, right: set[str], ids: list[str], tokens: int = 100) -> list[dict]:
    return records(bench, {pid: [pid in right] for pid in ids}, tokens)


IDS = [f"p{i}" for i in range(8)]


def test_problem_outcomes_count_per_problem():
    o = analysis.problem_outcomes(records("amc23", {"a": [True, False, True], "b": [False] * 3}))
    out = o["amc23"]
    assert out.problem_ids == ("a", "b")
    assert out.n_correct.tolist() == [2, 0] and out.n_samples.tolist() == [3, 3]
    assert out.accuracy == pytest.approx(1 / 3) and not out.single_sample
    assert out.take(["b"]).n_correct.tolist() == [0]


def test_run_interval_with_one_sample_is_the_plain_bootstrap():
    recs = one_sample("aime24", {"p0", "p3", "p4"}, IDS)
    o = analysis.problem_outcomes(recs)
    got = analysis.run_intervals(o, ["aime24"])
    values = [1.0 if pid in {"p0", "p3", "p4"} else 0.0 for pid in IDS]
    expected = bootstrap_ci(values, seed=analysis.stream_seed(0, "aime24"))
    assert got["aime24"] == expected and got["avg"] == expected  # one benchmark: avg = it


def test_samples_are_resampled_when_there_are_several():
    # Every problem has 2 of 4 samples right: over problems alone the accuracy never moves,
    # but resampling each problem's samples does.
    o = analysis.problem_outcomes(records("math500", {pid: [True, True, False, False]
                                                      for pid in IDS}))
    lo, hi = analysis.run_intervals(o, ["math500"])["math500"]
    assert lo < 0.5 < hi
    assert 0.25 < lo and hi < 0.75


def test_average_interval_combines_benchmarks():
    recs = one_sample("math500", set(IDS[:4]), IDS) + one_sample("amc23", set(IDS[:2]), IDS)
    got = analysis.run_intervals(analysis.problem_outcomes(recs), ["math500", "amc23"])
    assert got["avg"][0] < (0.5 + 0.25) / 2 < got["avg"][1]
    # the average of two independent benchmarks is narrower than either benchmark alone
    assert got["avg"][1] - got["avg"][0] < got["math500"][1] - got["math500"][0]


def test_paired_comparison_lists_flips_and_runs_mcnemar():
    base = analysis.problem_outcomes(one_sample("amc23", {"p0", "p1"}, IDS, tokens=200))
    run = analysis.problem_outcomes(one_sample("amc23", {"p1", "p2", "p3", "p4", "p5", "p6"},
                                               IDS, tokens=100))
    result = analysis.paired_comparison(base, run, ["amc23"])
    d = result.per_benchmark["amc23"]
    assert d.gained == ("p2", "p3", "p4", "p5", "p6") and d.lost == ("p0",)
    assert d.n_shared == 8 and d.diff == pytest.approx((6 - 2) / 8)
    assert d.test == "McNemar" and d.p_value == pytest.approx(2 * (1 + 6) / 64)  # b=1, c=5
    assert not d.resolved and d.ci[0] < d.diff < d.ci[1]
    # the average of one benchmark: the sign-flip test approximates the same exact p
    assert result.average.diff == pytest.approx(d.diff)
    assert result.average.p_value == pytest.approx(d.p_value, abs=0.02)
    assert result.average.gained[0] == "amc23/p2"
    # the baseline's 2 of 8 resample to 0 of 8 in (6/8)^8 = 10% of draws: an infinite gain
    lo, hi = result.aes_ci
    assert lo < aes(6 / 8, 100, 2 / 8, 200) and hi == math.inf


def test_paired_comparison_matches_problems_by_id_not_position():
    base = analysis.problem_outcomes(one_sample("gsm8k", {"p0"}, ["p0", "p1", "p2"]))
    # the same results in another order, plus a problem the baseline does not have
    run = analysis.problem_outcomes(one_sample("gsm8k", {"p0"}, ["p9", "p2", "p1", "p0"]))
    d = analysis.paired_comparison(base, run, ["gsm8k"]).per_benchmark["gsm8k"]
    assert d.n_shared == 3 and d.diff == 0 and d.gained == d.lost == ()
    assert d.p_value == 1.0 and d.ci == (0.0, 0.0)


def test_large_paired_difference_is_resolved():
    ids = [f"q{i}" for i in range(40)]
    base = analysis.problem_outcomes(one_sample("math500", set(ids[:8]), ids))
    run = analysis.problem_outcomes(one_sample("math500", set(ids[:20]), ids))
    result = analysis.paired_comparison(base, run, ["math500"])
    d = result.per_benchmark["math500"]
    assert d.p_value == pytest.approx(mcnemar_p(0, 12)) and d.resolved
    assert d.ci[0] > 0 and result.average.resolved


def test_sign_test_with_several_samples():
    base = analysis.problem_outcomes(records("aime24", {"a": [True, False], "b": [True, True],
                                                        "c": [False, False]}))
    run = analysis.problem_outcomes(records("aime24", {"a": [True, True], "b": [True, False],
                                                       "c": [True, False]}))
    d = analysis.paired_comparison(base, run, ["aime24"]).per_benchmark["aime24"]
    assert d.test == "sign test" and d.gained == ("a", "c") and d.lost == ("b",)
    assert d.p_value == mcnemar_p(1, 2) == 1.0


def test_no_average_when_the_run_lacks_an_averaged_benchmark():
    base = analysis.problem_outcomes(one_sample("math500", {"p0"}, IDS)
                                     + one_sample("amc23", {"p0"}, IDS))
    run = analysis.problem_outcomes(one_sample("math500", {"p1"}, IDS))
    result = analysis.paired_comparison(base, run, ["math500", "amc23"])
    assert list(result.per_benchmark) == ["math500"] and result.average is None


def test_aes_interval():
    ids = [f"q{i}" for i in range(40)]
    base = analysis.problem_outcomes(one_sample("amc23", set(ids[:20]), ids, tokens=300))
    run = analysis.problem_outcomes(one_sample("amc23", set(ids[:24]), ids, tokens=200))
    lo, hi = analysis.paired_comparison(base, run, ["amc23"]).aes_ci
    point = aes(24 / 40, 200, 20 / 40, 300)  # 1/3 + 3 * 0.2
    assert lo < point < hi < math.inf
    assert analysis._aes_draw(0.0, 0.0, 300, 200) == pytest.approx(1 / 3)  # both 0: length only
    nothing = analysis.problem_outcomes(one_sample("amc23", set(), ids))
    assert analysis.paired_comparison(nothing, run, ["amc23"]).aes_ci is None  # AES undefined
    assert analysis._aes_draw(0.0, 0.1, 300, 200) == math.inf


def test_split_seed():
    assert analysis.split_seed("grpo_replay_seed42") == ("grpo_replay", 42)
    assert analysis.split_seed("Qwen3-1.7B-Base") == ("Qwen3-1.7B-Base", None)


def test_seed_groups_and_sign_test_over_seeds():
    rows = [("grpo_seed1", {"math500": 0.30, "avg": 0.20}),
            ("grpo_seed2", {"math500": 0.40, "avg": 0.25}),
            ("grpo_seed3", {"math500": 0.20, "avg": 0.15}),
            ("replay_seed1", {"math500": 0.35, "avg": 0.30}),
            ("replay_seed2", {"math500": 0.50, "avg": 0.28}),
            ("replay_seed3", {"math500": 0.25, "avg": 0.35}),
            ("base", {"math500": 0.1, "avg": 0.1}),        # no seed: not grouped
            ("solo_seed1", {"math500": 0.1, "avg": 0.1})]  # one seed: not a group
    groups = analysis.seed_groups(rows)
    assert [g.condition for g in groups] == ["grpo", "replay"]
    grpo, replay = groups
    s = grpo.stats("math500")
    assert (s["median"], s["q1"], s["q3"]) == pytest.approx((0.30, 0.25, 0.35))
    half = 4.302652729749464 * 0.1 / math.sqrt(3)  # sd 0.1 over 3 seeds
    assert s["ci"] == pytest.approx((0.3 - half, 0.3 + half))
    t = analysis.seed_comparison(grpo, replay, "math500")
    assert (t["n"], t["positive"], t["negative"]) == (3, 3, 0)
    assert t["median_diff"] == pytest.approx(0.05)
    assert t["p_value"] == mcnemar_p(0, 3) == 0.25 and not t["resolved"] and t["min_p"] == 0.25


def test_seed_comparison_pairs_by_seed_number():
    groups = analysis.seed_groups([("a_seed1", {"x": 0.1}), ("a_seed2", {"x": 0.2}),
                                   ("b_seed2", {"x": 0.1}), ("b_seed7", {"x": 0.9})])
    a, b = groups
    t = analysis.seed_comparison(a, b, "x")
    assert t["n"] == 1 and t["negative"] == 1  # only seed 2 is in both
    assert analysis.seed_comparison(a, b, "missing") is None


def test_sign_flip_is_seeded():
    diffs = [np.array([1.0, -1.0, 1.0, 1.0, 0.0])]
    assert analysis._sign_flip_p(diffs, 0, 2000) == analysis._sign_flip_p(diffs, 0, 2000)
    assert analysis._sign_flip_p([np.zeros(4)], 0, 100) == 1.0
