"""`ReplayBuffer`: the one object the integration calls, once per training step.

    buf = ReplayBuffer(ReplayConfig.from_namespace(args))
    comp = buf.step(fresh, step)        # train on comp.batch
    logger.log(buf.metrics())           # flat dict, `replay/` keys
    buf.save(path) / ReplayBuffer.load(path, config)
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Mapping

import numpy as np

from replay.checkpoint import ReplayCheckpointError, load_state, save_state
from replay.composer import Composition, compose, compose_rlep
from replay.config import ReplayConfig
from replay.metrics import composition_metrics, store_metrics
from replay.record import RolloutBatch
from replay.samplers import sampler_from_config
from replay.store import RolloutStore

FORMAT_VERSION = 1


def holding_rules(config: ReplayConfig) -> dict[str, Any]:
    """The settings (as flags) that decide which rollouts the store holds, with the values in force.
    A checkpoint written under other values holds rollouts this run would not keep, or lacks ones
    it would: resuming from it would quietly mix two configurations."""
    rules = {"replay.max_age": config.max_age_steps or "unset (no age limit)", "replay.capacity": config.capacity}
    if config.store_filter == "success":
        rules["replay.success_threshold"] = config.success_threshold
    else:
        rules["replay.min_abs_advantage"] = config.min_abs_advantage
    return rules


class ReplayBuffer:
    """Store + sampler + composer for one run, with its own random generator."""

    def __init__(self, config: ReplayConfig) -> None:
        if config.mode == "freshness" and config.beta_steps is None:
            raise ValueError("replay.beta_steps is unset: the freshness importance weights anneal over it; set it to "
                             "the run's length in steps (config.for_run(steps))")
        self.config = config
        self.store = self._new_store(config)
        self.sampler = sampler_from_config(config) if config.enabled else None
        self.rng = np.random.default_rng(config.seed)
        self.last_step: int | None = None
        self._step_metrics: dict[str, float] = {}

    @staticmethod
    def _new_store(config: ReplayConfig) -> RolloutStore:
        return RolloutStore(config.capacity, config.max_age_steps, keep=config.store_filter or "all",
                            min_abs_advantage=config.min_abs_advantage, success_threshold=config.success_threshold)

    def __len__(self) -> int:
        return len(self.store)

    def step(self, fresh: RolloutBatch, step: int, *, multiple_of: int = 1, divide_by_std: bool = True) -> Composition:
        """One training step: evict by age at `step`; draw the replay part from what is already
        stored (so never this step's own rollouts); count the reuse; store `fresh` with
        version `step` (its faulty rollouts are refused and counted). Steps must increase. `multiple_of`: the number
        replayed is a multiple of it (see `nominal_replay_count`). `divide_by_std`: success mode
        recomputes enlarged groups' advantages as group_norm (True) or dr_grpo (False).

        With mode none nothing is stored or drawn: the composition is `fresh` alone.
        """
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step {step} does not follow the last step {self.last_step}: steps must increase")
        if self.config.enabled:
            self.store.evict(step)
            if self.config.mode == "success":
                comp = compose_rlep(fresh, self.store, self.sampler, self.config, step, self.rng, multiple_of,
                                    divide_by_std=divide_by_std)
            else:
                comp = compose(fresh, self.store, self.sampler, self.config, step, self.rng, multiple_of)
            self.store.increment_reuse(comp.indices)
            self.store.insert(fresh, version=step)
        else:
            comp = Composition(fresh, RolloutBatch.empty(), np.zeros(0, np.float32), np.zeros(0, np.int64))
        self.last_step = step
        self._step_metrics = composition_metrics(comp, step)
        return comp

    def metrics(self) -> dict[str, float]:
        """Flat `replay/...` metrics: buffer size and cumulative counters, plus the statistics of
        the last `step` (replayed fraction, ages, reuse, ess, importance weights where used)."""
        both = store_metrics(self.store) | self._step_metrics
        return {f"replay/{k}": float(v) for k, v in both.items()}

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: contents, counters, generator, last step,
        and the config it ran with (checked on load)."""
        return {
            "format_version": FORMAT_VERSION,
            "config": self.config.to_dict(),
            "last_step": self.last_step,
            "rng": self.rng.bit_generator.state,
            "store": self.store.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state`; ValueError (and nothing changed) if it is malformed or was written
        by an incompatible configuration: another mode, or other rules for what the store holds
        (`holding_rules`). Settings that only shape later draws (ratio, alpha, warm-up, ...) may
        differ."""
        version = state.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(f"format version {version!r} is not supported (this code reads {FORMAT_VERSION})")
        saved_mode = dict(state.get("config") or {}).get("mode")
        if saved_mode != self.config.mode:
            raise ValueError(f"written with replay.mode={saved_mode!r}, this run has replay.mode="
                             f"{self.config.mode!r}: its contents and counters do not carry over")
        try:
            saved = holding_rules(ReplayConfig.from_dict(dict(state["config"])))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"its replay config cannot be read: {e}") from e
        ours = holding_rules(self.config)
        if saved != ours:
            written = ", ".join(f"{k} {v}" for k, v in saved.items() if ours[k] != v)
            wanted = ", ".join(f"{k} {v}" for k, v in ours.items() if saved[k] != v)
            raise ValueError(f"written with {written}, this run has {wanted}: the buffer holds rollouts by "
                             "other rules than this run's; resume with the settings it was written with")
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = state["rng"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"random generator state is missing or not {type(rng.bit_generator).__name__}: {e!r}") \
                from e
        store = self._new_store(self.config)
        store.load_state_dict(state["store"])
        last_step = state.get("last_step")
        self.store, self.rng = store, rng
        self.last_step = None if last_step is None else int(last_step)
        self._step_metrics = {}

    def save(self, path: str | os.PathLike) -> None:
        """Write the state to `path` atomically (the previous file stays intact until replaced)."""
        save_state(path, self.state_dict())

    @classmethod
    def load(cls, path: str | os.PathLike, config: ReplayConfig) -> ReplayBuffer:
        """A buffer for `config` restored from `path`. A missing file gives an empty buffer when
        `config.allow_empty_resume`, else ReplayCheckpointError, as do corrupt or incompatible files."""
        buf = cls(config)
        if not os.path.exists(path):
            if not config.allow_empty_resume:
                raise ReplayCheckpointError(f"{os.fspath(path)}: no such replay checkpoint (pass "
                                            "--replay.allow_empty_resume to resume with an empty buffer)")
            warnings.warn(f"{os.fspath(path)}: no replay checkpoint, starting with an empty buffer "
                          "(replay.allow_empty_resume)", stacklevel=2)
            return buf
        state = load_state(path)
        try:
            buf.load_state_dict(state)
        except (ValueError, KeyError, TypeError) as e:
            raise ReplayCheckpointError(f"{os.fspath(path)}: {e}") from e
        return buf
