"""The lab's fifth edition: its conditions' commands (skipping's loader and warm-up, the launcher
accepting each), the session's count of what generation made, and a trained run graded on resume.
The conditions train end to end in test_sample_efficiency.py's quick sweep."""
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks/lab")]

import sample_efficiency as se  # noqa: E402
import se_command  # noqa: E402
from se_session import GenerationTally  # noqa: E402


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_the_fifth_editions_defaults_and_primary_pair():
    a = se.parse_args([])
    assert a.condition_list == list(se.FIFTH_EDITION) and a.out_dir.name == "sample_efficiency_e5"
    assert (a.steps, a.pool_steps, a.eval_every, a.pool_size) == (60, 20, 6, 320)  # every prompt 3 times
    assert {c: a.seeds_of(c) for c in a.condition_list} == \
        {"none": 16, "uniform": 8, "skip": 8, "skip_uniform": 8, "skip_refill": 16}
    assert se.parse_args(["--edition", "4"]).condition_list == list(se.EDITION)


def test_skipping_runs_get_more_passes_and_the_same_lr_warm_up():
    a = se.parse_args(["--out-dir", "/tmp/unused"])
    cmds = {c: se.train_command(a, c, 2, Path("m"), Path("d"), Path("r")) for c in se.FIFTH_EDITION}
    assert {c for c, cmd in cmds.items() if "--replay.skip" in cmd} == set(se.SKIPPING) & set(cmds)
    assert {c: _flag(cmd, "--train.num_episodes") for c, cmd in cmds.items()} == \
        {"none": "3", "uniform": "3", "skip": "9", "skip_uniform": "9", "skip_refill": "9"}
    # upstream sizes the schedule from the passes: 3 x the optimizer steps, a third of the ratio
    warm_up = {}
    for c, cmd in cmds.items():
        schedule = int(_flag(cmd, "--train.num_episodes")) * a.pool_size * a.group_size // a.train_batch
        warm_up[c] = math.ceil(schedule * float(_flag(cmd, "--actor.lr_warmup_ratio")))
    assert set(warm_up.values()) == {4}, warm_up  # ceil(0.03 x 120) optimizer steps for every condition
    assert "--algo.dynamic_filtering_enable" in cmds["skip_refill"] and "--replay.refill" in cmds["skip_refill"]
    assert se.condition_flags("skip_uniform", a) == [*se.condition_flags("uniform", a), "--replay.skip"]


def test_the_launcher_accepts_every_fifth_edition_command():
    from openrlhf_replay.cli.validate import resolve_training, split_command

    a = se.parse_args(["--out-dir", "/tmp/unused"])
    for cond in se.FIFTH_EDITION:
        module, argv = split_command(se.train_command(a, cond, 1, ROOT / "m", ROOT / "d.jsonl", Path("/tmp/r")))
        args, _ = resolve_training(module, argv)
        assert args.train.num_episodes in (3, 9), cond


class _Generator:
    """The two methods of upstream's samples generator the tally wraps (their real counterparts
    run in the quick sweep): a call returns its samples and the prompts drawn."""

    def __init__(self, group_size):
        self.args = SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=group_size))

    def generate_samples(self, **kwargs):
        return [], None, kwargs["prompts"], False

    def _process_response_into_experience(self, response, **kwargs):
        return SimpleNamespace(prompts=[response["prompt"]], response_length=torch.tensor([response["length"]]))


def test_the_tally_counts_tokens_groups_and_zero_variance_groups_per_step():
    gen, tally = _Generator(group_size=2), GenerationTally()
    tally.install(gen)
    for prompt, rewards in (("a", (1.0, 1.0)), ("b", (0.0, 1.0)), ("c", (0.0, 0.0))):
        for r in rewards:
            gen._process_response_into_experience({"prompt": prompt, "reward": r, "length": 3})
    gen._process_response_into_experience({"prompt": "d", "reward": 1.0, "length": 5})  # its group is not complete
    gen.generate_samples(prompts=4)
    assert tally.take() == {"lab/prompts_consumed": 4, "lab/generated_tokens": 23, "lab/groups": 3,
                            "lab/zero_variance_groups": 2}
    gen._process_response_into_experience({"prompt": "d", "reward": 0.0, "length": 1})
    assert tally.take() == {"lab/prompts_consumed": 0, "lab/generated_tokens": 1, "lab/groups": 1,
                            "lab/zero_variance_groups": 0}


def test_the_tally_ends_a_run_once_its_prompts_are_drawn():
    gen, tally = _Generator(group_size=2), GenerationTally(max_prompts=32)
    tally.install(gen)
    assert [gen.generate_samples(prompts=16)[2:] for _ in range(3)] == [(16, False), (16, False), (0, True)]
    assert tally.take()["lab/prompts_consumed"] == 32


def test_a_run_trained_and_not_graded_is_graded_on_resume_not_retrained(tmp_path):
    a = se.parse_args(["--out-dir", str(tmp_path)])
    cmd = se.train_command(a, "skip", 1, Path("m"), Path("d"), se.run_dir_of(a, "skip", 1))
    run_dir = se.run_dir_of(a, "skip", 1)
    (run_dir / "model").mkdir(parents=True)
    (run_dir / "command.sh").write_text(se_command.command_script(cmd))
    assert se.finished_record(a, "skip", 1, cmd) is None and not run_dir.exists()  # training unfinished
    (run_dir / "model").mkdir(parents=True)
    (run_dir / "command.sh").write_text(se_command.command_script(cmd))
    (run_dir / "steps.json").write_text(json.dumps({"steps": []}))
    assert se.finished_record(a, "skip", 1, cmd) == "trained"
    other = se.train_command(a, "skip", 2, Path("m"), Path("d"), run_dir)
    assert se.finished_record(a, "skip", 1, other) is None and not run_dir.exists()  # another command


def test_analyse_only_reads_a_committed_archive_and_refuses_two_runs_of_one_seed(tmp_path):
    import gzip

    archive = tmp_path / "archive.json.gz"
    records = [{"condition": c, "seed": s, "fingerprint": f"{c}{s}"} for c in ("none", "skip") for s in (1, 2, 9)]
    with gzip.open(archive, "wt") as f:
        json.dump(records + [{"condition": "advantage", "seed": 1, "fingerprint": "x"}], f)
    a = se.parse_args(["--analyse-only", "--archive", str(archive), "--out-dir", str(tmp_path),
                       "--conditions", "none,skip", "--seeds", "16", "--ablation-seeds", "2"])
    assert sorted((r["condition"], r["seed"]) for r in se.analysed_runs(a)) == \
        [("none", 1), ("none", 2), ("none", 9), ("skip", 1), ("skip", 2)]  # skip: 2 seeds planned
    with gzip.open(archive, "wt") as f:
        json.dump(records + [{"condition": "none", "seed": 1, "fingerprint": "another command"}], f)
    with pytest.raises(SystemExit, match="two runs of none seed 1"):
        se.analysed_runs(a)


def _timed_run(cond, seed, step_s, session=None):
    step = {"generation_s": step_s / 2, "make_experience_s": 0.0, "ppo_train_s": step_s / 2, "broadcast_s": 0.0}
    return {"condition": cond, "seed": seed, "session": session, "wall_s": 1000.0, "steps": [step, step]}


def test_step_seconds_compare_a_run_only_with_its_seeds_baseline_timed_in_the_same_session():
    import se_costs

    none = [_timed_run("none", 1, 2.0, "A"), _timed_run("none", 2, 4.0, "A"), _timed_run("none", 3, 1.0, "B")]
    other = [_timed_run("skip", 1, 3.0, "A"), _timed_run("skip", 2, 4.0, "A"), _timed_run("skip", 3, 9.0, "C")]
    r = se_costs.seconds_vs_baseline(other, none)
    assert r["n"] == 2 and r["median"] == pytest.approx(1.25)  # seed 3 ran in another session: not paired
    assert se_costs.seconds_vs_baseline(other[2:], none) is None
    old = [{**r, "session": None} for r in none], [{**r, "session": None} for r in other]
    assert se_costs.seconds_vs_baseline(old[1], old[0])["n"] == 3  # records without a session pair by seed


def test_the_table_names_the_runs_date_and_cpu_or_says_they_are_not_recorded():
    import se_report

    base = {"settings": {"task": "t", "steps": 1, "prompts_per_step": 1, "group_size": 1}}
    assert "measured 2026-12-06 on cpu X" in se_report.header_line({**base, "timing": {"date": "2026-12-06",
                                                                                        "cpu": "cpu X"}})
    older = {**base, "timing": {"date": None, "cpu": None, "analysed": "2026-12-07", "analysed_on": "cpu Y"}}
    assert "analysed 2026-12-07 on cpu Y; the runs do not record their date and CPU" in se_report.header_line(older)


def test_the_median_curve_is_read_checkpoint_by_checkpoint_and_tabled_with_the_zero_variance_thirds():
    import se_analysis
    import se_report

    def run(*accs, steps=(0, 6, 12)):
        return {"evals": [{"step": s, "accuracy": a} for s, a in zip(steps, accs)]}

    curve = se_analysis.median_curve([run(0.1, 0.2, 0.3), run(0.1, 0.4, 0.2), run(0.1, 0.3, 0.1)])
    assert curve == pytest.approx({0: 0.1, 6: 0.3, 12: 0.2})
    assert se_analysis.median_curve([run(0.1, 0.2, 0.3), run(0.1, 0.2, steps=(0, 5))]) is None  # ended early
    conds = {"none": {"median_curve": curve, "zero_variance_share_by_third": [0.4, 0.3, 0.2]},
             "skip": {"median_curve": curve, "zero_variance_share_by_third": None}}
    lines = se_report._curves_table({"conditions": conds, "primary_metric": {"name": "avg@8"}})
    assert "| none | 0.100 | 0.300 | 0.200 | 0.40 / 0.30 / 0.20 |" in lines
    assert "| skip | 0.100 | 0.300 | 0.200 | n/a |" in lines
    conds["skip"]["median_curve"] = None
    assert se_report._curves_table({"conditions": conds, "primary_metric": {"name": "avg@8"}}) == []
