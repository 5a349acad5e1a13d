"""The registry of replay modes and off-policy rules: one entry holds everything a variant is.

A mode is one `ReplayMode` entry, registered once (`register_mode`). The entry holds its behaviour
as objects and functions: its sampler, keep rule, composer, state hooks, checkpoint rules and the
launcher's checks and lines. The code that runs a mode calls what the entry holds; nothing
branches on a mode's name, nor on a field only one mode sets. Off-policy handling of replayed rows
(how pi_old and the importance weight are formed) is the same: one `OffPolicyRule` per choice.
The shape follows verl's registries (`@register_policy_loss`, `@register_adv_est`: one registered
function per variant, an unknown name answered with the valid ones) and TorchRL's replay buffer
(storage, writer and sampler as objects, each carrying its own state); the code is this project's.

This module is pure: it imports nothing of the project, so `config.py` can read the registry while
the built-in entries (`replay/modes.py`) and those of `replay/plugins/` import what they hold.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np


class ModeHooks:
    """A mode's state hooks, one instance per buffer (`ReplayMode.hooks` is the class). The
    default has no state: every rollout enters with priority 1.0 and a draw changes nothing.

    A mode whose state is per rollout keeps it in the store's per-rollout `priorities` column and
    its running `max_priority` (evicted with its rollout, saved with the store). State of another
    kind goes in `state_dict`, which the buffer saves under "mode_state" when it is not empty."""

    def insert_priorities(self, fresh: Any, config: Any) -> np.ndarray | None:
        """The stored priority of each of `fresh`'s rollouts as they enter; None: 1.0 each."""
        return None

    def after_draw(self, store: Any, composition: Any, config: Any) -> None:
        """Called after the step's draw is counted, before the fresh rollouts are stored."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, but the file holds {sorted(state)}")


class CheckpointRules:
    """A mode's checkpoint rules: what it adds to the holding rules every replay checkpoint records
    (`replay/holding.py`: the common ones and its keep rule's are added for every mode), and the
    rules files of an older format were written under. The default adds nothing and has no history.
    A resume refuses a file whose rules differ from the run's."""

    def holding(self, config: Any) -> dict[str, Any]:
        """Rules of its own, e.g. what its stored priorities mean (FreshPER's)."""
        return {}

    def format_1(self, config: Any, rules: dict[str, Any]) -> dict[str, Any]:
        """`rules` (today's, for `config`) as format-1 code of this mode had them."""
        return rules


def _no_check(config: Any) -> None:
    return None


def _no_knobs(config: Any) -> dict[str, Any]:
    return {}


def _as_is(config: Any, steps: int, group_size: int | None) -> Any:
    return config


def _no_launch_errors(config: Any, args: Any) -> list[str]:
    return []


def ratio_count_text(config: Any, prompts: int, fresh: int) -> str:
    """What sets a fresh-anchored mode's replayed count, for the launcher's messages."""
    return f"--replay.ratio {config.ratio} x {fresh} fresh rollouts"


def _common_line(config: Any, args: Any, rows: int, common: str) -> str:
    return common


@dataclass(frozen=True)
class ReplayMode:
    """Everything one `--replay.mode` is (docs/METHOD.md section 3). The code that runs a mode calls
    what its entry holds and never asks which mode it is."""

    name: str
    help: str
    """One sentence for `--replay.mode`'s help."""
    keep: Any
    """Its keep rule, a `replay.keep.KeepRule`: which rollouts the store holds."""
    composer: Callable[..., Any]
    """`f(fresh, store, sampler, config, step, rng, multiple_of, *, divide_by_std, extra) -> Composition`
    (`extra`: rows dynamic filtering dropped, for replay to take with `--replay.refill`)."""
    target: Callable[[Any, int, int, int], int]
    """(config, n_fresh, n_groups, multiple_of) -> rollouts a step replays once the store holds
    enough (`composer.replay_target`)."""
    sampler: Callable[..., Any] | None = None
    """Its sampler, `f(view, k, step, rng, *, fresh_prompt_uids, <knobs>) -> Draw`, wherever it is
    defined; None for a composer that draws nothing from the store."""
    knobs: Callable[[Any], dict[str, Any]] = _no_knobs
    """config -> the sampler's keyword knobs, bound once when the buffer is built."""
    max_age_steps: int | None = None
    """Default age limit in steps; None: no age limit (FIFO by capacity only)."""
    alpha: float | None = None
    """Default priority exponent, for a sampler that prioritises; None: it reads none."""
    off_policy: str = "stale"
    """Default off-policy rule of its replayed rows, a registered `OffPolicyRule`."""
    hooks: type[ModeHooks] = ModeHooks
    """Its state hooks (on insert; after a draw), instantiated per buffer."""
    check: Callable[[Any], None] = _no_check
    """Raises ValueError, with the fix, for a config this mode cannot run (after the common checks)."""
    check_buffer: Callable[[Any], None] = _no_check
    """The same, for what must be settled before a buffer is built (e.g. the run's length)."""
    for_run: Callable[[Any, int, int | None], Any] = _as_is
    """(config, steps, group_size) -> the config with what derives from the run filled in (its
    length; K, the run's rollouts per prompt, which is None when unknown)."""
    checkpoint: CheckpointRules = CheckpointRules()
    """Its checkpoint rules, beyond the common ones and its keep rule's."""
    load_pool: Callable[[str], Any] | None = None
    """Loads `--replay.success_pool`, a pool built before training (`replay.pool.load_pool`);
    None: the mode takes no such pool."""
    launch_errors: Callable[[Any, Any], list[str]] = _no_launch_errors
    """(config, upstream's nested args) -> why the launcher must refuse this run, each with its fix
    (e.g. an advantage estimator the mode cannot run with)."""
    count_text: Callable[[Any, int, int], str] = ratio_count_text
    """(config, prompts, fresh rollouts) -> what sets its replayed count, for the launcher's messages."""
    describe: Callable[[Any, Any, int, str], str] = _common_line
    """(config, nested args, rows per step, the common line) -> the launcher's start-up line."""


@dataclass(frozen=True)
class OffPolicyRule:
    """How replayed rows enter the loss: pi_old and the importance weight (docs/METHOD.md section 2)."""

    name: str
    help: str
    recompute_old: bool = False
    """pi_old of replayed rows is recomputed under the current weights before the update."""
    behaviour_weight: bool = True
    """`rollout_log_probs` keeps pi_behaviour, so upstream's IS correction (when on) weighs
    pi_old / pi_behaviour; False: it takes pi_old too, and the weight is exactly 1."""
    corrections: tuple[tuple[str, str, str], ...] = ()
    """Upstream IS corrections (level, mode, gating) it needs, one of them; () for none."""
    corrections_hint: str = ""
    """Appended to the launcher's refusal when those corrections are missing (where to find them)."""
    loss: str | None = None
    """Loss side: the actor's policy loss under this rule, "module:Class" of a subclass of the
    integration's `SplitStatsPolicyLoss` (ExGRPO's shaped objective on replayed rows). The
    integration imports it (`ppo_actor.py:policy_loss_class`); this pure core only names it.
    None: `SplitStatsPolicyLoss`, upstream's loss with per-kind statistics."""
    loss_settings: Callable[[Any], dict[str, Any]] = _no_knobs
    """Loss side: config -> attributes set on the actor's loss (M2PO: the threshold of its
    second-moment mask over each micro-batch's tokens, `--replay.m2_threshold`)."""

    @property
    def behaviour_apart_from_old(self) -> bool:
        """pi_old is recomputed while `rollout_log_probs` keeps pi_behaviour (`refresh`, `m2po`): what
        weighs the behaviour policy's samples, e.g. the KL loss's pi_theta / pi_behaviour, reads the
        latter (docs/METHOD.md section 2, "KL")."""
        return self.recompute_old and self.behaviour_weight


MODE_REGISTRY: dict[str, ReplayMode] = {}
OFF_POLICY_REGISTRY: dict[str, OffPolicyRule] = {}
NONE = "none"  # replay off: upstream's run, no entry


def register_mode(entry: ReplayMode) -> ReplayMode:
    """Add a mode; its name becomes a `--replay.mode` choice. A second entry of one name is an error,
    and so is an entry holding something other than what its fields say."""
    _check_mode(entry)
    _register(MODE_REGISTRY, entry, "replay mode")
    return entry


_MODE_FUNCTIONS = ("composer", "target", "knobs", "check", "check_buffer", "for_run", "launch_errors", "count_text",
                   "describe")


def _check_mode(entry: ReplayMode) -> None:
    wrong = [f"{name} (a function)" for name in _MODE_FUNCTIONS if not callable(getattr(entry, name))]
    wrong += [f"{name} (a function or None)" for name in ("sampler", "load_pool")
              if getattr(entry, name) is not None and not callable(getattr(entry, name))]
    if not (callable(entry.keep) and isinstance(getattr(entry.keep, "settings", None), tuple)):
        wrong.append("keep (a replay.keep.KeepRule)")
    if not isinstance(entry.checkpoint, CheckpointRules):
        wrong.append("checkpoint (a CheckpointRules)")
    if not (isinstance(entry.hooks, type) and issubclass(entry.hooks, ModeHooks)):
        wrong.append("hooks (a ModeHooks subclass)")
    if wrong:
        raise ValueError(f"replay mode {entry.name!r} must hold {'; '.join(wrong)}")


def register_off_policy(rule: OffPolicyRule) -> OffPolicyRule:
    """Add an off-policy rule; its name becomes a `--replay.off_policy` choice."""
    _register(OFF_POLICY_REGISTRY, rule, "off-policy rule")
    return rule


def unregister_mode(name: str) -> None:
    """Remove a mode (tests that register a toy one clean up with this)."""
    MODE_REGISTRY.pop(name, None)


def _register(table: dict, entry: Any, what: str) -> None:
    if not isinstance(entry.name, str) or not entry.name.isidentifier() or entry.name == NONE:
        raise ValueError(f"a {what} needs a name that is an identifier other than {NONE!r}; got {entry.name!r}")
    if entry.name in table:
        raise ValueError(f"{what} {entry.name!r} is registered already; pick another name")
    table[entry.name] = entry


def mode_names() -> tuple[str, ...]:
    """`--replay.mode`'s choices: none, then every registered mode in registration order."""
    return (NONE, *MODE_REGISTRY)


def off_policy_names() -> tuple[str, ...]:
    return tuple(OFF_POLICY_REGISTRY)


def get_mode(name: str) -> ReplayMode | None:
    """The entry of mode `name`; None for none. An unknown name is a ValueError naming the choices."""
    if name == NONE:
        return None
    try:
        return MODE_REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"replay.mode must be one of {', '.join(mode_names())}; got {name!r}") from None


def get_off_policy(name: str) -> OffPolicyRule:
    try:
        return OFF_POLICY_REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"replay.off_policy must be one of {', '.join(off_policy_names())}; got {name!r}") from None


def choices_help(table: Mapping[str, Any], first: str | None = None) -> str:
    """'name: help; name: help' over a registry, for a flag's `--help`."""
    return "; ".join(([first] if first else []) + [f"{e.name}: {e.help}" for e in table.values()])


__all__ = ["ModeHooks", "CheckpointRules", "ReplayMode", "OffPolicyRule", "MODE_REGISTRY", "OFF_POLICY_REGISTRY",
           "NONE", "register_mode", "register_off_policy", "unregister_mode", "mode_names", "off_policy_names",
           "get_mode", "get_off_policy", "choices_help", "ratio_count_text"]
