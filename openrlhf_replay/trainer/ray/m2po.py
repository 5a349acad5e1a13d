"""M2PO's second-moment mask (Zheng et al. 2025, arXiv 2510.01161), as AReaL computes it.

Reference: inclusionAI/AReaL, `areal/trainer/ppo/actor.py`: `grpo_loss_fn` applies
`_apply_m2po_masking(old_logp, prox_logp, loss_mask, m2_threshold)` to every token of the micro-batch's
loss mask, before the PPO loss; `_get_m2po_loss_mask` sorts the tokens' M2 = (log pi_behaviour -
log pi_prox)^2 from largest down and masks the largest ones until the mean M2 of those left is below
the threshold (at least one token is kept). Here pi_prox is pi_old recomputed under the current
weights (`--replay.off_policy m2po` recomputes it, as `refresh` does) and pi_behaviour is upstream's
`rollout_log_probs` (the stored log-prob on replayed rows, the generating engine's on fresh ones).
"""
from __future__ import annotations

import torch


def m2po_keep(old_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, action_mask: torch.Tensor,
              threshold: float) -> torch.Tensor:
    """(B, T) bool: `action_mask` without the tokens M2PO masks. Among the tokens of `action_mask`,
    the k of largest M2 = (old - behaviour)^2 are dropped, k the fewest for which the mean M2 of the
    rest is below `threshold`; all but one when no k is (ties: the sort's order, as the reference)."""
    mask = action_mask.bool()
    m2 = (old_log_probs.detach().float() - behaviour_log_probs.detach().float()).square()[mask]
    if not m2.numel():
        return mask
    ordered, order = torch.sort(m2, descending=True)
    n = ordered.numel()
    rest_mean = ordered.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, device=m2.device, dtype=m2.dtype)
    below = torch.nonzero(rest_mean < threshold)
    dropped = int(below[0]) if len(below) else n - 1
    keep_sorted = torch.arange(n, device=m2.device) >= dropped
    keep = torch.empty_like(keep_sorted)
    keep[order] = keep_sorted
    out = torch.zeros_like(mask)
    out[mask] = keep
    return out
