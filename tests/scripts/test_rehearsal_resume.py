"""A resume from a checkpoint taken on an episode's last step walks no episode again
(`openrlhf_replay/trainer/resume.py`): the rehearsal stops the real controller after that
checkpoint and resumes a new one from it, then checks the plan (`rehearsal/cli.py:completed`): as
many episodes as asked for, every prompt of each generated once, and, without dynamic filtering, the
steps the prompts make. 64 prompts, 8 a step, 3 episodes; a checkpoint every step.

Under dynamic filtering an episode's step count is not known in advance: a first rehearsal without
a resume finds where episode 1 ends, and the same seeded rehearsal then resumes there (the stand-ins
draw the same up to that step). Upstream's own launcher, whose controller is unchanged, walks the
episode again: the check fails there, as it did with this project's launcher before the fix.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from openrlhf_replay.rehearsal.cli import completed

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared/data/train/deepscaler_math_train.json"
PROMPTS, BATCH, EPISODES = 64, 8, 3
OURS, UPSTREAM = "openrlhf_replay.cli.train_ppo_ray", "openrlhf.cli.train_ppo_ray"
FILTERING = ("--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.01", "0.99")
REPLAY = ("--replay.mode", "advantage", "--replay.warmup", "2")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    if not DATA.is_file():
        pytest.fail(f"{DATA} not found (the scripts' prompt file; see ../shared/data/SOURCES.md)")
    path = tmp_path_factory.mktemp("resume") / "prompts.json"
    path.write_text(json.dumps(json.loads(DATA.read_text())[:PROMPTS]))
    return path


def _rehearse(prompts: Path, launcher: str, resume_at: int, *flags: str) -> dict:
    command = [
        sys.executable, "-m", launcher, "--actor.model_name_or_path", "Qwen/Qwen3-0.6B-Base",
        "--data.prompt_dataset", str(prompts), "--data.input_key", "problem", "--data.label_key", "answer",
        "--data.max_len", "1024", "--rollout.max_new_tokens", "512",
        "--reward.remote_url", str(ROOT / "evaluation/reward.py"),
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0", "--rollout.n_samples_per_prompt", "4",
        "--rollout.batch_size", str(BATCH), "--rollout.micro_batch_size", "4", "--train.batch_size", "16",
        "--train.micro_batch_size", "4", "--train.num_episodes", str(EPISODES), "--actor.num_gpus_per_node", "1",
        "--vllm.num_engines", "1", "--ckpt.path", str(prompts.parent / "ckpt"), "--ckpt.save_steps", "1",
        "--ckpt.load_enable", *flags]
    proc = subprocess.run([sys.executable, "-m", "openrlhf_replay.rehearsal", "--resume-at", str(resume_at), "--",
                           *command], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["crash"] is None and report["resumed_at"] == (resume_at or None), proc.stderr[-3000:]
    return report


def _episode_end(prompts: Path, launcher: str, *flags: str) -> int:
    """The last step of episode 1 of this rehearsal, run without a resume."""
    first = _rehearse(prompts, launcher, 0, *flags)["steps_per_episode"][0]
    assert 0 < first < PROMPTS // BATCH  # dynamic filtering dropped groups: fewer steps than batches
    return first


@pytest.mark.parametrize("flags", [REPLAY, ("--replay.mode", "none")], ids=["replay", "replay-off"])
@pytest.mark.parametrize("filtering", [False, True], ids=["whole-batches", "dynamic-filtering"])
def test_a_resume_at_an_episodes_last_step_walks_no_episode_again(prompts, flags, filtering):
    flags = (*flags, *FILTERING) if filtering else flags
    end = _episode_end(prompts, OURS, *flags) if filtering else PROMPTS // BATCH
    report = _rehearse(prompts, OURS, end, *flags)
    assert (report["episodes_completed"], report["prompts_generated"]) == (EPISODES, PROMPTS * EPISODES)
    assert len(report["steps_per_episode"]) == EPISODES and report["steps_per_episode"][0] == end
    if not filtering:
        assert report["steps_completed"] == EPISODES * PROMPTS // BATCH
    assert completed(report)


def test_upstreams_own_controller_walks_the_episode_of_its_checkpoint_again(prompts):
    """The same check on upstream's launcher (its `PPOTrainer` unchanged) fails: one episode more."""
    end = _episode_end(prompts, UPSTREAM, *FILTERING)
    report = _rehearse(prompts, UPSTREAM, end, *FILTERING)
    assert report["episodes_completed"] == EPISODES + 1 and report["prompts_generated"] == PROMPTS * (EPISODES + 1)
    assert not completed(report)
