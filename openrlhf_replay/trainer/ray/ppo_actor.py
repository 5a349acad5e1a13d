"""Training actors that report PPO statistics separately for fresh and replayed rows.

Upstream's `ActorPPOTrainer.training_step` logs one clip fraction per micro-batch, which mixes
fresh and replayed rows; a stale replay that fights the clip would hide inside it. Seams used
(OpenRLHF 0.11.2): `PolicyModelActor.init_model_from_pretrained` builds `self.trainer`
(its class is switched to the subclass below, which only adds behaviour), `training_step`
(wrapped), and `PolicyLoss.forward` (wrapped: the per-row statistics come from its inputs).
"""
from __future__ import annotations

import ray
import torch
from openrlhf.models import PolicyLoss
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor

from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY
from openrlhf_replay.utils import undecorated


def row_ratio_stats(log_probs, old_log_probs, advantages, action_mask, clip_low: float, clip_high: float):
    """Per-row PPO statistics, all (B,): fraction of tokens whose ratio is clipped (as upstream
    counts it: the clipped surrogate is the smaller one), mean ratio, and mean |log ratio|."""
    mask = action_mask.float()
    tokens = mask.sum(-1).clamp(min=1)
    log_ratio = (log_probs - old_log_probs).detach().float().clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - clip_low, 1 + clip_high) * advantages
    clipped = (surr2 < surr1).float()
    return (clipped * mask).sum(-1) / tokens, (ratio * mask).sum(-1) / tokens, (log_ratio.abs() * mask).sum(-1) / tokens


class SplitStatsPolicyLoss(PolicyLoss):
    """Upstream's `PolicyLoss` (same loss, same return), which also writes per-row statistics,
    split by the replay flag, into the info dict of the micro-batch being trained (`row_info`)."""

    row_info: dict | None = None

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, **kwargs):
        out = super().forward(log_probs, old_log_probs, advantages, action_mask=action_mask, **kwargs)
        info = self.row_info
        if info is not None and REPLAYED_KEY in info and action_mask is not None:
            # After the actor's collate, 0-d info values arrive as a list (make_experience_batch).
            replayed = torch.as_tensor([float(x) for x in info[REPLAYED_KEY]], device=log_probs.device)
            stats = row_ratio_stats(log_probs, old_log_probs, advantages, action_mask,
                                    self.clip_eps_low, self.clip_eps_high)
            for name, value in zip(("clip_frac", "ratio_mean", "abs_log_ratio"), stats):
                # Averaged over all rows by upstream, then divided by the row share by the controller.
                info[f"replay/{name}_replay_x"] = (value * replayed).cpu()
                info[f"replay/{name}_fresh_x"] = (value * (1 - replayed)).cpu()
        return out


class ReplayActorPPOTrainer(ActorPPOTrainer):
    """`ActorPPOTrainer` whose loss also reports fresh vs replay statistics."""

    def enable_split_stats(self) -> None:
        self.actor_loss_fn.__class__ = SplitStatsPolicyLoss  # same state, one extra behaviour

    def training_step(self, experience, kl_ctl, step, loss_batch_info=None):
        self.actor_loss_fn.row_info = experience.info
        try:
            return super().training_step(experience, kl_ctl, step, loss_batch_info)
        finally:
            self.actor_loss_fn.row_info = None


class _ReplayPolicyModelActor(undecorated(PolicyModelActor)):
    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
        super().init_model_from_pretrained(strategy, pretrain, max_steps, vllm_engines)
        if getattr(getattr(strategy.args, "replay", None), "mode", "none") != "none":
            # Upstream builds its ActorPPOTrainer inline; building a second one would open a
            # second weight-sync group to vLLM, so the instance is switched to the subclass.
            self.trainer.__class__ = ReplayActorPPOTrainer
            self.trainer.enable_split_stats()


ReplayPolicyModelActor = ray.remote(num_gpus=1)(_ReplayPolicyModelActor)
