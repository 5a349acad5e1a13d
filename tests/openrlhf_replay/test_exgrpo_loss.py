"""ExGRPO's policy shaping on replayed rows (`openrlhf_replay/trainer/exgrpo_loss.py`) on
hand-computed tensors, and its composition with upstream's real `PolicyLoss`.

Hand values: w = 0.5 / 0.25 = 2 gives f(w) = 2 / 2.1 = 0.952381 and d(-A f(w)) / d log pi =
-A beta w / (w + beta)^2 = -0.1 * 2 / 4.41 = -0.045351 for A = 1; LUFFY's form (old log-prob 0,
w = pi_theta; ExGRPO's reference takes the ratio, as here) at pi = 0.3 gives f = 0.3 / 0.4 = 0.75.
"""
import math

import pytest
import torch
from openrlhf.models.loss import PolicyLoss

from openrlhf_replay.trainer.exgrpo_loss import ShapedReplayPolicyLoss, shaped_tokens

LN = math.log


def test_shaped_tokens_by_hand():
    lp = torch.tensor([[LN(0.5), LN(0.5)], [LN(0.5), LN(0.5)]])
    old = torch.tensor([[LN(0.25), LN(0.25)], [LN(0.25), LN(0.25)]])
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    out = shaped_tokens(lp, old, adv, mask, torch.tensor([True, False]))
    torch.testing.assert_close(out, torch.tensor([[-2 / 2.1, 0.0], [0.0, 0.0]]))


def test_reference_code_form_with_old_log_prob_zero():
    out = shaped_tokens(torch.tensor([[LN(0.3)]]), torch.zeros(1, 1), torch.tensor([[1.0]]),
                        torch.ones(1, 1, dtype=torch.bool), torch.tensor([True]))
    assert out.item() == pytest.approx(-0.75, abs=1e-6)


def test_gradient_is_the_shaped_one():
    lp = torch.tensor([[LN(0.5)]], requires_grad=True)
    shaped_tokens(lp, torch.tensor([[LN(0.25)]]), torch.tensor([[1.0]]), torch.ones(1, 1, dtype=torch.bool),
                  torch.tensor([True])).sum().backward()
    assert lp.grad.item() == pytest.approx(-0.1 * 2 / 2.1 ** 2, abs=1e-6)


def test_one_flag_per_row_is_required():
    with pytest.raises(ValueError, match="one flag per row"):
        shaped_tokens(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(3))


def _loss(token_level=True):
    return ShapedReplayPolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=10.0, token_level_loss=token_level)


def _batch():
    # Row 0 fresh, on-policy (w = 1), A = 0.5: upstream's token loss -0.5. Row 1 replayed, w = 2,
    # A = 1: shaped token loss -0.952381 (upstream would clip it at 1.28: -1.28).
    lp = torch.tensor([[LN(0.4), LN(0.4)], [LN(0.5), LN(0.5)]])
    old = torch.tensor([[LN(0.4), LN(0.4)], [LN(0.25), LN(0.25)]])
    adv = torch.tensor([[0.5, 0.5], [1.0, 1.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    return lp, old, adv, mask


def test_without_replayed_rows_it_is_upstreams_loss():
    lp, old, adv, mask = _batch()
    mine, upstream = _loss(), PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=10.0)
    for rows in (None, torch.tensor([False, False])):
        mine.replayed_rows = rows
        for a, b in zip(mine(lp, old, adv, action_mask=mask), upstream(lp, old, adv, action_mask=mask)):
            torch.testing.assert_close(a, b)


def test_mixed_micro_batch_token_mean_and_global_token_count():
    lp, old, adv, mask = _batch()
    fn = _loss()
    fn.replayed_rows = torch.tensor([False, True])
    # token-mean over the 3 action tokens: (-0.5 - 0.5 - 0.952381) / 3
    assert fn(lp, old, adv, action_mask=mask)[0].item() == pytest.approx((-1.0 - 2 / 2.1) / 3, abs=1e-6)
    # upstream's global normaliser: sum / batch_num_tokens * dp_size
    got = fn(lp, old, adv, action_mask=mask, dp_size=2, batch_num_tokens=12.0)[0].item()
    assert got == pytest.approx((-1.0 - 2 / 2.1) / 12 * 2, abs=1e-6)


def test_mixed_micro_batch_sequence_mean():
    lp, old, adv, mask = _batch()
    fn = _loss(token_level=False)
    fn.replayed_rows = torch.tensor([False, True])
    # per-sequence token means -0.5 and -0.952381, then their mean
    assert fn(lp, old, adv, action_mask=mask)[0].item() == pytest.approx((-0.5 - 2 / 2.1) / 2, abs=1e-6)
