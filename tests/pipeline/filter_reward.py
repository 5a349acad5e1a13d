"""A reward for the dynamic-filtering pipeline run: 0 for every response to a prompt whose answer
is a multiple of 3 (a group of one reward, which dynamic filtering drops), else 0 and 1 by turns
over each prompt's responses, so that each of those prompts' groups of 4 has two of each and is
kept.

Turns, not a coin flip: with coin flips one group in 8 came out constant, and how often depended
on the CPU's arithmetic (a CI machine saw a whole call dropped where this one never did). The
run's one vLLM engine sends every response here, one per call, from several threads."""
import itertools
import threading

import torch

_turns: dict[str, itertools.count] = {}
_lock = threading.Lock()


def _turn(prompt: str) -> int:
    with _lock:
        return next(_turns.setdefault(prompt, itertools.count()))


def reward_func(queries, prompts, labels):
    rewards = torch.tensor([0.0 if int(label) % 3 == 0 else float(_turn(p) % 2) for p, label in zip(prompts, labels)])
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": {}}
