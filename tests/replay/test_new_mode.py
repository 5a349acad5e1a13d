"""A new mode built by the README's recipe alone ("Adding a sampler or a mode"): one product file,
`replay/plugins/newest.py`, holding its sampler, its own keep rule and its entry, and this test.

The toy, `newest`: the most recently stored rollouts first, each weighted 1 / (1 + its age), from a
store that keeps only rollouts of positive advantage. `test_the_recipe_touches_one_product_file`
applies the recipe to a copy of `replay/` and counts the files that differ from this checkout's:
the mode's own module, and nothing else (with its sampler in `replay/samplers.py` instead: that
file too); the registry's checks (`tests/support/registry_checks.py`) then pass over every mode,
the toy included, and `--help` states its defaults."""
import argparse
import filecmp
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

from buffer_machine import SETTINGS, BufferMachine
from registry_checks import check_every_entry
from replay import MODE_REGISTRY, ReplayBuffer, ReplayConfig
from replay.registry import unregister_mode
from replay.testing import random_batch

ROOT = Path(__file__).resolve().parents[2]
NAME = "newest"

# Recipe step 1: the sampler, with the one signature (no knobs: nothing to bind).
SAMPLER = '''
def newest(view, k, step, rng, *, fresh_prompt_uids=None):
    """The k most recently stored rollouts, newest first, each weighted 1 / (1 + its age)."""
    idx = np.argsort(-view.serials, kind="stable")[:max(k, 0)]
    return Draw.of(idx, 1.0 / (1.0 + view.ages(step)[idx]), ess=len(view), candidates=len(view))
'''

# Recipe step 2: the mode's own module, with its keep rule and its entry.
MODULE = '''"""Toy mode `newest` (tests/replay/test_new_mode.py)."""
import numpy as np

from replay.keep import KeepRule
from replay.modes import COMMON
from replay.registry import ReplayMode, register_mode
{sampler_import}

def _positive(batch, ok, *, min_abs_advantage):
    return batch.advantages >= min_abs_advantage


POSITIVE_ADVANTAGE = KeepRule("positive_advantage", _positive, ("min_abs_advantage",))
register_mode(ReplayMode(name="newest", help="toy: the newest stored rollouts of positive advantage, weighted by age",
                         sampler=newest, keep=POSITIVE_ADVANTAGE, max_age_steps=5, **COMMON))
'''
OWN_MODULE = MODULE.format(sampler_import="from replay.samplers import Draw\n" + SAMPLER)
WITH_SAMPLERS = MODULE.format(sampler_import="from replay.samplers import newest\n")


def load_toy() -> types.ModuleType:
    """Run the toy's module as `replay.plugins` would import it (here without writing the file)."""
    module = types.ModuleType(f"replay.plugins.{NAME}")
    exec(compile(OWN_MODULE, f"replay/plugins/{NAME}.py", "exec"), module.__dict__)
    return module


@pytest.fixture
def toy_mode():
    load_toy()
    yield MODE_REGISTRY[NAME]
    unregister_mode(NAME)


def test_the_new_mode_is_a_flag_choice_with_its_help_and_its_defaults(toy_mode):
    parser = ReplayConfig.add_cli_args(argparse.ArgumentParser())
    config = ReplayConfig.from_namespace(parser.parse_args(["--replay.mode", NAME]))
    assert config.entry is toy_mode and config.max_age_steps == 5 and config.entry.keep.name == "positive_advantage"
    helps = {a.dest: " ".join(a.help.split()) for a in parser._actions}
    assert NAME in parser._option_string_actions["--replay.mode"].choices
    assert f"{NAME}: {toy_mode.help}" in helps["replay.mode"]
    assert f"5 for {NAME}" in helps["replay.max_age"] and f"stale for naive, uniform, advantage, freshness, age0, " \
        f"{NAME}" in helps["replay.off_policy"]
    assert f", exgrpo, {NAME}." in helps["replay.min_abs_advantage"]  # its keep rule reads it
    with pytest.raises(ValueError, match="is registered already"):
        load_toy()


def test_the_new_mode_keeps_by_its_rule_replays_with_its_weights_and_saves(toy_mode, tmp_path):
    buf = ReplayBuffer(ReplayConfig(mode=NAME, warmup=1, ratio=0.5))
    rng = np.random.default_rng(0)
    for step in range(4):
        comp = buf.step(random_batch(rng, 4, 4, step), step)
    assert np.all(buf.store.view().advantages > 0)
    assert len(comp.replayed) == 8 and np.all(np.diff(comp.replayed.versions) <= 0)  # newest first
    assert np.allclose(comp.weights, 1.0 / (1.0 + 3 - comp.replayed.versions))
    buf.save(tmp_path / "toy.npz")
    again = ReplayBuffer.load(tmp_path / "toy.npz", buf.config)
    assert np.array_equal(again.store.view().serials, buf.store.view().serials)
    assert buf.state_dict()["holding_rules"]["keep rule"] == "positive_advantage"


def test_the_registry_checks_pass_with_the_new_mode(toy_mode):
    check_every_entry()


# The recipe applied to a copy of replay/: what a fresh process sees there.
CHECK = textwrap.dedent(f"""
    import argparse, os, sys
    sys.path.insert(1, {str(ROOT / "tests" / "support")!r})
    import replay
    from registry_checks import check_every_entry
    from replay import MODE_REGISTRY, ReplayConfig
    assert os.path.realpath(replay.__file__) == os.path.realpath("replay/__init__.py"), replay.__file__  # the copy
    assert "{NAME}" in MODE_REGISTRY, sorted(MODE_REGISTRY)
    check_every_entry()
    parser = ReplayConfig.add_cli_args(argparse.ArgumentParser())
    help = " ".join(parser.format_help().split())
    assert "5 for {NAME}" in help and "{NAME}: toy" in help
    print("ok", MODE_REGISTRY["{NAME}"].sampler.__module__)
""")


def _product_files(tree: Path) -> set[str]:
    return {p.relative_to(tree).as_posix() for p in tree.rglob("*.py") if "__pycache__" not in p.parts}


@pytest.mark.parametrize("sampler_in_samplers_py", [False, True])
def test_the_recipe_touches_one_product_file(tmp_path, sampler_in_samplers_py):
    copy = tmp_path / "replay"
    shutil.copytree(ROOT / "replay", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "plugins" / f"{NAME}.py").write_text(WITH_SAMPLERS if sampler_in_samplers_py else OWN_MODULE)
    if sampler_in_samplers_py:  # the sampler in its obvious home, beside the others
        with open(copy / "samplers.py", "a") as f:
            f.write("\n" + SAMPLER)
    res = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("ok"), res.stderr
    assert res.stdout.split()[1] == ("replay.samplers" if sampler_in_samplers_py else f"replay.plugins.{NAME}")
    ours, theirs = _product_files(ROOT / "replay"), _product_files(copy)
    touched = sorted((theirs - ours) | {f for f in ours & theirs if not filecmp.cmp(ROOT / "replay" / f, copy / f,
                                                                                  shallow=False)})
    assert touched == (["plugins/newest.py", "samplers.py"] if sampler_in_samplers_py else ["plugins/newest.py"])


class ToyModeMachine(BufferMachine):
    MODE_CHOICES = (NAME,)


class TestToyModeMachine(ToyModeMachine.TestCase):  # recipe step 3: the store's state machine on it
    settings = SETTINGS

    @classmethod
    def setUpClass(cls):
        load_toy()
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        unregister_mode(NAME)
        super().tearDownClass()
