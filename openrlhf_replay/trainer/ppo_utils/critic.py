"""PPO with a critic (`--algo.advantage.estimator gae`) and replay: a replayed row's advantage is
recomputed against the critic of the step that replays it.

A stored GAE advantage was computed with the critic of its own time; replaying it as it was would
train the policy on a baseline the critic no longer holds. So a stored rollout keeps its per-token
reward (`token_rewards`: the outcome on its last action token, any KL penalty of generation on
every token), and when it is replayed the experience maker (`ReplayExperienceMaker`)

1. asks the critic group for the current values of its tokens (the forward upstream's experience
   maker runs for fresh rows, `make_experience`),
2. runs upstream's own GAE (`RemoteExperienceMaker.get_advantages_and_returns`, with upstream's
   `--algo.advantage.gamma` / `lambd`) on the stored rewards and those values, and
3. whitens the advantages with the statistics upstream whitened the step's fresh rows with, so a
   replayed and a fresh row with the same raw advantage train on the same value.

`returns` (GAE's advantage + value, unwhitened) and `values` (the current ones) are what upstream's
critic loss reads: the critic trains on replayed rows as it does on fresh ones.

The per-token rewards of the fresh rows are taken where upstream's GAE receives them
(`GaeCapture`, filled by the experience maker's `get_advantages_and_returns`), so the store holds
exactly what upstream computed, length penalties, reward clipping and KL included.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from replay import RolloutBatch


@dataclass
class GaeCall:
    """One call of upstream's GAE on a fresh micro-batch: its inputs and its raw advantages."""

    rewards: torch.Tensor  # (B, T - 1) per-token reward
    advantages: torch.Tensor  # (B, T - 1) before upstream's whitening
    action_mask: torch.Tensor  # (B, T - 1)


@dataclass(frozen=True)
class Whitening:
    """Upstream's advantage whitening for `gae`: A' = (A - mean) x rstd (rstd 1 with
    `--algo.advantage.no_std_norm`), its statistics over a batch's action tokens."""

    mean: float
    rstd: float

    @classmethod
    def of(cls, calls: list[GaeCall], no_std_norm: bool) -> "Whitening":
        """The statistics upstream's `compute_advantages_and_returns` whitens these fresh
        micro-batches with (mean and variance over all their action tokens, variance floored at
        1e-8); `tests/openrlhf_replay/test_critic_replay.py` checks they reproduce its output."""
        adv = torch.cat([c.advantages.flatten().float() for c in calls])
        mask = torch.cat([c.action_mask.flatten().float() for c in calls])
        tokens = mask.sum()
        mean = (adv * mask).sum() / tokens
        if no_std_norm:
            return cls(float(mean), 1.0)
        var = ((adv - mean).pow(2) * mask).sum() / tokens
        return cls(float(mean), float(var.clamp(min=1e-8).rsqrt()))

    def apply(self, advantages: torch.Tensor) -> torch.Tensor:
        return (advantages - self.mean) * self.rstd


def padded_token_rewards(rows: RolloutBatch, micro_batch_size: int, pad_token_id: int) -> list[torch.Tensor]:
    """The stored per-token rewards of `rows`, (B, T - 1) per micro-batch, cut and padded exactly as
    `experience.rollouts_to_experiences` cuts and pads the rows themselves."""
    out = []
    for lo in range(0, len(rows), micro_batch_size):
        part = rows.select(np.arange(lo, min(lo + micro_batch_size, len(rows))))
        out.append(torch.from_numpy(part.to_padded(pad_token_id)["token_rewards"]))
    return out


def recompute_gae(experiences, values, token_rewards, gae, whitening: Whitening, is_weight_key: str) -> None:
    """Set each replayed Experience's `values`, `returns` and `advantages` from the current critic's
    `values` and its stored `token_rewards` (both (B, T - 1) per Experience), in place.

    `gae(values, rewards, action_mask)` is upstream's GAE with the run's gamma and lambda. The
    advantage is whitened as the step's fresh rows were, then multiplied by the row's importance
    weight (FreshPER's; 1 elsewhere), as a frozen advantage is (`experience.replayed_loss_inputs`).
    `info["return"]` is the summed reward, as upstream logs it."""
    for exp, value, reward in zip(experiences, values, token_rewards, strict=True):
        mask = exp.action_mask
        value = value.to(exp.action_log_probs.device)
        reward = reward.to(value.dtype)
        advantages, returns = gae(value, reward, mask)
        weight = torch.as_tensor(exp.info[is_weight_key], dtype=torch.float32)[:, None]
        exp.values = value
        exp.returns = returns
        exp.advantages = (whitening.apply(advantages.float()) * weight).to(advantages.dtype)
        if "return" in exp.info:
            exp.info["return"] = (reward * mask).sum(-1).to(exp.info["return"].dtype)
