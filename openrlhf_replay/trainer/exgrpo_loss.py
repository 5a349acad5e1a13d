"""ExGRPO's objective on replayed rows: policy shaping instead of PPO's clipped ratio.

The reference trains a replayed trajectory's tokens on -A f(w) with f(w) = w / (w + beta),
beta = 0.1, and no clip (ElliottYan/LUFFY, ExGRPO `exp_scripts/run_exgrpo.sh`:
`off_policy_reshape="p_div_p_0.1"`, `loss_remove_clip=True`, `exp_is_correct=True`). w is the
ratio to the stored behaviour policy, exp(log pi_theta - log pi_old), as here and in the paper:
`exp_is_correct=True` puts the recorded log-probs in `old_log_probs`
(`experience/experience_trainer_ops.py:replace_recorded_old_log_probs`), and ExGRPO's
`mix_core_alg.py:compute_token_on_off_policy_loss` shapes that ratio (issue #48; that file is not in
our search index). LUFFY's own `mix_core_alg.py` takes w = pi_theta(o_t) instead, the behaviour
probability set to 1 (docs/METHOD.md section 3, ExGRPO, difference 5). f' = beta / (w + beta)^2
shrinks the gradient of tokens the policy already favours and keeps that of low-probability ones,
with a bounded loss in place of a clip.

Upstream's `PolicyLoss` cannot express it: its per-token loss is -min(w A, clip(w) A) for every
row alike, with no per-row flag, and matching -A f(w) through its inputs would need an
advantage that depends on the current log-prob, which the loss computes after its inputs are
fixed. So this is a loss-side seam: `shaped_tokens` is the per-token objective, and
`ShapedReplayPolicyLoss` adds it to upstream's loss of the fresh rows under upstream's own
aggregation. With no replayed row it is upstream's loss, value for value.
"""
from __future__ import annotations

import torch
from openrlhf.models.loss import PolicyLoss, aggregate_loss

SHAPING_BETA = 0.1  # ref: `p_div_p_0.1`
LOG_RATIO_BOUND = 20.0  # upstream clamps the PPO log-ratio to the same bound


def shaping(w: torch.Tensor, beta: float = SHAPING_BETA) -> torch.Tensor:
    """f(w) = w / (w + beta)."""
    return w / (w + beta)


def shaped_tokens(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                  action_mask: torch.Tensor, replayed: torch.Tensor, beta: float = SHAPING_BETA) -> torch.Tensor:
    """(B, T) per-token loss: -A f(w) with w = exp(log_probs - old_log_probs) on the action tokens
    of replayed rows (`replayed`: (B,) bool), 0 elsewhere. `old_log_probs` is the stored behaviour
    log-prob (the reference's and the paper's w); zeros give LUFFY's w = pi_theta."""
    if replayed.shape != log_probs.shape[:1]:
        raise ValueError(f"replayed must be one flag per row, shape ({log_probs.shape[0]},), got {tuple(replayed.shape)}")
    w = (log_probs - old_log_probs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
    loss = -advantages * shaping(w, beta)
    keep = replayed.bool().unsqueeze(-1) & action_mask.bool()
    return torch.where(keep, loss, torch.zeros_like(loss))


class ShapedReplayPolicyLoss(PolicyLoss):
    """Upstream's `PolicyLoss` on the fresh rows and `shaped_tokens` on the replayed ones, both
    aggregated by upstream's `aggregate_loss` over the whole micro-batch (same token count or
    sample count), so the two parts add as one loss matrix would. The integration sets
    `replayed_rows` ((B,) bool) before each call, as `SplitStatsPolicyLoss` gets its `row_info`.
    The replayed rows enter upstream's forward with advantage 0, so they add nothing there (its
    clip statistic counts their tokens as unclipped)."""

    replayed_rows: torch.Tensor | None = None
    shaping_beta: float = SHAPING_BETA

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, **kwargs):
        rows = self.replayed_rows
        if rows is None or not bool(rows.any()):
            return super().forward(log_probs, old_log_probs, advantages, action_mask=action_mask, **kwargs)
        rows = rows.to(device=advantages.device, dtype=torch.bool)
        fresh_adv = torch.where(rows.unsqueeze(-1), torch.zeros_like(advantages), advantages)
        loss, *stats = super().forward(log_probs, old_log_probs, fresh_adv, action_mask=action_mask, **kwargs)
        mask = torch.ones_like(log_probs, dtype=torch.bool) if action_mask is None else action_mask
        shaped = shaped_tokens(log_probs, old_log_probs, advantages, mask, rows, self.shaping_beta)
        kwargs.pop("rollout_log_probs", None)
        loss = loss + aggregate_loss(shaped, mask, token_level_loss=self.token_level_loss, **kwargs)
        return (loss, *stats)
