"""One sample's failed reward must not stop a run, nor poison its group.

OpenRLHF 0.11.2 calls the reward file's `reward_func` once per sample inside the vLLM engine's
actor (`openrlhf/utils/agent.py`, `SingleTurnAgentExecutor.execute`). When the call raises,
upstream logs "[SingleTurnExecutor] Failed to fetch reward ..." and leaves that sample without a
reward; batching it with the others then fails on the controller, minutes into the run. A NaN or
inf reward is passed on as it is and turns its group's advantages, the loss and the weights into
NaN. `guard_rewards` runs on the controller on each step's samples before they are batched: such a
sample is scored 0 like a wrong answer, counted, and warned about; the step goes on. A step in
which every sample failed stops the run: the reward file itself is broken.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


class RewardFunctionBroken(RuntimeError):
    """Every sample of a step failed to get a reward."""


@dataclass(frozen=True)
class RewardFaults:
    """What `guard_rewards` replaced in one step."""

    failed: int  # samples without a reward: the reward function raised for them
    non_finite: int  # samples whose reward or score was NaN or inf
    example: str  # the prompt of the first such sample (shortened), for the warning

    @property
    def total(self) -> int:
        return self.failed + self.non_finite

    def metrics(self) -> dict[str, float]:
        return {"reward/failed": float(self.failed), "reward/non_finite": float(self.non_finite)}


def guard_rewards(samples: list) -> RewardFaults:
    """Score 0 every sample (a one-row `Experience`) whose reward is missing or not finite, in place,
    giving it the same info keys as the healthy samples. Raises RewardFunctionBroken when no
    sample of the step has a usable reward."""
    def usable(s) -> bool:
        return s.rewards is not None and bool(torch.isfinite(s.rewards.float()).all())

    healthy = next((s for s in samples if usable(s)), None)
    if healthy is None:
        raise RewardFunctionBroken(
            f"the reward function failed for all {len(samples)} samples of this step (see "
            "'[SingleTurnExecutor] Failed to fetch reward' above for its error): fix the file given "
            "as --reward.remote_url, then rerun the same command to resume from the last checkpoint")
    failed = non_finite = 0
    example = ""
    for s in samples:
        if usable(s):
            continue
        if s.rewards is None:
            failed += 1
        else:
            non_finite += 1
        example = example or str((s.prompts or [""])[0])[-120:]
        s.rewards = torch.zeros_like(healthy.rewards)
        if healthy.scores is not None:
            s.scores = torch.zeros_like(healthy.scores)
        for key, like in healthy.info.items():  # "reward", "score" and the reward file's extra logs
            value = s.info.get(key)
            if key in ("reward", "score") or value is None or not bool(torch.isfinite(torch.as_tensor(value).float()).all()):
                s.info[key] = torch.zeros_like(like)
    return RewardFaults(failed, non_finite, example)
