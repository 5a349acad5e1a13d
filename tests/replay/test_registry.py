"""The registry: every entry holds its behaviour, the help states what the entries say, and no
code outside the entries asks which mode it runs (issue #48)."""
import argparse
import ast
import re
from pathlib import Path

import pytest

from registry_checks import check_every_entry
from replay import MODE_REGISTRY, ReplayConfig, RolloutStore
from replay.keep import KeepRule

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("replay", "openrlhf_replay", "benchmarks", "examples")
# Comparisons with a string that happens to spell a mode's name but means something else.
NOT_A_MODE = {
    ("openrlhf_replay/trainer/ppo_utils/experience.py", "advantage"): "a key of the loss inputs",
}
# Fields that once served one mode each, which the integration branched on (issue #48).
RETIRED_FLAGS = {"offline_pool", "rewrites_fresh_advantages", "uses_group_size", "format_1_rules", "priority_rule",
                 "estimators", "estimators_why", "kl_in_reward", "no_refill", "store_filter", "sampler_name",
                 "SAMPLERS", "KEEP_RULES", "SUCCESS_RULES", "get_sampler", "m2_mask", "policy_shaping"}


def test_every_built_in_entry_passes_the_registry_checks():
    check_every_entry()


def _help(parser: argparse.ArgumentParser, flag: str) -> str:
    return " ".join(next(a for a in parser._actions if a.dest == flag).help.split())


def test_every_per_mode_default_in_the_help_comes_from_the_entries():
    parser = ReplayConfig.add_cli_args(argparse.ArgumentParser())
    defaults = {"replay.max_age": lambda e: "no age limit" if e.max_age_steps is None else e.max_age_steps,
                "replay.alpha": lambda e: e.alpha, "replay.off_policy": lambda e: e.off_policy}
    for flag, default in defaults.items():
        text = _help(parser, flag)
        stated = dict(re.findall(r"(\S+(?: \S+)*?) for ([\w, ]+)(?:;|\.)", text.split("The modes' defaults: ")[1]))
        for entry in MODE_REGISTRY.values():
            value = default(entry)
            if value is not None:
                assert entry.name in stated[str(value)].split(", "), (flag, entry.name, text)
    refill = _help(parser, "replay.refill")
    assert refill.endswith("Modes that refuse it: none, success, age0. (default: False)"), refill
    assert all("refuse" not in _help(parser, f"replay.{flag}") for flag in ("skip", "replacement"))
    assert "naive, uniform, advantage, age0, exgrpo" in _help(parser, "replay.min_abs_advantage")


def test_a_store_holds_a_keep_rule_not_a_name():
    with pytest.raises(ValueError, match="keep must be a KeepRule"):
        RolloutStore(10, None, keep="nonzero_advantage")
    with pytest.raises(ValueError, match="skipped_counter must be one of"):
        KeepRule("odd", lambda batch, ok: ok, skipped_counter="skipped_odd")
    with pytest.raises(ValueError, match="identifier"):
        KeepRule("not a name", lambda batch, ok: ok)


def _compared_strings(node: ast.Compare) -> set[str]:
    out = set()
    for operand in (node.left, *node.comparators):
        items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
        out |= {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
    return out


def _product_code():
    """(path relative to the root, its syntax tree) of each product file outside the files that
    register modes (the entries' own files, which name their modes and their fields)."""
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            if "register_mode(" not in source:
                yield path.relative_to(ROOT).as_posix(), ast.parse(source)


def name_branches(names: set[str]) -> list[str]:
    """`==`, `!=`, `in`, `not in` with a mode's name (argument parsing compares flags' own names,
    never modes')."""
    found = []
    for rel, tree in _product_code():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                hits = {n for n in _compared_strings(node) & names if (rel, n) not in NOT_A_MODE}
                found += [f"{rel}:{node.lineno} {sorted(hits)}"] if hits else []
    return found


def test_no_code_outside_the_entries_branches_on_a_mode_name_or_a_retired_flag():
    assert name_branches(set(MODE_REGISTRY)) == []
    flags = []
    for rel, tree in _product_code():
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            flags += [f"{rel}:{node.lineno} {name}"] if name in RETIRED_FLAGS else []
    assert flags == []


def test_the_guard_finds_a_name_branch():
    # Control: the same scan over a snippet that does branch on a mode's name.
    tree = ast.parse('if config.mode in ("success", "exgrpo"):\n    pass\nif x == "naive":\n    pass\n')
    hits = [_compared_strings(n) & set(MODE_REGISTRY) for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    assert hits == [{"success", "exgrpo"}, {"naive"}]


def test_an_entry_holding_a_name_instead_of_a_rule_is_refused():
    from replay import ReplayMode, register_mode
    from replay.modes import COMMON

    with pytest.raises(ValueError, match=r"'toy' must hold keep \(a replay.keep.KeepRule\)"):
        register_mode(ReplayMode(name="toy", help="toy", keep="nonzero_advantage", **COMMON))
    with pytest.raises(ValueError, match=r"sampler \(a function or None\)"):
        register_mode(ReplayMode(name="toy", help="toy", keep=MODE_REGISTRY["uniform"].keep, sampler="uniform",
                                 **COMMON))
    assert "toy" not in MODE_REGISTRY
