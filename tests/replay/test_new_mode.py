"""A new mode built by the README's recipe alone ("Adding a sampler or a mode"): a sampler, one
registry entry, and the store's state machine run on it. The toy is staleness-weighted uniform
replay: every stored rollout equally likely, each replayed one weighted by 1 / (1 + its age)."""
import argparse

import numpy as np
import pytest

from replay import Draw, ReplayBuffer, ReplayConfig, ReplayMode, register_mode
from replay.modes import COMMON
from replay.registry import unregister_mode
from replay.samplers import uniform_draw
from replay.testing import random_batch
from buffer_machine import SETTINGS, BufferMachine

NAME = "staleness_uniform"


def staleness_uniform(view, k, step, rng, *, fresh_prompt_uids=None, replacement):
    """Uniform over the live rollouts; weight 1 / (1 + age) (recipe step 1: the sampler)."""
    idx = uniform_draw(len(view), k, rng, replacement)
    return Draw.of(idx, 1.0 / (1.0 + view.ages(step)[idx]), ess=len(view), candidates=len(view))


ENTRY = ReplayMode(  # recipe step 2: one entry
    name=NAME, help="toy: uniform, each replayed rollout weighted 1 / (1 + age)", sampler=staleness_uniform,
    knobs=lambda c: dict(replacement=c.replacement), keep="nonzero_advantage", max_age_steps=5, **COMMON)


@pytest.fixture
def toy_mode():
    register_mode(ENTRY)
    yield ENTRY
    unregister_mode(NAME)


def test_the_new_mode_is_a_flag_choice_with_its_help_and_its_defaults(toy_mode):
    parser = ReplayConfig.add_cli_args(argparse.ArgumentParser())
    ns = parser.parse_args(["--replay.mode", NAME])
    config = ReplayConfig.from_namespace(ns)
    assert config.entry is toy_mode and config.max_age_steps == 5 and config.store_filter == "nonzero_advantage"
    mode_flag = next(a for a in parser._actions if a.dest == "replay.mode")
    assert NAME in mode_flag.choices and f"{NAME}: {toy_mode.help}" in mode_flag.help
    with pytest.raises(ValueError, match="is registered already"):
        register_mode(ENTRY)


def test_the_new_mode_replays_with_its_weights_and_saves(toy_mode, tmp_path):
    buf = ReplayBuffer(ReplayConfig(mode=NAME, warmup=1, ratio=0.5))
    rng = np.random.default_rng(0)
    for step in range(4):
        comp = buf.step(random_batch(rng, 4, 4, step), step)
    assert len(comp.replayed) == 8
    assert np.allclose(comp.weights, 1.0 / (1.0 + 3 - comp.replayed.versions))
    buf.save(tmp_path / "toy.npz")
    again = ReplayBuffer.load(tmp_path / "toy.npz", buf.config)
    assert np.array_equal(again.store.view().serials, buf.store.view().serials)


class ToyModeMachine(BufferMachine):
    MODE_CHOICES = (NAME,)


class TestToyModeMachine(ToyModeMachine.TestCase):  # recipe step 3: the store's state machine on it
    settings = SETTINGS

    @classmethod
    def setUpClass(cls):
        register_mode(ENTRY)
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        unregister_mode(NAME)
        super().tearDownClass()
