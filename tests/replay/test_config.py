"""ReplayConfig: checks, derived values, generated CLI flags."""
import argparse
import dataclasses
from types import SimpleNamespace

import pytest

from replay import MODE_REGISTRY, MODES, OFF_POLICY_REGISTRY, ReplayConfig, field_help


def test_defaults_match_method_md():
    c = ReplayConfig()
    assert (c.mode, c.ratio, c.warmup, c.capacity, c.eps, c.replacement, c.tau) == ("none", 0.5, 20, 30000, 1e-6,
                                                                                     False, 500.0)
    assert (c.beta_start, c.beta_end, c.effective_off_policy, c.per_prompt) == (0.4, 0.4, "stale", 2)
    assert c.off_policy is None and c.success_pool is None  # unset: resolved per mode
    assert not c.enabled and c.entry is None


@pytest.mark.parametrize("mode, max_age_steps, alpha, sampler, keep", [
    ("naive", None, 0.5, "group", "nonzero_group"),
    ("uniform", 10, 0.5, "uniform", "nonzero_advantage"),
    ("advantage", 10, 0.5, "advantage", "nonzero_advantage"),
    ("freshness", None, 0.6, "freshness", "all"),
    ("success", None, 0.5, "success", "success"),  # RLEP's pool keeps every success
    ("exgrpo", None, 0.5, "exgrpo", "exgrpo"),
    ("age0", 1, 0.5, None, "nonzero_advantage"),  # its composer draws from the step's own rows: no sampler
])
def test_mode_defaults(mode, max_age_steps, alpha, sampler, keep):
    c = ReplayConfig(mode=mode)
    assert c.enabled
    sampler_name = c.entry.sampler and c.entry.sampler.__name__
    got = (c.max_age_steps, c.effective_alpha, sampler_name, c.entry.keep.name)
    assert got == (max_age_steps, alpha, sampler, keep)
    assert c.entry is c.defaults is MODE_REGISTRY[mode]
    assert c.alpha is None and c.max_age is None  # derived, never written back


@pytest.mark.parametrize("mode, off_policy", [("success", "recompute"), ("advantage", "stale"),
                                              ("freshness", "stale"), ("naive", "stale"), ("none", "stale")])
def test_off_policy_resolves_per_mode_unless_set(mode, off_policy):
    assert ReplayConfig(mode=mode).effective_off_policy == off_policy
    assert ReplayConfig(mode=mode, off_policy="stale").effective_off_policy == "stale"
    assert ReplayConfig(mode=mode, off_policy="recompute").effective_off_policy == "recompute"


def test_success_pool_belongs_to_success_mode_without_an_age_limit():
    assert ReplayConfig(mode="success", success_pool="pool.npz").success_pool == "pool.npz"
    with pytest.raises(ValueError, match="replay.mode 'advantage'"):
        ReplayConfig(mode="advantage", success_pool="pool.npz")
    with pytest.raises(ValueError, match="would evict the offline pool"):
        ReplayConfig(mode="success", success_pool="pool.npz", max_age=100)


def test_explicit_values_override_mode_defaults():
    assert ReplayConfig(mode="freshness", alpha=0.3).effective_alpha == 0.3
    assert ReplayConfig(mode="advantage", max_age=40).max_age_steps == 40
    assert ReplayConfig(mode="naive", max_age=4).max_age_steps == 4


@pytest.mark.parametrize("changes, quoted, allowed", [
    ({"mode": "prioritised"}, "'prioritised'", "none, naive, uniform"),
    ({"ratio": -0.1}, "-0.1", ">= 0"),
    ({"ratio": float("nan")}, "nan", "finite"),
    ({"warmup": 1.5}, "1.5", "integer >= 0"),
    ({"max_age": 0}, "0", "would evict every stored rollout"),
    ({"capacity": 0}, "0", "integer >= 1"),
    ({"capacity": True}, "True", "integer >= 1"),
    ({"alpha": -1.0}, "-1.0", ">= 0"),
    ({"tau": 0.0}, "0.0", "> 0"),
    ({"beta_start": 1.5}, "1.5", "<= 1.0"),
    ({"per_prompt": 0}, "0", "integer >= 1"),
    ({"off_policy": "fresh"}, "'fresh'", "stale, refresh, recompute"),
    ({"seed": -3}, "-3", "integer >= 0"),
    ({"replacement": "yes"}, "'yes'", "True or False"),
    ({"mode": "advantage", "eps": 0.0, "min_abs_advantage": 0.0}, "0.0", "make one of them positive"),
    ({"mode": "freshness", "eps": 0.0}, "0.0", "make it positive"),
])
def test_errors_quote_the_value_and_say_what_is_allowed(changes, quoted, allowed):
    with pytest.raises(ValueError) as err:
        ReplayConfig(**changes)
    assert quoted in str(err.value) and allowed in str(err.value)


def test_frozen_and_dict_round_trip():
    c = ReplayConfig(mode="advantage", ratio=1.0, max_age=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.ratio = 2.0
    assert ReplayConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown replay config fields"):
        ReplayConfig.from_dict({"mode": "none", "rho": 1})


def test_every_field_has_help_and_appears_in_cli_help():
    helps = field_help(ReplayConfig)
    assert set(helps) == {f.name for f in dataclasses.fields(ReplayConfig)}
    parser = ReplayConfig.add_cli_args(argparse.ArgumentParser())
    text = parser.format_help()
    for f in dataclasses.fields(ReplayConfig):
        assert f"--replay.{f.name}" in text
    assert "Priority exponent" in text  # docstring text reaches --help


def test_cli_parses_into_flat_and_hierarchised_namespaces():
    parser = ReplayConfig.add_cli_args(argparse.ArgumentParser())
    ns = parser.parse_args(["--replay.mode", "freshness", "--replay.ratio", "1", "--replay.max_age", "7",
                            "--replay.alpha", "0.2", "--replay.replacement", "--replay.seed", "5"])
    c = ReplayConfig.from_namespace(ns)
    assert (c.mode, c.ratio, c.max_age, c.alpha, c.replacement, c.seed) == ("freshness", 1.0, 7, 0.2, True, 5)
    assert c.allow_empty_resume is False and c.capacity == 30000
    # OpenRLHF's hierarchize turns dotted flags into nested namespaces.
    nested = SimpleNamespace(replay=SimpleNamespace(**{k.split(".", 1)[1]: v for k, v in vars(ns).items()}))
    assert ReplayConfig.from_namespace(nested) == c
    assert ReplayConfig.from_namespace(SimpleNamespace()) == ReplayConfig()
    with pytest.raises(SystemExit):
        parser.parse_args(["--replay.mode", "bogus"])
    assert ReplayConfig.from_namespace(parser.parse_args([])) == ReplayConfig()


def test_modes_and_their_help_come_from_the_registry():
    assert MODES == ("none", *MODE_REGISTRY)
    parser = ReplayConfig.add_cli_args(argparse.ArgumentParser())
    actions = {a.dest: a for a in parser._actions}
    for flag, table in (("replay.mode", MODE_REGISTRY), ("replay.off_policy", OFF_POLICY_REGISTRY)):
        assert tuple(actions[flag].choices) == tuple(c for c in ((["none"] if flag == "replay.mode" else []) + list(table)))
        for entry in table.values():
            assert f"{entry.name}: {entry.help}" in actions[flag].help


def test_for_run_fills_the_group_size_only_for_a_mode_that_reads_it():
    """K reaches exgrpo's sampler; every other mode's config (saved with each buffer, in its
    digest) stays as its flags made it, so checkpoints written before exgrpo existed still match."""
    from replay import ReplayConfig

    assert ReplayConfig(mode="exgrpo").for_run(10, group_size=8).group_size == 8
    for mode in ("uniform", "advantage", "success", "freshness", "naive"):
        assert ReplayConfig(mode=mode).for_run(10, group_size=8).group_size is None, mode
