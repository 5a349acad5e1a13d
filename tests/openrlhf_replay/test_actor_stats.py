"""Statistics per kind of row: computed by the actors (loss and generation statistics), recombined by
the controller into means over fresh rows and over replayed rows."""
import torch
from openrlhf.models import PolicyLoss

from openrlhf_replay.trainer.ppo_utils.experience import REPLAYED_KEY, split_by_row_kind
from openrlhf_replay.trainer.ray.ppo_actor import SplitStatsPolicyLoss, split_generation_stats


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
    assert torch.equal(info["replay/clip_frac_replay@replay"], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert torch.equal(info["replay/clip_frac_fresh@fresh"], torch.zeros(4))
    assert torch.allclose(info["replay/abs_log_ratio_replay@replay"], torch.tensor([0.0, 0.0, 0.5, 0.5]))


def test_controller_turns_row_averages_into_fresh_and_replay_means():
    # upstream averages per-row values over all rows; here 1 of 4 rows is replayed
    status = {REPLAYED_KEY: 0.25, "replay/clip_frac_replay@replay": 0.8 * 0.25,
              "replay/clip_frac_fresh@fresh": 0.1 * 0.75, "policy_loss": 1.0}
    out = split_by_row_kind(status)
    assert abs(out["replay/clip_frac_replay"] - 0.8) < 1e-12 and abs(out["replay/clip_frac_fresh"] - 0.1) < 1e-12
    assert "replay/clip_frac_replay@replay" not in status and status["policy_loss"] == 1.0
    # no replayed rows this step: no replay mean is invented
    out = split_by_row_kind({REPLAYED_KEY: 0.0, "replay/clip_frac_replay@replay": 0.0,
                             "replay/clip_frac_fresh@fresh": 0.2})
    assert out == {"replay/clip_frac_fresh": 0.2}


def test_generation_statistics_describe_fresh_rows_only():
    """Upstream logs the reward, return, lengths, truncation, ... of every row a micro-batch trains
    on; replayed rows carry stored copies or zeros there. After the split, `reward` etc. are
    the means over fresh rows, and the stored reward of replayed rows has its own key."""
    replayed = torch.tensor([0.0, 0.0, 0.0, 1.0])
    status = {"metrics": {"reward": torch.tensor([1.0, 0.0, 1.0, 1.0]), "response_length": torch.tensor([10, 20, 30, 99]),
                          "truncated": torch.tensor([False, True, False, False]), "policy_loss": torch.tensor(0.3),
                          REPLAYED_KEY: replayed, "actor_lr": 1e-6},
              "weights": {"reward": "sample", "response_length": "sample", "truncated": "sample",
                          "policy_loss": "token", REPLAYED_KEY: "sample", "actor_lr": None}}
    split_generation_stats(status, replayed)
    metrics = status["metrics"]
    assert set(metrics) == {"reward@fresh", "response_length@fresh", "truncated@fresh", "replay/reward_replay@replay",
                            "replay/response_length_replay@replay", "policy_loss", REPLAYED_KEY, "actor_lr"}
    assert all(status["weights"][k] == "sample" for k in metrics if "@" in k)
    # What upstream's ppo_train then does (a sample-weighted mean over rows), and the controller:
    step = {k: v.float().mean().item() for k, v in metrics.items() if k.endswith(("@fresh", "@replay"))}
    out = split_by_row_kind({**step, REPLAYED_KEY: replayed.mean().item()})
    assert out["reward"] == 2 / 3 and out["response_length"] == 20 and out["truncated"] == 1 / 3
    assert out["replay/reward_replay"] == 1.0 and out["replay/response_length_replay"] == 99


def test_kl_is_logged_per_kind_of_row_both_ways():
    """KL as a loss: each row's KL to the reference under the current policy, from the loss's
    inputs. KL in the reward: each row's KL at generation (`info["kl"]`, replayed rows' read back
    from their stored advantages), carried like the reward."""
    from openrlhf.models.utils import compute_approx_kl

    torch.manual_seed(1)
    new, ref = -torch.rand(4, 6), -torch.rand(4, 6)
    mask = torch.ones(4, 6, dtype=torch.bool)
    loss = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28)
    loss.__class__ = SplitStatsPolicyLoss
    info = {REPLAYED_KEY: [torch.tensor(x) for x in (0.0, 0.0, 1.0, 1.0)]}
    loss.row_info, loss.row_ref_log_probs, loss.kl_estimator = info, ref, "k3"
    loss(new, new.detach(), torch.ones(4, 6), action_mask=mask)
    per_row = compute_approx_kl(new, ref, kl_estimator="k3").mean(-1)
    assert torch.allclose(info["replay/kl_fresh@fresh"], per_row * torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert torch.allclose(info["replay/kl_replay@replay"], per_row * torch.tensor([0.0, 0.0, 1.0, 1.0]))

    replayed = torch.tensor([0.0, 1.0])
    status = {"metrics": {"kl": torch.tensor([0.2, 0.6])}, "weights": {"kl": "sample"}}
    split_generation_stats(status, replayed, carried=("kl",))
    assert set(status["metrics"]) == {"kl@fresh", "replay/kl_fresh@fresh", "replay/kl_replay@replay"}
    assert status["metrics"]["replay/kl_replay@replay"].tolist() == [0.0, 0.6000000238418579]
