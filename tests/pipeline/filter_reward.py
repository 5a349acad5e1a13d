"""A reward for the dynamic-filtering pipeline run: 0 for every response to a prompt whose answer
is a multiple of 3 (a group of one reward, which dynamic filtering drops), else parity_reward's
coin flip (groups with reward variance, which it keeps)."""
import torch


def reward_func(queries, prompts, labels):
    rewards = torch.tensor([0.0 if int(label) % 3 == 0 else float(len(q) % 2 == 0) for q, label in zip(queries, labels)])
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": {}}
