"""Replay in upstream's async training (`--train.async_enable`), through the real pipeline on a CPU.

One command (Ray, a vLLM CPU engine, DeepSpeed ZeRO-2, a tiny random Qwen3; advantage replay with
warm-up 1, a checkpoint every step, upstream's token-level IS correction so vLLM's log-probs are
stored), run twice: the first run's driver is killed with SIGKILL once step 2's checkpoint is
complete (the generator is then already on the next batch), and the second resumes it, with
partial rollouts on as well (`--train.partial_rollout_enable`: vLLM paused for each broadcast
instead of locked out, a run-time setting a resume may change). Asserted:
rows are replayed after the warm-up, fresh rows are stored older than 0 (generation runs a
version ahead of training), the resumed buffer is the one saved (its digest), and the batch in
flight at the kill is generated again and trained once.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from openrlhf_replay.cpu.quickstart import read_scalars
from tiny_run import BATCHES, DIGEST, LARGE_LR, PLATFORM, read_histograms  # tests/support

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REWARD = Path(__file__).with_name("parity_reward.py")
RUN_TIMEOUT_S = 600


def _command(tmp: Path, model: Path) -> list[str]:
    return [
        sys.executable, "-m", "openrlhf_replay.cli.train_ppo_ray", "--train.async_enable",
        "--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(tmp / "prompts.jsonl"),
        "--reward.remote_url", str(REWARD), *PLATFORM, *BATCHES, *LARGE_LR,
        "--algo.kl.init_coef", "0", "--algo.advantage.estimator", "group_norm",
        "--algo.advantage.is_correction_level", "token", "--data.max_samples", "16",
        "--replay.mode", "advantage", "--replay.warmup", "1", "--replay.ratio", "0.5",
        "--ckpt.path", str(tmp / "ckpt"), "--ckpt.save_steps", "1", "--ckpt.load_enable",
        "--logger.tensorboard_dir", str(tmp / "tensorboard"), "--logger.wandb.run_name", "tb",
        "--ckpt.output_dir", str(tmp / "final"),
    ]


def _run(tmp: Path, name: str, cmd: list[str], kill_at: str | None = None) -> dict:
    """Run `cmd`; with `kill_at`, SIGKILL the driver once `<ckpt>/_actor/latest` names it. The log is
    the driver's output plus its Ray workers' own files (a killed driver has not printed them)."""
    env = dict(os.environ, OPENRLHF_REPLAY_DEVICE="cpu", PYTHONUNBUFFERED="1",
               OPENRLHF_REPLAY_DEBUG_DUMP_DIR=str(tmp / name / "dump"))
    env.pop("RAY_ADDRESS", None)
    (tmp / name).mkdir()
    latest = tmp / "ckpt" / "_actor" / "latest"
    t0, started = time.monotonic(), time.time()
    with open(tmp / name / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None:
                assert time.monotonic() - t0 < RUN_TIMEOUT_S, f"{name}: still running after {RUN_TIMEOUT_S} s"
                if kill_at and latest.is_file() and latest.read_text().strip() == kill_at:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    ray_tmp = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    sessions = [d for d in ray_tmp.glob(f"session_*_{proc.pid}") if d.stat().st_mtime >= started]
    workers = sorted(p for d in sessions for p in (d / "logs").glob("worker-*") if p.suffix in (".out", ".err"))
    output = (tmp / name / "log.txt").read_text(errors="replace")
    return {"returncode": proc.returncode, "output": output,
            "log": output + "".join(p.read_text(errors="replace") for p in workers),
            "dumps": {int(p.stem.removeprefix("step")): json.loads(p.read_text())
                      for p in (tmp / name / "dump").glob("step*.json")}}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    from infra.models import build_tiny_qwen3

    tmp = tmp_path_factory.mktemp("async")
    rng = np.random.default_rng(0)
    texts = []
    with open(tmp / "prompts.jsonl", "w") as f:
        for a, b in rng.permutation(np.array([(a, b) for a in range(2, 50) for b in range(2, 50)]))[:16]:
            question = f"Sam has {a} apples and buys {b} more. How many apples does Sam have?"
            f.write(json.dumps({"prompt": question, "label": str(a + b)}) + "\n")  # 16 distinct prompts
            texts += [question, f"Sam has {a + b} apples. The answer is \\boxed{{{a + b}}}."]
    model = build_tiny_qwen3(tmp / "tiny-qwen3", corpus=texts, vocab_size=512)
    cmd = _command(tmp, model)
    killed = _run(tmp, "killed", cmd, kill_at="global_step2")
    resumed = _run(tmp, "resumed", cmd + ["--train.partial_rollout_enable"])
    assert resumed["returncode"] == 0, resumed["output"][-6000:]
    scalars = read_scalars(tmp / "tensorboard" / "tb")  # both runs' events; the resumed run's steps are 3, 4
    return {"killed": killed, "resumed": resumed, "scalars": scalars,
            "histograms": read_histograms(tmp / "tensorboard" / "tb")}


def _digests(run: dict, kind: str) -> dict[int, tuple[int, str]]:
    return {int(m[3]): (int(m[2]), m[4]) for m in DIGEST.finditer(run["log"]) if m[1] == kind}


def _by_step(chain, key) -> dict[int, float]:
    return chain["scalars"].get(f"train/{key}", {})


def test_async_replays_after_the_warmup_from_the_restored_buffer(chain):
    assert chain["killed"]["returncode"] == -signal.SIGKILL
    assert "--train.async_enable" not in chain["resumed"]["output"].split("replay: mode")[0]  # not refused
    replayed = _by_step(chain, "replay/replayed")
    assert replayed[3] == replayed[4] == 8  # round(0.5 x 16 / 8) x 8, drawn at once after the resume
    assert _by_step(chain, "replay/is_replayed")[4] == pytest.approx(8 / 24)  # they reached the loss


def test_tensorboard_draws_the_replayed_rows_ages_from_generation_and_their_uses(chain):
    """The resumed run's steps draw a value per replayed row in both histograms; its ages count
    from the policy version that generated each row (the versions the experience maker dumped)."""
    ages, uses = (chain["histograms"].get(f"train/replay/replayed_{k}", {}) for k in ("age", "uses"))
    for step in (3, 4):
        dump = chain["resumed"]["dumps"][step - 1]  # the buffer counts steps from 0
        dumped = dump["step"] - np.array(dump["stored_versions"])
        assert ages[step].num == uses[step].num == len(dumped) == _by_step(chain, "replay/replayed")[step] == 8
        assert (ages[step].min, ages[step].max, ages[step].sum) == (dumped.min(), dumped.max(), dumped.sum())
        assert 1 <= uses[step].min and uses[step].max == _by_step(chain, "replay/reuse_max")[step]


def test_fresh_rows_are_recorded_older_than_zero(chain):
    """Generation runs ahead: a fresh batch is generated with weights a version older than those it
    is trained on. Each row's stored age counts from the version that generated it."""
    fresh_max = _by_step(chain, "replay/fresh_age_max")
    assert set(fresh_max) >= {3, 4} and max(fresh_max.values()) >= 1, fresh_max
    assert all(0 <= v <= 2 for v in fresh_max.values()), fresh_max  # queue size 1: at most one batch ahead
    assert all(np.isfinite(v) for v in _by_step(chain, "policy_loss").values())


def test_the_training_actor_logs_what_the_generator_actor_generated(chain):
    """Counted in the generator actor and carried to the training actor with the batch, through
    Ray's queue: each step's 4 prompts x 4 (no filtering here; tests/scripts/test_rehearsal.py
    compares the counts with the engines' under dynamic filtering)."""
    generated, filtered = _by_step(chain, "replay/generated_rollouts"), _by_step(chain, "replay/filtered_rollouts")
    assert set(generated) >= {1, 2, 3, 4} and set(generated.values()) == {16.0}, generated
    assert set(filtered) == set(generated) and set(filtered.values()) == {0.0}


def test_a_killed_driver_resumes_with_the_buffer_it_saved(chain):
    saved, restored = _digests(chain["killed"], "saved"), _digests(chain["resumed"], "restored")
    assert 2 in saved and restored == {2: saved[2]}
    assert set(_digests(chain["resumed"], "saved")) == {3, 4}  # the resume trains steps 3 and 4 only


def _fresh_prompts(dump: dict) -> set[tuple]:
    rows = [r for r in dump["rows"] if not r["replayed"]]
    prompts = {tuple(r["sequence"][: r["action_mask"].index(True) + 1]) for r in rows}
    assert len(rows) == 16 and len(prompts) == 4  # 4 prompts x 4 samples
    return prompts


def test_the_batch_in_flight_at_the_kill_is_generated_again_and_trained_once(chain):
    """The checkpoint of step 2 holds the prompt loader's position after step 2's batch, so the
    batch generated (or being generated) when the driver died is generated again by the resume,
    and no batch is trained twice. The experience maker dumps each replaying step's rows (steps
    counted from 0: 1 is the second)."""
    killed, resumed = chain["killed"]["dumps"], chain["resumed"]["dumps"]
    assert 1 in killed and set(resumed) == {2, 3}
    batches = [_fresh_prompts(killed[1]), _fresh_prompts(resumed[2]), _fresh_prompts(resumed[3])]
    assert not (batches[0] & batches[1]) and not (batches[1] & batches[2]) and not (batches[0] & batches[2])
    if 2 in killed:  # the killed run had made step 3's batch into experiences: the same prompts again
        assert _fresh_prompts(killed[2]) == batches[1]
