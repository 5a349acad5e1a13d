"""The lab's fifth-edition statistics on hand-made inputs (no Ray, no model): the sign-flip
interval of the mean and its agreement with the test, rollouts-to-match interpolated with its
bootstrap p, the token cost model, the zero-variance share, the edition's families and report."""
import itertools
import math
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks/lab")]

import se_analysis as sa  # noqa: E402
import se_costs as sc  # noqa: E402
import se_match as sm  # noqa: E402
import se_report  # noqa: E402
import se_settings  # noqa: E402
import se_stats as ss  # noqa: E402

# uniform - none, final avg@8, of the fourth edition's second regime (4 x 192 policy, 16 seeds;
# benchmarks/results/sample_efficiency_L4W192/summary.json): p 0.068, yet the percentile
# bootstrap of the median gave [+0.005, +0.020], which excludes 0.
SECOND_REGIME = [0.0205, 0.00975, -0.0105, -0.00075, -0.01475, 0.02175, 0.00575, 0.01725, 0.00725, 0.01475,
                 0.01975, 0.01975, 0.0075, 0.0205, 0.00525, -0.02825]


# ----------------------------------------------------------------- the sign-flip interval

def _random_vectors():
    """(diffs) for n = 6..16: normal draws around effects from none to clear, and draws on the
    held-out metric's grid (multiples of 1/4000), where ties and subset means equal to 0 occur."""
    rng = np.random.default_rng(7)
    for n in range(6, 17):
        for shift in (0.0, 0.004, 0.008, 0.012, 0.02):
            yield rng.normal(shift, 0.01, n)
            yield np.round(rng.normal(shift, 0.01, n) * 4000) / 4000
        yield np.array([0.01, -0.01] * (n // 2) + [0.01] * (n % 2))  # subsets whose mean is exactly 0


@pytest.mark.parametrize("n", range(6, 17))
def test_the_interval_excludes_0_exactly_when_the_test_rejects(n):
    checked = 0
    for d in _random_vectors():
        if d.size != n:
            continue
        lo, hi = ss.sign_flip_interval(d)
        assert (lo > 0 or hi < 0) == (ss.sign_flip_p(d) < ss.ALPHA), (d.tolist(), lo, hi)
        assert lo <= d.mean() <= hi
        stat = ss.paired_difference(dict(enumerate(d)), dict.fromkeys(range(n), 0.0))
        assert stat["resolved"] == (stat["interval"][0] > 0 or stat["interval"][1] < 0)
        checked += 1
    assert checked == 11


def test_the_interval_ends_are_where_the_test_turns():
    rng = np.random.default_rng(3)
    for n in (6, 9, 12, 16):
        d = rng.normal(0.005, 0.01, n)
        lo, hi = ss.sign_flip_interval(d)
        eps = 1e-4 * (d.max() - d.min())
        assert ss.sign_flip_p(d - hi) >= ss.ALPHA > ss.sign_flip_p(d - (hi + eps))
        assert ss.sign_flip_p(d - lo) >= ss.ALPHA > ss.sign_flip_p(d - (lo - eps))


def test_the_interval_matches_the_subset_means_it_is_made_of():
    """Independent of the bisection: an assignment keeping the differences in P and flipping those
    in N is as extreme as the observed one for every shift up to max(mean P, mean N) (the mean of
    an empty set infinite), so the upper end is the ceil(0.05 x 2**n)-th largest such cut-off."""
    d = np.array([0.012, -0.004, 0.020, 0.007, 0.001, 0.015, -0.009])
    cuts = []
    for signs in itertools.product((True, False), repeat=d.size):
        kept, flipped = d[np.array(signs)], d[~np.array(signs)]
        cuts.append(max(kept.mean() if kept.size else math.inf, flipped.mean() if flipped.size else math.inf))
    upper = sorted(cuts, reverse=True)[math.ceil(0.05 * 2 ** d.size) - 1]
    assert ss.sign_flip_interval(d)[1] == pytest.approx(upper, abs=1e-6 * (d.max() - d.min()))
    lower = -ss.sign_flip_interval(-d)[1]
    assert ss.sign_flip_interval(d)[0] == pytest.approx(lower, abs=1e-6 * (d.max() - d.min()))


def test_the_second_regime_no_longer_has_an_interval_that_excludes_0_beside_p_0_068():
    d = ss.paired_difference(dict(enumerate(SECOND_REGIME)), dict.fromkeys(range(16), 0.0))
    assert d["p"] == pytest.approx(0.0676, abs=1e-4) and not d["resolved"]
    lo, hi = d["interval"]
    assert lo < 0 < hi and d["interval_kind"] == "95% sign-flip inversion, mean"
    # about the t-interval on the mean the issue quotes, [-0.05, +1.50] points
    assert lo == pytest.approx(-0.0005, abs=0.0005) and hi == pytest.approx(0.015, abs=0.001)
    assert d["mean"] == pytest.approx(np.mean(SECOND_REGIME)) and d["median"] == pytest.approx(0.008625)


def test_a_constant_difference_has_a_point_interval_and_few_seeds_their_range():
    assert ss.sign_flip_interval([0.01] * 8) == (0.01, 0.01)
    d = ss.paired_difference({1: 0.3, 2: 0.5, 3: 0.2}, {1: 0.1, 2: 0.1, 3: 0.1})
    assert d["interval"] == pytest.approx([0.1, 0.4]) and d["interval_kind"] == "min-max"
    assert not d["resolved"]  # the smallest p at 3 seeds is 0.25
    with pytest.raises(ValueError, match="needs 6"):
        ss.sign_flip_interval([0.1] * 5)


def test_beyond_16_seeds_the_interval_inverts_the_sampled_test():
    d = np.random.default_rng(11).normal(0.006, 0.01, 20)
    lo, hi = ss.sign_flip_interval(d)
    assert (lo > 0 or hi < 0) == (ss.sign_flip_p(d) < ss.ALPHA) and lo < d.mean() < hi
    assert ss.sign_flip_p(d - hi) >= ss.ALPHA > ss.sign_flip_p(d - (hi + 1e-4))


# -------------------------------------------------------------------------- run records

def make_run(condition, seed, accs, *, eval_every=2, tokens=6.0, groups=16, zero_variance=(8,), train_tokens=None,
             generated_tokens=None, ppo_s=2.0, gen_s=3.0, rollouts_per_step=128, fifth=True):
    """A run with one evaluation every `eval_every` steps (len(accs) - 1 after step 0). Fifth-edition
    records carry generated tokens and zero-variance counts per step (`zero_variance` cycled)."""
    n_steps = eval_every * (len(accs) - 1)
    steps = []
    for t in range(1, n_steps + 1):
        step = {"step": t, "reward": 0.3, "response_tokens": tokens, "generation_s": gen_s, "make_experience_s": 1.0,
                "ppo_train_s": ppo_s, "broadcast_s": 0.5, "optimizer_steps": 2, "replayed_rollouts": 0.0,
                "generated_rollouts": rollouts_per_step,
                "train_tokens": rollouts_per_step * tokens if train_tokens is None else train_tokens}
        if fifth:
            step |= {"generated_tokens": rollouts_per_step * tokens if generated_tokens is None else generated_tokens,
                     "groups": groups, "zero_variance_groups": zero_variance[(t - 1) % len(zero_variance)]}
        steps.append(step)
    evals = [{"step": i * eval_every, "accuracy": a, "accuracy_greedy": a + 0.1, "response_tokens": tokens,
              "by_band": {"easy": a, "hard": a / 2}} for i, a in enumerate(accs)]
    return {"condition": condition, "seed": seed, "rollouts_per_step": rollouts_per_step, "steps": steps,
            "evals": evals, "wall_s": 40.0 + seed, "eval_s": 20.0 + seed, "startup_s": 3.0}


# ---------------------------------------------------------------- rollouts-to-match, its p

@pytest.mark.parametrize("below", [0, 1, 97, 98, 99, 100, 101, 102, 1000, 3899, 3900, 3901, 3999, 4000])
def test_the_ratio_interval_excludes_1_exactly_when_the_bootstrap_p_is_below_alpha(below):
    """4,000 draws, `below` of them < 1, some exactly 1, the rest above or infinite: the boundary
    is at 100 draws on either side (2 x 100 / 4000 = 0.05)."""
    rng = np.random.default_rng(below)
    draws = np.concatenate([rng.uniform(0.3, 0.99, below), np.ones(min(3, 4000 - below)),
                            np.full(max(0, 4000 - below - 3), math.inf)])
    draws[below + 3::2] = rng.uniform(1.01, 3.0, len(draws[below + 3::2]))
    lo, hi, p = sm.ratio_interval_and_p(draws)
    assert (lo > 1 or hi < 1) == (p < ss.ALPHA)
    share_le, share_ge = np.mean(draws <= 1), np.mean(draws >= 1)
    assert p == pytest.approx(min(1.0, 2 * min(share_le, share_ge)))
    assert lo <= hi


def test_the_bootstrap_p_and_interval_agree_on_runs_and_are_seeded():
    rng = np.random.default_rng(5)
    agreed = set()
    for trial in range(12):
        speed = rng.uniform(0.6, 1.6)
        base = [make_run("none", s, np.minimum(0.4, 0.2 + np.arange(6) * 0.04 + rng.normal(0, 0.01, 6)).tolist())
                for s in range(1, 9)]
        fast = [make_run("skip_refill", s, np.minimum(0.4, 0.2 + np.arange(6) * 0.04 * speed
                                                      + rng.normal(0, 0.01, 6)).tolist()) for s in range(1, 9)]
        out = sm.to_match_bootstrap(fast, base, 1.0, "rollouts")
        lo, hi = (math.inf if v is None else v for v in out["interval"])
        assert (lo > 1 or hi < 1) == (out["p"] < ss.ALPHA)
        agreed.add(out["p"] < ss.ALPHA)
        assert sm.to_match_bootstrap(fast, base, 1.0, "rollouts") == out  # seeded
    assert agreed == {True, False}  # both kinds of answer were met


def test_rollouts_to_match_moves_finer_than_the_checkpoints():
    """Checkpoints every 10 of 50 steps: the first checkpoint at or above the threshold could only
    give ratios in steps of 0.2 of GRPO's 50; the interpolated crossing falls between them."""
    base = [make_run("none", s, [0.20, 0.25, 0.30, 0.35, 0.38, 0.40], eval_every=10) for s in range(1, 7)]
    fast = [make_run("skip_refill", s, [0.20, 0.27, 0.33, 0.37, 0.41, 0.41], eval_every=10) for s in range(1, 7)]
    out = sm.to_match_bootstrap(fast, base, 1.0, "rollouts")
    # threshold 0.392: GRPO 0.6 of the way from step 40 to 50 (46), skip_refill 0.55 from 30 to 40 (35.5)
    assert out["ratio"] == pytest.approx(35.5 / 46)
    assert round(out["ratio"] / 0.2, 6) % 1 != 0


@pytest.mark.parametrize("ratio, interval, p, words", [
    (0.45, [0.35, 0.8], 0.001, "reaches the 0.5 mark"),
    (0.5, [0.4, 0.99], 0.01, "reaches the 0.5 mark"),
    (0.55, [0.4, 0.9], 0.01, "saves rollouts"),
    (0.45, [0.3, 1.0], 0.06, "not resolved"),       # the upper end must be below 1
    (0.45, [0.3, None], 0.2, "not resolved"),       # may never match
    (0.45, [0.3, 0.6], None, "not resolved"),       # fewer than 6 seeds: a [min, max], no test
    (None, [None, None], None, "not resolved"),
])
def test_the_primary_verdict(ratio, interval, p, words):
    assert sm.primary_verdict(ratio, interval, p) == words


# ---------------------------------------------------------------------- the token cost model

def test_token_axes_count_generated_and_trained_tokens_and_price_trained_ones_at_three():
    run = make_run("skip_refill", 1, [0.2, 0.3], eval_every=2, generated_tokens=700.0, train_tokens=1000.0)
    axes = sc.cumulative_axes(run, 1.0)
    assert axes["generated_tokens"].tolist() == [0, 700, 1400]
    assert axes["trained_tokens"].tolist() == [0, 1000, 2000]
    assert axes["token_cost"].tolist() == [0, 3700, 7400]  # 700 + 3 x 1000 a step
    # a record before the fifth edition: generated rollouts x their mean response length
    old = make_run("none", 1, [0.2, 0.3], eval_every=2, tokens=6.5, fifth=False)
    old["steps"][1]["generated_rollouts"] = 200  # a filtering step that dropped groups
    assert sc.generated_tokens(old).tolist() == [128 * 6.5, 200 * 6.5]


def test_a_condition_reports_tokens_wall_clock_and_the_zero_variance_share():
    runs = [make_run("skip", s, [0.2, 0.3], eval_every=2, generated_tokens=500.0, train_tokens=800.0 + s,
                     zero_variance=(4, 12), groups=16) for s in (1, 2, 3)]
    costs = sc.condition_costs(runs, 1.0)
    assert costs["generated_tokens"] == 1000.0 and costs["trained_tokens"] == 2 * 802.0
    assert costs["token_cost"] == 1000.0 + 3 * 2 * 802.0
    assert costs["wall_s_median"] == 42.0 and costs["eval_s_median"] == 22.0
    assert costs["zero_variance_share"] == pytest.approx((4 / 16 + 12 / 16) / 2)
    assert sc.zero_variance_share(runs[0]).tolist() == [0.25, 0.75]
    old = [make_run("none", 1, [0.2, 0.3], fifth=False)]
    assert sc.condition_costs(old, 1.0)["zero_variance_share"] is None
    with pytest.raises(ValueError, match="zero_variance_groups"):
        sc.zero_variance_share(old[0])
    runs[0]["steps"][0]["groups"] = 0  # a step that generated nothing has no share
    assert math.isnan(sc.zero_variance_share(runs[0])[0])


# ------------------------------------------------------------------- the fifth edition's summary

def fifth_edition_runs(seeds=8):
    """GRPO learning to 0.40 in 50 steps; skip_refill reaching it by step 20; the others between."""
    curves = {"none": [0.20, 0.25, 0.30, 0.35, 0.38, 0.40], "uniform": [0.20, 0.27, 0.33, 0.37, 0.40, 0.41],
              "skip": [0.20, 0.26, 0.31, 0.36, 0.39, 0.40], "skip_uniform": [0.20, 0.28, 0.35, 0.39, 0.41, 0.42],
              "skip_refill": [0.20, 0.33, 0.41, 0.42, 0.42, 0.43]}
    return [make_run(c, s, [a + 0.002 * s for a in accs], eval_every=10, groups=12 if c.startswith("skip") else 16)
            for s in range(1, seeds + 1) for c, accs in curves.items()]


def test_the_fifth_edition_tests_its_six_pairs_and_answers_its_primary_question():
    summary = sa.summarize(fifth_edition_runs(), edition=sa.EDITIONS[5])
    assert summary["family"] == [f"{a}_vs_{b}" for a, b in sa.FIFTH_PAIRS] and len(summary["family"]) == 6
    primary_pair = summary["pairs"]["skip_refill_vs_none"]["final_acc"]
    assert primary_pair["holm_family"] == 6 and primary_pair["p_holm"] == pytest.approx(6 * 2 / 256)
    assert "p_holm" not in summary["pairs"]["skip_refill_vs_uniform"]["final_acc"]  # secondary, never tested
    assert "uniform_vs_none_matched" not in summary["pairs"]  # the fourth edition's pairs are not this one's
    primary = summary["primary"]
    assert primary["pair"] == "skip_refill_vs_none" and primary["n"] == 8
    # threshold 0.98 x 0.41 (GRPO's best median, seeds 4 and 5's 0.408 and 0.41): GRPO crosses past step 40,
    # skip_refill between steps 10 and 20
    assert primary["ratio"] < 0.5 and primary["interval"][1] < 1 and primary["p"] < 0.05
    assert primary["verdict"] == "reaches the 0.5 mark"
    refill = summary["conditions"]["skip_refill"]
    assert refill["cost_to_match_ratio"] == pytest.approx(refill["rollouts_to_match_ratio"])  # same tokens a step
    assert refill["cost_to_match_p"] == refill["rollouts_to_match_p"]
    assert refill["zero_variance_share"] == pytest.approx(8 / 12)
    assert summary["conditions"]["none"]["zero_variance_share"] == pytest.approx(8 / 16)


def test_the_primary_question_at_few_seeds_or_without_its_condition_is_not_resolved():
    few = sa.summarize(fifth_edition_runs(seeds=4), edition=sa.EDITIONS[5])["primary"]
    assert few["interval_kind"] == "min-max" and few["p"] is None and few["verdict"] == "not resolved"
    runs = [r for r in fifth_edition_runs() if r["condition"] != "skip_refill"]
    absent = sa.summarize(runs, edition=sa.EDITIONS[5])
    assert absent["primary"]["verdict"] == "not run"
    assert absent["pairs"]["uniform_vs_none"]["final_acc"]["holm_family"] == 6  # the family stays 6
    assert sa.summarize(runs)["primary"] is None  # the fourth edition has no primary question


def test_differences_equal_but_for_rounding_end_the_bisection():
    # a summary's differences of two curves shifted alike per seed: 0.032, one of them an ulp lower
    d = [float.fromhex("0x1.0624dd2f1aa00p-5")] * 8
    d[4] = float.fromhex("0x1.0624dd2f1a9f8p-5")
    assert 0 < np.ptp(d) < 1e-16

    def hung(*_):
        raise AssertionError("the bisection did not end in 20 s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        lo, hi = ss.sign_flip_interval(d)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert lo == pytest.approx(0.032) and hi == pytest.approx(0.032)


# ---------------------------------------------------------------------------------- the report

def report_summary(runs, edition, tmp_path, analyse_only=False):
    """se_report.summarize as the lab calls it, with the settings table.md reads."""
    a = SimpleNamespace(edition=edition, holm_conditions=se_settings.EDITION, eval_samples=8, out_dir=tmp_path,
                        task="mixed", steps=50, prompts_per_step=16, group_size=8, train_batch=64,
                        analyse_only=analyse_only)
    return se_report.summarize(a, runs)


def test_an_analysis_of_committed_runs_names_its_own_checkout_as_the_analysis_not_the_grading(tmp_path):
    runs = fifth_edition_runs(seeds=2)
    graded, analysed = report_summary(runs, 5, tmp_path), report_summary(runs, 5, tmp_path, analyse_only=True)
    assert "grader" in graded["provenance"] and "analysed_with" not in graded["provenance"]
    assert set(analysed["provenance"]) == {"analysed_with"}
    assert analysed["provenance"]["analysed_with"] == graded["provenance"]


def test_the_report_takes_the_family_and_the_primary_question_from_the_edition(tmp_path):
    runs = fifth_edition_runs()
    fifth = report_summary(runs, 5, tmp_path)
    assert fifth["edition"] == 5 and len(fifth["family"]) == 6 and fifth["primary"]["pair"] == "skip_refill_vs_none"
    assert fifth["pairs"]["uniform_vs_none"]["final_acc"]["holm_family"] == 6
    fourth = report_summary(runs, 4, tmp_path)
    assert fourth["primary"] is None and len(fourth["family"]) == 13  # the fourth's plan, as before
    assert set(fourth["pairs"]) == {"uniform_vs_none"}


def test_table_md_puts_the_primary_question_first_and_never_calls_a_secondary_score_resolved(tmp_path):
    runs = fifth_edition_runs()
    for r in runs:  # greedy: uniform 8 of 8 seeds above GRPO, p 0.0078 uncorrected
        if r["condition"] == "uniform":
            for e in r["evals"]:
                e["accuracy_greedy"] += 0.05 + 0.001 * r["seed"]
    text = se_report.table(report_summary(runs, 5, tmp_path))
    lines = text.splitlines()
    assert lines[2].startswith("**Primary question: rollouts-to-match of skip_refill against none** (8 seeds)")
    assert "**reaches the 0.5 mark**" in lines[2]
    greedy = next(line for line in lines if line.startswith("| uniform_vs_none | final_acc_greedy |"))
    assert greedy.endswith("| 0.008 | 0.008 |  | uniform above none, not tested |")
    secondary = [line for line in lines if line.startswith("| ") and ("_greedy |" in line or "| best_acc |" in line
                                                                       or "| auc |" in line)]
    assert secondary and not any("resolved" in line for line in secondary)
    assert not any("resolved" in line for line in lines if line.startswith("| skip_refill_vs_uniform |"))
    tested = next(line for line in lines if line.startswith("| skip_refill_vs_none | final_acc |"))
    assert tested.endswith("| resolved (Holm): skip_refill above none |")
    header = next(line for line in lines if line.startswith("| condition |"))
    assert "| zero-variance share of generation (mean over the run) |" in header
    refill = next(line for line in lines if line.startswith("| skip_refill | 8 |"))
    # the share, 8 of 12 groups; median wall-clock of training / grading, 44.5 and 24.5 s (to even: 44, 24)
    assert "| 0.67 |" in refill and "| 44 / 24 |" in refill
    assert "95% percentile bootstrap of the median" not in text and "median A - B" not in text


def test_write_plots_draws_the_zero_variance_share_when_the_records_count_it(tmp_path):
    runs = fifth_edition_runs(seeds=2)
    summary = report_summary(runs, 5, tmp_path) | {"primary_metric": {"name": "held-out avg@8"}}
    se_report.write_plots(runs, summary, tmp_path, [c for c in summary["conditions"]])
    assert {p.name for p in tmp_path.glob("*.png")} == {"curves.png", "curves_all.png", "bands.png",
                                                         "zero_variance.png"}
    old = [make_run(c, s, [0.2, 0.3, 0.35], fifth=False) for c in ("none", "uniform") for s in (1, 2)]
    (tmp_path / "old").mkdir()
    se_report.write_plots(old, report_summary(old, 4, tmp_path), tmp_path / "old", ["none", "uniform"])
    assert not (tmp_path / "old" / "zero_variance.png").exists() and (tmp_path / "old" / "curves.png").is_file()
    assert set(se_report.MAIN_PLOT[5]) == {"none", "uniform", "skip", "skip_uniform", "skip_refill"}
    assert all(c in se_report.COLOURS for c in se_report.MAIN_PLOT[5])
