"""A reward for pipeline tests with a random model: 1.0 when the decoded query has an even number
of characters. Any response of a random model then has a coin-flip reward, so every prompt group
has reward variance, non-zero advantages, and rollouts the replay buffer keeps."""
import torch


def reward_func(queries, prompts, labels):
    rewards = torch.tensor([float(len(q) % 2 == 0) for q in queries])
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": {}}
