"""Conversions between OpenRLHF's `Experience` micro-batches and the replay core's `RolloutBatch`.

Upstream 0.11.2 layout (see `samples_generator._process_response_into_experience`): each row of
`sequences` (B, T) is prompt + response tokens, right-padded; `attention_mask` (B, T) is 1 on real
tokens; `action_mask`, `action_log_probs` and `advantages` are (B, T - 1): position j scores token
j + 1. A row's prompt is everything up to its first action token, its response the rest (interior
non-action tokens of a multi-turn response keep action_mask 0, so they round-trip too).
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import torch
from openrlhf.trainer.ppo_utils.experience import Experience

from replay import RolloutBatch

REPLAYED_KEY = "replay/is_replayed"  # info key: 1.0 on replayed rows, 0.0 on fresh ones
IS_WEIGHT_KEY = "replay/row_is_weight"  # info key: importance weight folded into a replayed advantage
AGE_KEY = "replay/row_age"  # info key: steps since the row was generated (0 for fresh rows)


def prompt_uid(prompt_ids: np.ndarray) -> int:
    """A stable 63-bit identity for a prompt's token ids (the same prompt in a later epoch maps here)."""
    digest = hashlib.blake2b(np.ascontiguousarray(prompt_ids, np.int32).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def experiences_to_rollouts(experiences: list[Experience], version: int, n_samples_per_prompt: int) -> RolloutBatch:
    """The rollouts of a step's fresh experiences, in row order, after their advantages are computed.

    Behaviour log-probs are `action_log_probs`: the training model's log-probs of the generated
    tokens before this step's update, which upstream's PPO ratio uses as pi_old. The frozen
    advantage is the value at the row's first action token (the same on all its action tokens for
    the group estimators with KL off, the only setting replay accepts).
    """
    prompts, responses, masks, logprobs, rewards, advantages, uids, groups = ([] for _ in range(8))
    for exp in experiences:
        lengths = exp.attention_mask.sum(-1).tolist()
        action_mask = exp.action_mask.bool().cpu()
        log_probs = exp.action_log_probs.float().cpu()
        advs = exp.advantages.float().cpu()
        sequences = exp.sequences.cpu()
        for row, length in enumerate(lengths):
            mask = action_mask[row, : length - 1]
            action_positions = torch.nonzero(mask).flatten()
            start = int(action_positions[0]) if len(action_positions) else length - 1  # no action: empty response
            prompt = sequences[row, : start + 1].numpy()
            prompts.append(prompt)
            responses.append(sequences[row, start + 1 : length].numpy())
            masks.append(mask[start:].numpy())
            logprobs.append(log_probs[row, start : length - 1].numpy())
            advantages.append(float(advs[row, start]) if len(action_positions) else 0.0)
            rewards.append(float(exp.rewards[row]))
            uids.append(prompt_uid(prompt))
            # Upstream numbers a step's rollouts in prompt-major order (`split_rollout_samples`).
            groups.append((version << 32) + exp.index[row] // n_samples_per_prompt)
    return RolloutBatch.from_lists(prompts, responses, masks, logprobs, rewards, advantages, uids, groups, version)


def rollouts_to_experiences(
    rollouts: RolloutBatch,
    template: Experience,
    micro_batch_size: int,
    pad_token_id: int,
    *,
    step: int,
    is_weights: np.ndarray | None = None,
) -> list[Experience]:
    """Replayed rollouts as Experience micro-batches shaped like `template` (a fresh one).

    Upstream batches items by the first item's fields (`make_experience_batch`), and the actor's
    DataLoader shuffles fresh and replayed rows together: a replayed Experience must have exactly
    the fresh ones' non-None fields and info keys. Fields the store does not keep (per-row KL,
    truncation, prompt strings) are zeros / empty. The stored advantage is used as it is, times the
    importance weight where the sampler gives one (for w > 0, min(r*wA, clip(r)*wA) = w*min(rA, clip(r)A)).
    """
    weights = np.ones(len(rollouts), np.float32) if is_weights is None else np.asarray(is_weights, np.float32)
    return [
        _to_experience(rollouts.select(np.arange(lo, min(lo + micro_batch_size, len(rollouts)))),
                       weights[lo : lo + micro_batch_size], template, pad_token_id, step)
        for lo in range(0, len(rollouts), micro_batch_size)
    ]


def _to_experience(part: RolloutBatch, weights: np.ndarray, template: Experience, pad_token_id: int, step: int):
    n = len(part)
    p_len, r_len = part.prompt_lengths, part.response_lengths
    total = p_len + r_len
    width = int(total.max())
    sequences = torch.full((n, width), pad_token_id, dtype=template.sequences.dtype)
    attention_mask = torch.zeros((n, width), dtype=template.attention_mask.dtype)
    action_mask = torch.zeros((n, width - 1), dtype=template.action_mask.dtype)
    behaviour = torch.zeros((n, width - 1), dtype=template.action_log_probs.dtype)
    for i in range(n):
        p, t = int(p_len[i]), int(total[i])
        sequences[i, :p] = torch.from_numpy(part.prompt(i).astype(np.int64))
        sequences[i, p:t] = torch.from_numpy(part.response(i).astype(np.int64))
        attention_mask[i, :t] = 1
        lo, hi = part.response_offsets[i], part.response_offsets[i + 1]
        action_mask[i, p - 1 : t - 1] = torch.from_numpy(part.action_mask[lo:hi])
        behaviour[i, p - 1 : t - 1] = torch.from_numpy(part.behaviour_logprobs[lo:hi])
    advantage = torch.from_numpy(part.advantages * weights)  # (n,)
    per_token_adv = advantage[:, None] * action_mask.float()  # (n, width - 1)
    rewards = torch.from_numpy(part.rewards).to(template.rewards.dtype)

    values = dict(
        sequences=sequences,
        attention_mask=attention_mask,
        action_mask=action_mask,
        action_log_probs=behaviour,
        # With IS correction on, upstream weighs by pi_old / pi_rollout: the behaviour policy is
        # the rollout policy of a replayed row.
        rollout_log_probs=behaviour.clone(),
        advantages=per_token_adv.to(template.advantages.dtype),
        returns=per_token_adv.clone(),
        rewards=rewards,
        scores=rewards.clone(),
        response_length=torch.from_numpy(r_len),
        truncated=torch.zeros(n, dtype=torch.bool),
        total_length=torch.from_numpy(total.astype(np.float32)),
        index=None,
        prompts=[""] * n,
        labels=[""] * n,
        images=[None] * n,
        mm_train_inputs=[None] * n,
    )
    kwargs = {}
    for f in dataclasses.fields(Experience):
        like = getattr(template, f.name)
        if f.name == "info":
            continue
        if like is None:
            kwargs[f.name] = None
        elif f.name in values:
            v = values[f.name]
            kwargs[f.name] = v.to(like.dtype) if isinstance(v, torch.Tensor) and isinstance(like, torch.Tensor) else v
        elif isinstance(like, torch.Tensor):  # e.g. values from a critic: nothing stored, zeros
            kwargs[f.name] = torch.zeros((n, *like.shape[1:]), dtype=like.dtype)
        else:
            kwargs[f.name] = [None] * n
    info = {}
    for key, like in template.info.items():
        if key == "reward":
            info[key] = rewards.to(like.dtype)
        elif key == "return":
            info[key] = advantage.to(like.dtype)
        elif key == REPLAYED_KEY:
            info[key] = torch.ones(n, dtype=like.dtype)
        elif key == IS_WEIGHT_KEY:
            info[key] = torch.from_numpy(weights).to(like.dtype)
        elif key == AGE_KEY:
            info[key] = torch.from_numpy((step - part.versions).astype(np.float32)).to(like.dtype)
        else:  # per-row statistics of the generation step (kl, clip ratio, ...): not stored
            info[key] = torch.zeros(n, dtype=like.dtype)
    return Experience(**kwargs, info=info)


def mark_fresh(experiences: list[Experience]) -> None:
    """Add the replay info keys to fresh experiences (replayed 0, weight 1, age 0)."""
    for exp in experiences:
        n = len(exp.sequences)
        exp.info[REPLAYED_KEY] = torch.zeros(n)
        exp.info[IS_WEIGHT_KEY] = torch.ones(n)
        exp.info[AGE_KEY] = torch.zeros(n)


def set_advantages(experiences: list[Experience], advantages: np.ndarray) -> None:
    """Overwrite the per-row advantages of `experiences` (row order), e.g. after RLEP regrouping."""
    row = 0
    for exp in experiences:
        n = len(exp.sequences)
        adv = torch.from_numpy(np.asarray(advantages[row : row + n], np.float32))
        exp.advantages = (adv[:, None] * exp.action_mask.float()).to(exp.advantages.dtype)
        exp.returns = exp.advantages.clone()
        exp.info["return"] = adv.to(exp.info["return"].dtype) if "return" in exp.info else adv
        row += n
