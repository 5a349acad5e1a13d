"""Replay checkpoints that cannot be resumed from as they are: truncated, bit-flipped, written by
another configuration, or cut short by a full disk. A resume (`restore_replay_state`, what
`--ckpt.load_enable` runs) must stop with the file's name, the problem and the fix, never load
something else silently; a save that meets a full disk must leave the previous file usable."""
from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import zipfile

import numpy as np
import pytest

from openrlhf_replay.cli.train_ppo_ray import build_parser
from openrlhf_replay.trainer.ppo_trainer import REPLAY_STATE_KEY, replay_state_dir, restore_replay_state, save_replay_state
from replay import ReplayBuffer, ReplayCheckpointError, ReplayConfig
from replay.checkpoint import state_digest
from replay.testing import random_batch

ARGV = ["--actor.model_name_or_path", "unused", "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
        "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "8",
        "--replay.mode", "advantage", "--replay.warmup", "1", "--ckpt.max_num", "2"]


@pytest.fixture(scope="module")
def parser():
    return build_parser(with_replay=True)


def _args(parser, ckpt, *extra):
    from openrlhf.utils.config import hierarchize

    return hierarchize(parser.parse_args(ARGV + ["--ckpt.path", str(ckpt), *extra]))


def _saved(args, steps: int = 3) -> tuple[ReplayBuffer, str]:
    """A buffer after `steps` steps, saved as upstream's checkpoint of the last one would save it."""
    buf = ReplayBuffer(ReplayConfig.from_namespace(args).for_run(10))
    rng = np.random.default_rng(0)
    for step in range(steps):
        buf.step(random_batch(rng, n_groups=4, group_size=4, version=step), step)
    return buf, save_replay_state(buf, args, steps)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def _flip_one_bit(path):
    """One bit of the stored advantages: the zip stays valid, only the checksum can tell."""
    with zipfile.ZipFile(path) as z:
        members = {name: z.read(name) for name in z.namelist()}
    name = next(n for n in members if "advantages" in n)
    raw = bytearray(members[name])
    raw[-2] ^= 0x10
    members[name] = bytes(raw)
    with zipfile.ZipFile(path, "w") as z:
        for member, payload in members.items():
            z.writestr(member, payload)


FILE_FAULTS = {"truncated": (_truncate, "not a readable replay checkpoint"),
               "bit-flipped": (_flip_one_bit, "checksum mismatch")}


@pytest.mark.parametrize("fault", FILE_FAULTS)
def test_a_damaged_file_stops_the_resume_with_its_name_and_the_fix(parser, tmp_path, fault):
    args = _args(parser, tmp_path)
    _, name = _saved(args)
    damage, problem = FILE_FAULTS[fault]
    damage(tmp_path / "_replay" / name)
    states = {"global_step": 3, REPLAY_STATE_KEY: name}
    config = ReplayConfig.from_namespace(args).for_run(10)
    with pytest.raises(ReplayCheckpointError) as e:
        restore_replay_state(states, args, config)
    assert name in str(e.value) and problem in str(e.value) and "--replay.allow_empty_resume" in str(e.value)
    empty = restore_replay_state(states, args, dataclasses.replace(config, allow_empty_resume=True))
    assert len(empty) == 0  # asked for: an empty buffer, and a warning in the log


@pytest.mark.parametrize("flags, named", [
    (["--replay.mode", "uniform"], "replay.mode='advantage'"),
    (["--replay.max_age", "5"], "replay.max_age 10"),
    (["--replay.capacity", "100"], "replay.capacity 30000"),
])
def test_a_file_from_another_configuration_is_refused(parser, tmp_path, flags, named):
    saved_args = _args(parser, tmp_path)
    _, name = _saved(saved_args)
    args = _args(parser, tmp_path, *flags)
    with pytest.raises(ReplayCheckpointError) as e:
        restore_replay_state({"global_step": 3, REPLAY_STATE_KEY: name}, args,
                             ReplayConfig.from_namespace(args).for_run(10))
    assert name in str(e.value) and named in str(e.value) and "--replay.allow_empty_resume" in str(e.value)


def test_settings_that_only_change_later_draws_resume(parser, tmp_path):
    buf, name = _saved(_args(parser, tmp_path))
    args = _args(parser, tmp_path, "--replay.ratio", "0.25", "--replay.alpha", "1.0", "--replay.warmup", "4")
    config = ReplayConfig.from_namespace(args).for_run(20)  # a longer run, too
    restored = restore_replay_state({"global_step": 3, REPLAY_STATE_KEY: name}, args, config)
    assert len(restored) == len(buf) and restored.store.counters == buf.store.counters


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (root only: mount)."""
    path = tmp_path / "disk"
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)],
                                           capture_output=True).returncode:
        pytest.skip("no tmpfs: mounting one needs root")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_disk_during_a_save_leaves_the_previous_file_usable(parser, small_disk):
    args = _args(parser, small_disk)
    buf, name = _saved(args, steps=2)
    digest = state_digest(buf.state_dict())
    with open(small_disk / "filler", "wb") as f:  # take what is left
        with pytest.raises(OSError) as full:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    assert full.value.errno == errno.ENOSPC
    buf.step(random_batch(np.random.default_rng(1), n_groups=4, group_size=4, version=2), 2)
    with pytest.raises(OSError) as e:
        save_replay_state(buf, args, 3)
    assert e.value.errno == errno.ENOSPC
    assert sorted(os.listdir(replay_state_dir(args))) == [name]  # no partial file, the old one kept
    config = ReplayConfig.from_namespace(args).for_run(10)
    restored = restore_replay_state({"global_step": 2, REPLAY_STATE_KEY: name}, args, config)
    assert state_digest(restored.state_dict()) == digest
