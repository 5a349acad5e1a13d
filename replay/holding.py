"""Holding rules: what decides which rollouts a replay checkpoint holds, recorded in every file so
that a resume under other rules is refused instead of quietly mixing two configurations.

The common rules (age limit, capacity, the per-token columns the run's KL needs) are the same for
every mode; the keep rule and the config fields it reads come from the mode's keep rule
(`replay/keep.py`), and anything else (what stored priorities mean) from the mode's checkpoint
rules (`registry.CheckpointRules`), which also say how files of format 1 were written.
"""
from __future__ import annotations

from typing import Any, Mapping

from replay.config import ReplayConfig

KEEP_RULE, PRIORITY_RULE, KL_RULE = "keep rule", "priority rule", "per-token KL columns"
# What each optional per-token column is kept for; a file of another KL setting lacks what this
# run's loss reads (or holds what it would ignore), so the KL setting is a holding rule.
# (The rule's name predates the critic's and async's columns; saved files carry it, so it stays.)
_KL_COLUMN_USE = {"token_advantages": "KL in the reward", "ref_logprobs": "KL as a loss",
                  "token_rewards": "GAE against the current critic", "rollout_logprobs": "async IS correction"}
NO_KL_COLUMNS = "none (KL off)"
# Replay off (mode none): no keep rule, and the one threshold its files have always recorded.
_REPLAY_OFF_READS = ("min_abs_advantage",)


def holding_rules(config: ReplayConfig, token_columns: tuple[str, ...] = ()) -> dict[str, Any]:
    """What decides which rollouts the store holds and, where the store keeps priorities, what
    they mean: the flags with their values in force, the mode's keep rule with the config fields it
    reads, its checkpoint rules' own (freshness: its priority rule), and the per-token columns the
    run's KL needs. A checkpoint written under other rules holds rollouts this run would not keep,
    lacks ones it would, carries priorities of another meaning or lacks what the loss reads:
    resuming from it would quietly mix two configurations."""
    entry = config.entry
    rules = {"replay.max_age": config.max_age_steps or "unset (no age limit)", "replay.capacity": config.capacity,
             KEEP_RULE: None if entry is None else entry.keep.name,
             KL_RULE: ", ".join(f"{c} ({_KL_COLUMN_USE[c]})" for c in token_columns) or NO_KL_COLUMNS}
    read = _REPLAY_OFF_READS if entry is None else entry.keep.settings
    rules |= {f"replay.{name}": getattr(config, name) for name in read}
    return rules if entry is None else rules | entry.checkpoint.holding(config)


def written_rules(state: Mapping[str, Any]) -> dict[str, Any]:
    """The holding rules a checkpoint state was written under (format 1: those of its config
    under the code of that format)."""
    if state.get("format_version") != 1:
        return {KL_RULE: NO_KL_COLUMNS} | dict(state["holding_rules"])  # files from before KL: none
    config = ReplayConfig.from_dict(dict(state["config"]))
    rules = holding_rules(config)  # format 1 predates KL: no per-token columns
    return rules if config.entry is None else config.entry.checkpoint.format_1(config, rules)


def rules_mismatch(saved: Mapping[str, Any], ours: Mapping[str, Any], mode: str) -> str | None:
    """Why a buffer written under holding rules `saved` cannot resume under `ours`, with the
    fix; None when they agree."""
    differ = [k for k in {**saved, **ours} if saved.get(k) != ours.get(k)]
    if not differ:
        return None
    show = lambda rules: ", ".join(f"{k} {rules.get(k, 'unset')}" for k in differ)  # noqa: E731
    if KL_RULE in differ:
        return (f"written with {KL_RULE} {saved.get(KL_RULE)}, this run has {ours.get(KL_RULE)}: its rollouts do not "
                "carry what this run's KL or critic reads (--algo.kl.init_coef, --algo.kl.use_loss and "
                "--algo.advantage.estimator decide). Resume with the KL and estimator flags it was written with, "
                "or start with an empty buffer (--replay.allow_empty_resume)")
    if KEEP_RULE in differ or PRIORITY_RULE in differ:
        return (f"written under replay.mode={mode} with {show(saved)}; this code's replay.mode={mode} has "
                f"{show(ours)}: the buffer holds other rollouts, or priorities of another meaning. Resume with "
                "the code that wrote it, or start with an empty buffer (--replay.allow_empty_resume)")
    return (f"written with {show(saved)}, this run has {show(ours)}: the buffer holds rollouts by other rules than "
            "this run's; resume with the settings it was written with")
