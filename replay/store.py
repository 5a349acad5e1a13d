"""`RolloutStore`: which rollouts are held (insertion, age and capacity eviction) and their bytes.

Storage is a FIFO of chunks, one per insertion, each a columnar copy of the rollouts kept from
that insertion plus a live start index. Insertion order is version order, so both age and
capacity eviction remove the oldest rollouts: drop whole chunks from the left, or advance the
first chunk's start. Nothing is ever moved once stored.
"""
from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from replay.record import REFUSAL_REASONS, ROLLOUT_FIELDS, RolloutBatch, gather_segments, refusals

# What an insertion keeps (errors and non-finite values are refused before any rule):
# nonzero_advantage: |A| >= min_abs_advantage; nonzero_group: whole groups with at least one
# such rollout (naive replay works on groups); success: reward > success_threshold; all.
KEEP_RULES = ("nonzero_advantage", "nonzero_group", "success", "all")
COUNTER_KEYS = ("inserted", "skipped_zero_adv", "skipped_unsuccessful", "evicted_age", "evicted_capacity") + tuple(
    f"refused/{r}" for r in REFUSAL_REASONS
)
_META = ROLLOUT_FIELDS + ("serials",)  # per-rollout arrays of a chunk


@dataclass(frozen=True)
class InsertResult:
    """What one `insert` did with the rollouts it was given."""

    inserted: int
    skipped_zero_adv: int
    skipped_unsuccessful: int
    refused: dict[str, int]  # reason -> count, every reason present
    evicted_capacity: int  # oldest rollouts pushed out to make room

    @property
    def filtered(self) -> int:
        """Valid rollouts the keep rule did not store."""
        return self.skipped_zero_adv + self.skipped_unsuccessful


@dataclass(frozen=True, eq=False)
class StoreView:
    """Per-rollout metadata of the live rollouts, oldest first; index i here is index i of
    `RolloutStore.gather`. Arrays are (N,) and read-only."""

    advantages: np.ndarray  # float32
    rewards: np.ndarray  # float32
    versions: np.ndarray  # int64, non-decreasing
    prompt_uids: np.ndarray  # int64
    group_ids: np.ndarray  # int64
    reuse_counts: np.ndarray  # int32
    serials: np.ndarray  # int64, insertion serial number: unique for the store's lifetime
    response_lengths: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.versions)

    def ages(self, step: int) -> np.ndarray:  # (N,) int64
        return step - self.versions


class _Chunk:
    """One insertion's rollouts. `action_mask` is None when it was all True (the usual case),
    which saves one byte per token."""

    __slots__ = ("prompt_ids", "prompt_offsets", "response_ids", "response_offsets", "action_mask",
                 "logprobs", "meta", "start")

    def __init__(self, batch: RolloutBatch, serials: np.ndarray) -> None:
        self.prompt_ids, self.prompt_offsets = batch.prompt_ids, batch.prompt_offsets
        self.response_ids, self.response_offsets = batch.response_ids, batch.response_offsets
        self.action_mask = None if batch.action_mask.all() else batch.action_mask
        self.logprobs = batch.behaviour_logprobs
        self.meta = {k: getattr(batch, k) for k in ROLLOUT_FIELDS} | {"serials": serials}
        self.start = 0  # rows before this are evicted

    def __len__(self) -> int:
        return len(self.meta["versions"])

    def compacted(self) -> _Chunk:
        """A copy holding only the live rows (frees the bytes of evicted ones)."""
        s = self.start
        ch = object.__new__(_Chunk)
        p0, r0 = self.prompt_offsets[s], self.response_offsets[s]
        ch.prompt_ids, ch.prompt_offsets = self.prompt_ids[p0:].copy(), self.prompt_offsets[s:] - p0
        ch.response_ids, ch.response_offsets = self.response_ids[r0:].copy(), self.response_offsets[s:] - r0
        ch.action_mask = None if self.action_mask is None else self.action_mask[r0:].copy()
        ch.logprobs = self.logprobs[r0:].copy()
        ch.meta = {k: v[s:].copy() for k, v in self.meta.items()}
        ch.start = 0
        return ch

    @property
    def n_live(self) -> int:
        return len(self) - self.start

    @property
    def nbytes(self) -> int:
        arrays = [self.prompt_ids, self.prompt_offsets, self.response_ids, self.response_offsets, self.logprobs,
                  *self.meta.values()] + ([self.action_mask] if self.action_mask is not None else [])
        return sum(a.nbytes for a in arrays)


class RolloutStore:
    """Holds rollouts up to `capacity`, evicting those older than `max_age` steps (None: never)."""

    def __init__(self, capacity: int, max_age: int | None, *, keep: str = "nonzero_advantage",
                 min_abs_advantage: float = 1e-6, success_threshold: float = 0.5) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        if max_age is not None and (isinstance(max_age, bool) or not isinstance(max_age, int) or max_age < 0):
            raise ValueError(f"max_age must be None (no limit) or an integer >= 0, got {max_age!r}")
        if keep not in KEEP_RULES:
            raise ValueError(f"keep must be one of {', '.join(KEEP_RULES)}; got {keep!r}")
        self.capacity, self.max_age, self.keep = capacity, max_age, keep
        self.min_abs_advantage, self.success_threshold = min_abs_advantage, success_threshold
        self.counters: dict[str, int] = dict.fromkeys(COUNTER_KEYS, 0)
        self._chunks: collections.deque[_Chunk] = collections.deque()
        self._size = 0
        self._next_serial = 0
        self._last_version: int | None = None
        self._cache: tuple[StoreView, dict[str, np.ndarray], list[_Chunk]] | None = None

    def __len__(self) -> int:
        return self._size

    # ---------------------------------------------------------------- mutation

    def insert(self, batch: RolloutBatch, version: int | None = None) -> InsertResult:
        """Store the valid rollouts of `batch` that pass the keep rule, with policy version
        `version` (default: the batch's own versions). Versions must not go below stored ones."""
        ok, refused = refusals(batch)
        kept = ok & self._keep_rule(batch, ok)
        skipped = int(ok.sum() - kept.sum())
        rows = np.flatnonzero(kept)
        if version is not None:
            versions = np.full(len(rows), version, np.int64)
        else:
            versions = batch.versions[rows]
        if len(rows):
            floor = self._last_version if self._last_version is not None else versions[0]
            if versions[0] < floor or np.any(versions[1:] < versions[:-1]):
                raise ValueError(f"insert: versions must not decrease (stored up to {self._last_version}, "
                                 f"got {versions.min()} .. {versions.max()}): eviction relies on version order")
            chunk_batch = batch.select(rows).replace(versions=versions)
            self._chunks.append(_Chunk(chunk_batch, np.arange(self._next_serial, self._next_serial + len(rows))))
            self._next_serial += len(rows)
            self._size += len(rows)
            self._last_version = int(versions[-1])
            self._cache = None
        self.counters["inserted"] += len(rows)
        self.counters["skipped_unsuccessful" if self.keep == "success" else "skipped_zero_adv"] += skipped
        for reason, count in refused.items():
            self.counters[f"refused/{reason}"] += count
        n_cap = self._enforce_capacity()
        return InsertResult(
            inserted=len(rows),
            skipped_zero_adv=0 if self.keep == "success" else skipped,
            skipped_unsuccessful=skipped if self.keep == "success" else 0,
            refused=refused,
            evicted_capacity=n_cap,
        )

    def evict(self, step: int) -> tuple[int, int]:
        """Remove rollouts with `step - version > max_age`, then any beyond capacity.
        Returns (n_evicted_by_age, n_evicted_by_capacity)."""
        n_age = 0
        if self.max_age is not None:
            cutoff = step - self.max_age  # versions >= cutoff survive
            while self._chunks:
                ch = self._chunks[0]
                first_live = int(np.searchsorted(ch.meta["versions"], cutoff, side="left"))
                if first_live >= len(ch):
                    n_age += ch.n_live
                    self._chunks.popleft()
                    continue
                n_age += max(0, first_live - ch.start)
                ch.start = max(ch.start, first_live)
                self._compact_front()
                break
        if n_age:
            self._size -= n_age
            self.counters["evicted_age"] += n_age
            self._cache = None
        return n_age, self._enforce_capacity()

    def increment_reuse(self, indices: np.ndarray | Sequence[int]) -> None:
        """Count one more replay of each live rollout in `indices` (repeats count repeatedly)."""
        idx = self._check_indices(indices)
        if not len(idx):
            return
        added = np.bincount(idx, minlength=len(self)).astype(np.int32)  # (N,)
        view, loc, chunks = self._cached()  # before the chunks change, or a rebuild would count twice
        pos = 0
        for ch in chunks:
            ch.meta["reuse_counts"][ch.start:] += added[pos:pos + ch.n_live]
            pos += ch.n_live
        reuse = view.reuse_counts + added
        reuse.setflags(write=False)
        self._cache = (dataclasses.replace(view, reuse_counts=reuse), loc, chunks)

    def _enforce_capacity(self) -> int:
        excess = self._size - self.capacity
        if excess <= 0:
            return 0
        left = excess
        while left:
            ch = self._chunks[0]
            if ch.n_live <= left:
                left -= ch.n_live
                self._chunks.popleft()
            else:
                ch.start += left
                left = 0
                self._compact_front()
        self._size -= excess
        self.counters["evicted_capacity"] += excess
        self._cache = None
        return excess

    def _compact_front(self) -> None:
        """Copy the first chunk's live rows once more than half of it is evicted: dead bytes stay
        below half a chunk, and each rollout is copied at most once more on average."""
        if self._chunks and self._chunks[0].start * 2 > len(self._chunks[0]):
            self._chunks[0] = self._chunks[0].compacted()
            self._cache = None

    def _keep_rule(self, batch: RolloutBatch, ok: np.ndarray) -> np.ndarray:
        if self.keep == "all":
            return np.ones(len(batch), np.bool_)
        if self.keep == "success":
            return batch.rewards > self.success_threshold
        informative = np.abs(batch.advantages) >= self.min_abs_advantage
        if self.keep == "nonzero_advantage":
            return informative
        # nonzero_group: a group is kept whole when any of its valid rollouts is informative.
        _, group = np.unique(batch.group_ids, return_inverse=True)
        group_informative = np.bincount(group, weights=informative & ok, minlength=group.max(initial=-1) + 1) > 0
        return group_informative[group]

    # ---------------------------------------------------------------- reading

    def view(self) -> StoreView:
        """Metadata of the live rollouts (cached until the next mutation)."""
        return self._cached()[0]

    def gather(self, indices: np.ndarray | Sequence[int]) -> RolloutBatch:
        """Copy out live rollouts `indices` (into `view()`; repeats allowed), in that order."""
        idx = self._check_indices(indices)
        if not len(idx):
            return RolloutBatch.empty()
        view, loc, chunks = self._cached()
        which = loc["chunk"][idx]
        p_off, (prompt_ids,) = gather_segments([ch.prompt_ids for ch in chunks], which,
                                               loc["p_start"][idx], loc["p_end"][idx])
        r_start, r_end = loc["r_start"][idx], loc["r_end"][idx]
        if all(ch.action_mask is None for ch in chunks):
            r_off, (response_ids, logprobs) = gather_segments(
                [(ch.response_ids, ch.logprobs) for ch in chunks], which, r_start, r_end)
            action_mask = np.ones(len(response_ids), np.bool_)
        else:
            # Chunks whose mask was all True read from one shared all-True array instead.
            ones = np.ones(max(len(ch.response_ids) for ch in chunks), np.bool_)
            r_off, (response_ids, logprobs, action_mask) = gather_segments(
                [(ch.response_ids, ch.logprobs, ones if ch.action_mask is None else ch.action_mask)
                 for ch in chunks], which, r_start, r_end)
        return RolloutBatch(prompt_ids=prompt_ids, prompt_offsets=p_off, response_ids=response_ids,
                            response_offsets=r_off, action_mask=action_mask, behaviour_logprobs=logprobs,
                            **{k: getattr(view, k)[idx] for k in ROLLOUT_FIELDS})

    @property
    def nbytes(self) -> int:
        """Bytes held by stored arrays (evicted rows of a partly evicted chunk included)."""
        return sum(ch.nbytes for ch in self._chunks)

    @property
    def n_tokens(self) -> int:
        """Live prompt plus response tokens."""
        return sum(int(ch.prompt_offsets[-1] - ch.prompt_offsets[ch.start]
                       + ch.response_offsets[-1] - ch.response_offsets[ch.start]) for ch in self._chunks)

    def _check_indices(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        idx = np.asarray(indices, np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= self._size):
            raise IndexError(f"indices must lie in [0, {self._size}) (live rollouts), "
                             f"got min {idx.min()} max {idx.max()}")
        return idx

    def _cached(self) -> tuple[StoreView, dict[str, np.ndarray], list[_Chunk]]:
        if self._cache is None:
            chunks = list(self._chunks)
            cat = lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt)  # noqa: E731
            meta = {k: cat([ch.meta[k][ch.start:] for ch in chunks], np.int64) for k in _META}
            meta["response_lengths"] = cat([np.diff(ch.response_offsets)[ch.start:] for ch in chunks], np.int64)
            # Where each live rollout's tokens sit: its chunk and its token ranges there.
            loc = {
                "chunk": np.repeat(np.arange(len(chunks)), [ch.n_live for ch in chunks]),
                "p_start": cat([ch.prompt_offsets[ch.start:-1] for ch in chunks], np.int64),
                "p_end": cat([ch.prompt_offsets[ch.start + 1:] for ch in chunks], np.int64),
                "r_start": cat([ch.response_offsets[ch.start:-1] for ch in chunks], np.int64),
                "r_end": cat([ch.response_offsets[ch.start + 1:] for ch in chunks], np.int64),
            }
            if not chunks:  # keep the declared dtypes when empty
                meta.update(advantages=np.zeros(0, np.float32), rewards=np.zeros(0, np.float32),
                            reuse_counts=np.zeros(0, np.int32))
            for a in meta.values():
                a.setflags(write=False)
            self._cache = (StoreView(**meta), loc, chunks)
        return self._cache

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Contents (live rollouts as one columnar batch), serials and counters."""
        batch = self.gather(np.arange(len(self)))
        return {
            "rollouts": {f.name: getattr(batch, f.name) for f in dataclasses.fields(RolloutBatch)},
            "serials": self.view().serials.copy(),
            "counters": dict(self.counters),
            "next_serial": self._next_serial,
            "last_version": self._last_version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace contents and counters by `state`; then enforce this store's capacity (the
        age limit applies at the next `evict`). Raises ValueError on an inconsistent state."""
        try:
            batch = RolloutBatch(**state["rollouts"])
            serials = np.asarray(state["serials"])
            counters = {k: int(v) for k, v in state["counters"].items()}
            next_serial, last_version = int(state["next_serial"]), state["last_version"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"store state is incomplete or malformed: {e!r}") from e
        if set(counters) != set(COUNTER_KEYS):
            raise ValueError(f"store state counters {sorted(counters)} != expected {sorted(COUNTER_KEYS)}")
        if serials.dtype != np.int64 or serials.shape != (len(batch),) or np.any(np.diff(serials) <= 0) or (
                len(serials) and serials[-1] >= next_serial):
            raise ValueError("store state serials must be increasing int64, one per rollout, below next_serial")
        if np.any(np.diff(batch.versions) < 0) or (
                len(batch) and (last_version is None or batch.versions[-1] > last_version)):
            raise ValueError("store state versions must not decrease and must not exceed last_version")
        self._chunks.clear()
        if len(batch):
            # Reuse counts are mutated in place: never share them with the caller's state.
            self._chunks.append(_Chunk(batch.replace(reuse_counts=batch.reuse_counts.copy()), serials.copy()))
        self._size = len(batch)
        self.counters = counters
        self._next_serial = next_serial
        self._last_version = None if last_version is None else int(last_version)
        self._cache = None
        self._enforce_capacity()
