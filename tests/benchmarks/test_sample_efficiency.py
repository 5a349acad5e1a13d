"""The sample-efficiency lab: its analysis and task on hand-made inputs (no Ray, no model), and
its `--quick` sweep through the real pipeline (slow)."""
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks/lab")]

import sample_efficiency as se  # noqa: E402
import se_analysis as sa  # noqa: E402
import se_task as st  # noqa: E402
from replay.pool import load_pool  # noqa: E402


def make_run(condition, seed, accs, *, eval_every=2, reward=0.5, ppo_s=2.0, gen_s=3.0, opt_steps=2,
             tokens=7.0, rollouts_per_step=128, replayed=0.0, by_band=None, greedy=None):
    """A run with len(accs) - 1 evaluations after step 0, one every `eval_every` steps; greedy
    accuracies default to the sampled ones plus 0.1."""
    n_steps = eval_every * (len(accs) - 1)
    steps = [{"step": t, "reward": reward + 0.01 * t, "response_tokens": tokens, "generation_s": gen_s,
              "make_experience_s": 1.0, "ppo_train_s": ppo_s, "broadcast_s": 0.5, "optimizer_steps": opt_steps,
              "replayed_rollouts": replayed, "train_tokens": (rollouts_per_step + replayed) * tokens}
             for t in range(1, n_steps + 1)]
    greedy = greedy or [a + 0.1 for a in accs]
    evals = [{"step": i * eval_every, "accuracy": a, "accuracy_greedy": g, "response_tokens": tokens,
              "by_band": by_band or {"easy": a, "hard": a / 2}} for i, (a, g) in enumerate(zip(accs, greedy))]
    return {"condition": condition, "seed": seed, "rollouts_per_step": rollouts_per_step, "steps": steps,
            "evals": evals}


# ------------------------------------------------------------------------- curves (as before)

def test_quantile_band_median_and_iqr_per_point_ignoring_missing():
    band = sa.quantile_band([[0.0, 1.0, np.nan], [1.0, 2.0, 5.0], [2.0, 6.0, np.nan], [3.0, 3.0, np.nan]])
    assert band["median"].tolist() == [1.5, 2.5, 5.0]
    assert band["q25"][0] == pytest.approx(0.75) and band["q75"][0] == pytest.approx(2.25)
    assert band["n"].tolist() == [4, 4, 1]


def test_interpolate_onto_is_linear_and_never_extrapolates():
    out = sa.interpolate_onto([0, 10], [0.0, 1.0], [-1, 0, 5, 10, 11])
    assert out[1:4].tolist() == [0.0, 0.5, 1.0]
    assert math.isnan(out[0]) and math.isnan(out[4])


def test_unit_seconds_is_baseline_train_time_per_optimizer_step():
    runs = [make_run("none", 1, [0.1, 0.2], ppo_s=2.0, opt_steps=2),  # 2 steps: 4 s / 4 updates
            make_run("none", 2, [0.1, 0.2], ppo_s=6.0, opt_steps=2)]  # 2 steps: 12 s / 4 updates
    assert sa.unit_seconds(runs) == pytest.approx(16.0 / 8.0)
    with pytest.raises(ValueError):
        sa.unit_seconds([make_run("none", 1, [0.1, 0.2], opt_steps=0)])


def test_cumulative_axes_rollouts_and_compute_units():
    run = make_run("advantage", 1, [0.1, 0.2, 0.3], ppo_s=3.0, gen_s=3.0)  # 4 steps
    axes = sa.cumulative_axes(run, unit_s=0.5)
    assert axes["rollouts"].tolist() == [0, 128, 256, 384, 512]
    # training: (3.0 + 0.5) / 0.5 = 7 per step; generation: (3.0 + 1.0) / 0.5 = 8 per step
    assert axes["train_units"].tolist() == [0, 7, 14, 21, 28]
    assert axes["generation_units"].tolist() == [0, 8, 16, 24, 32]
    del run["steps"][0]
    with pytest.raises(ValueError, match="steps are not"):
        sa.cumulative_axes(run, 1.0)


def test_aggregate_shared_x_and_interpolated_x():
    curves = [(np.array([0, 1, 2]), np.array([0.1, 0.2, 0.3])),
              (np.array([0, 1, 2]), np.array([0.1, 0.4, 0.5])),
              (np.array([0, 1, 2]), np.array([0.1, 0.3, 0.9]))]
    assert sa.aggregate(curves)["median"].tolist() == pytest.approx([0.1, 0.3, 0.5])
    uneven = [(np.array([0.0, 10.0]), np.array([0.0, 1.0])), (np.array([0.0, 20.0]), np.array([0.0, 1.0]))]
    agg = sa.aggregate(uneven)
    assert agg["x"][-1] == 10.0 and agg["median"][-1] == pytest.approx((1.0 + 0.5) / 2)


def test_trailing_mean():
    assert sa.trailing_mean([1.0, 3.0, 5.0, 7.0], 2).tolist() == [1.0, 2.0, 4.0, 6.0]
    with pytest.raises(ValueError):
        sa.trailing_mean([1.0], 0)


def test_to_match_ratio_interpolates_between_checkpoints_never_and_the_tolerance():
    base = {"x": np.array([0, 100, 200, 300, 400]), "median": np.array([0.2, 0.3, 0.4, 0.45, 0.5])}
    fast = {"x": base["x"], "median": np.array([0.2, 0.5, 0.5, 0.5, 0.5])}
    slow = {"x": base["x"], "median": np.array([0.2, 0.25, 0.3, 0.35, 0.48])}
    almost = {"x": base["x"], "median": np.array([0.2, 0.25, 0.3, 0.35, 0.49])}
    assert sa.to_match_ratio(base, base) == 1.0
    # threshold 0.98 x 0.5 = 0.49: GRPO's segment 0.45 -> 0.5 reaches it at 300 + 0.8 x 100 = 380,
    # fast's 0.2 -> 0.5 at 0.29 / 0.3 x 100 (a checkpoint's x would give 100 / 400)
    assert sa.to_match_ratio(fast, base) == pytest.approx((0.29 / 0.3 * 100) / 380)
    assert sa.to_match_ratio(slow, base) is None  # 0.48 < 0.98 * 0.5
    assert sa.to_match_ratio(almost, base) == pytest.approx(400 / 380)  # 0.49 reached at its last checkpoint
    assert sa.first_reach([0, 10, 20], [0.1, float("nan"), 0.3], 0.2) == pytest.approx(10.0)  # NaN points skipped
    assert sa.first_reach([0, 10], [0.3, 0.4], 0.2) == 0.0 and sa.first_reach([0, 10], [0.1, 0.1], 0.2) is None


def test_median_step_curve_takes_the_median_compute_at_each_evaluated_step():
    runs = [make_run("none", 1, [0.1, 0.3], ppo_s=1.0), make_run("none", 2, [0.1, 0.5], ppo_s=3.0),
            make_run("none", 3, [0.1, 0.2], ppo_s=9.0)]
    curve = sa.median_step_curve(runs, 1.0, "compute_units")
    # per step: (ppo + 0.5) + (3 + 1); after 2 steps: 11, 15, 27 units; median 15 (mean 17.7)
    assert curve["x"].tolist() == [0.0, 15.0] and curve["median"].tolist() == pytest.approx([0.1, 0.3])


# ----------------------------------------------------------------------- per-seed statistics

def test_auc_is_the_mean_height_of_the_curve_over_rollouts():
    # trapezoids: (0.2 + 0.4) / 2 * 100 + (0.4 + 0.4) / 2 * 100 = 70 over 200 rollouts
    assert sa.auc_over_rollouts([0, 100, 200], [0.2, 0.4, 0.4]) == pytest.approx(0.35)
    with pytest.raises(ValueError):
        sa.auc_over_rollouts([0], [0.5])


def test_seed_scores_take_the_best_checkpoint_after_step_0():
    run = make_run("uniform", 1, [0.9, 0.3, 0.5, 0.4])  # step 0 is the highest: not a trained checkpoint
    scores = sa.seed_scores(run)
    assert scores["final_acc"] == 0.4 and scores["best_acc"] == 0.5
    # x = 0, 256, 512, 768: three equal spans, trapezoid heights (0.9 + 0.3) / 2, (0.3 + 0.5) / 2,
    # (0.5 + 0.4) / 2; step 0 counts here: the curve starts at the warm start
    assert scores["auc"] == pytest.approx((1.2 + 0.8 + 0.9) / 2 / 3)
    greedy = sa.seed_scores(make_run("uniform", 1, [0.9, 0.3, 0.5, 0.4], greedy=[0.1, 0.6, 0.2, 0.3]))
    assert (greedy["final_acc_greedy"], greedy["best_acc_greedy"], greedy["final_acc"]) == (0.3, 0.6, 0.4)


def test_minimal_detectable_effect_follows_the_t_formula():
    diffs = [0.01, 0.03, -0.02, 0.04, 0.00, 0.02, 0.05, -0.01]
    # t(0.975, 7) = 2.3646, t(0.80, 7) = 0.8960 (printed t tables)
    expected = (2.3646 + 0.8960) * np.std(diffs, ddof=1) / math.sqrt(8)
    assert sa.minimal_detectable_effect(diffs) == pytest.approx(expected, rel=1e-3)
    assert sa.minimal_detectable_effect(diffs * 4) < sa.minimal_detectable_effect(diffs)  # more seeds, smaller
    assert sa.minimal_detectable_effect([0.1]) is None


def test_to_match_bootstrap_brackets_the_ratio_and_reports_never_as_none():
    seeds = range(1, 7)  # 6 seeds: a bootstrap 95% interval and its p
    base = [make_run("none", s, [0.1, 0.2, 0.3, 0.4]) for s in seeds]
    fast = [make_run("advantage", s, [0.1, 0.4, 0.4, 0.4]) for s in seeds]
    out = sa.to_match_bootstrap(fast, base, 1.0, "rollouts")
    # threshold 0.392: GRPO at 512 + 0.92 x 256 rollouts, advantage at 0.292 / 0.3 x 256
    assert out["ratio"] == pytest.approx((0.292 / 0.3) / 2.92)
    assert out["interval"] == pytest.approx([out["ratio"]] * 2) and out["p"] == 0.0  # no spread, every ratio < 1
    assert out["interval_kind"] == "95% paired percentile bootstrap"
    # three seeds reach GRPO's level by step 2, three never: the interval spans to "never"
    mixed = fast[:3] + [make_run("advantage", s, [0.1, 0.2, 0.2, 0.2]) for s in (4, 5, 6)]
    out = sa.to_match_bootstrap(mixed, base, 1.0, "rollouts")
    assert out["interval"][0] == pytest.approx((0.292 / 0.3) / 2.92) and out["interval"][1] is None
    assert out["p"] > 0.05
    # below 6 seeds: each seed's own ratio, as [min, max], called so, and no p
    few = sa.to_match_bootstrap(mixed[2:4], base, 1.0, "rollouts")
    assert (few["interval"], few["interval_kind"], few["p"]) == ([pytest.approx(1 / 3), None], "min-max", None)
    same = sa.to_match_bootstrap(base, base, 1.0, "compute_units")
    assert same["interval"] == pytest.approx([1.0, 1.0]) and same["p"] == 1.0


@pytest.mark.parametrize("diffs, p", [
    ([1.0, 1.0, 1.0], 2 / 8),       # only the all-plus and all-minus assignments reach |mean| 1
    ([1.0] * 8, 2 / 256),
    ([3.0, -1.0, 1.0], 6 / 8),      # |sum| >= 3 in 3 of the 4 assignments with +3, and their mirrors
    ([1.0, -1.0], 1.0),             # mean 0: every assignment is as extreme
    ([0.0, 0.0, 0.0], 1.0),
    ([], 1.0),
])
def test_sign_flip_p_exact_cases(diffs, p):
    assert sa.sign_flip_p(diffs) == pytest.approx(p)


def test_sign_flip_p_samples_beyond_16_differences():
    # 2000 random sign assignments, none as extreme (each is with chance 2**-19), plus the observed
    # one: (0 + 1) / (2000 + 1), where the exact p would be 2 / 2**20
    assert sa.sign_flip_p([1.0] * 20, n_resamples=2000) == pytest.approx(1 / 2001)
    assert sa.sign_flip_p([1.0, -1.0] * 10, n_resamples=2000) == 1.0


def test_paired_difference_uses_common_seeds_only():
    a = {1: 0.5, 2: 0.6, 3: 0.7, 5: 0.1}
    b = {1: 0.4, 2: 0.4, 3: 0.4, 4: 0.9}  # seeds 4 and 5 have no partner
    d = sa.paired_difference(a, b)
    assert d["n"] == 3 and d["seeds"] == [1, 2, 3]
    assert d["diffs"] == pytest.approx([0.1, 0.2, 0.3]) and d["median"] == pytest.approx(0.2)
    # 3 seeds: the interval is their [min, max], and called so (a 95% interval needs 6)
    assert d["interval"] == pytest.approx([0.1, 0.3]) and d["interval_kind"] == "min-max"
    assert d["p"] == pytest.approx(0.25) and d["sign_p"] == pytest.approx(0.25)
    assert not d["resolved"] and sa.verdict(d) == "not resolved"  # 3 seeds cannot reach p < 0.05


def test_paired_difference_resolved_at_8_seeds_each_way():
    base = {s: 0.5 for s in range(1, 9)}
    better = {s: 0.5 + 0.01 * s for s in range(1, 9)}
    up = sa.paired_difference(better, base)
    assert up["p"] == pytest.approx(2 / 256) and up["interval"][0] > 0
    assert up["interval_kind"] == "95% sign-flip inversion, mean"
    assert up["resolved"] and sa.verdict(up) == "resolved: A higher"
    down = sa.paired_difference(base, better)
    assert down["resolved"] and down["interval"][1] < 0 and sa.verdict(down) == "resolved: A lower"


def test_paired_difference_mixed_signs_is_not_resolved():
    a = {s: v for s, v in enumerate([0.52, 0.47, 0.55, 0.49, 0.51, 0.46, 0.53, 0.50], start=1)}
    b = {s: 0.50 for s in a}
    d = sa.paired_difference(a, b)
    assert d["interval"][0] < 0 < d["interval"][1] and d["p"] > 0.05 and not d["resolved"]
    assert d["sign_p"] == pytest.approx(1.0)  # 3 below, 3 above, one tie dropped
    with pytest.raises(ValueError, match="no seed in common"):
        sa.paired_difference({1: 0.1}, {2: 0.2})


# ----------------------------------------------------------------------------------- summary

def test_summarize_end_to_end():
    runs = [make_run("none", s, [0.2, 0.3, 0.4], tokens=8.0) for s in (1, 2, 3)]
    runs += [make_run("advantage", 1, [0.2, 0.4, 0.4], tokens=6.0, opt_steps=3, ppo_s=3.0, replayed=64),
             make_run("advantage", 2, [0.2, 0.4, 0.5], tokens=6.0, opt_steps=3, ppo_s=3.0, replayed=64),
             make_run("advantage", 3, [0.2, 0.1, 0.3], tokens=6.0, opt_steps=3, ppo_s=3.0, replayed=64)]
    summary = sa.summarize(runs)
    none, adv = summary["conditions"]["none"], summary["conditions"]["advantage"]
    assert list(summary["conditions"]) == ["none", "advantage"] and adv["seeds"] == 3
    assert summary["unit_s"] == pytest.approx(1.0)  # 2.0 s per 2 updates
    # per seed: final 0.4 / 0.5 / 0.3, best 0.4 / 0.5 / 0.3, auc 0.35 / 0.375 / 0.175
    assert adv["final_acc"] == pytest.approx(0.4) and adv["best_acc"] == pytest.approx(0.4)
    assert adv["auc"] == pytest.approx(0.35) and none["auc"] == pytest.approx(0.3)
    assert adv["final_acc_by_band"] == {"easy": pytest.approx(0.4), "hard": pytest.approx(0.2)}
    # threshold 0.98 x 0.4, interpolated: GRPO 0.92 of the way from step 2 to step 4 (256 + 0.92 x 256
    # rollouts, 13 + 0.92 x 13 units at 6.5 a step); advantage's median curve (0.2, 0.4, 0.4) 0.96 of
    # the way to step 2 (0.96 x 256 rollouts, 0.96 x 15 units at 7.5 a step)
    assert summary["match_threshold"] == pytest.approx(0.392)
    assert adv["rollouts_to_match_ratio"] == pytest.approx(0.96 / 1.92)
    assert adv["compute_to_match_ratio"] == pytest.approx(0.96 * 15 / (1.92 * 13))
    assert none["rollouts_to_match_ratio"] == none["compute_to_match_ratio"] == pytest.approx(1.0)
    assert adv["aes_vs_grpo"] == pytest.approx(0.25)  # same final accuracy, 6 tokens vs 8: dLen 0.25
    assert adv["train_tokens_per_step"] == pytest.approx(192 * 6.0) and adv["replayed_per_step"] == 64
    assert adv["optimizer_steps_per_step"] == 3 and adv["train_units"] == pytest.approx(4 * 3.5)
    pair = summary["pairs"]["advantage_vs_none"]
    assert set(pair) == {"final_acc", "best_acc", "auc", "final_acc_greedy", "best_acc_greedy", "auc_greedy"}
    assert pair["final_acc"]["diffs"] == pytest.approx([0.0, 0.1, -0.1]) and pair["final_acc"]["p"] == 1.0
    assert "advantage_vs_uniform" not in summary["pairs"]  # uniform did not run
    assert pair["final_acc_greedy"]["diffs"] == pytest.approx([0.0, 0.1, -0.1])  # greedy = sampled + 0.1 here
    assert pair["final_acc"]["mde"] == pytest.approx(sa.minimal_detectable_effect([0.0, 0.1, -0.1]))
    # 3 seeds: each seed's own ratio (0.5, 0.5, never), as [min, max]
    assert adv["rollouts_to_match_interval"] == [0.5, None] and adv["rollouts_to_match_interval_kind"] == "min-max"
    assert none["rollouts_to_match_interval"] == [1.0, 1.0]
    # GRPO: 0.2 -> 0.4 in every seed; the control did not run
    assert summary["grpo_gain"]["median"] == pytest.approx(0.2) and summary["grpo_gain"]["n"] == 3
    assert summary["positive_control"] is None


def test_to_match_takes_its_point_estimate_and_interval_on_the_same_seeds():
    """A condition run at 3 seeds is matched against GRPO's 3 runs of those seeds, not all 8: here
    GRPO's seeds 4-8 learn far slower, which would halve the ratio if they entered the estimate."""
    runs = [make_run("none", s, [0.2, 0.3, 0.4]) for s in (1, 2, 3)]
    runs += [make_run("none", s, [0.2, 0.2, 0.25]) for s in range(4, 9)]
    runs += [make_run("naive", s, [0.2, 0.3, 0.4]) for s in (1, 2, 3)]
    naive = sa.summarize(runs)["conditions"]["naive"]
    assert naive["rollouts_to_match_ratio"] == pytest.approx(1.0)  # as fast as GRPO on its own seeds
    lo, hi = naive["rollouts_to_match_interval"]
    assert lo <= naive["rollouts_to_match_ratio"] <= hi


def test_summarize_reports_the_positive_control():
    runs = [make_run("none", s, [0.2, 0.3, 0.4 + 0.01 * s]) for s in range(1, 9)]
    runs += [make_run("none_half_prompts", s, [0.2, 0.25, 0.3 + 0.005 * s], rollouts_per_step=64)
             for s in range(1, 9)]
    control = sa.summarize(runs)["positive_control"]
    assert control["pair"] == "none_vs_none_half_prompts" and control["n"] == 8
    assert control["median"] == pytest.approx(0.1225) and control["resolved"] and control["p"] == pytest.approx(2 / 256)
    assert control["mde"] == pytest.approx(sa.minimal_detectable_effect([0.1 + 0.005 * s for s in range(1, 9)]))


def test_holm_adjusts_step_down_and_keeps_the_order():
    adjusted = sa.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5})
    # sorted 0.01, 0.03, 0.04, 0.5: x4, x3, x2, x1, each at least the one before
    assert adjusted == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "d": 0.5})
    assert sa.holm({"a": 0.3, "b": 0.6}) == pytest.approx({"a": 0.6, "b": 0.6})  # capped by the running max


def test_equivalence_needs_the_differences_inside_the_margin_on_both_sides():
    tight = [0.001, -0.001, 0.0, 0.002, -0.002, 0.001, 0.0, -0.001, 0.001, 0.0, -0.001, 0.002]
    assert sa.equivalence(tight, 0.005)["equivalent"]
    assert sa.equivalence(tight, 0.005)["p"] == pytest.approx(1 / 4096)  # every sign assignment but one is smaller
    assert not sa.equivalence([d + 0.005 for d in tight], 0.005)["equivalent"]  # centred on the upper margin
    assert not sa.equivalence([0.01, -0.01, 0.02, -0.02, 0.0, 0.01], 0.005)["equivalent"]  # too spread


def test_the_one_sided_sign_flip_p():
    # all 3 positive is the most extreme of the 8 sign assignments; negated, the least
    assert sa.sign_flip_p([1.0, 2.0, 3.0], side="greater") == pytest.approx(1 / 8)
    assert sa.sign_flip_p([-1.0, -2.0, -3.0], side="greater") == 1.0
    with pytest.raises(ValueError, match="side='less'"):
        sa.sign_flip_p([1.0], side="less")


def test_the_preregistered_pairs_get_holm_over_the_planned_family_and_selection_an_equivalence_test():
    runs = [make_run("none", s, [0.2, 0.3, 0.30 + 0.001 * s]) for s in range(1, 9)]
    runs += [make_run("uniform", s, [0.2, 0.3, 0.32 + 0.001 * s]) for s in range(1, 9)]
    runs += [make_run("advantage_alpha1", s, [0.2, 0.3, 0.32 + 0.001 * s + 0.0005 * (-1) ** s]) for s in range(1, 9)]
    summary = sa.summarize(runs, planned=list(se.EDITION))
    key = summary["pairs"]["uniform_vs_none"]["final_acc"]
    assert key["p"] == pytest.approx(2 / 256) and key["holm_family"] == 13
    # 13 planned pairs, the others not run count as p = 1: the smallest p is multiplied by 13
    assert key["p_holm"] == pytest.approx(13 * 2 / 256) and not key["resolved_holm"] and key["resolved"]
    sel = summary["pairs"]["advantage_alpha1_vs_uniform"]["final_acc"]
    assert sel["equivalence"]["margin"] == 0.005 and sel["equivalence"]["equivalent"]
    assert "equivalence" not in key
    alone = sa.summarize(runs[:16], planned=["none", "uniform"])["pairs"]["uniform_vs_none"]["final_acc"]
    assert alone["holm_family"] == 1 and alone["p_holm"] == pytest.approx(2 / 256) and alone["resolved_holm"]


def test_runs_that_end_with_the_pool_have_no_to_match_but_every_score():
    runs = [make_run("none", s, [0.2, 0.3, 0.4]) for s in (1, 2)]
    short = [make_run("none_df", s, [0.2, 0.35, 0.45]) for s in (1, 2)]
    short[1]["evals"][-1]["step"] = 3  # this seed's pool ran dry a step earlier
    short[1]["steps"] = short[1]["steps"][:3]
    df = sa.summarize(runs + short)["conditions"]["none_df"]
    assert df["rollouts_to_match_ratio"] is None and df["rollouts_to_match_interval_kind"].startswith("n/a")
    assert df["final_acc"] == pytest.approx(0.45)


def test_summarize_needs_the_baseline():
    with pytest.raises(ValueError, match="baseline"):
        sa.summarize([make_run("advantage", 1, [0.1, 0.2])])


# ----------------------------------------------------------------------------- the lab's runs

STATUS = {"step": 1, "rollout/reward_mean": 0.5, "rollout/response_length_mean": 7.0, "timing/generation": 1.0,
          "timing/make_experience": 1.0, "timing/ppo_train": 2.0, "timing/broadcast": 0.1,
          "rollout/num_samples": 128.0}


def test_step_record_counts_updates_and_trained_tokens():
    a = se.parse_args(["--out-dir", "/tmp/unused"])
    grpo = se.step_record(STATUS, a)
    assert grpo["optimizer_steps"] == 2 and grpo["train_tokens"] == 128 * 7.0
    twice = se.step_record(STATUS, a, "none_2epochs")
    assert twice["optimizer_steps"] == 4 and twice["train_tokens"] == 2 * 128 * 7.0
    replay = se.step_record({**STATUS, "response_length": 7.0, "replay/replayed": 64.0,
                             "replay/response_length_replay": 9.0}, a)
    assert replay["optimizer_steps"] == 3 and replay["train_tokens"] == 128 * 7.0 + 64 * 9.0
    # RLEP: 40 replayed rows completed by 24 inert ones to a whole training batch of 64, which is an
    # optimizer step (the ranks log 3); the inert rows train no token
    rlep = se.step_record({**STATUS, "replay/replayed": 40.0, "replay/inert_rows": 24.0,
                           "replay/response_length_replay": 9.0}, a, "success")
    assert rlep["optimizer_steps"] == 3 and rlep["train_tokens"] == 128 * 7.0 + 40 * 9.0
    # without upstream's sample count, a run counts its own condition's rollouts (the control takes half)
    bare = {k: v for k, v in STATUS.items() if k != "rollout/num_samples"}
    assert se.step_record(bare, a, "none_half_prompts")["fresh_rollouts"] == 64
    assert se.step_record(bare, a)["fresh_rollouts"] == 128


def test_step_record_of_the_new_conditions():
    a = se.parse_args(["--out-dir", "/tmp/unused"])
    # 128 fresh rows in batches of 42: upstream's loader drops the 2 left over, so 3 optimizer steps
    assert se.step_record(STATUS, a, "none_matched")["optimizer_steps"] == 3
    # upstream's filtering logs accepted rollouts per consumed prompt x 100: 128 / 25 prompts = 512
    df = se.step_record({**STATUS, "dynamic_filtering_pass_rate": 512.0}, a, "none_df")
    assert df["generated_rollouts"] == 25 * 8 and df["fresh_rollouts"] == 128
    # replay counts them itself (the dropped groups included)
    refill = se.step_record({**STATUS, "dynamic_filtering_pass_rate": 512.0, "replay/generated_rollouts": 128.0,
                             "replay/replayed": 112.0}, a, "refill")
    assert refill["generated_rollouts"] == 128 and refill["optimizer_steps"] == 3
    # the session's own count of prompts consumed comes first: it also holds a call that trained nothing
    tail = se.step_record({**STATUS, "dynamic_filtering_pass_rate": 512.0, "lab/prompts_consumed": 34},
                          a, "none_df")
    assert tail["generated_rollouts"] == 34 * 8 and tail["fresh_rollouts"] == 128


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_every_condition_has_the_same_prompts_steps_and_seed_and_differs_only_in_replay_and_epochs():
    a = se.parse_args(["--edition", "4", "--out-dir", "/tmp/unused"])
    commands = {c: se.train_command(a, c, 3, Path("m"), Path("d"), Path("r")) for c in se.CONDITIONS
                if c not in se.SKIPPING}  # their loader and warm-up: test_lab_fifth.py
    controls = ("--actor.adam.lr", "--rollout.batch_size", "--data.max_samples", "--train.batch_size",
                "--train.micro_batch_size")
    switches = ("--train.colocate_all", "--vllm.enforce_eager", "--ckpt.save_hf", "--ckpt.disable_ds",
                "--algo.dynamic_filtering")

    def shared(cmd):
        flags = [w for w in cmd if w.startswith("--")]
        return [(f, _flag(cmd, f)) for f in flags if not f.startswith("--replay.") and f != "--train.max_epochs"
                and f not in controls and not f.startswith(switches)]

    reference = shared(commands["none"])
    assert all(shared(cmd) == reference for cmd in commands.values())
    # what the controls change: LR (none_half_lr), and half the prompts per step from a pool of half
    # the size (none_half_prompts: still 50 steps, one pass); 50 steps x 16 prompts: no prompt returns
    # and none_matched's training batch of 42: 3 optimizer steps a step, as replay's
    expected = {c: ("0.0001", "16", "800", "64", "64") for c in commands}
    expected |= {"none_half_lr": ("5e-05", "16", "800", "64", "64"),
                 "none_half_prompts": ("0.0001", "8", "400", "64", "64"),
                 "none_matched": ("0.0001", "16", "800", "42", "42")}
    assert {c: tuple(_flag(cmd, f) for f in controls) for c, cmd in commands.items()} == expected
    assert _flag(commands["none"], "--train.num_episodes") == "1"  # 50 steps, one pass
    assert _flag(commands["none"], "--train.seed") == "3" and _flag(commands["none"], "--replay.seed") == "3"
    assert {c: _flag(cmd, "--train.max_epochs") for c, cmd in commands.items() if c.startswith("none")} == \
        {"none": "1", "none_half_prompts": "1", "none_half_lr": "1", "none_2epochs": "2", "none_matched": "1",
         "none_df": "1"}
    # dynamic filtering (upstream's, dropping groups of equal rewards) in exactly its three conditions
    assert {c for c, cmd in commands.items() if "--algo.dynamic_filtering_enable" in cmd} == \
        {"none_df", "uniform_df", "refill"}
    assert all(_flag(commands[c], "--algo.dynamic_filtering_range") == "0" for c in commands
               if c in se.DYNAMIC_FILTERING)


def test_condition_flags_of_the_ablations_and_rlep():
    a = se.parse_args(["--out-dir", "/tmp/unused"])
    flags = {c: se.condition_flags(c, a) for c in se.CONDITIONS}
    assert [_flag(flags[c], "--replay.max_age") for c in ("advantage", "advantage_tau2", "advantage_tau40")] \
        == ["10", "2", "40"]
    assert [_flag(flags[c], "--replay.alpha") for c in ("advantage", "advantage_alpha1", "advantage_alpha2")] \
        == ["0.5", "1.0", "2.0"]
    # the matched-update controls: age0 is a replay mode with uniform's ratio and warm-up, none_matched GRPO
    assert flags["age0"] == ["--replay.mode", "age0", *flags["uniform"][4:]]
    assert flags["none_matched"] == ["--replay.mode", "none"]
    assert flags["uniform_df"][:len(flags["uniform"])] == flags["uniform"]
    assert flags["refill"][-1] == "--replay.refill" and flags["refill"][:len(flags["uniform"])] == flags["uniform"]
    assert _flag(flags["exgrpo"], "--replay.mode") == "exgrpo" and "--replay.max_age" not in flags["exgrpo"]
    assert _flag(flags["success"], "--replay.mode") == "success" and _flag(flags["success"], "--replay.per_prompt") == "2"
    assert "--replay.max_age" not in flags["success"]  # RLEP keeps every success
    assert _flag(flags["success"], "--replay.success_pool") == "/tmp/unused/data/success_pool.npz"  # offline


def test_a_run_is_complete_when_its_steps_generated_every_planned_rollout():
    a = se.parse_args(["--quick", "--out-dir", "/tmp/unused"])  # 10 steps of 16 prompts x 8
    steps = [{"step": i + 1, "lab/prompts_consumed": 16} for i in range(10)]
    assert a.generated_all(steps, "refill")
    skipped = steps[:8] + [{"step": 9, "lab/prompts_consumed": 32}]  # a step upstream skipped, counted on
    assert a.generated_all(skipped, "refill")
    assert not a.generated_all(steps[:9], "refill")  # a run that stopped short
    half = [{"step": i + 1, "lab/prompts_consumed": 8} for i in range(10)]  # 8 prompts a step: 10 x 64 planned
    assert a.generated_all(half, "none_half_prompts") and not a.generated_all(steps, "none_half_prompts")


def test_args_defaults_per_task_and_checks():
    full = se.parse_args(["--edition", "4", "--out-dir", "/tmp/unused"])
    # the plan's: the five conditions of the key pairs at 16 seeds, the other six at 12
    assert full.condition_list == list(se.EDITION) and full.eval_every == 10
    assert sum(full.seeds_of(c) for c in full.condition_list) == 5 * 16 + 6 * 12
    assert "none_half_prompts" not in full.condition_list  # the third edition's control, run when named
    large = se.parse_args(["--edition", "4", "--policy-layers", "4", "--policy-width", "192"])
    assert large.out_dir.name == "sample_efficiency_L4W192"
    assert (large.warm_start_config.num_hidden_layers, large.warm_start_config.hidden_size,
            large.warm_start_config.intermediate_size) == (4, 192, 768)
    # Holm's family is the plan's whichever conditions a call runs; the second regime's pair is its own
    assert se.parse_args(["--edition", "4", "--conditions", "none,uniform"]).holm_conditions == se.EDITION
    assert large.holm_conditions == ("none", "uniform")
    with pytest.raises(SystemExit, match="multiple of 64"):
        se.parse_args(["--policy-width", "160"])
    first = se.parse_args(["--task", "add2"])
    assert (first.steps, first.pool_steps, first.heldout_size, first.condition_list) == \
        (48, 48, 200, list(se.FIRST_EDITION))
    assert first.out_dir.name == "sample_efficiency_add2" and not first.warm_start_config.split_digits
    quick = se.parse_args(["--quick", "--steps", "20"])
    assert quick.steps == 20 and quick.seeds == 1 and quick.condition_list == ["none", "uniform", "none_df"]
    with pytest.raises(SystemExit):
        se.parse_args(["--steps", "45"])  # not whole passes over the pool of 10 steps
    with pytest.raises(SystemExit):
        se.parse_args(["--conditions", "uniform,advantage"])  # no baseline


# ----------------------------------------------------------------------------------- the task

def test_problem_answers_and_band_sizes():
    assert [st.Problem(7, op, 3, "x").answer for op in "+-*"] == ["10", "4", "21"]
    assert st.Problem(12, "*", 3, "x").text == "What is 12 * 3?"
    bands = {b.name: b for b in st.FAMILIES["mixed"]}
    assert bands["sub 2d-2d"].size == sum(a - 9 for a in range(10, 100))  # b in 10..a: 4,095
    assert bands["add 3d+3d"].size == 900 * 900
    sub = bands["sub 2d-2d"].problems(0, 10 ** 6)
    assert len(sub) == 4095 and all(p.b <= p.a for p in sub)


def test_the_mixed_split_is_disjoint_and_stratified():
    cfg = st.TaskConfig(heldout_size=500)
    split = st.split_problems(cfg)
    per_band = {}
    for p in split.heldout:
        per_band[p.band] = per_band.get(p.band, 0) + 1
    assert per_band == {b.name: 100 for b in cfg.bands}
    train = {(p.a, p.op, p.b) for ps in split.train.values() for p in ps}
    assert not train & {(p.a, p.op, p.b) for p in split.heldout}
    assert len(split.train["add 3d+3d"]) == 20000 - 100  # a large band is a sample
    pool = split.pool(160)
    assert [p.band for p in pool[:5]] == [b.name for b in cfg.bands] and len(set(pool)) == 160
    with pytest.raises(ValueError):
        split.pool(16)  # 16 prompts do not split over 5 bands
    with pytest.raises(ValueError):
        st.TaskConfig(heldout_size=501)


def test_add2_reproduces_the_first_editions_split():
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(0).shuffle(pairs)  # the first edition's split_pairs
    split = st.split_problems(st.TaskConfig(family="add2", heldout_size=200))
    assert [(p.a, p.b) for p in split.heldout] == pairs[:200]
    assert [(p.a, p.b) for p in split.pool(768)] == pairs[200:968]  # its --data.max_samples 768 rows


def test_rate_histogram_and_as_problem():
    problems = [st.Problem(1, "+", 1, "easy"), st.Problem(2, "+", 2, "easy"), st.Problem(9, "*", 9, "hard")]
    hist = st.rate_histogram(problems, [1.0, 0.5, 0.0], n=4)
    assert hist == {"all": [1, 0, 1, 0, 1], "easy": [0, 0, 1, 0, 1], "hard": [1, 0, 0, 0, 0]}
    assert st.as_problem((12, 30)).answer == "42" and st.as_problem(problems[2]) is problems[2]


def test_a_tokenizer_that_merged_digits_is_refused():
    class Vocab:
        def __init__(self, tokens):
            self.tokens = tokens

        def get_vocab(self):
            return dict.fromkeys(self.tokens, 0)

    st._check_digits_are_single_tokens(Vocab(["1", "2", "What", "\u0120is"]))
    with pytest.raises(ValueError, match="merged digits"):
        st._check_digits_are_single_tokens(Vocab(["1", "\u01201"]))


# ------------------------------------------------------------------------ the whole lab (slow)

@pytest.mark.slow
def test_the_quick_sweep_trains_evaluates_and_summarises(tmp_path):
    out = tmp_path / "quick"
    quick = [sys.executable, str(ROOT / "benchmarks/lab/sample_efficiency.py"), "--quick", "--out-dir", str(out),
             "--conditions", "none,age0,none_df,refill,success,skip_refill", "--archive", str(tmp_path / "kept.json.gz")]
    env = {**__import__("os").environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(quick, cwd=ROOT, capture_output=True, text=True, timeout=1500, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    conds = summary["conditions"]
    assert list(conds) == ["none", "age0", "none_df", "refill", "success", "skip_refill"]
    for cond in ("age0", "refill", "success", "skip_refill"):
        assert conds[cond]["replayed_per_step"] > 0  # replay really happened
    assert set(summary["pairs"]) == {"skip_refill_vs_none"}  # the fifth edition's pairs among these conditions
    # the pool of 80 prompts passed twice: every condition generates its 1,280 rollouts, filtering's
    # dropped groups counted, and none_df (new prompts for dropped groups) gets there in fewer steps
    assert {c: s["total_rollouts"] for c, s in conds.items() if c != "success"} == \
        {"none": 1280, "age0": 1280, "none_df": 1280, "refill": 1280, "skip_refill": 1280}
    runs = {r["condition"]: r for r in json.load(__import__("gzip").open(out / "runs.json.gz", "rt"))}
    _check_the_quick_runs(runs)
    assert len(summary["conditions"]["none"]["final_acc_by_band"]) == 5
    assert summary["warm_start"]["pool_size"] == 80
    # the primary metric: avg@8 at the rollout temperature, greedy beside it, in every evaluation
    assert summary["primary_metric"] == {"name": "held-out avg@8", "temperature": 1.0, "samples_per_problem": 8}
    evals = [e for r in runs.values() for e in r["evals"]]
    assert all(0 <= e["accuracy"] <= 1 and 0 <= e["accuracy_greedy"] <= 1 for e in evals)
    assert any(e["accuracy"] != e["accuracy_greedy"] for e in evals)  # two measurements, not one copied
    assert "final_acc_greedy" in summary["pairs"]["skip_refill_vs_none"] and "grpo_gain" in summary
    assert summary["provenance"]["grader"]["math-verify"] and summary["provenance"]["git_commit"]
    for name in ("table.md", "curves.png", "curves_all.png", "bands.png", "spread.png", "runs.json.gz",
                 "zero_variance.png"):
        assert (out / name).is_file(), name
    assert "training 6 run(s) in one session" in proc.stdout
    assert "rollouts per condition; measured 20" in (out / "table.md").read_text().splitlines()[0]
    # RLEP's pool is decoded by GRPO seed 1's final model, in the same session: after that run
    # and just before `success` trains (the last run)
    pool = out / "data" / "success_pool.npz"
    assert "success: RLEP's pool from none_seed1's model, decoded in the session just before success_seed1" \
        in proc.stdout and pool.is_file()
    session = (out / "session.log").read_text()
    assert session.index("run none_seed1 done") < session.index("success_seed1 prepared in") \
        < session.index("run 6/6 success_seed1 starts")
    assert load_pool(pool).successes_per_prompt()
    assert _flag((out / "runs/success_seed1/command.sh").read_text().split(), "--replay.success_pool") == str(pool)
    _check_the_archive_and_the_resume(quick, out, tmp_path, conds, env)


def _check_the_quick_runs(runs: dict) -> None:
    """What each quick run did, step by step (test_the_quick_sweep_trains_evaluates_and_summarises)."""
    # refill generates no replacement prompt, so it takes the planned 10 steps, one fewer for a step
    # whose groups were all dropped (upstream skips it; its prompts count with the next step's)
    assert len(runs["none_df"]["steps"]) < len(runs["refill"]["steps"]) <= 10
    assert runs["none_df"]["evals"][-1]["step"] == len(runs["none_df"]["steps"])  # its final model, graded
    assert sum(s["replay"]["replay/refilled_rows"] for s in runs["refill"]["steps"]) > 0
    # age0's extra update: the step's own A != 0 rows, as many as uniform would replay (0.5 x 128),
    # and none on a step whose groups all had equal rewards (seen at this 0.05 warm start)
    age0 = runs["age0"]["steps"][4:]
    assert [s["replayed_rollouts"] for s in age0] == [64.0 if s["replay"].get("replay/candidates") else 0.0
                                                     for s in age0]
    assert sum(s["replayed_rollouts"] > 0 for s in age0) >= len(age0) // 2
    assert all(s["replay"]["replay/age_mean"] == 0 for s in age0)
    # skipping: its loader holds 3 x the passes and the session stops it after 10 steps; the second
    # pass skips prompts whose first group had equal rewards; every group generated is counted
    skip = runs["skip_refill"]["steps"]
    assert len(skip) <= 10 and sum(s["replay"].get("replay/skip_skipped_prompts", 0) for s in skip) > 0
    # one session, RLEP's run included (its pool decoded inside it); each run names its CPU
    assert len({run["session"] for run in runs.values()}) == 1 and all(r["cpu"] for r in runs.values())
    for run in runs.values():
        steps = run["steps"]
        assert sum(s["groups"] for s in steps) * 8 == sum(s["generated_rollouts"] for s in steps)
        assert all(0 <= s["zero_variance_groups"] <= s["groups"] for s in steps)
        assert all(s["generated_tokens"] >= s["groups"] * 8 for s in steps)  # at least the end token each


def _check_the_archive_and_the_resume(quick: list, out: Path, tmp_path: Path, conds: dict, env: dict) -> None:
    """A later checkout restores every run from the archive; a rerun of the same call redoes nothing."""
    again = subprocess.run([*quick[:quick.index("--out-dir") + 1], str(tmp_path / "again"),
                            *quick[quick.index("--out-dir") + 2:]], cwd=ROOT, capture_output=True, text=True,
                           timeout=600, env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "6 finished run(s) restored" in again.stdout and "run(s) in one session" not in again.stdout
    restored = json.loads(again.stdout.strip().splitlines()[-1])["conditions"]
    assert {c: (s["total_rollouts"], s["final_acc_by_band"]) for c, s in restored.items()} == \
        {c: (s["total_rollouts"], s["final_acc_by_band"]) for c, s in conds.items()}
    # resuming redoes nothing: every run is DONE with the same command, so no session starts
    session_log = (out / "session.log").read_text()
    again = subprocess.run(quick, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "run(s) in one session" not in again.stdout
    assert "warm start: its evaluation read from" in again.stdout  # not measured again either
    assert (out / "session.log").read_text() == session_log
