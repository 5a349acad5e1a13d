"""The replay state saved beside every OpenRLHF checkpoint, and restored on resume."""
import dataclasses
import os

import numpy as np
import pytest

from openrlhf_replay.trainer.ppo_trainer import (
    REPLAY_STATE_KEY,
    replay_state_dir,
    restore_replay_state,
    save_replay_state,
)
from replay import ReplayBuffer, ReplayCheckpointError, ReplayConfig
from replay.testing import random_batch


def _filled_buffer(config, steps=3):
    buf = ReplayBuffer(config)
    rng = np.random.default_rng(0)
    for step in range(steps):
        buf.step(random_batch(rng, n_groups=4, group_size=4, version=step), step)
    return buf


@pytest.fixture
def setup(make_args, tmp_path):
    args = make_args("--replay.mode", "advantage", "--replay.warmup", "1", "--ckpt.path", tmp_path, "--ckpt.max_num", 2)
    return args, ReplayConfig.from_namespace(args)


def test_resume_continues_with_the_same_buffer(setup):
    args, config = setup
    buf = _filled_buffer(config)
    names = [save_replay_state(buf, args, step) for step in (1, 2, 3)]
    # as many replay files are kept as upstream keeps model checkpoints
    assert sorted(os.listdir(replay_state_dir(args))) == names[1:]
    restored = restore_replay_state({"global_step": 3, REPLAY_STATE_KEY: names[-1]}, args, config)
    assert len(restored) == len(buf) > 0
    rng = np.random.default_rng(7)
    nxt = random_batch(rng, n_groups=4, group_size=4, version=3)
    a, b = buf.step(nxt, 3), restored.step(nxt, 3)
    assert np.array_equal(a.indices, b.indices)
    # everything but the memory layout (a reloaded store holds its rollouts in one chunk)
    layout = {"replay/nbytes", "replay/bytes_per_token"}
    assert {k: v for k, v in buf.metrics().items() if k not in layout} == \
        {k: v for k, v in restored.metrics().items() if k not in layout}


def test_missing_state_is_an_error_unless_an_empty_start_is_asked_for(setup):
    args, config = setup
    with pytest.raises(ReplayCheckpointError, match="allow_empty_resume"):
        restore_replay_state({"global_step": 5}, args, config)
    with pytest.raises(ReplayCheckpointError, match="global_step5.npz"):
        restore_replay_state({"global_step": 5, REPLAY_STATE_KEY: "global_step5.npz"}, args, config)
    empty = restore_replay_state({"global_step": 5}, args, dataclasses.replace(config, allow_empty_resume=True))
    assert len(empty) == 0


def test_corrupt_state_names_the_file(setup):
    args, config = setup
    name = save_replay_state(_filled_buffer(config), args, 4)
    path = os.path.join(replay_state_dir(args), name)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\x00garbage\x00" * 8)
    with pytest.raises(ReplayCheckpointError, match=name):
        restore_replay_state({"global_step": 4, REPLAY_STATE_KEY: name}, args, config)
