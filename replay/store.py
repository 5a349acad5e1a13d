"""`RolloutStore`: which rollouts are held (insertion, age and capacity eviction) and their bytes.

Token data lives in a FIFO of chunks, one per insertion, each a columnar copy of the rollouts kept
from that insertion plus a live start index. Per-rollout data (metadata and where each rollout's
tokens sit) lives in one table of the live rollouts, appended to and dropped from in place of
being rebuilt. Insertion order is version order, so both age and capacity eviction remove the
oldest rollouts: drop whole chunks from the left, or advance the first chunk's start.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from replay.chunk import Chunk
from replay.keep import SKIP_COUNTERS, KeepRule
from replay.record import REFUSAL_REASONS, ROLLOUT_FIELDS, TOKEN_COLUMNS, RolloutBatch, gather_segments, refusals
from replay.rows import VIEW_DTYPES, RowTable

COUNTER_KEYS = ("inserted", *SKIP_COUNTERS, "evicted_age", "evicted_capacity") + tuple(
    f"refused/{r}" for r in REFUSAL_REASONS
)


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
    `RolloutStore.gather`. Arrays are (N,) and read-only. The last three fields are the state of
    prioritised replay (PER): each rollout's stored priority, which rollouts came in with the
    most recent insertion, and the largest priority ever set."""

    advantages: np.ndarray  # float32
    rewards: np.ndarray  # float32
    versions: np.ndarray  # int64, non-decreasing
    prompt_uids: np.ndarray  # int64
    group_ids: np.ndarray  # int64
    reuse_counts: np.ndarray  # int32
    serials: np.ndarray  # int64, insertion serial number: unique for the store's lifetime
    response_lengths: np.ndarray  # int64
    priorities: np.ndarray  # float64 > 0, as inserted or last updated
    newest: np.ndarray  # bool, stored by the most recent `insert` (none when it kept nothing)
    max_priority: float = 1.0  # running maximum of the updated priorities, at least 1.0

    def __len__(self) -> int:
        return len(self.versions)

    def ages(self, step: int) -> np.ndarray:  # (N,) int64
        return step - self.versions


class RolloutStore:
    """Holds rollouts up to `capacity`, evicting those older than `max_age_steps` (None: never)."""

    def __init__(self, capacity: int, max_age_steps: int | None, *, keep: KeepRule,
                 token_columns: tuple[str, ...] = (), **settings: Any) -> None:
        """`keep`: which valid rollouts an insertion stores (`replay/keep.py`), with `settings` the
        values of the config fields it reads (e.g. `min_abs_advantage=1e-6`). `token_columns`: the
        optional per-token columns (`record.TOKEN_COLUMNS`) every stored rollout carries; an
        insertion with other ones is an error."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        if max_age_steps is not None and (isinstance(max_age_steps, bool) or not isinstance(max_age_steps, int)
                                          or max_age_steps < 0):
            raise ValueError(f"max_age_steps must be None (no limit) or an integer >= 0, got {max_age_steps!r}")
        if not isinstance(keep, KeepRule):
            raise ValueError(f"keep must be a KeepRule (replay/keep.py), got {keep!r}")
        self.capacity, self.max_age_steps, self.keep = capacity, max_age_steps, keep
        self.keep_settings = keep.check_settings(settings)
        self.token_columns = tuple(c for c in TOKEN_COLUMNS if c in token_columns)
        if set(token_columns) - set(self.token_columns):
            raise ValueError(f"token_columns must be among {TOKEN_COLUMNS}, got {token_columns!r}")
        self.counters: dict[str, int] = dict.fromkeys(COUNTER_KEYS, 0)
        self._chunks: collections.deque[Chunk] = collections.deque()
        self._chunks_dropped = 0  # the number of self._chunks[0] in the table's "chunk" column
        self._rows = RowTable()
        self._next_serial = 0
        self._newest_serial = 0  # rollouts with a serial from here on came in with the last insertion
        self.max_priority = 1.0  # PER's running maximum priority (new entries start at 1.0)
        self._last_version: int | None = None
        self._cache: tuple[StoreView, dict[str, np.ndarray], list[Chunk]] | None = None

    def __len__(self) -> int:
        return len(self._rows)

    # ---------------------------------------------------------------- mutation

    def insert(self, batch: RolloutBatch, version: int | None = None,
               priorities: np.ndarray | None = None) -> InsertResult:
        """Store the valid rollouts of `batch` that pass the keep rule, with policy version
        `version` (default: the batch's own versions) and stored priority `priorities` ((n,)
        aligned with `batch`, finite and > 0 where stored; default 1.0). Versions must not go below
        stored ones. The stored rollouts become the view's `newest`; those of earlier insertions stop
        being so."""
        priorities = np.ones(len(batch)) if priorities is None else np.asarray(priorities, np.float64).reshape(-1)
        if priorities.shape != (len(batch),):
            raise ValueError(f"insert: {len(priorities)} priorities for {len(batch)} rollouts")
        self._check_columns(batch, "insert")
        ok, refused = refusals(batch)
        kept = ok & self.keep(batch, ok, self.keep_settings)
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
        self._newest_serial = self._next_serial
        self._cache = None
        if len(rows):
            self._append(batch, rows, versions, np.arange(self._next_serial, self._next_serial + len(rows)),
                         self._checked_priorities(priorities[rows], len(rows)))
            self._next_serial += len(rows)
            self._last_version = int(versions[-1])
        self.counters["inserted"] += len(rows)
        self.counters[self.keep.skipped_counter] += skipped
        for reason, count in refused.items():
            self.counters[f"refused/{reason}"] += count
        n_cap = self._enforce_capacity()
        return InsertResult(
            inserted=len(rows),
            **{counter: skipped if counter == self.keep.skipped_counter else 0 for counter in SKIP_COUNTERS},
            refused=refused,
            evicted_capacity=n_cap,
        )

    def evict(self, step: int) -> tuple[int, int]:
        """Remove rollouts with `step - version > max_age_steps`, then any beyond capacity.
        Returns (n_evicted_by_age, n_evicted_by_capacity)."""
        n_age = 0
        if self.max_age_steps is not None:
            # Versions >= cutoff survive; they do not decrease, so the too old are a prefix.
            n_age = int(np.searchsorted(self._rows.live()["versions"], step - self.max_age_steps, side="left"))
            self._drop_oldest(n_age)
            self.counters["evicted_age"] += n_age
        return n_age, self._enforce_capacity()

    def increment_reuse(self, indices: np.ndarray | Sequence[int]) -> None:
        """Count one more replay of each live rollout in `indices` (repeats count repeatedly)."""
        idx = self._check_indices(indices)
        if not len(idx):
            return
        added = np.bincount(idx, minlength=len(self)).astype(np.int32)  # (N,)
        self._rows.assign("reuse_counts", self._rows.live()["reuse_counts"] + added)  # views already out keep theirs
        self._cache = None

    def update_priorities(self, indices: np.ndarray | Sequence[int], priorities: np.ndarray) -> None:
        """Set the stored priority of live rollouts `indices` (into `view()`) to `priorities` (> 0;
        of a repeated index, the last) and raise `max_priority` to their largest, as prioritised
        replay does after a draw."""
        idx = self._check_indices(indices)
        values = self._checked_priorities(priorities, len(idx))
        if not len(idx):
            return
        column = self._rows.live()["priorities"].copy()
        column[idx] = values
        self._rows.assign("priorities", column)  # views already out keep theirs
        self.max_priority = max(self.max_priority, float(values.max()))
        self._cache = None

    def _check_columns(self, batch: RolloutBatch, what: str) -> None:
        if len(batch) and batch.token_columns != self.token_columns:
            raise ValueError(f"{what}: the rollouts carry per-token columns {list(batch.token_columns) or 'none'}, "
                             f"this store holds {list(self.token_columns) or 'none'}")

    @staticmethod
    def _checked_priorities(priorities: np.ndarray, n: int) -> np.ndarray:
        values = np.asarray(priorities, np.float64).reshape(-1)
        if values.shape != (n,) or not np.all(np.isfinite(values) & (values > 0)):
            raise ValueError(f"priorities must be {n} finite values > 0 (one per rollout), got shape {values.shape}, "
                             f"min {values.min(initial=np.inf)}")
        return values

    def _append(self, batch: RolloutBatch, rows: np.ndarray, versions: np.ndarray, serials: np.ndarray,
                priorities: np.ndarray) -> None:
        """Store rollouts `rows` of `batch` as a new chunk, with these versions, serials and priorities."""
        ch = Chunk(batch, rows)
        self._rows.append({k: getattr(batch, k)[rows] for k in ROLLOUT_FIELDS} | {
            "versions": versions, "serials": serials, "response_lengths": np.diff(ch.response_offsets),
            "priorities": priorities,
            "chunk": np.full(len(rows), self._chunks_dropped + len(self._chunks)),
            "p_start": ch.prompt_offsets[:-1], "p_end": ch.prompt_offsets[1:],
            "r_start": ch.response_offsets[:-1], "r_end": ch.response_offsets[1:]})
        self._chunks.append(ch)
        self._cache = None

    def _enforce_capacity(self) -> int:
        excess = max(0, len(self) - self.capacity)
        self._drop_oldest(excess)
        self.counters["evicted_capacity"] += excess
        return excess

    def _drop_oldest(self, n: int) -> None:
        """Evict the n oldest live rollouts: whole chunks from the left, then the first chunk's start."""
        if not n:
            return
        self._rows.drop_oldest(n)
        while n:
            ch = self._chunks[0]
            if ch.n_live <= n:
                n -= ch.n_live
                self._chunks.popleft()
                self._chunks_dropped += 1
            else:
                ch.start += n
                n = 0
        self._compact_front()
        self._cache = None

    def _compact_front(self) -> None:
        """Copy the first chunk's live rows once more than half of it is dead and its dead rows
        outnumber the newest chunk's. A partly dead first chunk is the steady state when the
        capacity is not a multiple of the insertion size: tolerating one insertion's worth of dead
        rows keeps it from being copied every step, and waiting until half is dead keeps copying
        amortised (each rollout copied at most once more on average). Dead rows therefore stay
        within the first chunk's live rows or the rows of one (fully live) later chunk."""
        if not self._chunks:
            return
        front = self._chunks[0]
        newest = len(self._chunks[-1]) if len(self._chunks) > 1 else 0
        if front.start * 2 <= len(front) or front.start <= newest:
            return
        p0, r0 = front.prompt_offsets[front.start], front.response_offsets[front.start]
        self._chunks[0] = front.compacted()
        live = self._rows.live()
        for name, shift in (("p_start", p0), ("p_end", p0), ("r_start", r0), ("r_end", r0)):
            values = live[name].copy()
            values[:front.n_live] -= shift
            self._rows.assign(name, values)

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
        which = loc["chunk"][idx] - self._chunks_dropped
        p_off, (prompt_ids,) = gather_segments([ch.prompt_ids for ch in chunks], which,
                                               loc["p_start"][idx], loc["p_end"][idx])
        r_start, r_end = loc["r_start"][idx], loc["r_end"][idx]
        columns = self.token_columns
        if all(ch.action_mask is None for ch in chunks):
            r_off, (response_ids, logprobs, *extra) = gather_segments(
                [(ch.response_ids, ch.logprobs, *(ch.extras[c] for c in columns)) for ch in chunks],
                which, r_start, r_end)
            action_mask = np.ones(len(response_ids), np.bool_)
        else:
            # Chunks whose mask was all True read from one shared all-True array instead.
            ones = np.ones(max(len(ch.response_ids) for ch in chunks), np.bool_)
            r_off, (response_ids, logprobs, action_mask, *extra) = gather_segments(
                [(ch.response_ids, ch.logprobs, ones if ch.action_mask is None else ch.action_mask,
                  *(ch.extras[c] for c in columns)) for ch in chunks], which, r_start, r_end)
        return RolloutBatch(prompt_ids=prompt_ids, prompt_offsets=p_off, response_ids=response_ids,
                            response_offsets=r_off, action_mask=action_mask, behaviour_logprobs=logprobs,
                            **{k: getattr(view, k)[idx] for k in ROLLOUT_FIELDS}, **dict(zip(columns, extra)))

    @property
    def nbytes(self) -> int:
        """Bytes held by stored arrays: the chunks (evicted rows of a partly evicted first chunk
        included) and the per-rollout table (its room to grow included)."""
        return sum(ch.nbytes for ch in self._chunks) + self._rows.nbytes

    @property
    def n_tokens(self) -> int:
        """Live prompt plus response tokens."""
        return sum(int(ch.prompt_offsets[-1] - ch.prompt_offsets[ch.start]
                       + ch.response_offsets[-1] - ch.response_offsets[ch.start]) for ch in self._chunks)

    def _check_indices(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        idx = np.asarray(indices, np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"indices must lie in [0, {len(self)}) (live rollouts), "
                             f"got min {idx.min()} max {idx.max()}")
        return idx

    def _cached(self) -> tuple[StoreView, dict[str, np.ndarray], list[Chunk]]:
        if self._cache is None:
            rows = self._rows.live()  # slices: nothing is copied
            for a in rows.values():
                a.setflags(write=False)
            newest = rows["serials"] >= self._newest_serial
            newest.setflags(write=False)
            view = StoreView(**{k: rows[k] for k in VIEW_DTYPES}, newest=newest, max_priority=self.max_priority)
            self._cache = (view, rows, list(self._chunks))
        return self._cache

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Contents (live rollouts as one columnar batch), serials and counters."""
        batch = self.gather(np.arange(len(self)))
        return {
            "rollouts": {f.name: getattr(batch, f.name) for f in dataclasses.fields(RolloutBatch)
                         if getattr(batch, f.name) is not None},
            "serials": self.view().serials.copy(),
            "priorities": self.view().priorities.copy(),
            "max_priority": self.max_priority,
            "newest_serial": self._newest_serial,
            "counters": dict(self.counters),
            "next_serial": self._next_serial,
            "last_version": self._last_version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace contents and counters by `state`; then enforce this store's capacity (the
        age limit applies at the next `evict`). Raises ValueError on an inconsistent state. A state
        without priorities (written before they were kept) loads with every priority 1.0."""
        try:
            batch = RolloutBatch(**state["rollouts"])
            serials = np.asarray(state["serials"])
            counters = {k: int(v) for k, v in state["counters"].items()}
            next_serial, last_version = int(state["next_serial"]), state["last_version"]
            priorities = self._checked_priorities(state.get("priorities", np.ones(len(batch))), len(batch))
            max_priority = float(state.get("max_priority", 1.0))
            newest_serial = int(state.get("newest_serial", next_serial))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"store state is incomplete or malformed: {e!r}") from e
        self._check_columns(batch, "store state")
        if not (math.isfinite(max_priority) and max_priority >= 1.0) or not 0 <= newest_serial <= next_serial:
            raise ValueError(f"store state max_priority {max_priority} must be finite and >= 1, newest_serial "
                             f"{newest_serial} within [0, next_serial {next_serial}]")
        counters.pop("refused/length_mismatch", None)  # a reason no code path produces any more
        if set(counters) != set(COUNTER_KEYS):
            raise ValueError(f"store state counters {sorted(counters)} != expected {sorted(COUNTER_KEYS)}")
        if serials.dtype != np.int64 or serials.shape != (len(batch),) or np.any(np.diff(serials) <= 0) or (
                len(serials) and serials[-1] >= next_serial):
            raise ValueError("store state serials must be increasing int64, one per rollout, below next_serial")
        if np.any(np.diff(batch.versions) < 0) or (
                len(batch) and (last_version is None or batch.versions[-1] > last_version)):
            raise ValueError("store state versions must not decrease and must not exceed last_version")
        self._chunks.clear()
        self._chunks_dropped = 0
        self._rows = RowTable()
        if len(batch):  # copied: the store shares no array with the caller's state
            self._append(batch, np.arange(len(batch)), batch.versions, serials, priorities)
        self.counters = counters
        self._next_serial, self._newest_serial, self.max_priority = next_serial, newest_serial, max_priority
        self._last_version = None if last_version is None else int(last_version)
        self._cache = None
        self._enforce_capacity()
