"""`Chunk`: the token data of one insertion into the store, kept columnar (flat token arrays with
offsets, as `RolloutBatch` keeps them), with a live start index that age and capacity eviction
advance (`replay/store.py` holds a FIFO of these, oldest first)."""
from __future__ import annotations

import numpy as np

from replay.record import RolloutBatch, gather_segments


class Chunk:
    """One insertion's token data. `action_mask` is None when it was all True (the usual case),
    which saves one byte per token. `extras`: the batch's optional per-token columns, by name."""

    __slots__ = ("prompt_ids", "prompt_offsets", "response_ids", "response_offsets", "action_mask",
                 "logprobs", "extras", "start")

    def __init__(self, batch: RolloutBatch, rows: np.ndarray) -> None:
        """A copy of rollouts `rows` (increasing) of `batch`: one contiguous copy per array when
        the rows are consecutive. An all-True mask is not copied at all."""
        zeros = np.zeros(len(rows), np.int64)
        self.prompt_offsets, (self.prompt_ids,) = gather_segments(
            [batch.prompt_ids], zeros, batch.prompt_offsets[rows], batch.prompt_offsets[rows + 1])
        mask = () if batch.action_mask.all() else (batch.action_mask,)
        columns = batch.token_columns
        self.response_offsets, (self.response_ids, self.logprobs, *rest) = gather_segments(
            [(batch.response_ids, batch.behaviour_logprobs, *(getattr(batch, c) for c in columns), *mask)], zeros,
            batch.response_offsets[rows], batch.response_offsets[rows + 1])
        self.extras = dict(zip(columns, rest))
        mask = rest[len(columns):]
        self.action_mask = mask[0] if mask and not mask[0].all() else None
        self.start = 0  # rows before this are evicted

    def __len__(self) -> int:
        return len(self.prompt_offsets) - 1

    def compacted(self) -> Chunk:
        """A copy holding only the live rows (frees the bytes of evicted ones)."""
        s = self.start
        ch = object.__new__(Chunk)
        p0, r0 = self.prompt_offsets[s], self.response_offsets[s]
        ch.prompt_ids, ch.prompt_offsets = self.prompt_ids[p0:].copy(), self.prompt_offsets[s:] - p0
        ch.response_ids, ch.response_offsets = self.response_ids[r0:].copy(), self.response_offsets[s:] - r0
        ch.action_mask = None if self.action_mask is None else self.action_mask[r0:].copy()
        ch.logprobs = self.logprobs[r0:].copy()
        ch.extras = {k: v[r0:].copy() for k, v in self.extras.items()}
        ch.start = 0
        return ch

    @property
    def n_live(self) -> int:
        return len(self) - self.start

    @property
    def nbytes(self) -> int:
        arrays = [self.prompt_ids, self.prompt_offsets, self.response_ids, self.response_offsets, self.logprobs,
                  *self.extras.values()]
        return sum(a.nbytes for a in arrays) + (0 if self.action_mask is None else self.action_mask.nbytes)
