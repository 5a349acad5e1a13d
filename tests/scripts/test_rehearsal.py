"""The rehearsal (`REHEARSE=... bash examples/scripts/<script>.sh`): every shipped training script walked
step by step on this CPU through all its episodes, at every supported GPU count and model scale.

The GPU-shaped checks a launch cannot make before a GPU run: no crash at any shape (a partial
batch at an episode's end, a replay split that leaves ranks unequal), every rank taking the same
optimizer steps, every condition replaying what its configuration says and warming its LR up
over the same rollout steps, and reporting per step what it replayed and how many optimizer steps
it took (what compare.sh puts beside each condition's results). Data: a subset of the scripts'
real prompt file whose size is not a multiple of the batch (560 = 4 x 128 + 48), walked over the
scripts' 4 episodes with the replay warm-up shortened from 20 steps to 6 and checkpoints every 5
steps, so that replay, prompts coming back in later episodes and the rehearsal's resume all fall
inside 16 steps; and the real file
(7,474 = 58 x 128 + 50) for one episode of the method's script, its other settings as shipped.
The stand-in solves a prompt with a probability drawn around a mean of REHEARSE_SOLVE_RATE = 0.4.
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "examples/scripts"
DATA = ROOT.parent / "shared/data/train/deepscaler_math_train.json"
TRAINING = ["train_grpo", "train_grpo_replay", "train_grpo_naive_replay", "train_grpo_uniform_replay",
            "train_grpo_freshness_replay", "train_grpo_success_replay"]
SUBSET_PROMPTS, BATCH, EPISODES, WARMUP, SAVE_STEPS = 560, 128, 4, 6, 5
BATCH_ROWS = 256  # rollouts per training batch (one optimizer step)
STEPS_PER_EPISODE = SUBSET_PROMPTS // BATCH  # the 48 left over are not trained on (whole batches only)
STEPS = STEPS_PER_EPISODE * EPISODES
SOLVE_RATE = 0.4
# How each condition takes replayed rows' pi_old, as its launcher resolves it.
OFF_POLICY = {"train_grpo": None, "train_grpo_replay": "stale", "train_grpo_naive_replay": "stale",
              "train_grpo_uniform_replay": "stale", "train_grpo_freshness_replay": "stale",
              "train_grpo_success_replay": "recompute"}


def _rehearse(script: str, data: Path, tmp: Path, *flags: str, **env) -> tuple[dict, str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "NUM_GPUS", "NUM_NODES", "OUTPUT_DIR")}
    full_env.update(PYTHON=sys.executable, RUNS_DIR=str(tmp / "runs"), RAY_ADDRESS="", DATA=str(data), **env)
    proc = subprocess.run(["bash", str(SCRIPTS / f"{script}.sh"), *flags], env=full_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr + proc.stdout


@pytest.fixture(scope="module")
def subset_runs(tmp_path_factory):
    if not DATA.is_file():
        pytest.fail(f"{DATA} not found (the scripts' prompt file; see ../shared/data/SOURCES.md)")
    tmp = tmp_path_factory.mktemp("rehearsal")
    subset = tmp / "subset.json"
    subset.write_text(json.dumps(json.loads(DATA.read_text())[:SUBSET_PROMPTS]))
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores: two rehearsals at a time
        runs = pool.map(lambda s: _rehearse(s, subset, tmp, REHEARSE="all", SAVE_STEPS=str(SAVE_STEPS),
                                            REPLAY_WARMUP=str(WARMUP), REHEARSE_SOLVE_RATE=str(SOLVE_RATE)),
                        TRAINING)
        return dict(zip(TRAINING, runs))


@pytest.mark.parametrize("script", TRAINING)
def test_every_shape_runs_every_step_with_balanced_ranks(subset_runs, script):
    report, log = subset_runs[script]
    assert report["crash"] is None, log[-3000:]
    assert report["steps_expected"] == report["steps_completed"] == STEPS
    assert report["steps_per_episode"] == [STEPS_PER_EPISODE] * EPISODES
    shapes = report["shapes"]
    assert len(shapes) == 1 + 18  # the script's own, then 3 scales x 6 GPU counts
    assert {(s["gpus"], s["model"].split("-")[1]) for s in shapes[1:]} == {
        (g, m) for g in (1, 2, 4, 8, 16, 32) for m in ("0.6B", "1.7B", "4B")}
    total = sum(report["optimizer_steps_per_rank"]) / len(report["optimizer_steps_per_rank"])
    for shape in shapes:
        assert shape["crash"] is None and shape["steps_completed"] == report["steps_completed"], shape
        assert len(shape["optimizer_steps_per_rank"]) == shape["gpus"]
        for per_rank in (shape["optimizer_steps_per_rank"], *shape["micro_batches_per_rank"].values()):
            assert len(set(per_rank)) == 1, (shape["flags"], per_rank)  # every rank alike
        # The same rollouts at every shape: the same optimizer steps, none cut short or carried over.
        assert shape["optimizer_steps_per_rank"][0] == total
        assert set(shape["rows_dropped_per_rank"]) == {0} and set(shape["micro_batches_carried_at_end"]) == {0}
    # A resume of the whole controller from the first checkpoint after the replay warm-up (6; RLEP's
    # offline pool has none).
    assert report["checkpoints"] == [5, 10, 15]
    assert report["resumed_at"] == (5 if script in ("train_grpo", "train_grpo_success_replay") else 10)


def test_every_condition_replays_what_its_configuration_says(subset_runs):
    after = STEPS - WARMUP  # steps 7..16: replay starts after the warm-up steps
    for script in ("train_grpo_replay", "train_grpo_uniform_replay", "train_grpo_freshness_replay",
                   "train_grpo_naive_replay"):
        replayed = subset_runs[script][0]["replayed_per_step"]
        # ratio 0.5 x 1,024 fresh = 512 = two whole training batches of 256, on every step after warm-up
        assert (replayed["min"], replayed["max"], replayed["steps_with_replay"]) == (512, 512, after), script
    assert subset_runs["train_grpo"][0]["replayed_per_step"]["steps_after_warmup"] == 0
    success, log = subset_runs["train_grpo_success_replay"]
    # RLEP, by default from the offline pool (here the rehearsal's stand-in for it, the GRPO run not
    # being trained yet): min(2, its pooled successes) of each of the step's 128 prompts, so at most
    # 256, from the first step (an offline pool has no warm-up)
    replayed = success["replayed_per_step"]
    assert 0 < replayed["min"] <= replayed["max"] <= 256 and replayed["steps_with_replay"] == STEPS, replayed
    assert "is not built yet: rehearsing with a stand-in pool of" in log
    assert "up to 2 successes of each of the 128 prompts" in log and "from the first step, from the offline pool" in log
    assert "pi_old of replayed rows: recompute" in log
    assert success["replay_age"]["max"] == STEPS  # pool rollouts (version -1) are never evicted


def test_every_condition_warms_up_over_the_same_rollout_steps(subset_runs):
    reports = {script: run[0] for script, run in subset_runs.items()}
    base = reports["train_grpo"]
    # 512 prompts x 8 / 256 x 4 episodes = 64 optimizer steps (replay's are not counted: counted,
    # they would make it 84); 3% of them, rounded up, = 2: inside the first rollout step (4 each)
    assert (base["lr_schedule_optimizer_steps"], base["lr_warmup_optimizer_steps"]) == (64, 2)
    for script, report in reports.items():
        assert report["lr_warmup_rollout_steps"] == base["lr_warmup_rollout_steps"] == 1, script
        assert report["lr_schedule_optimizer_steps"] == 64, script
        lr = report["lr_after_warmup"]
        assert lr["min"] == lr["max"] == 1e-6, script  # constant after the warm-up (docs/METHOD.md)
        # Paced by rollout steps with replay: every run ends on the schedule's end, its last optimizer
        # step less than one step before it (docs/METHOD.md section 9).
        assert report["lr_schedule_position_at_end"] == 64, script
        assert 63 <= report["lr_last_optimizer_step"]["position"] < 64, script
    assert reports["train_grpo_replay"]["optimizer_steps_taken"] == 64 + 10 * 2  # replay's two batches a step


def test_the_real_dataset_is_cut_to_whole_batches_and_walked_through(tmp_path):
    if not DATA.is_file():
        pytest.fail(f"{DATA} not found")
    report, log = _rehearse("train_grpo_replay", DATA, tmp_path, REHEARSE="1", EPISODES="1")
    assert "--data.max_samples 7424" in report["command"]  # 7,474 = 58 x 128 + 50: the 50 are not used
    assert report["crash"] is None, log[-3000:]
    # The step that would have held the 50 (step 59, 400 rollouts) is not there; replay from step 21.
    assert report["steps_per_episode"] == [58] and report["steps_completed"] == 58
    assert set(report["optimizer_steps_per_rank"]) == {4 * 58 + 2 * (58 - 20)}
    assert report["resumed_at"] == 40


@pytest.mark.parametrize("script", ["train_grpo_replay", "train_grpo_success_replay"])
def test_dynamic_batching_trains_every_row_on_equal_steps(tmp_path, script):
    """--train.dynamic_batch_enable, with a fixed replayed count and with RLEP's varying one (completed
    by inert rows): upstream's controller deals the rows by length (`balance_experiences`), so the
    ranks' fresh shares differ; each stand-in rank takes one optimizer step per local training batch,
    as the actor's `AllRowsReplayBuffer` does (its packing by tokens is not modelled). No row is left
    out, every rank takes the same steps, and the LR schedule, paced by the rows summed over the
    ranks, ends on its end (paced by rank 0's own share it ended at 63.53 of 64 here)."""
    subset = tmp_path / "subset.json"
    subset.write_text(json.dumps(json.loads(DATA.read_text())[:SUBSET_PROMPTS]))
    report, log = _rehearse(script, subset, tmp_path, "--train.dynamic_batch_enable",
                            REHEARSE="1", REPLAY_WARMUP=str(WARMUP), REHEARSE_SOLVE_RATE=str(SOLVE_RATE))
    assert report["crash"] is None and report["steps_completed"] == STEPS, log[-3000:]
    assert set(report["rows_dropped_per_rank"]) == {0} and len(set(report["optimizer_steps_per_rank"])) == 1
    replayed = sum(report["replayed_per_step"]["counts"])
    assert replayed > 0 and report["optimizer_steps_per_rank"][0] >= 64 + replayed / BATCH_ROWS
    assert report["lr_schedule_position_at_end"] == 64 and 63 <= report["lr_last_optimizer_step"]["position"] < 64


@pytest.mark.parametrize("script", TRAINING)
def test_the_report_gives_each_steps_replay_and_optimizer_steps(subset_runs, script):
    report = subset_runs[script][0]
    assert report["settings"]["solve_rate"] == SOLVE_RATE  # REHEARSE_SOLVE_RATE reached the stand-in
    assert report["off_policy"] == OFF_POLICY[script]
    replayed = report["replayed_per_step"]
    counts = replayed["counts"]  # every rollout step from step 1, the warm-up's zeros included
    warmup = 0 if script == "train_grpo_success_replay" else WARMUP  # RLEP's offline pool has none
    assert len(counts) == len(replayed["candidates"]) == STEPS and counts[:warmup] == [0] * warmup
    after = counts[warmup:] if script != "train_grpo" else []
    assert replayed["steps_after_warmup"] == len(after)
    assert replayed["histogram"] == {str(c): after.count(c) for c in sorted(set(after))}
    if after:
        assert (replayed["min"], replayed["max"]) == (min(after), max(after))
        assert replayed["share_with_replay"] == round(sum(c > 0 for c in after) / len(after), 4)
    # Each step trains its 1,024 fresh rollouts in 4 batches of 256 and its replayed ones in whole
    # batches more; the report's mean over rollout steps is the run's total over its steps.
    per_rank = report["optimizer_steps_per_rank"][0]
    assert per_rank == 4 * STEPS + sum(-(-c // BATCH_ROWS) for c in counts)
    assert report["optimizer_steps_per_step"]["mean"] == pytest.approx(per_rank / STEPS)


def test_rlep_replays_on_nine_in_ten_of_all_steps_with_its_default_offline_pool(subset_runs):
    """A step replays when it trains on at least one pooled success; with the offline pool (the
    script's default) that holds from the first step, warm-up or not. The report's `candidates`
    (the success sampler's count of pooled successes of the step's prompts) says why a step that
    does not replay could not."""
    report = subset_runs["train_grpo_success_replay"][0]
    replayed = report["replayed_per_step"]
    replaying = [i for i in range(STEPS) if replayed["counts"][i] > 0]
    assert len(replaying) >= 0.9 * STEPS, (replayed["counts"], replayed["candidates"])
    steps = [i for i, c in enumerate(replayed["candidates"]) if c >= 1]
    assert replayed["when_pool_has_candidates"] == {"steps": len(steps), "steps_with_replay": len(replaying),
                                                    "share": round(len(replaying) / len(steps), 4)}


def test_the_stand_ins_solve_rate_is_a_seeded_spread_around_its_mean():
    from openrlhf_replay.rehearsal.standins import Settings, solve_probability

    prompts = [f"problem {i}" for i in range(4000)]
    p = np.array([solve_probability(t, Settings(solve_rate=0.4)) for t in prompts])
    assert abs(p.mean() - 0.4) < 0.02
    # Beta(0.6, 0.9): U-shaped, 15% of prompts below 0.05 and 4% above 0.95 (all-wrong, all-right groups)
    assert 0.12 < (p < 0.05).mean() < 0.19 and 0.02 < (p > 0.95).mean() < 0.07
    assert p[:50].tolist() == [solve_probability(t, Settings(solve_rate=0.4)) for t in prompts[:50]]
    assert p[:50].tolist() != [solve_probability(t, Settings(solve_rate=0.4, seed=1)) for t in prompts[:50]]
    tight = np.array([solve_probability(t, Settings(solve_rate=0.4, solve_concentration=200)) for t in prompts])
    assert abs(tight.mean() - 0.4) < 0.01 and tight.std() < 0.05
    assert {solve_probability(t, Settings(solve_rate=0.0)) for t in prompts[:20]} == {0.0}
    for bad, flag in (({"solve_rate": 1.5}, "--solve-rate 1.5"),
                      ({"solve_concentration": 0}, "--solve-concentration 0")):
        with pytest.raises(ValueError, match=flag):
            Settings(**bad)


def _finished_eval(label: str, correct: list[int]) -> "comparison.RunData":
    """A finished evaluation of `label`: one sample per problem of MATH-500, correct as given."""
    from evaluation import comparison, report
    from evaluation.metrics import summarize

    records = [dict(benchmark="math500", problem_id=str(i), sample_index=0, prompt="p", response="r",
                    response_tokens=100 + i, truncated=False, extracted="1", gold="1",
                    verdict="correct" if c else "incorrect") for i, c in enumerate(correct)]
    per = summarize(records)
    summary = {"benchmarks": per, "macro_average": report.macro(per), "run": {"model": label, "n_samples": 1},
               "wall_time_s": 1.0}
    return comparison.RunData(label, summary, records)


def test_compare_puts_each_runs_optimizer_steps_beside_its_results(subset_runs, tmp_path):
    """What compare.sh runs after `evaluation compare`: the real comparison's files, then each row's
    rehearsal (`<run>.json`, as the scripts write them) beside it."""
    import csv

    from evaluation import comparison, comparison_files
    from openrlhf_replay.rehearsal.report import main

    labels = {"grpo_seed42": "train_grpo", "Qwen3-1.7B-Base": None, "grpo_replay_seed42": "train_grpo_replay",
              "grpo_success_replay_seed42": "train_grpo_success_replay", "grpo_uniform_replay_seed42": None}
    runs = [_finished_eval(label, [(i * (k + 1)) % 3 == 0 for i in range(12)]) for k, label in enumerate(labels)]
    out, rehearsals = tmp_path / "compare", tmp_path / "rehearsal"
    comparison_files.write(out, comparison.build(runs))
    rehearsals.mkdir()
    for label, script in labels.items():
        if script:
            (rehearsals / f"{label}.json").write_text(json.dumps(subset_runs[script][0]))
    for _ in range(2):  # a rerun replaces the section rather than adding a second one
        assert main(["beside", "--compare", str(out), "--rehearsals", str(rehearsals)]) == 0
    rows = {r["run"]: r for r in csv.DictReader((out / "compare_steps.csv").open())}
    results = {r["run"]: r for r in csv.DictReader((out / "compare.csv").open())}
    assert list(rows) == list(labels)
    for label, script in labels.items():
        assert (rows[label]["avg"], rows[label]["AES"]) == (results[label]["avg(1)"], results[label]["AES"])
        expected = subset_runs[script][0]["optimizer_steps_per_step"]["mean"] if script else None
        assert rows[label]["optimizer_steps_per_rollout_step"] == ("" if script is None else str(expected))
    assert float(rows["grpo_seed42"]["optimizer_steps_per_rollout_step"]) == 4.0
    assert float(rows["grpo_replay_seed42"]["optimizer_steps_per_rollout_step"]) == (64 + 10 * 2) / STEPS
    md = (out / "compare.md").read_text()
    assert md.count("## Optimizer steps per rollout step") == 1 and md.startswith("#")
    assert "| Qwen3-1.7B-Base |" in md and "not trained by a launch script" in md
    assert "not rehearsed: `REHEARSE=1 SEED=42 bash examples/scripts/train_grpo_uniform_replay.sh`" in md
    assert "| grpo_replay_seed42 | " in md and "| 5.25 (4 / 6) | 512; 100% | stale | 0.4 |" in md


def test_async_training_with_dynamic_filtering_replays_and_counts_every_rollout_its_engines_generated(tmp_path):
    """`--train.async_enable` and dynamic filtering appended to the method's script: half the GPUs
    train, half generate; upstream's async controller runs replay's generator and training actors on
    threads, generation a batch ahead (queue size 1), and the generator actor filters (upstream's
    replacement prompts). Every episode completes, the ranks take equal optimizer steps, every step
    after the warm-up replays, and the training actor logs as generated what the engines generated,
    the filtered groups included (counted in the generator actor, carried with the samples)."""
    subset = tmp_path / "subset.json"
    subset.write_text(json.dumps(json.loads(DATA.read_text())[:SUBSET_PROMPTS]))
    report, log = _rehearse("train_grpo_replay", subset, tmp_path, "--train.async_enable",
                            "--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.01", "0.99",
                            REHEARSE="1", REPLAY_WARMUP=str(WARMUP), REHEARSE_SOLVE_RATE=str(SOLVE_RATE))
    assert report["crash"] is None and report["episodes_completed"] == EPISODES, log[-3000:]
    assert report["steps_completed"] == sum(report["steps_per_episode"]) > WARMUP
    command = report["command"]
    assert "--actor.num_gpus_per_node 4" in command and "--vllm.num_engines 4" in command
    assert "enable_sleep" not in command and "colocate_all" not in command
    assert len(report["optimizer_steps_per_rank"]) == 4 and len(set(report["optimizer_steps_per_rank"])) == 1
    assert report["replayed_per_step"]["share_with_replay"] >= 0.9
    assert "replay/fresh_age_max': 1.0" in log  # the training actor's steps: generated a version behind
    # Every prompt of every episode was dispatched once (its group kept or replaced), 8 rollouts each.
    every_prompt = EPISODES * STEPS_PER_EPISODE * BATCH * 8
    assert report["rollouts_generated"] == report["rollouts_generated_by_engines"] == every_prompt
    assert report["rollouts_filtered"] > 0


def test_the_matrix_rehearses_async_at_its_split_on_every_shape(tmp_path):
    """A slice of benchmarks/rehearsal_matrix.py (the whole matrix is its own run: docs/GPU_RUNS.md):
    the method with `--train.async_enable` at every shape, each shadow split as the run is (half of
    each node's GPUs train, half generate), every step walked, ranks alike, replay after the warm-up;
    a rerun keeps the report instead of rehearsing again."""
    def matrix():
        return subprocess.run([sys.executable, str(ROOT / "benchmarks/rehearsal_matrix.py"), "--only", "replay",
                               "--modes", "async", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                              text=True, timeout=1200)

    first = matrix()
    assert first.returncode == 0 and "[1/1] replay async: pass" in first.stdout, first.stdout[-3000:] + first.stderr[-3000:]
    report = json.loads((tmp_path / "replay-async.json").read_text())
    assert report["matrix"]["verdict"] == "pass" and report["steps_completed"] == STEPS
    shadows = report["shapes"][1:]
    assert len(shadows) == 3 * 5  # 2 to 32 GPUs: async needs a GPU on each side
    for shape in shadows:
        flags = shape["flags"].split()
        nodes, per_node = (int(flags[flags.index(f) + 1]) for f in ("--actor.num_nodes", "--actor.num_gpus_per_node"))
        engines = int(flags[flags.index("--vllm.num_engines") + 1])
        assert engines == nodes * per_node == shape["gpus"] and per_node <= 4, shape["flags"]
        assert len(set(shape["optimizer_steps_per_rank"])) == 1
    assert {s["gpus"] for s in shadows} == {1, 2, 4, 8, 16}  # training ranks: 2 nodes of 8 GPUs hold 8
    again = matrix()
    assert again.returncode == 0 and "[1/1] replay async: kept" in again.stdout
    assert "| replay | async | 16 of 16 |" in (tmp_path / "summary.md").read_text()


# Pre-rollout skipping (SKIP=1, docs/METHOD.md section 11): alone (the GRESO baseline) at every
# shape, and with replay and refill at the script's own shape (refill's 32-GPU shape fails at
# step 2 with or without skipping: a rank left with 0 replayed rows, not skipping's doing).
SKIP_RUNS = {"train_grpo": ("all", ()),
             "train_grpo_replay": ("1", ("--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0",
                                         "1", "--replay.refill"))}


@pytest.fixture(scope="module")
def skip_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rehearsal_skip")
    subset = tmp / "subset.json"
    subset.write_text(json.dumps(json.loads(DATA.read_text())[:SUBSET_PROMPTS]))
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = pool.map(lambda s: _rehearse(s, subset, tmp, *SKIP_RUNS[s][1], REHEARSE=SKIP_RUNS[s][0], SKIP="1",
                                            SAVE_STEPS=str(SAVE_STEPS), REPLAY_WARMUP=str(WARMUP),
                                            REHEARSE_SOLVE_RATE=str(SOLVE_RATE)), SKIP_RUNS)
        return dict(zip(SKIP_RUNS, runs))


@pytest.mark.parametrize("script", SKIP_RUNS)
def test_skipping_rehearses_alone_at_every_shape_and_with_replay_and_refill(skip_runs, script):
    """From the second pass on, prompts whose groups were constant are skipped; a pass then holds
    fewer steps, each of a whole batch (a pass's tail too short for one is deferred). Every prompt
    of every pass is generated, skipped or deferred (the rehearsal's resume from a checkpoint
    included, which restores the skip state), and every rank of every shape takes the same
    optimizer steps, none cut short."""
    report, log = skip_runs[script]
    assert report["crash"] is None and report["episodes_completed"] == EPISODES, log[-3000:]
    assert "--replay.skip" in report["command"] and "_skip_seed" in report["command"]  # its own output folder
    assert report["steps_per_episode"][0] == STEPS_PER_EPISODE  # the first pass: no history, no skip
    assert report["prompts_skipped"] > 0 and report["steps_completed"] <= STEPS
    drawn = report["rollouts_generated"] // 8 + report["prompts_skipped"] + report["prompts_deferred"]
    # but the last pass's deferred tail: the call that drew it generated nothing, and no step followed
    assert 0 <= STEPS_PER_EPISODE * BATCH * EPISODES - drawn < BATCH, drawn
    assert report["fresh_per_step"]["min"] == BATCH * 8 or script == "train_grpo_replay"  # refill: fresh = kept
    assert report["resumed_at"] == (5 if script == "train_grpo" else 10)
    if script == "train_grpo_replay":
        assert report["rollouts_filtered"] > 0 and report["rows_refilled"] > 0
    for shape in report["shapes"]:
        assert shape["crash"] is None and shape["steps_completed"] == report["steps_completed"], shape
        assert len(set(shape["optimizer_steps_per_rank"])) == 1 and set(shape["rows_dropped_per_rank"]) == {0}, shape
    assert len(report["shapes"]) == (19 if SKIP_RUNS[script][0] == "all" else 1)
