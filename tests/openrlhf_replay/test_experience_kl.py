"""KL, both ways, through real upstream Experiences (docs/METHOD.md section 2, "KL"): with KL in the
reward a replayed row trains on the per-token advantage upstream computed at generation, and its
priority is the group-normalised reward; with KL as a loss it carries the reference log-probs."""
import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from openrlhf.models.utils import compute_approx_kl, masked_mean
from openrlhf.trainer.ppo_utils.experience import split_experience_batch
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.utils import get_strategy

from openrlhf_replay.trainer.ppo_utils.experience import (
    experiences_to_rollouts,
    kl_token_columns,
    rollouts_to_experiences,
)
from replay import ReplayBuffer, ReplayConfig

PAD = SimpleNamespace(pad_token_id=0)
COEF = 0.05


def forward_with_kl(samples_list, use_loss: bool, seed: int = 0):
    """What upstream's `make_experience` attaches with a reference model (its own KL code): the
    actor's and the reference's log-probs (random here), k1 KL in the reward or the reference
    log-probs kept for the loss."""
    g = torch.Generator().manual_seed(seed)
    for s in samples_list:
        s.action_log_probs = -torch.rand(s.action_mask.shape, generator=g) * 3
        base = -torch.rand(s.action_mask.shape, generator=g) * 3
        kl = torch.zeros_like(base) if use_loss else compute_approx_kl(s.action_log_probs, base, kl_estimator="k1")
        s.base_action_log_probs = base if use_loss else None
        s.values, s.kl = None, kl
        s.info["kl"] = masked_mean(kl, s.action_mask, dim=-1)
        s.info["logprobs_diff"] = torch.zeros(len(s.sequences))
    return samples_list


def fresh(args, rollout_samples, coef: float, use_loss: bool):
    maker = RemoteExperienceMaker(None, None, None, None, FixedKLController(coef), get_strategy(args), PAD)
    samples = rollout_samples(args.rollout.batch_size, args.rollout.n_samples_per_prompt, 1)
    return maker.compute_advantages_and_returns(forward_with_kl(maker.split_rollout_samples(samples), use_loss))


def rows(experiences):
    out = {}
    for exp in experiences:
        for item in split_experience_batch(copy.copy(exp)):
            n = int(item.attention_mask.sum())
            out[tuple(item.sequences[:n].tolist())] = (item, n)
    return out


def replay_all(experiences, args, columns, coef):
    rollouts = experiences_to_rollouts(experiences, 0, 4, token_columns=columns, kl_coef=coef)
    buf = ReplayBuffer(ReplayConfig(mode="advantage", warmup=0), columns)
    buf.step(rollouts, 0)
    stored = buf.store.gather(np.arange(len(buf.store)))
    return rollouts, rollouts_to_experiences(stored, experiences[0], 5, 0, step=1, kl_coef=coef)


def test_kl_settings_choose_the_columns(make_args):
    assert kl_token_columns(make_args()) == ()
    assert kl_token_columns(make_args("--algo.kl.init_coef", "0.01")) == ("token_advantages",)
    assert kl_token_columns(make_args("--algo.kl.init_coef", "0.001", "--algo.kl.use_loss")) == ("ref_logprobs",)


def test_kl_in_the_reward_replays_the_per_token_advantage_of_generation(make_args, rollout_samples):
    args = make_args("--algo.kl.init_coef", str(COEF))
    exps = fresh(args, rollout_samples, COEF, use_loss=False)
    rollouts, back = replay_all(exps, args, ("token_advantages",), COEF)

    # The priority |A| is the group-normalised reward: the same rollouts without KL give it exactly.
    no_kl = fresh(make_args(), rollout_samples, 0.0, use_loss=False)
    group = experiences_to_rollouts(no_kl, 0, 4).advantages
    np.testing.assert_allclose(rollouts.advantages, group, atol=2e-6)
    assert np.abs(rollouts.token_advantages - np.repeat(group, rollouts.response_lengths)).max() > 1e-3

    originals = rows(exps)
    for key, (item, n) in rows(back).items():
        orig, _ = originals[key]
        mask = orig.action_mask[: n - 1].bool()
        assert torch.equal(item.advantages[: n - 1][mask], orig.advantages[: n - 1][mask])  # KL term included
        torch.testing.assert_close(item.info["kl"], orig.info["kl"], atol=1e-4, rtol=1e-4)  # read back
    assert len(rows(back)) == len(rollouts) == 32


def test_kl_as_a_loss_replays_the_reference_log_probs(make_args, rollout_samples):
    args = make_args("--algo.kl.init_coef", "0.001", "--algo.kl.use_loss", "--algo.kl.estimator", "k3")
    exps = fresh(args, rollout_samples, 0.001, use_loss=True)
    rollouts, back = replay_all(exps, args, ("ref_logprobs",), 0.001)
    assert rollouts.token_advantages is None
    originals = rows(exps)
    for key, (item, n) in rows(back).items():
        orig, _ = originals[key]
        mask = orig.action_mask[: n - 1].bool()
        assert torch.equal(item.base_action_log_probs[: n - 1][mask], orig.base_action_log_probs[: n - 1][mask])
        assert torch.equal(item.advantages[: n - 1][mask], orig.advantages[: n - 1][mask])
    # a checkpointed column the loss reads is never silently zeros: KL off stores none
    with pytest.raises(ValueError, match="this store holds none"):
        ReplayBuffer(ReplayConfig(mode="advantage", warmup=0)).step(rollouts, 0)
