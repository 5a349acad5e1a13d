"""`ReplayBuffer`: the one object the integration calls, once per training step.

    buf = ReplayBuffer(ReplayConfig.from_namespace(args))
    comp = buf.step(fresh, step)        # train on comp.batch
    logger.log(buf.metrics())           # flat dict, `replay/` keys
    buf.save(path) / ReplayBuffer.load(path, config)
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from replay.checkpoint import ReplayCheckpointError, load_state, save_state
from replay.composer import Composition
from replay.config import ReplayConfig
from replay.holding import holding_rules, rules_mismatch, written_rules
from replay.keep import EVERYTHING
from replay.metrics import composition_histograms, composition_metrics, store_metrics
from replay.pool import POOL_VERSION, SuccessPool
from replay.record import RolloutBatch
from replay.registry import ModeHooks
from replay.samplers import sampler_from_config
from replay.store import RolloutStore

# 2: the state records its holding rules and the store its per-rollout priorities. Format 1 is
# still read, with the rules its code had (each mode's checkpoint rules, `format_1`).
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)


class ReplayBuffer:
    """Store + sampler + composer for one run, with its own random generator."""

    def __init__(self, config: ReplayConfig, token_columns: tuple[str, ...] = ()) -> None:
        """`token_columns`: the optional per-token columns (`record.TOKEN_COLUMNS`) the run's KL
        needs every stored rollout to carry (none with KL off)."""
        entry = config.entry
        if entry is not None:
            entry.check_buffer(config)
        self.config = config
        self.token_columns = tuple(token_columns)
        self.store = self._new_store(config, self.token_columns)
        self.pool: SuccessPool | None = None
        if config.success_pool:
            self.pool = self._load_pool(config)
        self.sampler = sampler_from_config(config) if entry is not None else None
        self.hooks: ModeHooks = entry.hooks() if entry is not None else ModeHooks()
        self.rng = np.random.default_rng(config.seed)
        self.last_step: int | None = None
        self._step_metrics: dict[str, float] = {}
        self._step_histograms: dict[str, np.ndarray] = {}

    def _load_pool(self, config: ReplayConfig) -> SuccessPool:
        """An offline pool (RLEP's, `replay/pool.py`), loaded by the mode's entry into the store as
        rollouts of version -1."""
        pool = config.entry.load_pool(config.success_pool)
        if len(pool.rollouts) > config.capacity:
            raise ValueError(f"the success pool {config.success_pool} holds {len(pool.rollouts)} successes, more "
                             f"than replay.capacity {config.capacity}: pass --replay.capacity {len(pool.rollouts)}")
        self.store.insert(pool.rollouts, version=POOL_VERSION)
        return pool

    @staticmethod
    def _new_store(config: ReplayConfig, token_columns: tuple[str, ...]) -> RolloutStore:
        """The mode's store, kept by its keep rule (replay off: a store that is never written)."""
        keep = EVERYTHING if config.entry is None else config.entry.keep
        return RolloutStore(config.capacity, config.max_age_steps, keep=keep, token_columns=token_columns,
                            **keep.settings_of(config))

    def __len__(self) -> int:
        return len(self.store)

    def step(self, fresh: RolloutBatch, step: int, *, multiple_of: int = 1, divide_by_std: bool = True,
             refill: int = 0, recorded_versions: bool = False) -> Composition:
        """One training step: evict by age at `step`; draw the replay part from what is already
        stored (so never this step's own rollouts); count the reuse; store `fresh` with
        version `step` (its faulty rollouts are refused and counted). Steps must increase. `multiple_of`: the number
        replayed is a multiple of it (see `nominal_replay_count`). `divide_by_std`: success mode
        recomputes enlarged groups' advantages as group_norm (True) or dr_grpo (False). `refill`: rows
        of the step's batch that dynamic filtering dropped, to be taken by replayed rollouts
        (`compose`'s `extra`; fresh-anchored modes only).

        With mode none nothing is stored or drawn: the composition is `fresh` alone.
        `recorded_versions` (async training): `fresh` is stored with its own versions, the policy
        version that generated each row (at most `step`), so ages count from generation.
        """
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step {step} does not follow the last step {self.last_step}: steps must increase")
        entry = self.config.entry
        if entry is not None:
            self.store.evict(step)
            comp = entry.composer(fresh, self.store, self.sampler, self.config, step, self.rng, multiple_of,
                                  divide_by_std=divide_by_std, extra=refill)
            self.store.increment_reuse(comp.indices)
            self.hooks.after_draw(self.store, comp, self.config)  # e.g. PER's update of the drawn
            priorities = self.hooks.insert_priorities(fresh, self.config)
            if self.pool is None:  # an offline pool is fixed, as RLEP's: the run's own successes stay out
                if recorded_versions:
                    self._insert_recorded(fresh, step, priorities)
                else:
                    self.store.insert(fresh, version=step, priorities=priorities)
        else:
            comp = Composition(fresh, RolloutBatch.empty(), np.zeros(0, np.float32), np.zeros(0, np.int64))
        self.last_step = step
        self._step_metrics = composition_metrics(comp, step)
        self._step_histograms = composition_histograms(comp, step)
        return comp

    def _insert_recorded(self, fresh: RolloutBatch, step: int, priorities: np.ndarray | None) -> None:
        """Store `fresh` with its recorded versions, oldest first (the store keeps version order;
        a batch whose rows came from two generation calls may hold them in any order)."""
        if len(fresh) and fresh.versions.max() > step:
            raise ValueError(f"step {step}: fresh rollouts of policy version {fresh.versions.max()} come from a "
                             "later policy than the one being trained")
        order = np.argsort(fresh.versions, kind="stable")
        self.store.insert(fresh.select(order), priorities=None if priorities is None else priorities[order])

    def metrics(self) -> dict[str, float]:
        """Flat `replay/...` metrics: buffer size and cumulative counters, plus the statistics of
        the last `step` (replayed fraction, ages, reuse, ess, importance weights where used)."""
        both = store_metrics(self.store) | self._step_metrics
        return {f"replay/{k}": float(v) for k, v in both.items()}

    def histograms(self) -> dict[str, np.ndarray]:
        """Flat `replay/...` value arrays of the last `step`, one value per replayed rollout (its
        age in steps, its uses this one included): what TensorBoard draws as histograms. Empty
        arrays on a step that replayed nothing; no keys before the first step."""
        return {f"replay/{k}": v for k, v in self._step_histograms.items()}

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: contents, counters, generator, last step,
        and the config it ran with (checked on load). The mode's hook state joins as "mode_state"
        only when it has any, so the files of modes without such state keep their format."""
        state = {
            "format_version": FORMAT_VERSION,
            "config": self.config.to_dict(),
            "holding_rules": holding_rules(self.config, self.token_columns),
            "last_step": self.last_step,
            "rng": self.rng.bit_generator.state,
            "store": self.store.state_dict(),
            "success_pool": None if self.pool is None else {"digest": self.pool.digest,
                                                            "rollouts": len(self.pool.rollouts)},
        }
        hook_state = self.hooks.state_dict()
        if hook_state:
            state["mode_state"] = hook_state
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state`; ValueError (and nothing changed) if it is malformed or was written
        by an incompatible configuration: another mode, or other rules for what the store holds
        (`holding_rules`). Settings that only shape later draws (ratio, alpha, warm-up, ...) may
        differ."""
        version = state.get("format_version")
        if version not in READABLE_FORMATS:
            raise ValueError(f"format version {version!r} is not supported (this code reads "
                             f"{', '.join(map(str, READABLE_FORMATS))})")
        saved_mode = dict(state.get("config") or {}).get("mode")
        if saved_mode != self.config.mode:
            raise ValueError(f"written with replay.mode={saved_mode!r}, this run has replay.mode="
                             f"{self.config.mode!r}: its contents and counters do not carry over")
        try:
            saved = written_rules(state)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"its replay config or holding rules cannot be read: {e}") from e
        problem = rules_mismatch(saved, holding_rules(self.config, self.token_columns), self.config.mode)
        if problem:
            raise ValueError(problem)
        self._check_pool_rule(state)
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = state["rng"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"random generator state is missing or not {type(rng.bit_generator).__name__}: {e!r}") \
                from e
        store = self._new_store(self.config, self.token_columns)
        store.load_state_dict(state["store"])
        hooks = type(self.hooks)()
        hooks.load_state_dict(state.get("mode_state") or {})
        last_step = state.get("last_step")
        self.store, self.rng, self.hooks = store, rng, hooks
        self.last_step = None if last_step is None else int(last_step)
        self._step_metrics, self._step_histograms = {}, {}

    def _check_pool_rule(self, state: Mapping[str, Any]) -> None:
        """ValueError when `state` was written with another RLEP pool than this run's: an offline
        pool of other contents, or the in-run pool where this run has an offline one, or back."""
        saved = (state.get("success_pool") or {}).get("digest")
        ours = None if self.pool is None else self.pool.digest
        if saved == ours:
            return
        def name(digest, path=None):
            return "the in-run pool (replay.success_pool unset)" if digest is None else \
                f"the offline pool {path + ' ' if path else ''}of digest {digest}"
        raise ValueError(f"written with {name(saved)}, this run has {name(ours, self.config.success_pool)}: the "
                         "buffer holds other successes than this run would replay; resume with the pool file it "
                         "was written with (or with replay.success_pool unset for the in-run pool), or start a "
                         "new run")

    def save(self, path: str | os.PathLike) -> None:
        """Write the state to `path` atomically (the previous file stays intact until replaced)."""
        save_state(path, self.state_dict())

    @classmethod
    def load(cls, path: str | os.PathLike, config: ReplayConfig, token_columns: tuple[str, ...] = ()) -> ReplayBuffer:
        """A buffer for `config` restored from `path`. A missing, corrupt or incompatible file is a
        ReplayCheckpointError; whether to start empty instead (`--replay.allow_empty_resume`) is the
        resuming caller's decision (`ppo_trainer.py:restore_replay_state`)."""
        buf = cls(config, token_columns)
        if not os.path.exists(path):
            raise ReplayCheckpointError(f"{os.fspath(path)}: no such replay checkpoint")
        state = load_state(path)
        try:
            buf.load_state_dict(state)
        except (ValueError, KeyError, TypeError) as e:
            raise ReplayCheckpointError(f"{os.fspath(path)}: {e}") from e
        return buf
