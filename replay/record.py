"""The one stored record type: a columnar batch of rollouts, and the checks that guard the store.

A `RolloutBatch` holds n rollouts as flat arrays, not as n Python objects: the token data of all
rollouts is concatenated without padding and addressed by offsets, so storing, gathering and
checkpointing are a handful of contiguous copies whatever n is. It is the data contract between
the integration (which converts OpenRLHF `Experience`s into it) and the replay core.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Why a rollout is refused, in the order checked: a rollout with several faults is counted once,
# under the first.
REFUSAL_REASONS = (
    "empty_response",
    "non_finite_reward",
    "non_finite_advantage",
    "non_finite_logprob",
)

# name -> (dtype, what its length must match). "prompt"/"response" are flat token arrays,
# "offsets" are (n + 1,) prefix sums, "rollout" arrays hold one value per rollout. A table: its
# rows share one shape by design.
_LAYOUT: dict[str, tuple[type, str]] = {
    "prompt_ids": (np.int32, "prompt"),
    "prompt_offsets": (np.int64, "offsets"),
    "response_ids": (np.int32, "response"),
    "response_offsets": (np.int64, "offsets"),
    "action_mask": (np.bool_, "response"),
    "behaviour_logprobs": (np.float32, "response"),
    "rewards": (np.float32, "rollout"),
    "advantages": (np.float32, "rollout"),
    "prompt_uids": (np.int64, "rollout"),
    "group_ids": (np.int64, "rollout"),
    "versions": (np.int64, "rollout"),
    "reuse_counts": (np.int32, "rollout"),
}
ROLLOUT_FIELDS = tuple(k for k, (_, kind) in _LAYOUT.items() if kind == "rollout")
# Optional float32 columns, one value per response token, held only when the run needs them
# (docs/METHOD.md section 2, "KL" and "A critic"): `token_advantages`, the per-token advantage of KL
# in the reward; `ref_logprobs`, the reference model's log-probs for KL as a loss; `token_rewards`,
# the per-token reward GAE starts from (the outcome on the last action token, any KL penalty on
# every token), from which a replayed row's advantage is recomputed against the current critic;
# `rollout_logprobs`, vLLM's log-probs at generation, in async training with upstream's IS
# correction (section 10). Absent (None) they cost no byte.
TOKEN_COLUMNS = ("token_advantages", "ref_logprobs", "token_rewards", "rollout_logprobs")


@dataclass(frozen=True, eq=False)
class RolloutBatch:
    """n rollouts, columnar. Token arrays are flat; rollout i's response is
    `response_ids[response_offsets[i]:response_offsets[i + 1]]` (same for the prompt).

    Arrays are not copied on creation: treat them as read-only once handed over.
    """

    # -- token data (flat, no padding) --
    prompt_ids: np.ndarray  # (sum Lp,) int32, all prompts concatenated
    prompt_offsets: np.ndarray  # (n + 1,) int64, prompt_offsets[0] == 0
    response_ids: np.ndarray  # (sum Lr,) int32, all responses concatenated
    response_offsets: np.ndarray  # (n + 1,) int64
    action_mask: np.ndarray  # (sum Lr,) bool, True on tokens the loss trains on
    behaviour_logprobs: np.ndarray  # (sum Lr,) float32, log pi_behaviour of each response token
    # -- one value per rollout --
    rewards: np.ndarray  # (n,) float32
    advantages: np.ndarray  # (n,) float32, frozen: computed in the rollout's own fresh group
    prompt_uids: np.ndarray  # (n,) int64, identity of the prompt across steps
    group_ids: np.ndarray  # (n,) int64, one id per fresh group
    versions: np.ndarray  # (n,) int64, policy version (training step) that generated it
    reuse_counts: np.ndarray  # (n,) int32, times replayed so far
    # -- optional, per response token (`TOKEN_COLUMNS`) --
    token_advantages: np.ndarray | None = None  # (sum Lr,) float32, advantage with the KL penalty
    ref_logprobs: np.ndarray | None = None  # (sum Lr,) float32, log pi_ref of each response token
    token_rewards: np.ndarray | None = None  # (sum Lr,) float32, per-token reward (GAE's input)
    rollout_logprobs: np.ndarray | None = None  # (sum Lr,) float32, vLLM's log-prob at generation (async)

    def __post_init__(self) -> None:
        for name, (dtype, _) in _LAYOUT.items():
            a = getattr(self, name)
            if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype != dtype:
                got = f"{a.dtype} array of shape {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
                raise ValueError(f"RolloutBatch.{name}: expected a 1-D {np.dtype(dtype)} array, got {got}")
        n = len(self.rewards)
        for name in ROLLOUT_FIELDS:
            if len(getattr(self, name)) != n:
                raise ValueError(f"RolloutBatch.{name}: length {len(getattr(self, name))} != n_rollouts {n}")
        for flat, offsets in (("prompt_ids", "prompt_offsets"), ("response_ids", "response_offsets")):
            _check_offsets(offsets, getattr(self, offsets), n, len(getattr(self, flat)))
        for name in self.token_columns:
            a = getattr(self, name)
            if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype != np.float32:
                raise ValueError(f"RolloutBatch.{name}: expected None or a 1-D float32 array, got {type(a).__name__}"
                                 f"{f' {a.dtype} of shape {a.shape}' if isinstance(a, np.ndarray) else ''}")
        for name in ("action_mask", "behaviour_logprobs", *self.token_columns):
            if len(getattr(self, name)) != len(self.response_ids):
                raise ValueError(
                    f"RolloutBatch.{name}: length {len(getattr(self, name))} != "
                    f"len(response_ids) {len(self.response_ids)}"
                )

    # ---------------------------------------------------------------- construction

    @classmethod
    def empty(cls) -> RolloutBatch:
        """A batch of zero rollouts."""
        return cls(**{k: np.zeros(1 if kind == "offsets" else 0, dt) for k, (dt, kind) in _LAYOUT.items()})

    @classmethod
    def from_lists(
        cls,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        action_masks: Sequence[Sequence[bool]],
        logprobs: Sequence[Sequence[float]],
        rewards: Sequence[float],
        advantages: Sequence[float],
        prompt_uids: Sequence[int],
        group_ids: Sequence[int],
        version: int | Sequence[int],
    ) -> RolloutBatch:
        """Build a batch from per-rollout sequences (lists, arrays or CPU tensors).

        Strict: a rollout whose response, mask and log-probs differ in length raises ValueError.
        """
        n = _common_length(prompts=prompts, responses=responses, action_masks=action_masks, logprobs=logprobs,
                           rewards=rewards, advantages=advantages, prompt_uids=prompt_uids, group_ids=group_ids)
        for i in range(n):
            lens = (len(responses[i]), len(action_masks[i]), len(logprobs[i]))
            if len(set(lens)) != 1:
                raise ValueError(f"rollout {i}: response, action_mask and logprobs lengths differ: {lens}")
        versions = np.broadcast_to(np.asarray(version, np.int64), (n,)).copy()
        return cls(
            prompt_ids=_token_ids("prompts", prompts),
            prompt_offsets=_offsets(prompts),
            response_ids=_token_ids("responses", responses),
            response_offsets=_offsets(responses),
            action_mask=_flat(action_masks, np.bool_),
            behaviour_logprobs=_flat(logprobs, np.float32),
            rewards=np.asarray(rewards, np.float32).reshape(n),
            advantages=np.asarray(advantages, np.float32).reshape(n),
            prompt_uids=np.asarray(prompt_uids, np.int64).reshape(n),
            group_ids=np.asarray(group_ids, np.int64).reshape(n),
            versions=versions,
            reuse_counts=np.zeros(n, np.int32),
        )

    @classmethod
    def concat(cls, batches: Sequence[RolloutBatch]) -> RolloutBatch:
        """All rollouts of `batches`, in order, as one batch (one copy per field)."""
        batches = [b for b in batches if len(b)]
        if not batches:
            return cls.empty()
        if len(batches) == 1:
            return batches[0]
        columns = {b.token_columns for b in batches}
        if len(columns) > 1:
            raise ValueError(f"concat: batches hold different optional columns {sorted(columns)}")
        fields = {name: np.concatenate([getattr(b, name) for b in batches]) for name in batches[0].token_columns}
        for name, (_, kind) in _LAYOUT.items():
            if kind == "offsets":
                ends = np.cumsum([getattr(b, name)[-1] for b in batches])[:-1]
                parts = [getattr(batches[0], name)] + [getattr(b, name)[1:] + e for b, e in zip(batches[1:], ends)]
            else:
                parts = [getattr(b, name) for b in batches]
            fields[name] = np.concatenate(parts)
        return cls(**fields)

    def replace(self, **changes: np.ndarray) -> RolloutBatch:
        """A copy with some fields swapped (checked again)."""
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------- access

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def response_lengths(self) -> np.ndarray:  # (n,) int64
        return np.diff(self.response_offsets)

    @property
    def prompt_lengths(self) -> np.ndarray:  # (n,) int64
        return np.diff(self.prompt_offsets)

    @property
    def n_tokens(self) -> int:
        """Prompt plus response tokens held."""
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def token_columns(self) -> tuple[str, ...]:
        """The optional per-token columns this batch holds (`TOKEN_COLUMNS` order)."""
        return tuple(k for k in TOKEN_COLUMNS if getattr(self, k) is not None)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, k).nbytes for k in (*_LAYOUT, *self.token_columns))

    def response(self, i: int) -> np.ndarray:
        """Response token ids of rollout i (a view)."""
        return self.response_ids[self.response_offsets[i]:self.response_offsets[i + 1]]

    def prompt(self, i: int) -> np.ndarray:
        """Prompt token ids of rollout i (a view)."""
        return self.prompt_ids[self.prompt_offsets[i]:self.prompt_offsets[i + 1]]

    def select(self, indices: np.ndarray | Sequence[int]) -> RolloutBatch:
        """Rollouts `indices` (repeats allowed), in that order, as a new batch (copied)."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"select: indices must lie in [0, {len(self)}), got min {idx.min()} max {idx.max()}")
        zeros = np.zeros(len(idx), np.int64)
        p_off, (prompt_ids,) = gather_segments([self.prompt_ids], zeros, self.prompt_offsets[idx],
                                               self.prompt_offsets[idx + 1])
        columns = self.token_columns
        r_off, (response_ids, action_mask, logprobs, *extra) = gather_segments(
            [(self.response_ids, self.action_mask, self.behaviour_logprobs, *(getattr(self, c) for c in columns))],
            zeros, self.response_offsets[idx], self.response_offsets[idx + 1])
        return RolloutBatch(prompt_ids=prompt_ids, prompt_offsets=p_off, response_ids=response_ids,
                            response_offsets=r_off, action_mask=action_mask, behaviour_logprobs=logprobs,
                            **{k: getattr(self, k)[idx] for k in ROLLOUT_FIELDS}, **dict(zip(columns, extra)))

    def to_padded(self, pad_id: int) -> dict[str, np.ndarray]:
        """The rollouts as OpenRLHF's `Experience` lays out a micro-batch (numpy; the integration
        wraps them as tensors): each row is prompt + response, right-padded to the longest.

        sequences (B, T) int64, pad_id on padding; attention_mask (B, T) int64, 1 on real tokens;
        action_mask (B, T - 1) bool and behaviour_logprobs (B, T - 1) float32, where column j
        scores token j + 1: a response's tokens sit at columns [len(prompt) - 1, len - 1)
        (False / 0.0 elsewhere); each optional column held, (B, T - 1) float32 in the same columns;
        lengths (B,) int64, prompt + response.
        """
        n, lp, lr = len(self), self.prompt_lengths, self.response_lengths
        lengths = lp + lr
        width = int(lengths.max(initial=1))
        sequences = np.full((n, width), pad_id, np.int64)
        attention = np.zeros((n, width), np.int64)
        action = np.zeros((n, width - 1), np.bool_)
        logprobs = np.zeros((n, width - 1), np.float32)
        # Row and column of every flat token, computed once instead of a loop over rollouts.
        rows_p, cols_p = _rows_and_positions(self.prompt_offsets)
        sequences[rows_p, cols_p] = self.prompt_ids
        rows_r, cols_r = _rows_and_positions(self.response_offsets)
        cols_r = cols_r + lp[rows_r]
        sequences[rows_r, cols_r] = self.response_ids
        attention[np.arange(width) < lengths[:, None]] = 1
        action[rows_r, cols_r - 1] = self.action_mask
        logprobs[rows_r, cols_r - 1] = self.behaviour_logprobs
        out = {"sequences": sequences, "attention_mask": attention, "action_mask": action,
               "behaviour_logprobs": logprobs, "lengths": lengths}
        for name in self.token_columns:
            out[name] = np.zeros((n, width - 1), np.float32)
            out[name][rows_r, cols_r - 1] = getattr(self, name)
        return out


# -------------------------------------------------------------------- validation


def refusals(batch: RolloutBatch) -> tuple[np.ndarray, dict[str, int]]:
    """Which rollouts may be stored: `(ok (n,) bool, {reason: count})`.

    Log-probs (and the optional per-token columns: a per-token advantage counts as an advantage,
    reference log-probs as log-probs, a per-token reward as a reward) are only checked where the action mask is set:
    padding-like positions may hold -inf without harming the loss.
    """
    bad = {
        "empty_response": batch.response_lengths == 0,
        "non_finite_reward": ~np.isfinite(batch.rewards),
        "non_finite_advantage": ~np.isfinite(batch.advantages),
        "non_finite_logprob": np.zeros(len(batch), np.bool_),
    }
    per_token = [("non_finite_logprob", batch.behaviour_logprobs), ("non_finite_logprob", batch.ref_logprobs),
                 ("non_finite_logprob", batch.rollout_logprobs), ("non_finite_advantage", batch.token_advantages),
                 ("non_finite_reward", batch.token_rewards)]
    for reason, values in per_token:
        if values is not None:
            bad[reason] |= _non_finite_rows(batch, values)
    refused = np.zeros(len(batch), np.bool_)
    counts = dict.fromkeys(REFUSAL_REASONS, 0)
    for reason in REFUSAL_REASONS:
        new = bad[reason] & ~refused
        counts[reason] = int(new.sum())
        refused |= new
    return ~refused, counts


def _non_finite_rows(batch: RolloutBatch, values: np.ndarray) -> np.ndarray:
    """(n,) bool: rollouts with a non-finite value of per-token `values` under the action mask."""
    rows_bad = np.zeros(len(batch), np.bool_)
    # A finite sum means every value is finite (inf and NaN propagate through a sum); it is one
    # read of the values, no token-sized temporaries. A sum that overflows takes the exact path.
    with np.errstate(over="ignore", invalid="ignore"):
        total = values.sum()
    if not np.isfinite(total):
        bad_tok = ~np.isfinite(values) & batch.action_mask
        rows_bad[np.searchsorted(batch.response_offsets, np.flatnonzero(bad_tok), side="right") - 1] = True
    return rows_bad


# -------------------------------------------------------------------- helpers


def gather_segments(
    sources: Sequence[tuple[np.ndarray, ...] | np.ndarray],
    which: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Concatenate segments `[starts[i], ends[i])` of flat arrays, one copy per output array.

    `sources[c]` is an array or a tuple of parallel arrays; segment i comes from source
    `which[i]`. Returns the (k + 1,) offsets of the segments in the output and one output array
    per parallel array. Adjacent segments of one source are merged first, so gathering a
    contiguous range costs one slice, not one per rollout.
    """
    sources = [s if isinstance(s, tuple) else (s,) for s in sources]
    lengths = ends - starts
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if len(starts) > 1:
        # A run breaks where the source changes or the next segment does not start at this end.
        brk = np.flatnonzero((which[1:] != which[:-1]) | (starts[1:] != ends[:-1])) + 1
        first = np.concatenate(([0], brk))
        last = np.concatenate((brk - 1, [len(starts) - 1]))
        which, starts, ends = which[first], starts[first], ends[last]
    runs = list(zip(which.tolist(), starts.tolist(), ends.tolist()))
    outs = []
    for j in range(len(sources[0])):
        cols = [s[j] for s in sources]
        pieces = [cols[c][a:b] for c, a, b in runs]
        outs.append(np.concatenate(pieces) if pieces else cols[0][:0].copy())
    return offsets, outs


def _rows_and_positions(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every flat token: its rollout row and its position inside that rollout."""
    lengths = np.diff(offsets)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    return rows, np.arange(offsets[-1]) - offsets[rows]


def _check_offsets(name: str, off: np.ndarray, n: int, total: int) -> None:
    if len(off) != n + 1:
        raise ValueError(f"RolloutBatch.{name}: length {len(off)} != n_rollouts + 1 = {n + 1}")
    if off[0] != 0 or off[-1] != total or (n and np.any(off[1:] < off[:-1])):
        raise ValueError(f"RolloutBatch.{name}: must rise from 0 to {total} without decreasing, "
                         f"got {off[0]} .. {off[-1]}")


def _common_length(**seqs: Sequence) -> int:
    lens = {k: len(v) for k, v in seqs.items()}
    if len(set(lens.values())) > 1:
        raise ValueError(f"per-rollout inputs differ in length: {lens}")
    return next(iter(lens.values()))


def _offsets(seqs: Sequence[Sequence]) -> np.ndarray:
    off = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum([len(s) for s in seqs], out=off[1:])
    return off


def _flat(seqs: Sequence[Sequence], dtype: type) -> np.ndarray:
    parts = [np.asarray(s).reshape(-1) for s in seqs]
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _token_ids(name: str, seqs: Sequence[Sequence[int]]) -> np.ndarray:
    ids = _flat(seqs, np.int64)
    # Reject rather than let the int32 cast silently wrap.
    if len(ids) and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
        raise ValueError(f"{name}: token ids must lie in [0, 2**31), got {ids.min()} .. {ids.max()}")
    return ids.astype(np.int32)
