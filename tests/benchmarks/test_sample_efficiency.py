"""The sample-efficiency lab's analysis on hand-made run records (no Ray, no model)."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import se_analysis as sa  # noqa: E402


def make_run(condition, seed, accs, *, eval_every=2, reward=0.5, ppo_s=2.0, gen_s=3.0, opt_steps=2,
             tokens=7.0, rollouts_per_step=128):
    """A run with len(accs) - 1 evaluations after step 0, one every `eval_every` steps."""
    n_steps = eval_every * (len(accs) - 1)
    steps = [{"step": t, "reward": reward + 0.01 * t, "response_tokens": tokens, "generation_s": gen_s,
              "make_experience_s": 1.0, "ppo_train_s": ppo_s, "broadcast_s": 0.5, "optimizer_steps": opt_steps}
             for t in range(1, n_steps + 1)]
    evals = [{"step": i * eval_every, "accuracy": a, "response_tokens": tokens} for i, a in enumerate(accs)]
    return {"condition": condition, "seed": seed, "rollouts_per_step": rollouts_per_step, "steps": steps,
            "evals": evals}


def test_quantile_band_median_and_iqr_per_point_ignoring_missing():
    band = sa.quantile_band([[0.0, 1.0, np.nan], [1.0, 2.0, 5.0], [2.0, 6.0, np.nan], [3.0, 3.0, np.nan]])
    assert band["median"].tolist() == [1.5, 2.5, 5.0]
    assert band["q25"][0] == pytest.approx(0.75) and band["q75"][0] == pytest.approx(2.25)
    assert band["n"].tolist() == [4, 4, 1]


def test_quantile_band_all_missing_column_is_nan():
    band = sa.quantile_band([[1.0, np.nan], [2.0, np.nan]])
    assert math.isnan(band["median"][1]) and band["n"][1] == 0


def test_interpolate_onto_is_linear_and_never_extrapolates():
    out = sa.interpolate_onto([0, 10], [0.0, 1.0], [-1, 0, 5, 10, 11])
    assert out[1:4].tolist() == [0.0, 0.5, 1.0]
    assert math.isnan(out[0]) and math.isnan(out[4])


def test_unit_seconds_is_baseline_train_time_per_optimizer_step():
    runs = [make_run("none", 1, [0.1, 0.2], ppo_s=2.0, opt_steps=2),  # 2 steps: 4 s / 4 updates
            make_run("none", 2, [0.1, 0.2], ppo_s=6.0, opt_steps=2)]  # 2 steps: 12 s / 4 updates
    assert sa.unit_seconds(runs) == pytest.approx(16.0 / 8.0)


def test_unit_seconds_refuses_runs_without_updates():
    with pytest.raises(ValueError):
        sa.unit_seconds([make_run("none", 1, [0.1, 0.2], opt_steps=0)])


def test_cumulative_axes_rollouts_and_compute_units():
    run = make_run("advantage", 1, [0.1, 0.2, 0.3], ppo_s=3.0, gen_s=3.0)  # 4 steps
    axes = sa.cumulative_axes(run, unit_s=0.5)
    assert axes["rollouts"].tolist() == [0, 128, 256, 384, 512]
    # training: (3.0 + 0.5) / 0.5 = 7 per step; generation: (3.0 + 1.0) / 0.5 = 8 per step
    assert axes["train_units"].tolist() == [0, 7, 14, 21, 28]
    assert axes["generation_units"].tolist() == [0, 8, 16, 24, 32]
    assert axes["compute_units"][-1] == pytest.approx(60)


def test_cumulative_axes_refuses_missing_steps():
    run = make_run("none", 1, [0.1, 0.2])
    del run["steps"][0]
    with pytest.raises(ValueError, match="steps are not"):
        sa.cumulative_axes(run, 1.0)


def test_eval_curve_places_evaluations_on_the_chosen_axis():
    run = make_run("none", 1, [0.1, 0.2, 0.4], eval_every=2)
    x, y = sa.eval_curve(run, 1.0, "rollouts")
    assert x.tolist() == [0, 256, 512] and y.tolist() == [0.1, 0.2, 0.4]
    x, _ = sa.eval_curve(run, 1.0, "step")
    assert x.tolist() == [0, 2, 4]


def test_aggregate_shared_x_takes_the_median_over_runs():
    curves = [(np.array([0, 1, 2]), np.array([0.1, 0.2, 0.3])),
              (np.array([0, 1, 2]), np.array([0.1, 0.4, 0.5])),
              (np.array([0, 1, 2]), np.array([0.1, 0.3, 0.9]))]
    agg = sa.aggregate(curves)
    assert agg["x"].tolist() == [0, 1, 2]
    assert agg["median"].tolist() == pytest.approx([0.1, 0.3, 0.5])
    assert agg["q75"][2] == pytest.approx(0.7)


def test_aggregate_different_x_interpolates_within_the_shortest_run():
    curves = [(np.array([0.0, 10.0]), np.array([0.0, 1.0])), (np.array([0.0, 20.0]), np.array([0.0, 1.0]))]
    agg = sa.aggregate(curves)
    assert agg["x"][-1] == 10.0
    assert agg["median"][-1] == pytest.approx((1.0 + 0.5) / 2)


def test_trailing_mean():
    assert sa.trailing_mean([1.0, 3.0, 5.0, 7.0], 2).tolist() == [1.0, 2.0, 4.0, 6.0]
    assert sa.trailing_mean([2.0, 4.0], 5).tolist() == [2.0, 3.0]
    with pytest.raises(ValueError):
        sa.trailing_mean([1.0], 0)


def test_first_reach():
    assert sa.first_reach([0, 1, 2, 3], [0.1, 0.5, 0.4, 0.9], 0.45) == 1
    assert sa.first_reach([0, 1], [0.1, 0.2], 0.5) is None


def test_rollouts_to_match_ratio_half_and_never():
    base = {"x": np.array([0, 100, 200, 300, 400]), "median": np.array([0.2, 0.3, 0.4, 0.45, 0.5])}
    fast = {"x": base["x"], "median": np.array([0.2, 0.5, 0.5, 0.5, 0.5])}
    slow = {"x": base["x"], "median": np.array([0.2, 0.25, 0.3, 0.35, 0.48])}
    assert sa.rollouts_to_match_ratio(base, base) == 1.0
    assert sa.rollouts_to_match_ratio(fast, base) == pytest.approx(100 / 400)
    assert sa.rollouts_to_match_ratio(slow, base) is None  # 0.48 < 0.98 * 0.5
    almost = {"x": base["x"], "median": np.array([0.2, 0.25, 0.3, 0.35, 0.49])}
    assert sa.rollouts_to_match_ratio(almost, base) == 1.0  # 0.49 >= 0.98 * 0.5


def test_summarize_end_to_end():
    runs = [make_run("none", s, [0.2, 0.3, 0.4], tokens=8.0) for s in (1, 2, 3)]
    runs += [make_run("advantage", 1, [0.2, 0.4, 0.4], tokens=6.0, opt_steps=3, ppo_s=3.0),
             make_run("advantage", 2, [0.2, 0.4, 0.5], tokens=6.0, opt_steps=3, ppo_s=3.0),
             make_run("advantage", 3, [0.2, 0.1, 0.3], tokens=6.0, opt_steps=3, ppo_s=3.0)]
    summary = sa.summarize(runs)
    assert summary["conditions"] == ["none", "advantage"]
    assert summary["unit_s"] == pytest.approx(1.0)  # 2.0 s per 2 updates
    assert summary["none"]["best_acc"] == pytest.approx(0.4)
    assert summary["advantage"]["best_acc"] == pytest.approx(0.4)  # median curve: 0.2, 0.4, 0.4
    # GRPO reaches 0.392 at 512 rollouts; advantage's median curve reaches it at 256
    assert summary["advantage"]["rollouts_to_match_ratio"] == pytest.approx(0.5)
    assert summary["none"]["rollouts_to_match_ratio"] == pytest.approx(1.0)
    assert summary["none"]["aes_vs_grpo"] == pytest.approx(0.0)
    # final median acc 0.4 vs 0.4 (dAcc 0), length 6 vs 8: dLen = 0.25
    assert summary["advantage"]["aes_vs_grpo"] == pytest.approx(0.25)
    assert summary["advantage"]["train_units"] == pytest.approx(4 * (3.0 + 0.5))
    assert summary["advantage"]["total_rollouts"] == 512


def test_summarize_needs_the_baseline():
    with pytest.raises(ValueError, match="baseline"):
        sa.summarize([make_run("advantage", 1, [0.1, 0.2])])


def test_parse_step_logs_reads_upstream_status_lines():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from sample_efficiency import parse_step_logs

    text = ("noise\n(PPOTrainer pid=1) INFO ppo_trainer.py:551] \u2728 Global step 1: {'reward': 0.5, "
            "'timing/generation': 1.0, 'x': nan}\n"
            "(PPOTrainer pid=1) INFO ppo_trainer.py:551] \u2728 Global step 2: {'reward': 0.75}\n")
    steps = parse_step_logs(text)
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[1]["reward"] == 0.75 and math.isnan(steps[0]["x"])


def test_parse_step_logs_joins_a_line_ray_split():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from sample_efficiency import parse_step_logs

    pre = "\x1b[36m(_ReplayPPOTrainer pid=7)\x1b[0m "
    text = (pre + "INFO ppo_trainer.py:551] \u2728 Global step 3: {'reward': 0.5, 'replay/size': 12\n"
            + pre + "Episode [1/1]:  90%|#### | 688/768\n"
            + "\x1b[36m(Other pid=8)\x1b[0m 99, 'x': 1}\n"
            + pre + "80.0, 'timing/generation': 1.0}\n")
    steps = parse_step_logs(text)
    assert steps == [{"step": 3, "reward": 0.5, "replay/size": 1280.0, "timing/generation": 1.0}]


def test_the_more_updates_control_trains_each_batch_twice_and_counts_its_updates():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import sample_efficiency as se

    a = se.parse_args(["--out-dir", "/tmp/unused"])
    commands = {c: se.train_command(a, c, 1, Path("m"), Path("d"), Path("r")) for c in ("none", "none_2epochs")}
    epochs = {c: cmd[cmd.index("--train.max_epochs") + 1] for c, cmd in commands.items()}
    assert epochs == {"none": "1", "none_2epochs": "2"}
    assert "--replay.mode" in commands["none_2epochs"] and commands["none_2epochs"].count("--train.max_epochs") == 1
    status = {"step": 1, "rollout/reward_mean": 0.5, "rollout/response_length_mean": 7.0, "timing/generation": 1.0,
              "timing/make_experience": 1.0, "timing/ppo_train": 2.0, "timing/broadcast": 0.1,
              "rollout/num_samples": 128.0}
    assert se.step_record(status, a)["optimizer_steps"] == 2
    assert se.step_record(status, a, se.EPOCHS["none_2epochs"])["optimizer_steps"] == 4
