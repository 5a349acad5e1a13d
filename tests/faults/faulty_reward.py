"""A reward file with injected faults, for the pipeline fault tests: a coin flip per response
(`tests/pipeline/parity_reward.py`), except that in each process the 3rd call raises and the 5th
returns NaN. OpenRLHF calls `reward_func` once per sample from many threads."""
import itertools
import threading

import torch

_calls = itertools.count(1)
_lock = threading.Lock()


def reward_func(queries, prompts, labels):
    with _lock:
        call = next(_calls)
    if call == 3:
        raise RuntimeError("injected fault: this reward function raised")
    value = float("nan") if call == 5 else float(len(queries[0]) % 2 == 0)
    rewards = torch.tensor([value])
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": {"parity": rewards.clone()}}
