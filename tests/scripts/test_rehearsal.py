"""The rehearsal (`REHEARSE=... bash examples/scripts/<script>.sh`): every shipped training script walked
step by step on this CPU through all its episodes, at every supported GPU count and model scale.

The GPU-shaped checks a launch cannot make before a GPU run: no crash at any shape (a partial
batch at an episode's end, a replay split that leaves ranks unequal), every rank taking the same
optimizer steps, every condition replaying what its configuration says and warming its LR up
over the same rollout steps. Data: a subset of the scripts' real prompt file whose size is not a
multiple of the batch (560 = 4 x 128 + 48), walked over the scripts' 4 episodes with the replay
warm-up shortened from 20 steps to 6 and checkpoints every 5 steps, so that replay, prompts coming
back in later episodes and the rehearsal's resume all fall inside 16 steps; and the real file
(7,474 = 58 x 128 + 50) for one episode of the method's script, its other settings as shipped.
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "examples/scripts"
DATA = ROOT.parent / "shared/data/train/deepscaler_math_train.json"
TRAINING = ["train_grpo", "train_grpo_replay", "train_grpo_naive_replay", "train_grpo_uniform_replay",
            "train_grpo_freshness_replay", "train_grpo_success_replay"]
SUBSET_PROMPTS, BATCH, EPISODES, WARMUP, SAVE_STEPS = 560, 128, 4, 6, 5
STEPS_PER_EPISODE = SUBSET_PROMPTS // BATCH  # the 48 left over are not trained on (whole batches only)
STEPS = STEPS_PER_EPISODE * EPISODES


def _rehearse(script: str, data: Path, tmp: Path, **env) -> tuple[dict, str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "NUM_GPUS", "NUM_NODES", "OUTPUT_DIR")}
    full_env.update(PYTHON=sys.executable, RUNS_DIR=str(tmp / "runs"), RAY_ADDRESS="", DATA=str(data), **env)
    proc = subprocess.run(["bash", str(SCRIPTS / f"{script}.sh")], env=full_env, cwd=ROOT, capture_output=True,
                          text=True, timeout=1200)
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
                                            REPLAY_WARMUP=str(WARMUP)), TRAINING)
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
    # A resume of the whole controller from the first checkpoint after the replay warm-up (6).
    assert report["checkpoints"] == [5, 10, 15] and report["resumed_at"] == (10 if script != "train_grpo" else 5)


def test_every_condition_replays_what_its_configuration_says(subset_runs):
    after = STEPS - WARMUP  # steps 7..16: replay starts after the warm-up steps
    for script in ("train_grpo_replay", "train_grpo_uniform_replay", "train_grpo_freshness_replay",
                   "train_grpo_naive_replay"):
        replayed = subset_runs[script][0]["replayed_per_step"]
        # ratio 0.5 x 1,024 fresh = 512 = two whole training batches of 256, on every step after warm-up
        assert (replayed["min"], replayed["max"], replayed["steps_with_replay"]) == (512, 512, after), script
    assert subset_runs["train_grpo"][0]["replayed_per_step"]["steps_after_warmup"] == 0
    success, log = subset_runs["train_grpo_success_replay"]
    # RLEP: 2 successes x 128 prompts = 256, one training batch, once the step's prompts have come
    # back (every step here is past the first epoch) and have 256 successes stored between them.
    replayed = success["replayed_per_step"]
    assert replayed["max"] == 256 and replayed["steps_with_replay"] >= after - 2, replayed
    assert f"256 replayed successes + 1024 fresh rollouts per step after step {WARMUP}" in log  # the launch says so
    assert success["replay_age"]["max"] >= STEPS_PER_EPISODE  # successes outlive an epoch: no age limit


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
