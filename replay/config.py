"""`ReplayConfig`: every knob of the replay core, its CLI flags and its derived values.

The docstring under each field is the one source of its `--help` text (parsed from this file).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import typing
from dataclasses import dataclass
from typing import Any, Optional

import replay.registry as registry
from replay.registry import OffPolicyRule, ReplayMode

UNREAD_ALPHA = 0.5  # `effective_alpha` where no mode's default applies (the method's exponent)


def __getattr__(name: str) -> Any:
    """`MODES` and `OFF_POLICY`: the registered names now (`replay/registry.py`), not a copy."""
    if name == "MODES":
        return registry.mode_names()
    if name == "OFF_POLICY":
        return registry.off_policy_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class ReplayConfig:
    """Rollout-level replay for GRPO (docs/METHOD.md sections 2-3). Flags: `--replay.<field>`."""

    mode: str = "none"
    """Replay variant, one entry of the registry (replay/modes.py):"""
    ratio: float = 0.5
    """Replayed rollouts per fresh rollout: k = round(ratio * n_fresh), halves up (the integration
    rounds to whole training batches). Not used by success mode (see per_prompt)."""
    warmup: int = 20
    """Steps trained on fresh rollouts only while the buffer fills: the first replay is in step
    warmup + 1 (OpenRLHF's log counts steps from 1; the buffer's step t counts from 0). Not
    applied with an offline pool (replay.success_pool), which is full before the first step."""
    max_age: Optional[int] = None
    """Age limit in steps: a rollout older than this (age = step - version) is evicted; a value
    beyond the run's length keeps every rollout until capacity pushes it out. Unset: the mode's
    default."""
    capacity: int = 30000
    """Most rollouts held; the oldest go first when full."""
    alpha: Optional[float] = None
    """Priority exponent, for a mode whose sampler prioritises. Unset: the mode's default."""
    eps: float = 1e-6
    """Added to |A| (freshness: to |reward|) before the exponent, so every stored rollout can be
    drawn."""
    replacement: bool = False
    """Draw with replacement within a step (uniform, advantage; naive and freshness always
    replace)."""
    tau: float = 500.0
    """FreshPER's age decay in steps: a stored priority times exp(-age / tau), before the
    exponent."""
    beta_start: float = 0.4
    """Freshness importance-weight exponent at step 0 (0.4: FreshPER's reference code, which keeps
    it fixed)."""
    beta_end: float = 0.4
    """Freshness importance-weight exponent after beta_steps. Equal to beta_start (the default),
    beta is fixed, as FreshPER's reference runs it; 1.0 anneals it as PER prescribes."""
    beta_steps: Optional[int] = None
    """Steps over which beta moves linearly from beta_start to beta_end. Unset: the run's length,
    so beta reaches beta_end at its last step (the integration sets it from the number of rollout
    steps; with the core alone, set it when beta anneals)."""
    per_prompt: int = 2
    """RLEP: M, the most successes replayed per fresh prompt: each prompt of the step gets
    min(M, its stored successes), drawn without replacement, and its group grows from G to up
    to G + M. The integration completes the replayed rows to whole training batches with inert
    rows (no loss, no tokens counted)."""
    success_threshold: float = 0.5
    """A rollout is verified-correct when its reward > this."""
    min_abs_advantage: float = 1e-6
    """Rollouts with |A| below this carry no gradient: a keep rule that reads it does not store them."""
    group_size: Optional[int] = None
    """Rollouts per prompt, K (exgrpo: its buckets are success counts out of K). Unset: the
    integration fills it from --rollout.n_samples_per_prompt when it builds the buffer; set, it
    must equal that."""
    off_policy: Optional[str] = None
    """How replayed rows enter the loss (pi_old and the importance weight); unset: the mode's
    default. One registered rule (replay/modes.py):"""
    m2_threshold: float = 0.04
    """M2PO (--replay.off_policy m2po): each micro-batch masks its tokens of largest
    (log pi_old - log pi_behaviour)^2 until the mean of the rest is below this (AReaL's
    actor.m2_threshold; 0.04 in its M2PO recipe)."""
    success_pool: Optional[str] = None
    """RLEP: a pool file of verified successes built before training from a seed checkpoint
    (`python -m openrlhf_replay.cli.build_success_pool`), loaded at start and replayed from the
    first step (replay.warmup does not apply to it); the run's own successes are then not added.
    Unset: the in-run pool (the run's own successes, from a prompt's second visit on)."""
    refill: bool = False
    """With upstream's dynamic filtering (--algo.dynamic_filtering_enable): a prompt group the
    filter drops is not replaced by a newly generated prompt; replayed rollouts take its rows in
    the step's batch instead (on top of the usual replayed share), so the step costs no extra
    generation. What the buffer cannot supply (the warm-up, a small buffer) is taken by inert rows
    (no loss), so every step trains as many rows as it generated. A mode that cannot take them refuses it."""
    skip: bool = False
    """Pre-rollout skipping (GRESO's rule, docs/METHOD.md "Pre-rollout skipping"): before
    generation, a prompt whose latest groups were zero-variance (all rewards equal) is skipped with
    a probability that grows with their number, and the loader supplies another prompt in its
    place, so a step still generates --rollout.batch_size groups. With --replay.mode none it is the
    GRESO baseline; with a replay mode, replay composes the steps as usual."""
    skip_target: float = 0.25
    """Share of zero-variance groups among those generated that skipping aims at (GRESO's
    target_zero_variance): a third of it for all-correct groups, two thirds for all-wrong ones."""
    skip_explore: float = 0.5
    """Starting exploration probability p (GRESO's p_easy and p_hard): a prompt whose last r groups
    were zero-variance of one kind is generated with probability max(p ** r, 0.01)."""
    skip_explore_step: float = 0.01
    """How far p moves after each generation call, toward the target share (GRESO: 0.01)."""
    skip_explore_min: float = 0.05
    """Least p (GRESO's min_p)."""
    skip_explore_max: float = 0.95
    """Largest p (GRESO's max_p)."""
    seed: int = 0
    """Seed of the buffer's own random generator (sampling) and of pre-rollout skipping's."""
    allow_empty_resume: bool = False
    """On resume, start with an empty buffer when the replay checkpoint is missing, instead of
    failing."""

    def __post_init__(self) -> None:
        entry = registry.get_mode(self.mode)  # an unknown mode names the choices
        if self.off_policy is not None:
            registry.get_off_policy(self.off_policy)
        if self.success_pool is not None and (entry is None or entry.load_pool is None
                                              or not isinstance(self.success_pool, str) or not self.success_pool):
            takers = [e.name for e in registry.MODE_REGISTRY.values() if e.load_pool is not None]
            raise ValueError(f"replay.success_pool {self.success_pool!r} is a pool of successes for replay.mode "
                             f"{' or '.join(takers)} (got replay.mode {self.mode!r}); unset it or use mode "
                             f"{' or '.join(takers)}")
        if self.success_pool is not None and self.max_age is not None:
            raise ValueError(f"replay.max_age {self.max_age} would evict the offline pool replay.success_pool "
                             f"{self.success_pool!r} (its rollouts are older than step 0): unset replay.max_age")
        _number("ratio", self.ratio, low=0.0)
        _integer("warmup", self.warmup, low=0)
        if self.max_age is not None:
            _integer("max_age", self.max_age, low=1, extra="; unset means the mode's default (an age limit of 0 "
                     "would evict every stored rollout before it could be replayed)")
        _integer("capacity", self.capacity, low=1)
        if self.alpha is not None:
            _number("alpha", self.alpha, low=0.0, extra="; unset means the mode's default")
        _number("eps", self.eps, low=0.0)
        _number("tau", self.tau, low=0.0, strict=True)
        _number("beta_start", self.beta_start, low=0.0, high=1.0)
        _number("beta_end", self.beta_end, low=0.0, high=1.0)
        if self.beta_steps is not None:
            _integer("beta_steps", self.beta_steps, low=0, extra="; unset means the run's length")
        _integer("per_prompt", self.per_prompt, low=1)
        if self.group_size is not None:
            _integer("group_size", self.group_size, low=1, extra="; unset means --rollout.n_samples_per_prompt")
        _number("success_threshold", self.success_threshold)
        _number("min_abs_advantage", self.min_abs_advantage, low=0.0)
        _number("m2_threshold", self.m2_threshold, low=0.0, strict=True)
        _integer("seed", self.seed, low=0)
        _number("skip_target", self.skip_target, low=0.0, high=1.0)
        for name in ("skip_explore", "skip_explore_min", "skip_explore_max"):
            _number(name, getattr(self, name), low=0.0, high=1.0, strict=True)
        _number("skip_explore_step", self.skip_explore_step, low=0.0)
        if not self.skip_explore_min <= self.skip_explore <= self.skip_explore_max:
            raise ValueError(f"replay.skip_explore {self.skip_explore} must lie within [replay.skip_explore_min "
                             f"{self.skip_explore_min}, replay.skip_explore_max {self.skip_explore_max}]: raise "
                             "or lower the bound, or move replay.skip_explore inside it")
        for name in ("replacement", "allow_empty_resume", "refill", "skip"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"replay.{name} must be True or False, got {getattr(self, name)!r}")
        if entry is not None:
            entry.check(self)  # a mode that cannot refill refuses it there (`modes.refuses_refill`)
        elif self.refill:
            raise ValueError(f"replay.refill fills the groups dynamic filtering drops with replayed rollouts, which "
                             f"replay.mode {self.mode!r} cannot do (nothing is replayed): pick a replay mode such as "
                             "advantage")

    # ---------------------------------------------------------------- derived values

    @property
    def entry(self) -> ReplayMode | None:
        """This mode's registry entry (replay/modes.py); None when replay is off."""
        return registry.get_mode(self.mode)

    @property
    def enabled(self) -> bool:
        return self.entry is not None

    @property
    def active(self) -> bool:
        """Whether the integration's controller runs: replay, or pre-rollout skipping alone."""
        return self.enabled or self.skip

    @property
    def defaults(self) -> ReplayMode | None:
        """The entry, which holds the mode's defaults; None when replay is off."""
        return self.entry

    @property
    def max_age_steps(self) -> int | None:
        """The age limit in force, in steps (the user's, else the mode's); None for no age limit."""
        if self.max_age is not None:
            return self.max_age
        return self.entry.max_age_steps if self.entry else None

    @property
    def effective_alpha(self) -> float:
        """The priority exponent in force (the user's, else the mode's; 0.5 for a mode that reads none,
        and when replay is off)."""
        if self.alpha is not None:
            return self.alpha
        return UNREAD_ALPHA if self.entry is None or self.entry.alpha is None else self.entry.alpha

    @property
    def effective_off_policy(self) -> str:
        """The off-policy rule in force (the user's, else the mode's; stale when replay is off)."""
        if self.off_policy is not None:
            return self.off_policy
        return self.entry.off_policy if self.entry else ReplayMode.off_policy

    @property
    def off_policy_rule(self) -> OffPolicyRule:
        """The registry's rule of `effective_off_policy`."""
        return registry.get_off_policy(self.effective_off_policy)

    @property
    def effective_warmup(self) -> int:
        """Steps before the first replay: replay.warmup, except with an offline pool, which holds
        its successes before step 0 and replays from the first step, as RLEP runs it."""
        return 0 if self.success_pool else self.warmup

    def for_run(self, steps: int, group_size: int | None = None) -> ReplayConfig:
        """This config with what derives from the run filled in by the mode's entry: from the run's
        length (freshness: beta_steps, unless set) and from `group_size`, the run's rollouts per
        prompt (exgrpo: its K, unless set). A mode that reads neither leaves its config, saved with
        each buffer, as its flags made it."""
        return self if self.entry is None else self.entry.for_run(self, steps, group_size)

    # ---------------------------------------------------------------- (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplayConfig:
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            known = [f.name for f in dataclasses.fields(cls)]
            raise ValueError(f"unknown replay config fields {sorted(unknown)}; known: {known}")
        return cls(**d)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, prefix: str = "replay") -> argparse.ArgumentParser:
        """Add `--<prefix>.<field>` flags (OpenRLHF's dotted style) with help from the field docstrings."""
        helps = field_help(cls)
        hints = typing.get_type_hints(cls)
        group = parser.add_argument_group(prefix, cls.__doc__)
        for f in dataclasses.fields(cls):
            flag, dest, tp = f"--{prefix}.{f.name}", f"{prefix}.{f.name}", hints[f.name]
            choices, text = _registry_help(f.name, helps[f.name], switch=tp is bool)
            text = f"{text} (default: {'unset' if f.default is None else f.default})"
            if tp is bool:
                group.add_argument(flag, dest=dest, action="store_true", default=f.default, help=text)
                continue
            base = typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Union else tp
            group.add_argument(flag, dest=dest, type=base, default=f.default, choices=choices, help=text,
                               metavar=None if choices else base.__name__.upper())
        return parser

    @classmethod
    def from_namespace(cls, ns: Any, prefix: str = "replay") -> ReplayConfig:
        """Read flags from argparse's flat namespace (`getattr(ns, "replay.mode")`) or from the
        nested one OpenRLHF's `hierarchize` builds (`ns.replay.mode`); absent fields keep defaults."""
        nested = getattr(ns, prefix, None)
        values = {}
        for f in dataclasses.fields(cls):
            if hasattr(ns, f"{prefix}.{f.name}"):
                values[f.name] = getattr(ns, f"{prefix}.{f.name}")
            elif nested is not None and hasattr(nested, f.name):
                values[f.name] = getattr(nested, f.name)
        return cls(**values)


def _registry_help(name: str, text: str, switch: bool = False) -> tuple[tuple[str, ...] | None, str]:
    """A flag's choices where a registry holds them, and its help completed by what the registry's
    entries say of it: each entry's own line, each mode's default, the modes that refuse it and the
    keep rules that read it (`switch`: an on/off flag, asked of each mode's checks). Read when the
    parser is built, so an entry registered before then is listed, and no per-mode fact is restated
    in prose."""
    choices = None
    if name == "mode":
        choices = registry.mode_names()
        text = f"{text} {registry.choices_help(registry.MODE_REGISTRY, 'none: plain GRPO')}."
    elif name == "off_policy":
        choices = registry.off_policy_names()
        text = f"{text} {registry.choices_help(registry.OFF_POLICY_REGISTRY)}."
    defaults = _mode_defaults(name)
    if defaults:
        text += f" The modes' defaults: {defaults}."
    refusing = _modes_refusing(**{name: True}) if switch else []
    if refusing:
        text += f" Modes that refuse it: {', '.join(refusing)}."
    keeping = [entry.name for entry in registry.MODE_REGISTRY.values() if name in entry.keep.settings]
    if keeping:
        text += f" The modes whose keep rule reads it: {', '.join(keeping)}."
    return choices, text


def _mode_defaults(name: str) -> str:
    """'value for mode, mode; value for mode' of the fields whose default each mode sets; '' for the others."""
    entries = registry.MODE_REGISTRY.values()
    pairs = {"max_age": [(e.name, "no age limit" if e.max_age_steps is None else e.max_age_steps) for e in entries],
             "alpha": [(e.name, e.alpha) for e in entries if e.alpha is not None],
             "off_policy": [(e.name, e.off_policy) for e in entries]}.get(name, [])
    by_value: dict[Any, list[str]] = {}
    for mode, value in pairs:
        by_value.setdefault(value, []).append(mode)
    return "; ".join(f"{value} for {', '.join(modes)}" for value, modes in by_value.items())


def _modes_refusing(**changes: Any) -> list[str]:
    """The modes (none too) whose checks accept their default config but refuse it with `changes`."""
    refusing = []
    for mode in registry.mode_names():
        try:
            ReplayConfig(mode=mode)
        except ValueError:
            continue
        try:
            ReplayConfig(mode=mode, **changes)
        except ValueError:
            refusing.append(mode)
    return refusing


@functools.lru_cache(maxsize=None)
def field_help(cls: type) -> dict[str, str]:
    """{field: the docstring written under it} for a dataclass defined in a source file."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    helps = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            helps[stmt.target.id] = " ".join(nxt.value.value.split())
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in helps]
    if missing:
        raise TypeError(f"{cls.__name__}: fields without a docstring: {missing}")
    return helps


# -------------------------------------------------------------------- checks


def _integer(name: str, value: Any, low: int, extra: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"replay.{name} must be an integer >= {low}{extra}; got {value!r}")


def _number(name: str, value: Any, low: float | None = None, high: float | None = None,
            strict: bool = False, extra: str = "") -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if strict else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bounds = [f"{'>' if strict else '>='} {low}"] if low is not None else []
        bounds += [f"<= {high}"] if high is not None else []
        bounds_text = (" " + " and ".join(bounds)) if bounds else ""
        raise ValueError(f"replay.{name} must be a finite number{bounds_text}{extra}; got {value!r}")
