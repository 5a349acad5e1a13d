"""Synthetic rollout batches for tests and benchmarks (GRPO-shaped: groups of G samples of one
prompt, binary rewards, group-normalised advantages)."""
from __future__ import annotations

import numpy as np

from replay.composer import group_normalise
from replay.record import RolloutBatch


def random_batch(
    rng: np.random.Generator,
    n_groups: int,
    group_size: int,
    version: int = 0,
    *,
    prompt_len: tuple[int, int] = (1, 8),
    response_len: tuple[int, int] = (1, 16),
    p_correct: float = 0.5,
    n_prompts: int = 1_000_000,
    group_id_base: int = 0,
    partial_mask: bool = False,
) -> RolloutBatch:
    """n_groups * group_size rollouts at `version`. Group j has group id `group_id_base + j` and
    a prompt uid drawn from `n_prompts` (small pools make prompts recur across steps). Lengths are
    uniform in the closed ranges given. `partial_mask` leaves some response tokens unmasked."""
    n = n_groups * group_size
    uids = rng.integers(0, n_prompts, n_groups)
    # Each group's rollouts share its prompt (and groups drawing the same uid, the same prompt).
    prompts: dict[int, np.ndarray] = {}
    for u in uids.tolist():
        prompts.setdefault(u, rng.integers(0, 50_000, int(rng.integers(prompt_len[0], prompt_len[1] + 1))))
    per_rollout = [prompts[u] for u in np.repeat(uids, group_size).tolist()]
    p_lens = np.array([len(p) for p in per_rollout], np.int64)
    prompt_ids = np.concatenate(per_rollout) if per_rollout else np.zeros(0, np.int64)
    r_lens = rng.integers(response_len[0], response_len[1] + 1, n)
    r_total = int(r_lens.sum())
    rewards = (rng.random(n) < p_correct).astype(np.float32)
    group = np.repeat(np.arange(n_groups), group_size)
    mask = rng.random(r_total) < 0.8 if partial_mask else np.ones(r_total, np.bool_)
    return RolloutBatch(
        prompt_ids=prompt_ids.astype(np.int32),
        prompt_offsets=np.r_[0, np.cumsum(p_lens)].astype(np.int64),
        response_ids=rng.integers(0, 50_000, r_total).astype(np.int32),
        response_offsets=np.r_[0, np.cumsum(r_lens)].astype(np.int64),
        action_mask=mask,
        behaviour_logprobs=-rng.exponential(size=r_total).astype(np.float32),
        rewards=rewards,
        advantages=group_normalise(rewards, group) if n else np.zeros(0, np.float32),
        prompt_uids=np.repeat(uids, group_size).astype(np.int64),
        group_ids=(group + group_id_base).astype(np.int64),
        versions=np.full(n, version, np.int64),
        reuse_counts=np.zeros(n, np.int32),
    )
