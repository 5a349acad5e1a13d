"""Faults injected into the real pipeline (`python -m openrlhf_replay.cli.train_ppo_ray`: Ray,
DeepSpeed ZeRO-2 over gloo, vLLM's CPU engine) with a tiny random Qwen3 and advantage replay. One
command, run five times, each of the first four ended by a fault and resumed by the next (a start
costs about a minute here, so the faults share runs). KL is in the reward (upstream's default), so
the buffers saved and restored carry per-token advantages:

1. The reward file (`faulty_reward.py`) raises for one sample and returns NaN for another. The
   checkpoints go to a small tmpfs; once step 1's checkpoint is complete, a file takes all its free
   space, so the save at step 2 meets a full disk and the run stops.
2. The same command, the space freed again: it resumes from step 1's checkpoint. Once step 2's
   checkpoint is complete, the driver is killed with SIGKILL (in step 3).
3. The same command: it resumes from step 2 with the buffer saved there. Once step 3's
   checkpoint is complete, the vLLM engine's Ray actor is killed with SIGKILL (in step 4).
4. The same command: it resumes from step 3. Once step 4's checkpoint is complete, the policy
   actor's DeepSpeed process (its Ray worker, an OOM-killed rank's fate) is killed with SIGKILL
   (in step 5).
5. The same command: it resumes from step 4, the last step of episode 1 (4 steps an episode), with
   the buffer saved there, and runs to its end: episode 2, steps 5 to 8, and no episode again.

Each run's processes carry a tag in their environment, so "nothing left behind" is checked over
every process the run started, Ray's and vLLM's included. Without root (no tmpfs) the full disk
is not simulated: run 1 is stopped by killing its driver after step 1 instead.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from run_processes import TAG_ENV, left_after, new_tag, tagged_processes
from tiny_run import BATCHES, DIGEST, LARGE_LR, PLATFORM

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REWARD = Path(__file__).with_name("faulty_reward.py")
RUN_TIMEOUT_S = 600
STOP_WITHIN_S = 120  # a run must end this soon after a fault that stops it
# Ray's dashboard and runtime-env agents outlive a driver killed with SIGKILL (they were the
# raylet's children, now init's) until they notice the raylet is gone: about a minute here.
ORPHANS_EXIT_S = 120
REPLAY = ["--replay.mode", "advantage", "--replay.warmup", "1", "--replay.ratio", "0.5"]
# Upstream's default KL (in the reward): the buffer saved and restored holds per-token advantages.
KL_IN_REWARD = ["--algo.kl.init_coef", "0.01"]


def _command(tmp: Path, model: Path, ckpt: Path) -> list[str]:
    return [
        sys.executable, "-m", "openrlhf_replay.cli.train_ppo_ray",
        "--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(tmp / "prompts.jsonl"),
        "--reward.remote_url", str(REWARD), *PLATFORM, *BATCHES, *LARGE_LR,
        *KL_IN_REWARD, "--algo.advantage.estimator", "group_norm",
        "--train.num_episodes", "2", "--data.max_samples", "16",
        *REPLAY,
        "--ckpt.path", str(ckpt), "--ckpt.save_steps", "1", "--ckpt.max_num", "2", "--ckpt.load_enable",
        "--logger.tensorboard_dir", str(tmp / "tensorboard"), "--logger.wandb.run_name", "tb",
        "--ckpt.output_dir", str(tmp / "final"),
    ]


def _prompts(path: Path, n: int = 16) -> list[str]:
    rng = np.random.default_rng(0)
    texts = []
    with open(path, "w") as f:
        for _ in range(n):
            a, b = (int(x) for x in rng.integers(2, 50, 2))
            question = f"Sam has {a} apples and buys {b} more. How many apples does Sam have?"
            f.write(json.dumps({"prompt": question, "label": str(a + b)}) + "\n")
            texts += [question, f"Sam has {a + b} apples. The answer is \\boxed{{{a + b}}}."]
    return texts


def _latest(ckpt: Path) -> str:
    with contextlib.suppress(OSError):
        return (ckpt / "_actor" / "latest").read_text().strip()
    return ""


def _run(tmp: Path, name: str, cmd: list[str], ckpt: Path, fault_at: str | None, inject) -> dict:
    """Run `cmd`; once `<ckpt>/_actor/latest` names `fault_at`, call `inject(proc, tag)` once. Returns
    the run's exit status, log (the driver's output and its Ray workers' logs), scalars and the
    seconds from the fault to the end."""
    tagged = new_tag(name)
    tag = tagged[TAG_ENV]
    env = dict(os.environ, OPENRLHF_REPLAY_DEVICE="cpu", PYTHONUNBUFFERED="1", **tagged)
    env.pop("RAY_ADDRESS", None)
    log_path = tmp / f"{name}.log"
    events_before = set((tmp / "tensorboard").rglob("events.*"))
    t0, started = time.monotonic(), time.time()
    injected_at = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > RUN_TIMEOUT_S:
                    pytest.fail(f"{name}: still running after {RUN_TIMEOUT_S} s; log: {log_path}")
                if injected_at is None and fault_at and _latest(ckpt) == fault_at:
                    inject(proc, tag)
                    injected_at = time.monotonic()
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    ended = time.monotonic()
    # What the driver printed, and what the Ray workers wrote themselves: a driver killed with
    # SIGKILL has not printed its workers' last lines yet.
    ray_tmp = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    sessions = [d for d in ray_tmp.glob(f"session_*_{proc.pid}") if d.stat().st_mtime >= started]  # pids recur
    workers = sorted(p for d in sessions for p in (d / "logs").glob("worker-*"))
    output = log_path.read_text(errors="replace")
    log = output + "".join(p.read_text(errors="replace") for p in workers if p.suffix in (".out", ".err"))
    return {"name": name, "tag": tag, "returncode": proc.returncode, "output": output, "log": log,
            "stop_s": None if injected_at is None else ended - injected_at, "seconds": ended - t0, "ended": ended,
            "scalars": _scalars(set((tmp / "tensorboard").rglob("events.*")) - events_before)}


def _scalars(event_files) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of these TensorBoard event files (one run's: the runs share a folder)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for path in event_files:
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


@contextlib.contextmanager
def _small_tmpfs(path: Path):
    """A 64 MiB tmpfs at `path` (a checkpoint of the model below takes ~6 MiB), or None where
    mounting is not allowed (not root)."""
    path.mkdir(parents=True)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(path)], capture_output=True).returncode == 0
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(folder: Path) -> Path:
    """Take all the free space of `folder`'s filesystem, at once (fallocate): the next step's
    checkpoint save must find the disk full."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        stat = os.statvfs(folder)
        os.posix_fallocate(f.fileno(), 0, max(stat.f_bavail * stat.f_frsize - (1 << 16), 1))
        f.seek(0, os.SEEK_END)
        try:  # and what fallocate left
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return filler


def _kill_driver(proc, tag):
    os.kill(proc.pid, signal.SIGKILL)


def _kill_actor(name: str):
    """A fault that kills every process of the run whose command line (Ray's title of an actor's
    worker, `ray::<class>...`) names the actor class `name`."""
    def kill(proc, tag):
        found = [line for line in tagged_processes(tag) if name in line]
        assert found, f"no {name} among {tagged_processes(tag)}"
        for line in found:
            os.kill(int(line.split()[0]), signal.SIGKILL)

    return kill


_kill_vllm_engine = _kill_actor("RolloutRayActor")
_kill_policy_actor = _kill_actor("PolicyModelActor")  # ReplayPolicyModelActor's worker


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    from infra.models import build_tiny_qwen3

    tmp = tmp_path_factory.mktemp("faults")
    texts = _prompts(tmp / "prompts.jsonl")
    model = build_tiny_qwen3(tmp / "tiny-qwen3", corpus=texts, vocab_size=512, hidden_size=128,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                             intermediate_size=256)
    with _small_tmpfs(tmp / "disk") as disk:
        ckpt = (disk or tmp / "disk") / "ckpt"
        cmd = _command(tmp, model, ckpt)
        filled = []

        def fill_disk(proc, tag):
            filled.append(_fill(disk))

        first = _run(tmp, "run1", cmd, ckpt, "global_step1", fill_disk if disk else _kill_driver)
        after_full = {"latest": _latest(ckpt), "replay_files": sorted(p.name for p in (ckpt / "_replay").iterdir())}
        for f in filled:
            f.unlink()
        second = _run(tmp, "run2", cmd, ckpt, "global_step2", _kill_driver)
        third = _run(tmp, "run3", cmd, ckpt, "global_step3", _kill_vllm_engine)
        fourth = _run(tmp, "run4", cmd, ckpt, "global_step4", _kill_policy_actor)
        fifth = _run(tmp, "run5", cmd, ckpt, None, None)
        runs = (first, second, third, fourth, fifth)
        left = {run["name"]: left_after(run["tag"], run["ended"], ORPHANS_EXIT_S) for run in runs}
        for run in runs:
            print(f"{run['name']}: exit {run['returncode']} after {run['seconds']:.0f} s"
                  f" ({run['stop_s'] or 0:.1f} s after its fault)")
        yield {"runs": runs, "ckpt": ckpt, "disk": disk, "after_full": after_full,
               "left": left}


def _by_step(run, key) -> dict[int, float]:
    return run["scalars"].get(f"train/{key}", {})


def _digests(run, kind: str) -> dict[int, tuple[int, str]]:
    return {int(m.group(3)): (int(m.group(2)), m.group(4)) for m in DIGEST.finditer(run["log"]) if m.group(1) == kind}


def test_a_failed_or_nan_reward_is_scored_zero_counted_and_the_run_goes_on(chain):
    # faulty_reward.py fails at its 3rd and 5th call in each process: in each run's first step.
    for run, step in zip(chain["runs"], (1, 2, 3, 4, 5)):
        assert _by_step(run, "reward/failed")[step] == 1 and _by_step(run, "reward/non_finite")[step] == 1
        assert (f"reward: step {step}: the reward function raised for 1 and returned NaN / inf for 1 of 16 "
                "samples; scored 0") in run["log"]
        assert "injected fault: this reward function raised" in run["log"]  # upstream's own log of the error
        for key in ("policy_loss", "actor_grad_norm"):  # the step trained on finite numbers
            assert math.isfinite(_by_step(run, key)[step]), (run["name"], key)
        assert step in _digests(run, "saved")  # and went on to its checkpoint
        assert 0 < _by_step(run, "replay/size")[step]


def test_a_full_disk_during_a_checkpoint_stops_the_run_and_keeps_the_previous_checkpoint(chain):
    if chain["disk"] is None:
        pytest.skip("no tmpfs: mounting one needs root")
    first, second = chain["runs"][:2]
    assert first["returncode"] not in (0, -signal.SIGKILL) and first["stop_s"] < STOP_WITHIN_S
    assert "No space left on device" in first["log"]
    assert "train_ppo_ray: a step failed inside a Ray worker" in first["output"]
    assert "Fix: the disk is full: free space on it, then rerun the same command" in first["output"]
    # The checkpoint of step 1 is the last complete one; the failed save left no partial replay file.
    assert chain["after_full"]["latest"] == "global_step1"
    assert "global_step1.npz" in chain["after_full"]["replay_files"]
    assert not [f for f in chain["after_full"]["replay_files"] if f.endswith(".tmp")]
    # It was usable: the next run resumed from it with the very buffer saved there.
    saved, restored = _digests(first, "saved"), _digests(second, "restored")
    assert restored == {1: saved[1]}
    assert min(_by_step(second, "policy_loss")) == 2


def test_a_killed_driver_resumes_from_its_last_checkpoint_with_the_same_buffer(chain):
    second, third = chain["runs"][1:3]
    assert second["returncode"] == -signal.SIGKILL
    saved, restored = _digests(second, "saved"), _digests(third, "restored")
    assert 2 in saved and restored == {2: saved[2]}  # the buffer in memory at the save, restored
    assert sorted(_by_step(third, "policy_loss")) == [3]  # the step counter continues (killed in step 4)
    assert _by_step(third, "replay/replayed")[3] == 8  # drawn from the restored buffer at once


def test_the_replay_files_left_hold_the_buffers_that_were_saved(chain):
    """What a later run would load: each replay file kept (--ckpt.max_num 2) holds the buffer whose
    digest the run that wrote it logged at the save."""
    from replay import ReplayBuffer, ReplayCheckpointError, ReplayConfig
    from replay.checkpoint import state_digest

    saved = {}
    for run in chain["runs"]:
        saved.update(_digests(run, "saved"))
    files = sorted((chain["ckpt"] / "_replay").glob("global_step*.npz"))
    assert [f.name for f in files] == ["global_step7.npz", "global_step8.npz"]  # the last run's last two
    config = ReplayConfig.from_namespace(ReplayConfig.add_cli_args(argparse.ArgumentParser()).parse_args(REPLAY))
    for f in files:
        buffer = ReplayBuffer.load(f, config, ("token_advantages",))
        count, digest = saved[int(f.stem.removeprefix("global_step"))]
        assert (len(buffer), state_digest(buffer.state_dict())) == (count, digest), f.name
        # KL in the reward: the stored per-token advantages carry the penalty beside the group's
        stored = buffer.store.gather(np.arange(len(buffer)))
        group = np.repeat(stored.advantages, stored.response_lengths)
        assert 0 < np.abs(stored.token_advantages - group).max() < 10, f.name
        with pytest.raises(ReplayCheckpointError, match="per-token KL columns"):
            ReplayBuffer.load(f, config)  # a run with KL off cannot resume from it


def test_a_killed_vllm_engine_stops_the_run_with_a_message_and_nothing_left(chain):
    third = chain["runs"][2]
    assert third["stop_s"] is not None, "the vLLM engine was never killed"
    assert third["returncode"] not in (0, -signal.SIGKILL) and third["stop_s"] < STOP_WITHIN_S
    tail = third["output"][-3000:]
    assert "train_ppo_ray: a step failed inside a Ray worker" in tail and "RolloutRayActor" in tail


def test_a_killed_deepspeed_actor_stops_the_run_with_a_message_naming_it(chain):
    fourth = chain["runs"][3]
    assert fourth["stop_s"] is not None, "the policy actor was never killed"
    assert fourth["returncode"] not in (0, -signal.SIGKILL) and fourth["stop_s"] < STOP_WITHIN_S
    tail = fourth["output"][-3000:]
    assert "train_ppo_ray: a step failed inside a Ray worker" in tail and "PolicyModelActor (pid" in tail
    assert "rerun the same command with --ckpt.load_enable" in tail


def test_the_rerun_after_a_killed_deepspeed_actor_resumes_with_its_buffer_and_walks_no_episode_again(chain):
    third, fourth, fifth = chain["runs"][2:]
    assert _digests(fourth, "restored") == {3: _digests(third, "saved")[3]}
    saved, restored = _digests(fourth, "saved"), _digests(fifth, "restored")
    assert 4 in saved and restored == {4: saved[4]}  # the buffer saved on episode 1's last step
    assert fifth["returncode"] == 0, fifth["output"][-3000:]
    # 16 prompts, 4 a step, 2 episodes: 8 steps in all; the resume trains episode 2 once.
    assert sorted(_by_step(fifth, "policy_loss")) == [5, 6, 7, 8]
    assert _by_step(fifth, "replay/replayed")[5] == 8  # drawn from the restored buffer at once


def test_no_process_is_left_behind(chain):
    assert chain["left"] == {f"run{i}": [] for i in range(1, 6)}
