"""Keep rules: which of an insertion's valid rollouts the store holds. A mode's entry holds one.

A rule is a `KeepRule` object: the selection itself, the `ReplayConfig` fields it reads (handed
to it by name, recorded with every checkpoint, see `replay/holding.py`), and the store counter
its skipped rollouts count under. The store calls the rule it was given and never asks which it
is. The shared rules live here; a mode's own rule lives in its own module, beside its entry
(ExGRPO's: `replay/exgrpo_keep.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from replay.record import RolloutBatch

# The store counters a rule's skipped (valid, not kept) rollouts may count under.
SKIP_COUNTERS = ("skipped_zero_adv", "skipped_unsuccessful")


@dataclass(frozen=True)
class KeepRule:
    """One keep rule. `select(batch, ok, **settings) -> (n,) bool` over the n rollouts of `batch`,
    `ok` marking the valid ones (faulty ones are refused before any rule runs; a rule's answer on
    them is ignored)."""

    name: str
    """Recorded in checkpoints as the holding rule "keep rule": a file kept by another rule does not resume."""
    select: Callable[..., np.ndarray]
    settings: tuple[str, ...] = ()
    """The `ReplayConfig` fields `select` reads, passed by name; recorded in checkpoints."""
    skipped_counter: str = "skipped_zero_adv"
    """The store counter its skipped rollouts count under (one of `SKIP_COUNTERS`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a keep rule needs a name that is an identifier; got {self.name!r}")
        if self.skipped_counter not in SKIP_COUNTERS:
            raise ValueError(f"keep rule {self.name}: skipped_counter must be one of {', '.join(SKIP_COUNTERS)}; "
                             f"got {self.skipped_counter!r}")

    def check_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """`settings` as the rule takes them; ValueError when one it reads is missing or one is extra."""
        missing, extra = set(self.settings) - set(settings), set(settings) - set(self.settings)
        if missing or extra:
            raise ValueError(f"keep rule {self.name} reads {list(self.settings) or 'no settings'}; got "
                             f"{sorted(settings) or 'none'}" + (f": pass {sorted(missing)}" if missing else "")
                             + (f": drop {sorted(extra)}" if extra else ""))
        return {name: settings[name] for name in self.settings}

    def settings_of(self, config: Any) -> dict[str, Any]:
        """The values of its settings in `config` (a `ReplayConfig`)."""
        return {name: getattr(config, name) for name in self.settings}

    def __call__(self, batch: RolloutBatch, ok: np.ndarray, settings: Mapping[str, Any]) -> np.ndarray:
        keep = np.asarray(self.select(batch, ok, **settings), np.bool_)
        if keep.shape != (len(batch),):
            raise ValueError(f"keep rule {self.name} answered shape {keep.shape} for {len(batch)} rollouts")
        return keep


def _informative(batch: RolloutBatch, ok: np.ndarray, *, min_abs_advantage: float) -> np.ndarray:
    return np.abs(batch.advantages) >= min_abs_advantage


def _informative_groups(batch: RolloutBatch, ok: np.ndarray, *, min_abs_advantage: float) -> np.ndarray:
    _, group = np.unique(batch.group_ids, return_inverse=True)
    weights = _informative(batch, ok, min_abs_advantage=min_abs_advantage) & ok
    return (np.bincount(group, weights=weights, minlength=group.max(initial=-1) + 1) > 0)[group]


def _successes(batch: RolloutBatch, ok: np.ndarray, *, success_threshold: float) -> np.ndarray:
    return batch.rewards > success_threshold


def _everything(batch: RolloutBatch, ok: np.ndarray) -> np.ndarray:
    return np.ones(len(batch), np.bool_)


NONZERO_ADVANTAGE = KeepRule("nonzero_advantage", _informative, ("min_abs_advantage",))
"""|A| >= min_abs_advantage: the rollouts that carry a gradient."""
NONZERO_GROUP = KeepRule("nonzero_group", _informative_groups, ("min_abs_advantage",))
"""Whole groups with at least one such rollout (naive replay works on groups)."""
SUCCESSES = KeepRule("success", _successes, ("success_threshold",), skipped_counter="skipped_unsuccessful")
"""reward > success_threshold (RLEP's pool of verified successes)."""
EVERYTHING = KeepRule("all", _everything)
"""Every valid rollout (FreshPER; and the store of a run with replay off, which stores nothing)."""
