"""The registry of replay modes and off-policy rules: one entry holds everything a variant is.

A mode used to be spread over parallel tables (its name, its defaults, its sampler, the knobs bound
to it) and over branches on its name in the buffer, the composer and the launcher. Here it is one
`ReplayMode` entry, registered once (`register_mode`); every other module reads the entry's fields
and calls its hooks, and none branches on a name. Off-policy handling of replayed rows (how pi_old
and the importance weight are formed) is the same: one `OffPolicyRule` per choice. The idea follows
verl's `@register_adv_est` and TorchRL's `Sampler` objects (which carry their own update and state
hooks); the code is this project's.

This module is pure: it imports nothing of the project, so `config.py` can read the registry while
the built-in entries (`replay/modes.py`) import the samplers and composers they name.
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


def _no_check(config: Any) -> None:
    return None


@dataclass(frozen=True)
class ReplayMode:
    """Everything one `--replay.mode` is (docs/METHOD.md section 3)."""

    name: str
    help: str
    """One sentence for `--replay.mode`'s help."""
    sampler: Callable[..., Any]
    """Its sampler, `f(view, k, step, rng, *, fresh_prompt_uids, <knobs>) -> Draw` (samplers.py)."""
    knobs: Callable[[Any], dict[str, Any]]
    """config -> the sampler's keyword knobs, bound once when the buffer is built."""
    keep: str
    """The store's keep rule, one of `store.KEEP_RULES`."""
    composer: Callable[..., Any]
    """`f(fresh, store, sampler, config, step, rng, multiple_of, *, divide_by_std, extra) -> Composition`
    (`extra`: rows dynamic filtering dropped, for replay to take with `--replay.refill`)."""
    target: Callable[[Any, int, int, int], int]
    """(config, n_fresh, n_groups, multiple_of) -> rollouts a step replays once the store holds
    enough (`composer.replay_target`)."""
    max_age_steps: int | None = None
    """Default age limit in steps; None: no age limit (FIFO by capacity only)."""
    alpha: float = 0.5
    """Default priority exponent (for samplers that prioritise)."""
    off_policy: str = "stale"
    """Default off-policy rule of its replayed rows, a registered `OffPolicyRule`."""
    hooks: type[ModeHooks] = ModeHooks
    """Its state hooks (on insert; after a draw), instantiated per buffer."""
    check: Callable[[Any], None] = _no_check
    """Raises ValueError, with the fix, for a config this mode cannot run (after the common checks)."""
    check_buffer: Callable[[Any], None] = _no_check
    """The same, for what must be settled before a buffer is built (e.g. the run's length)."""
    for_run: Callable[[Any, int], Any] | None = None
    """(config, steps) -> the config with what derives from the run's length filled in."""
    priority_rule: str | None = None
    """Checkpoint rule: what its stored priorities mean, when they mean anything (a holding rule)."""
    format_1_rules: Mapping[str, Any] | None = None
    """Checkpoint rule: the holding rules format-1 files of this mode were written under, where they
    differ from today's (None: the same)."""
    uses_group_size: bool = False
    """Its knobs read `group_size` (K, the run's rollouts per prompt), which `for_run` then fills
    in; other modes leave it unset, so their saved configs (and digests) do not change."""
    no_refill: str = ""
    """Why it cannot take the rows of groups dynamic filtering drops (`--replay.refill`); empty: it can."""
    offline_pool: bool = False
    """Accepts `--replay.success_pool` (a pool built before training)."""
    rewrites_fresh_advantages: bool = False
    """Its composer recomputes fresh rows' advantages (the integration writes them back)."""
    estimators: tuple[str, ...] | None = None
    """The upstream advantage estimators it runs with; None: every one replay runs with."""
    estimators_why: str = ""
    """Why only those, for the launcher's refusal of another."""
    kl_in_reward: bool = True
    """Runs with KL folded into the reward (its stored per-token advantages survive composing)."""
    count_text: Callable[[Any, int, int], str] | None = None
    """(config, prompts, fresh rollouts) -> what sets its replayed count, for the launcher's messages."""
    describe: Callable[[Any, Any, int], str] | None = None
    """(config, nested args, rows per step) -> the launcher's start-up line; None: the common one."""


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
    m2_mask: bool = False
    """Loss side: M2PO's second-moment mask over each micro-batch's tokens (`--replay.m2_threshold`)."""
    policy_shaping: bool = False
    """Loss side: replayed rows train on ExGRPO's shaped objective -A w / (w + 0.1), unclipped, in
    place of upstream's clipped ratio (`openrlhf_replay/trainer/exgrpo_loss.py`)."""

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
    """Add a mode; its name becomes a `--replay.mode` choice. A second entry of one name is an error."""
    _register(MODE_REGISTRY, entry, "replay mode")
    return entry


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


__all__ = ["ModeHooks", "ReplayMode", "OffPolicyRule", "MODE_REGISTRY", "OFF_POLICY_REGISTRY", "NONE",
           "register_mode", "register_off_policy", "unregister_mode", "mode_names", "off_policy_names",
           "get_mode", "get_off_policy", "choices_help"]
