"""The `exgrpo` mode wired end to end on CPU: its entry through the buffer and the experience maker
(replayed rows carry their mixed group's advantage, hand-computed), and the loss seam the actor
selects from the off-policy rule (ExGRPO's shaped objective on replayed rows only, upstream's on
fresh ones, the per-kind statistics kept).

Hand values, K = 4 (0/1 rewards): a question last seen at k = 2 of 4 has the mixed group mean
m = (1 + 3 * 2/4) / 4 = 0.625, so A = 0.375 without std (dr_grpo); group_norm's std of that group,
sqrt(4 m (1 - m) / 3) = sqrt(0.3125), gives A = 0.375 / 0.559017 = 0.670820. At k = 1:
m = 0.4375, A = 0.5625, std sqrt(4 * 0.4375 * 0.5625 / 3) = 0.572822, A = 0.981981.
"""
import math

import numpy as np
import pytest
import torch
from openrlhf.models import PolicyLoss

from openrlhf_replay.trainer.exgrpo_loss import ShapedReplayPolicyLoss
from openrlhf_replay.trainer.ppo_utils.experience import INERT_KEY, REPLAYED_KEY
from openrlhf_replay.trainer.ppo_utils.experience_maker import ReplayExperienceMaker
from openrlhf_replay.trainer.ray.ppo_actor import ReplayActorPPOTrainer, ShapedSplitStatsPolicyLoss, \
    SplitStatsPolicyLoss, policy_loss_class
from replay import MODE_REGISTRY, OFF_POLICY_REGISTRY, ReplayBuffer, ReplayConfig, RolloutBatch
from replay.composer import group_normalise
from replay.exgrpo import mixed_group_advantage

K = 4
HAND = {(2, False): 0.375, (1, False): 0.5625, (2, True): 0.670820, (1, True): 0.981981}


def test_mixed_group_advantage_by_hand_with_and_without_std():
    for (k, std), value in HAND.items():
        assert mixed_group_advantage(np.array([k]), K, std)[0] == pytest.approx(value, abs=1e-6)
    # at a whole fresh count it is group_norm of that very group: k = 0 of 8 -> 1 success of 8
    rewards = np.r_[1.0, np.zeros(7)].astype(np.float32)
    assert mixed_group_advantage(np.array([0]), 8, True)[0] == pytest.approx(
        group_normalise(rewards, np.zeros(8, np.int64))[0], abs=1e-5)


def _step_batch(step: int, counts: dict[int, int]) -> RolloutBatch:
    """One step's groups of K: question q with counts[q] successes, 0/1 rewards, group_norm
    advantages, log-probs that differ per rollout (the trajectory score)."""
    rewards = np.array([float(j < counts[q]) for q in counts for j in range(K)], np.float32)
    groups = np.repeat(np.arange(len(counts)), K) + 100 * step
    uids = np.repeat(np.array(list(counts)), K)
    lp = [[-0.1 * (1 + i % K)] * 3 for i in range(len(rewards))]
    return RolloutBatch.from_lists(
        prompts=[[int(u) + 3] for u in uids], responses=[[5, 6, 7]] * len(rewards), action_masks=[[1, 1, 1]] * len(rewards),
        logprobs=lp, rewards=rewards, advantages=group_normalise(rewards, groups), prompt_uids=uids, group_ids=groups,
        version=step)


@pytest.mark.parametrize("divide_by_std", [True, False])
def test_buffer_replays_one_success_per_question_with_the_mixed_advantage(divide_by_std):
    config = ReplayConfig(mode="exgrpo", warmup=1, ratio=1.0).for_run(10, group_size=K)
    assert config.group_size == K and config.effective_off_policy == "exgrpo"
    buf = ReplayBuffer(config)
    buf.step(_step_batch(0, {0: 2, 1: 1, 2: 4, 3: 0}), 0, divide_by_std=divide_by_std)
    # question 2 (all correct) is retired, question 3 (none) stored nothing; 0 and 1 are replayable
    comp = buf.step(_step_batch(1, {0: 0, 1: 0, 2: 0, 3: 0}), 1, divide_by_std=divide_by_std)
    assert sorted(comp.replayed.prompt_uids.tolist()) == [0, 1]
    for uid, adv, lp in zip(comp.replayed.prompt_uids, comp.replayed.advantages, comp.replayed.behaviour_logprobs[::3]):
        assert adv == pytest.approx(HAND[({0: 2, 1: 1}[int(uid)], divide_by_std)], abs=1e-6)
        assert lp == pytest.approx(-0.1)  # its question's highest-scoring (lowest-perplexity) success
    assert buf.metrics()["replay/questions_retired"] == 1.0


def test_group_size_is_required_to_build_the_buffer():
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        ReplayBuffer(ReplayConfig(mode="exgrpo"))
    assert ReplayConfig(mode="exgrpo", group_size=8).for_run(10, group_size=4).group_size == 8  # a set K stays


def test_experience_maker_carries_the_mixed_advantage_to_replayed_rows(make_args, experience_maker_cls,
                                                                       rollout_samples):
    args = make_args("--replay.mode", "exgrpo", "--replay.warmup", "1")
    config = ReplayConfig.from_namespace(args).for_run(10, group_size=args.rollout.n_samples_per_prompt)
    maker = experience_maker_cls(ReplayExperienceMaker, args, replay_buffer=ReplayBuffer(config))
    maker.step = 0
    maker.make_experience_batch(rollout_samples(8, 4, seed=3))  # successes: 2 of 4 (p % 3), else 1 of 4
    maker.step = 1
    out = maker.make_experience_batch(rollout_samples(8, 4, seed=4))
    replayed = [e for e in out if bool(e.info[REPLAYED_KEY].any())]
    seen = set()
    for e in replayed:
        for adv, mask, dead in zip(e.advantages, e.action_mask, e.info[INERT_KEY].bool()):
            if dead:
                continue
            value = float(adv[mask.bool()][0])
            assert any(value == pytest.approx(HAND[(k, True)], abs=1e-5) for k in (1, 2)), value
            seen.add(round(value, 4))
    assert len(seen) == 2  # both buckets replayed (8 questions, 16 rows asked)


def _batch():
    # Row 0 fresh (w = 1, A = 0.5): upstream's token loss -0.5. Row 1 replayed (w = 2, A = 1):
    # shaped -2 / 2.1; upstream's clip would give -1.28.
    lp = torch.tensor([[math.log(0.4)] * 2, [math.log(0.5)] * 2])
    old = torch.tensor([[math.log(0.4)] * 2, [math.log(0.25)] * 2])
    return lp, old, torch.tensor([[0.5, 0.5], [1.0, 1.0]]), torch.ones(2, 2, dtype=torch.bool)


def _trainer_loss(off_policy: str) -> PolicyLoss:
    trainer = ReplayActorPPOTrainer.__new__(ReplayActorPPOTrainer)  # only its loss is exercised
    trainer.actor_loss_fn = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=10.0)
    trainer.enable_split_stats(policy_loss_class(OFF_POLICY_REGISTRY[off_policy]))
    return trainer.actor_loss_fn


def test_the_rule_selects_the_shaped_loss_for_replayed_rows_only():
    assert MODE_REGISTRY["exgrpo"].off_policy == "exgrpo"
    assert policy_loss_class(OFF_POLICY_REGISTRY["exgrpo"]) is ShapedSplitStatsPolicyLoss
    assert all(policy_loss_class(r) is SplitStatsPolicyLoss for name, r in OFF_POLICY_REGISTRY.items()
               if name != "exgrpo")
    assert type(_trainer_loss("stale")) is SplitStatsPolicyLoss
    loss = _trainer_loss("exgrpo")
    assert type(loss) is ShapedSplitStatsPolicyLoss and isinstance(loss, ShapedReplayPolicyLoss)
    lp, old, adv, mask = _batch()
    info = {REPLAYED_KEY: [torch.tensor(0.0), torch.tensor(1.0)]}
    loss.row_info = info
    got = loss(lp, old, adv, action_mask=mask)[0].item()
    assert got == pytest.approx((-0.5 * 2 - 2 * 2 / 2.1) / 4, abs=1e-6)  # token-mean of 4 tokens
    assert loss.replayed_rows is None  # read from the micro-batch's flags, not kept
    assert torch.equal(info["replay/clip_frac_replay@replay"], torch.tensor([0.0, 1.0]))  # statistics kept
    # all rows fresh: upstream's loss exactly
    loss.row_info = {REPLAYED_KEY: [torch.tensor(0.0), torch.tensor(0.0)]}
    upstream = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=10.0)
    torch.testing.assert_close(loss(lp, old, adv, action_mask=mask)[0], upstream(lp, old, adv, action_mask=mask)[0])
    # without the rule, the replayed row takes upstream's clipped loss: -1.28 per token
    plain = _trainer_loss("stale")
    plain.row_info = info
    assert plain(lp, old, adv, action_mask=mask)[0].item() == pytest.approx((-1.0 - 2 * 1.28) / 4, abs=1e-6)
