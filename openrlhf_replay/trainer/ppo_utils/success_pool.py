"""What ties an RLEP success pool (`replay/pool.py`) to a run: its tokenizer and its prompts.

A pool's rollouts are token ids, and RLEP replays a prompt's successes by the prompt's identity,
a hash of its token ids (`experience.py:prompt_uid`). Both hold only for the tokenizer and the
prompt texts the pool was built with, so the pool builder and the trainer compute them here, the
way upstream tokenizes a prompt for vLLM (`openrlhf/utils/agent.py`, `execute`).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from openrlhf_replay.trainer.ppo_utils.experience import prompt_uid
from replay.pool import SuccessPool, SuccessPoolError, pool_mismatch


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 of the tokenizer's vocabulary (token -> id) and its special tokens."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    special = sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", []))
    return hashlib.sha256(json.dumps([vocab, special], ensure_ascii=False).encode()).hexdigest()


def prompt_token_ids(tokenizer, prompt: str, max_prompt_len: int | None = None) -> list[int]:
    """The token ids upstream generates from for `prompt` (no special tokens added), cut from the
    left to `max_prompt_len` as upstream does when the prompt leaves no room for the response."""
    ids = tokenizer(text=prompt, add_special_tokens=False)["input_ids"]
    if max_prompt_len is not None and len(ids) > max_prompt_len:
        ids = ids[-max_prompt_len:]
    return list(ids)


def max_prompt_len(max_len: int, max_new_tokens: int | None) -> int | None:
    """Upstream's prompt budget: `--data.max_len` less `--rollout.max_new_tokens` (None: no cut)."""
    return None if max_new_tokens is None else max(1, max_len - max_new_tokens)


def prompt_uids(tokenizer, prompts: list[str], budget: int | None = None) -> np.ndarray:
    """(P,) int64 identities of `prompts` as a run tokenizes them."""
    return np.array([prompt_uid(np.asarray(prompt_token_ids(tokenizer, p, budget), np.int32)) for p in prompts],
                    np.int64)


def check_success_pool(pool: SuccessPool, tokenizer, prompts: list[str], budget: int | None = None) -> None:
    """SuccessPoolError unless `pool` was built with this tokenizer and decoded every one of the
    run's training `prompts` (their texts after upstream's templates)."""
    errors = pool_mismatch(pool, tokenizer_fingerprint(tokenizer), prompt_uids(tokenizer, prompts, budget))
    if errors:
        raise SuccessPoolError("; ".join(errors))
