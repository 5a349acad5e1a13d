"""What every registered mode must satisfy, whoever registered it and wherever its parts are
defined: the registry's own tests run these over the built-in modes, and the toy-mode test runs
them again with its mode added (a sampler in `replay/samplers.py` or in a module of its own)."""
import argparse
import dataclasses
import inspect

import numpy as np

from replay import MODE_REGISTRY, ReplayBuffer, ReplayConfig, sampler_from_config
from replay.holding import KEEP_RULE, holding_rules
from replay.keep import KeepRule
from replay.registry import CheckpointRules, ModeHooks
from replay.store import StoreView
from replay.testing import random_batch

FIELDS = {f.name for f in dataclasses.fields(ReplayConfig)}
# Settings under which every mode builds a buffer: freshness's annealing needs the run's length,
# exgrpo's buckets K.
RUN = dict(beta_steps=10, group_size=8)


def empty_view(n: int = 4) -> StoreView:
    z = np.zeros(n)
    return StoreView(advantages=np.ones(n, np.float32), rewards=z.astype(np.float32), versions=z.astype(np.int64),
                     prompt_uids=np.arange(n), group_ids=np.arange(n), reuse_counts=z.astype(np.int32),
                     serials=np.arange(n), response_lengths=np.ones(n, np.int64), priorities=np.ones(n),
                     newest=np.zeros(n, np.bool_))


def check_sampler(entry) -> None:
    """The one signature: (view, k, step, rng, *, fresh_prompt_uids, <knobs without defaults>), bound
    by the entry's knobs; a draw of 0 is empty."""
    if entry.sampler is None:
        assert sampler_from_config(ReplayConfig(mode=entry.name, **RUN)) is None, entry.name
        return
    params = list(inspect.signature(entry.sampler).parameters.values())
    assert [p.name for p in params[:4]] == ["view", "k", "step", "rng"], entry.name
    assert params[4].name == "fresh_prompt_uids" and params[4].kind is inspect.Parameter.KEYWORD_ONLY, entry.name
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[4:]), entry.name
    # no defaults of their own: every knob comes from the config, bound by the mode's entry
    assert all(p.default is inspect.Parameter.empty for p in params[5:]), entry.name
    bound = sampler_from_config(ReplayConfig(mode=entry.name, **RUN))
    assert len(bound(empty_view(), 0, 0, np.random.default_rng(0)).indices) == 0, entry.name


def check_entry(entry) -> None:
    """Everything an entry holds is something to call or an object of the right kind, and the
    common code reads it: flags, help, holding rules, a buffer's first steps."""
    assert isinstance(entry.keep, KeepRule) and set(entry.keep.settings) <= FIELDS, entry.name
    assert isinstance(entry.checkpoint, CheckpointRules) and issubclass(entry.hooks, ModeHooks), entry.name
    for hook in (entry.composer, entry.target, entry.knobs, entry.check, entry.check_buffer, entry.for_run,
                 entry.launch_errors, entry.count_text, entry.describe):
        assert callable(hook), entry.name
    check_sampler(entry)
    config = ReplayConfig(mode=entry.name, **RUN)
    assert isinstance(config.for_run(10, 8), ReplayConfig), entry.name
    rules = holding_rules(config)
    assert rules[KEEP_RULE] == entry.keep.name, entry.name
    assert all(rules[f"replay.{name}"] == getattr(config, name) for name in entry.keep.settings), entry.name
    parser = ReplayConfig.add_cli_args(argparse.ArgumentParser())
    flag = next(a for a in parser._actions if a.dest == "replay.mode")
    assert entry.name in flag.choices and f"{entry.name}: {entry.help}" in flag.help
    buf = ReplayBuffer(dataclasses.replace(config, warmup=0))
    rng = np.random.default_rng(0)
    for step in range(3):
        comp = buf.step(random_batch(rng, 4, 8, step), step)
        assert len(comp.fresh) == 32, entry.name


def check_every_entry() -> None:
    assert MODE_REGISTRY, "no mode is registered"
    for entry in MODE_REGISTRY.values():
        check_entry(entry)
