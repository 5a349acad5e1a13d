"""The store's per-rollout table: one row per live rollout, oldest first (`replay/store.py`).

Its columns are what `StoreView` shows of a rollout, then where the rollout's tokens sit in the
store's chunks. The store appends an insertion's rows at the back and drops evicted ones from the
front; this module keeps that amortised O(1) per row without copying the live rows each step.
"""
from __future__ import annotations

import numpy as np

from replay.record import ROLLOUT_FIELDS, RolloutBatch

# The per-rollout table's columns: what `StoreView` shows, then where each rollout's tokens sit
# (the number of its chunk, counted since the store was created or loaded, and its token ranges).
# "priorities" is prioritised replay's per-rollout state (FreshPER's stored priority; 1.0 where
# no sampler keeps one), set on insertion and by `update_priorities` after a draw.
VIEW_DTYPES = {k: getattr(RolloutBatch.empty(), k).dtype for k in ROLLOUT_FIELDS} | {
    "serials": np.int64, "response_lengths": np.int64, "priorities": np.float64}
ROW_DTYPES = VIEW_DTYPES | dict.fromkeys(("chunk", "p_start", "p_end", "r_start", "r_end"), np.int64)


class RowTable:
    """Per-rollout columns of the live rollouts, oldest first, appended at the back and dropped from
    the front without copying the rest: each column is a slice of a backing array with room to
    grow, and the live rows move to new backing arrays, twice their size, only when that room is
    used up (amortised O(1) per row). Nothing is written where a slice already handed out can see
    (appends go past it, `assign` writes a new backing array), so handed-out slices are snapshots."""

    def __init__(self) -> None:
        self._backing = {k: np.zeros(0, dt) for k, dt in ROW_DTYPES.items()}
        self._head = self._tail = 0

    def __len__(self) -> int:
        return self._tail - self._head

    def live(self) -> dict[str, np.ndarray]:
        return {k: b[self._head:self._tail] for k, b in self._backing.items()}

    def append(self, columns: dict[str, np.ndarray]) -> None:
        n = len(columns["serials"])
        if self._tail + n > len(self._backing["serials"]):
            live, size = self.live(), 2 * (len(self) + n)
            self._backing = {k: np.empty(size, b.dtype) for k, b in self._backing.items()}
            for k, b in self._backing.items():
                b[:len(live[k])] = live[k]
            self._head, self._tail = 0, len(self)
        for k, b in self._backing.items():
            b[self._tail:self._tail + n] = columns[k]
        self._tail += n

    def drop_oldest(self, n: int) -> None:
        self._head += n

    def assign(self, name: str, values: np.ndarray) -> None:
        """Set column `name` of the live rows to `values`, in a new backing array."""
        backing = self._backing[name].copy()
        backing[self._head:self._tail] = values
        self._backing[name] = backing

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._backing.values())
