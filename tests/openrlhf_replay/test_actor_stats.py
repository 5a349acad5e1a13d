"""Fresh vs replay PPO statistics: computed by the actors' loss, recombined by the controller."""
import torch
from openrlhf.models import PolicyLoss

from openrlhf_replay.trainer.ppo_trainer import _split_loss_stats
from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY
from openrlhf_replay.trainer.ray.ppo_actor import SplitStatsPolicyLoss


def test_split_stats_loss_gives_upstreams_loss_and_per_row_statistics():
    torch.manual_seed(0)
    old = -torch.rand(4, 6) * 2
    new = old.clone()
    new[2:] += 0.5  # rows 2, 3 (replayed) moved far: every token's ratio e^0.5 > 1.28 is clipped
    adv = torch.ones(4, 6)
    mask = torch.ones(4, 6, dtype=torch.bool)
    upstream = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28)
    ours = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28)
    ours.__class__ = SplitStatsPolicyLoss
    # after upstream's collate a 0-d info value arrives as a list of 0-d tensors
    info = {REPLAYED_KEY: [torch.tensor(0.0), torch.tensor(0.0), torch.tensor(1.0), torch.tensor(1.0)]}
    ours.row_info = info
    expected = upstream(new, old, adv, action_mask=mask)
    got = ours(new, old, adv, action_mask=mask)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert torch.equal(info["replay/clip_frac_replay_x"], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert torch.equal(info["replay/clip_frac_fresh_x"], torch.zeros(4))
    assert torch.allclose(info["replay/abs_log_ratio_replay_x"], torch.tensor([0.0, 0.0, 0.5, 0.5]))


def test_controller_turns_row_averages_into_fresh_and_replay_means():
    # upstream averages per-row values over all rows; here 1 of 4 rows is replayed
    status = {REPLAYED_KEY: 0.25, "replay/clip_frac_replay_x": 0.8 * 0.25, "replay/clip_frac_fresh_x": 0.1 * 0.75,
              "policy_loss": 1.0}
    out = _split_loss_stats(status)
    assert abs(out["replay/clip_frac_replay"] - 0.8) < 1e-12 and abs(out["replay/clip_frac_fresh"] - 0.1) < 1e-12
    assert "replay/clip_frac_replay_x" not in status and status["policy_loss"] == 1.0
    # no replayed rows this step: no replay mean is invented
    out = _split_loss_stats({REPLAYED_KEY: 0.0, "replay/clip_frac_replay_x": 0.0, "replay/clip_frac_fresh_x": 0.2})
    assert out == {"replay/clip_frac_fresh": 0.2}
