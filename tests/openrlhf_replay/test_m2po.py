"""M2PO's mask against hand-computed cases of AReaL's rule (areal/trainer/ppo/actor.py:
_get_m2po_loss_mask): drop the tokens of largest M2 = (log pi_old - log pi_behaviour)^2 until the
mean M2 of the rest is below the threshold, keeping at least one; then upstream's loss on the rest."""
import pytest
import torch
from openrlhf.models import PolicyLoss

from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY
from openrlhf_replay.trainer.ray.m2po import m2po_keep
from openrlhf_replay.trainer.ray.ppo_actor import SplitStatsPolicyLoss


def test_the_largest_second_moment_goes_until_the_mean_of_the_rest_is_below_the_threshold():
    behaviour = torch.zeros(1, 4)
    old = torch.tensor([[0.1, 0.5, 0.0, -0.1]])  # M2 = 0.01, 0.25, 0, 0.01
    # all four: mean 0.27 / 4 = 0.0675 >= 0.04; without the 0.25: 0.02 / 3 = 0.0067 < 0.04
    keep = m2po_keep(old, behaviour, torch.ones(1, 4, dtype=torch.bool), 0.04)
    assert keep.tolist() == [[True, False, True, True]]
    # threshold 0.07: the mean of all four, 0.0675, is below it already: nothing is masked
    assert m2po_keep(old, behaviour, torch.ones(1, 4, dtype=torch.bool), 0.07).all()
    # threshold 0.005: without 0.25 the mean is 0.0067, without 0.25 and one 0.01 it is 0.005 (not below);
    # without both 0.01 too it is 0 -> three masked, the M2-0 token alone kept
    assert m2po_keep(old, behaviour, torch.ones(1, 4, dtype=torch.bool), 0.005).tolist() == [[False, False, True, False]]


def test_at_least_one_token_is_kept_and_only_the_action_mask_counts():
    old, behaviour = torch.tensor([[1.0, -1.0, 3.0]]), torch.zeros(1, 3)  # M2 = 1, 1, 9
    mask = torch.tensor([[True, True, False]])  # the 9 is no action token: neither counted nor kept
    keep = m2po_keep(old, behaviour, mask, 0.04)  # means 1, 1: never below -> all but one masked
    assert keep.sum() == 1 and not keep[0, 2]
    assert not m2po_keep(old, behaviour, torch.zeros(1, 3, dtype=torch.bool), 0.04).any()


def test_the_threshold_reaches_across_rows_of_the_micro_batch():
    # one stale row and one fresh row: the mask is computed over every token of the micro-batch
    behaviour = torch.zeros(2, 3)
    old = torch.tensor([[0.6, 0.0, 0.0], [0.05, 0.05, 0.05]])  # M2 0.36, 0, 0 | 0.0025 x 3
    keep = m2po_keep(old, behaviour, torch.ones(2, 3, dtype=torch.bool), 0.04)
    assert keep.tolist() == [[False, True, True], [True, True, True]]  # 0.36 / 6 = 0.06 >= 0.04; the rest 0.0015


def test_the_loss_is_upstreams_on_the_tokens_m2po_keeps():
    torch.manual_seed(0)
    new, behaviour = -torch.rand(2, 5), -torch.rand(2, 5)
    old = behaviour.clone()
    old[1, :2] += 1.0  # a replayed row whose first two tokens moved far from their behaviour policy
    adv, mask = torch.randn(2, 5), torch.ones(2, 5, dtype=torch.bool)
    ours = PolicyLoss(is_correction_level="token", is_correction_mode="mask", is_correction_threshold=(0.0, 5.0))
    ours.__class__ = SplitStatsPolicyLoss
    ours.m2_threshold = 0.04
    ours.row_info = info = {REPLAYED_KEY: [torch.tensor(0.0), torch.tensor(1.0)]}
    kept = m2po_keep(old, behaviour, mask, 0.04)
    assert kept.sum() == 8 and not kept[1, :2].any()
    upstream = PolicyLoss(is_correction_level="token", is_correction_mode="mask", is_correction_threshold=(0.0, 5.0))
    expected = upstream(new, old, adv, action_mask=kept, rollout_log_probs=behaviour)
    got = ours(new, old, adv, action_mask=mask, rollout_log_probs=behaviour)
    assert torch.equal(got[0], expected[0])
    assert torch.allclose(info["replay/m2po_masked_replay@replay"], torch.tensor([0.0, 0.4]))
    assert torch.equal(info["replay/m2po_masked_fresh@fresh"], torch.zeros(2))
    ours.m2_threshold = None  # off: upstream's loss on every token
    assert torch.equal(ours(new, old, adv, action_mask=mask, rollout_log_probs=behaviour)[0],
                       upstream(new, old, adv, action_mask=mask, rollout_log_probs=behaviour)[0])


@pytest.mark.parametrize("threshold", [0.0, -1.0, float("nan")])
def test_a_threshold_that_is_not_positive_is_refused(threshold):
    from replay import ReplayConfig
    with pytest.raises(ValueError, match="replay.m2_threshold must be a finite number > 0"):
        ReplayConfig(mode="advantage", off_policy="m2po", m2_threshold=threshold)
