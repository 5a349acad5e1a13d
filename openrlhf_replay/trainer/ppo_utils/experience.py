"""Conversions between OpenRLHF's `Experience` micro-batches and the replay core's `RolloutBatch`.

Upstream 0.11.2 layout (see `samples_generator._process_response_into_experience`): each row of
`sequences` (B, T) is prompt + response tokens, right-padded; `attention_mask` (B, T) is 1 on real
tokens; `action_mask`, `action_log_probs` and `advantages` are (B, T - 1): position j scores token
j + 1. A row's prompt is everything up to its first action token, its response the rest (interior
non-action tokens of a multi-turn response keep action_mask 0, so they round-trip too).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from openrlhf.trainer.ppo_utils.experience import Experience

from openrlhf_replay.trainer.ppo_utils.prompt_identity import prompt_uid
from replay import RolloutBatch

REPLAYED_KEY = "replay/is_replayed"  # info key: 1.0 on replayed rows, 0.0 on fresh ones
IS_WEIGHT_KEY = "replay/row_is_weight"  # info key: importance weight folded into a replayed advantage
AGE_KEY = "replay/row_age"  # info key: steps since the row was generated (0 for fresh rows)
INERT_KEY = "replay/is_inert"  # info key: 1.0 on rows without loss that complete a step's last batch
REFILL_KEY = "replay/is_refill"  # info key: 1.0 on rows standing for filtered ones (--replay.refill)
PACE_KEY = "replay/row_pace"  # info key: rollouts generated that a row accounts for in the LR schedule


def stored_token_columns(args) -> tuple[str, ...]:
    """The optional per-token columns every stored rollout carries for this run: with a critic
    (`gae`), the per-token reward its advantage is recomputed from (KL in the reward is inside it)
    and, with KL as a loss, the reference log-probs; otherwise KL's (`kl_token_columns`). In async
    training with upstream's IS correction on, also vLLM's log-probs at generation, so that a
    replayed row is corrected by its own behaviour policy (docs/METHOD.md section 10)."""
    async_is = ("rollout_logprobs",) if args.train.async_enable and args.algo.advantage.is_correction_level != "off" \
        else ()
    if args.algo.advantage.estimator == "gae":
        return ("token_rewards",) + tuple(c for c in kl_token_columns(args) if c == "ref_logprobs") + async_is
    return kl_token_columns(args) + async_is


def kl_token_columns(args) -> tuple[str, ...]:
    """The optional per-token columns a stored rollout needs for the run's KL (docs/METHOD.md
    section 2, "KL"): its per-token advantage when KL is in the reward (upstream's default), the
    reference model's log-probs when KL is a loss (`--algo.kl.use_loss`); none with KL off."""
    if args.algo.kl.init_coef <= 0:
        return ()
    return ("ref_logprobs",) if args.algo.kl.use_loss else ("token_advantages",)


def experiences_to_rollouts(experiences: list[Experience], version: int, n_samples_per_prompt: int, *,
                            token_columns: tuple[str, ...] = (), kl_coef: float = 0.0,
                            token_rewards: list[torch.Tensor] | None = None) -> RolloutBatch:
    """The rollouts of a step's fresh experiences, in row order, after their advantages are computed.

    Behaviour log-probs are `action_log_probs`: the training model's log-probs of the generated
    tokens before this step's update, which upstream's PPO ratio uses as pi_old. The per-rollout
    advantage (the sampler's |A|, the keep rule's A != 0) is the group-normalised reward: the value
    at the row's first action token, the same on all its action tokens with KL off. With KL in the
    reward (`token_columns` holds "token_advantages") the per-token advantages are stored as they
    are, and the KL penalty upstream folded into the first token's value, `kl_coef` x the row's
    summed KL (its `info["kl"]` mean x action tokens), is added back for the per-rollout one. With
    KL as a loss ("ref_logprobs") the reference model's log-probs are stored. With a critic
    ("token_rewards") `token_rewards` holds each experience's (B, T - 1) per-token reward, the one
    upstream's GAE started from, and the advantage is GAE's (whitened) at the first action token.
    """
    rewards = token_rewards if token_rewards is not None else [None] * len(experiences)
    if len(rewards) != len(experiences):
        raise ValueError(f"{len(rewards)} per-token rewards for {len(experiences)} experiences")
    parts = [_rows_of(exp, version, n_samples_per_prompt, token_columns, kl_coef, r)
             for exp, r in zip(experiences, rewards)]
    return RolloutBatch.concat(parts)


def _rows_of(exp: Experience, version: int, n_samples_per_prompt: int, token_columns: tuple[str, ...] = (),
             kl_coef: float = 0.0, token_rewards: torch.Tensor | None = None) -> RolloutBatch:
    """One micro-batch's rows as rollouts, without a loop over rows (but for the prompt hashes)."""
    sequences = exp.sequences.cpu()  # (B, T)
    lengths = exp.attention_mask.sum(-1).cpu()  # (B,) prompt + response
    width = sequences.shape[1]
    cols = torch.arange(width - 1)  # column j scores token j + 1
    real = cols < (lengths - 1)[:, None]  # (B, T - 1)
    action = exp.action_mask.bool().cpu() & real
    has_action = action.any(-1)
    # The response starts at the first action column (no action at all: an empty response).
    start = torch.where(has_action, action.int().argmax(-1), lengths - 1)  # (B,)
    tokens = torch.arange(width)
    prompt_part = tokens <= start[:, None]  # (B, T)
    response_part = (tokens > start[:, None]) & (tokens < lengths[:, None])
    scored = real & (cols >= start[:, None])  # (B, T - 1): the response's columns
    advantages = exp.advantages.float().cpu().gather(1, start.clamp(max=width - 2)[:, None]).squeeze(1)
    prompt_lengths, response_lengths = prompt_part.sum(-1).numpy(), response_part.sum(-1).numpy()
    prompt_ids = sequences[prompt_part].numpy().astype(np.int32)
    prompt_offsets = np.r_[0, np.cumsum(prompt_lengths)].astype(np.int64)
    uids = [prompt_uid(prompt_ids[a:b]) for a, b in zip(prompt_offsets[:-1], prompt_offsets[1:])]
    # Upstream numbers a step's rollouts in prompt-major order (`split_rollout_samples`).
    groups = (version << 32) + np.asarray(exp.index, np.int64) // n_samples_per_prompt
    extra = {}
    if "token_advantages" in token_columns:
        extra["token_advantages"] = exp.advantages.float().cpu()[scored].numpy()
        penalty = kl_coef * exp.info["kl"].float().cpu() * exp.action_mask.float().cpu().sum(-1)  # (B,)
        advantages = advantages + penalty
    if "ref_logprobs" in token_columns:
        extra["ref_logprobs"] = exp.base_action_log_probs.float().cpu()[scored].numpy()
    if "token_rewards" in token_columns:
        if token_rewards is None:
            raise ValueError("the store holds per-token rewards (a critic's run) but none were given")
        extra["token_rewards"] = token_rewards.float().cpu()[scored].numpy()
    if "rollout_logprobs" in token_columns:
        extra["rollout_logprobs"] = exp.rollout_log_probs.float().cpu()[scored].numpy()
    return RolloutBatch(**extra,
        prompt_ids=prompt_ids, prompt_offsets=prompt_offsets,
        response_ids=sequences[response_part].numpy().astype(np.int32),
        response_offsets=np.r_[0, np.cumsum(response_lengths)].astype(np.int64),
        action_mask=exp.action_mask.bool().cpu()[scored].numpy(),
        behaviour_logprobs=exp.action_log_probs.float().cpu()[scored].numpy(),
        rewards=exp.rewards.float().cpu().numpy().reshape(-1),
        advantages=torch.where(has_action, advantages, 0.0).numpy(),
        prompt_uids=np.asarray(uids, np.int64), group_ids=groups,
        versions=np.full(len(uids), version, np.int64), reuse_counts=np.zeros(len(uids), np.int32))


def rollouts_to_experiences(
    rollouts: RolloutBatch,
    template: Experience,
    micro_batch_size: int,
    pad_token_id: int,
    *,
    step: int,
    is_weights: np.ndarray | None = None,
    kl_coef: float = 0.0,
) -> list[Experience]:
    """Replayed rollouts as Experience micro-batches shaped like `template` (a fresh one).

    Upstream batches items by the first item's fields (`make_experience_batch`), and the actor's
    DataLoader shuffles fresh and replayed rows together: a replayed Experience must have exactly
    the fresh ones' non-None fields and info keys. Its loss inputs are `replayed_loss_inputs`;
    fields the store does not keep (truncation, prompt strings) are zeros / empty. With KL in the
    reward, `info["kl"]` is the row's KL at generation, read back from its stored advantages
    (group advantage - first token's = `kl_coef` x summed KL).
    """
    weights = np.ones(len(rollouts), np.float32) if is_weights is None else np.asarray(is_weights, np.float32)
    return [
        _to_experience(rollouts.select(np.arange(lo, min(lo + micro_batch_size, len(rollouts)))),
                       weights[lo : lo + micro_batch_size], template, pad_token_id, step, kl_coef)
        for lo in range(0, len(rollouts), micro_batch_size)
    ]


def replayed_loss_inputs(padded: dict[str, np.ndarray], advantages: np.ndarray,
                         is_weights: np.ndarray) -> dict[str, torch.Tensor]:
    """What a replayed rollout brings to upstream's PPO loss (`PolicyLoss`: token-mean, clip
    0.2 / 0.28, dual-clip), built from its stored record; all (B, T - 1) but `advantage` (B,).

    - `action_log_probs`, the ratio's pi_old: the stored behaviour log-probs (stale anchor, the
      default: the clip then bounds how far a stale rollout moves the policy). With
      `--replay.off_policy refresh` or `recompute` the experience maker later replaces them by the
      current policy's (`ReplayExperienceMaker._refresh_old_log_probs`).
    - `rollout_log_probs`, pi_behaviour: the same stored log-probs. Upstream's IS correction
      (refresh requires token-level clip) weighs each token by clip(pi_old / pi_behaviour); under
      stale they are equal to pi_old and the weight is 1. In async training with the IS correction
      on, the stored vLLM log-probs at generation (`rollout_logprobs`): the row's own behaviour
      policy, so under stale it gets the weight it had when fresh.
    - `advantages` and `returns` (GRPO has no critic): the frozen advantage A, from the rollout's
      own fresh group, times the sampler's importance weight w (freshness's (N P(i))^-beta / max,
      1 elsewhere), on every action token; with KL in the reward, the stored per-token advantage
      (KL penalty included) times w. For w > 0, min(r wA, clip(r) wA) = w min(rA, clip(r) A):
      w scales the rollout's loss and leaves its clip alone.
    - `action_mask`: the stored mask, in upstream's columns (column j scores token j + 1).
    - `base_action_log_probs` (with KL as a loss): the stored reference log-probs.
    """
    action_mask = torch.from_numpy(padded["action_mask"])
    behaviour = torch.from_numpy(padded["behaviour_logprobs"])
    advantage = torch.from_numpy(advantages * is_weights)  # (B,)
    if "token_advantages" in padded:
        per_token = torch.from_numpy(padded["token_advantages"] * is_weights[:, None]) * action_mask.float()
    else:
        per_token = advantage[:, None] * action_mask.float()
    rollout = torch.from_numpy(padded["rollout_logprobs"]) if "rollout_logprobs" in padded else behaviour.clone()
    out = {"action_mask": action_mask, "action_log_probs": behaviour, "rollout_log_probs": rollout,
           "advantages": per_token, "returns": per_token.clone(), "advantage": advantage}
    if "ref_logprobs" in padded:
        out["base_action_log_probs"] = torch.from_numpy(padded["ref_logprobs"])
    return out


def _to_experience(part: RolloutBatch, weights: np.ndarray, template: Experience, pad_token_id: int, step: int,
                   kl_coef: float = 0.0):
    n = len(part)
    padded = part.to_padded(pad_token_id)  # right-padded prompt + response, upstream's layout
    loss = replayed_loss_inputs(padded, part.advantages, weights)
    rewards = torch.from_numpy(part.rewards).to(template.rewards.dtype)

    values = dict(
        sequences=torch.from_numpy(padded["sequences"]),
        attention_mask=torch.from_numpy(padded["attention_mask"]),
        **{k: v for k, v in loss.items() if k != "advantage"},
        rewards=rewards,
        scores=rewards.clone(),
        response_length=torch.from_numpy(part.response_lengths),
        truncated=torch.zeros(n, dtype=torch.bool),
        total_length=torch.from_numpy(padded["lengths"].astype(np.float32)),
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
            info[key] = loss["advantage"].to(like.dtype)
        elif key == REPLAYED_KEY:
            info[key] = torch.ones(n, dtype=like.dtype)
        elif key == IS_WEIGHT_KEY:
            info[key] = torch.from_numpy(weights).to(like.dtype)
        elif key == AGE_KEY:
            info[key] = torch.from_numpy((step - part.versions).astype(np.float32)).to(like.dtype)
        elif key == "kl" and part.token_advantages is not None and kl_coef > 0:
            info[key] = torch.from_numpy(generation_kl(part, padded, kl_coef)).to(like.dtype)
        else:  # per-row statistics of the generation step (kl, clip ratio, ...): not stored
            info[key] = torch.zeros(n, dtype=like.dtype)
    return Experience(**kwargs, info=info)


def generation_kl(part: RolloutBatch, padded: dict[str, np.ndarray], kl_coef: float) -> np.ndarray:
    """(B,) each row's mean KL at generation (upstream's `info["kl"]`), with KL in the reward: the
    penalty its first action token carries, group advantage - stored per-token advantage, over
    `kl_coef` and its action tokens."""
    mask = padded["action_mask"]
    first = np.where(mask.any(-1), mask.argmax(-1), 0)
    penalty = part.advantages - padded["token_advantages"][np.arange(len(part)), first]
    return (penalty / kl_coef / np.maximum(mask.sum(-1), 1)).astype(np.float32)


def per_kind(name: str, value: torch.Tensor, replayed: torch.Tensor, kind: str,
             inert: torch.Tensor | None = None) -> dict:
    """{`<name>@<kind>`: the per-row `value` (B,) on rows of that kind, 0 on the others}.

    Upstream averages a per-row statistic over all rows; `split_by_row_kind` turns that average of
    the masked values back into the mean over one kind of row. Inert rows (flagged replayed and
    inert) belong to neither kind."""
    if kind == "replay":
        flags = replayed.float() - (0.0 if inert is None else inert.float())
    else:
        flags = 1.0 - replayed.float()
    return {f"{name}@{kind}": value.float() * flags}


def split_by_row_kind(status: dict) -> dict:
    """{name: mean over its kind of row} from the `<name>@fresh` / `<name>@replay` averages in a
    step's `status` (which it pops): an average over all rows of values masked to one kind, divided
    by that kind's share of the rows (`REPLAYED_KEY`'s average, less `INERT_KEY`'s for replayed
    rows). A kind with no rows this step gets no value rather than a made-up 0."""
    replayed_share = status.get(REPLAYED_KEY)
    out = {}
    for key in [k for k in status if k.endswith(("@fresh", "@replay"))]:
        value = status.pop(key)
        name, kind = key.rsplit("@", 1)
        if replayed_share is None:
            continue
        share = 1.0 - replayed_share if kind == "fresh" else replayed_share - status.get(INERT_KEY, 0.0)
        if share > 1e-9:
            out[name] = value / share
    return out


def select_rows(exp: Experience, lo: int, hi: int) -> Experience:
    """Rows lo:hi of a batched Experience: each per-row field (tensor, list, info entry) sliced,
    the rest (None, 0-d values) shared."""
    n = len(exp.sequences)

    def cut(value):
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        per_row = isinstance(value, list) or (isinstance(value, torch.Tensor) and value.dim() > 0)
        return value[lo:hi] if per_row and len(value) == n else value

    return Experience(**{f.name: cut(getattr(exp, f.name)) for f in dataclasses.fields(Experience)})


def set_row_flags(experiences: list[Experience], key: str, flags: np.ndarray) -> None:
    """info[key] := `flags` (row order over `experiences`), as 0.0 / 1.0 in the key's dtype."""
    row = 0
    for exp in experiences:
        n = len(exp.sequences)
        exp.info[key] = torch.from_numpy(np.asarray(flags[row:row + n], np.float32)).to(exp.info[key].dtype)
        row += n


def mark_fresh(experiences: list[Experience]) -> None:
    """Add the replay info keys to fresh experiences (replayed 0, weight 1, age 0)."""
    for exp in experiences:
        n = len(exp.sequences)
        exp.info[REPLAYED_KEY] = torch.zeros(n)
        exp.info[IS_WEIGHT_KEY] = torch.ones(n)
        exp.info[AGE_KEY] = torch.zeros(n)
        exp.info[INERT_KEY] = torch.zeros(n)
        exp.info[REFILL_KEY] = torch.zeros(n)
        exp.info[PACE_KEY] = torch.ones(n)


def set_pace(experiences: list[Experience], skipped_rows: int = 0) -> None:
    """info[PACE_KEY] of a step's rows: 1 on a fresh row and on a refill row (it stands for a
    filtered fresh one, inert or not), 0 on other replayed and inert rows; plus, spread evenly over
    every row, `skipped_rows`: the rollouts of refill calls whose groups were all dropped, which
    upstream's loop gave no step of their own (`ppo_trainer.py:skipped_rollouts`)."""
    total = sum(len(e.sequences) for e in experiences)
    for exp in experiences:
        own = 1.0 - exp.info[REPLAYED_KEY] + exp.info[REFILL_KEY]
        exp.info[PACE_KEY] = own + skipped_rows / total


def paced_rows(experience: Experience) -> float:
    """The rollouts generated that a micro-batch accounts for in the LR schedule, the one rule of
    the policy actor and the critic (`lr_schedule.py`): the sum of its rows' `PACE_KEY` (after
    upstream's `balance_experiences`, a list of 0-d tensors). Without the key (replay off) every
    row is a fresh one."""
    pace = experience.info.get(PACE_KEY)
    if pace is None:
        return float(len(experience.sequences))
    return float(torch.as_tensor(pace, dtype=torch.float64).sum())


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
