"""A reward function that raises, or returns NaN, for one sample (`guard_rewards`), on the samples
upstream's own generator builds from vLLM responses. The pipeline version of this fault, with a
real reward file inside the vLLM engine's actor, is in test_pipeline_faults.py."""
from __future__ import annotations

import pytest
import torch
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

from openrlhf_replay.trainer.ppo_utils.reward_guard import RewardFunctionBroken, guard_rewards


def _sample(reward):
    """One sample as upstream builds it; `reward` None: the reward call raised (upstream logs the
    error and leaves the sample without a reward or the reward file's extra logs)."""
    r = None if reward is None else torch.tensor([reward])
    response = {"prompt": f"prompt {reward}", "label": "1", "images": None, "mm_train_inputs": None,
                "observation_tokens": [5, 6, 7, 8, 9], "action_ranges": [(3, 5)], "rollout_log_probs": None,
                "truncated": False, "reward": r, "scores": r,
                "extra_logs": {} if r is None else {"grade_error": torch.tensor([0.0])}}
    return SamplesGenerator._process_response_into_experience(None, response, max_len=64)


def test_upstream_cannot_batch_a_sample_whose_reward_failed():
    with pytest.raises(AttributeError):  # what a run would die of, on the controller
        Experience.concat_experiences([_sample(1.0), _sample(None)], 0)


def test_failed_and_nan_rewards_are_scored_zero_and_counted():
    samples = [_sample(1.0), _sample(None), _sample(float("nan")), _sample(float("inf")), _sample(0.0)]
    faults = guard_rewards(samples)
    assert (faults.failed, faults.non_finite) == (1, 2)
    assert faults.metrics() == {"reward/failed": 1.0, "reward/non_finite": 2.0}
    assert faults.example.endswith("prompt None")
    batch = Experience.concat_experiences(samples, 0)
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert batch.info["reward"].tolist() == batch.info["score"].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert batch.info["grade_error"].tolist() == [0.0] * 5  # the failed sample got the keys the others have


def test_healthy_samples_are_left_alone():
    samples = [_sample(1.0), _sample(0.0)]
    before = [s.rewards.clone() for s in samples]
    assert guard_rewards(samples).total == 0
    assert all(torch.equal(s.rewards, b) for s, b in zip(samples, before))


def test_a_step_where_every_reward_failed_stops_the_run():
    with pytest.raises(RewardFunctionBroken, match="failed for all 2 samples.*--reward.remote_url"):
        guard_rewards([_sample(None), _sample(float("nan"))])
