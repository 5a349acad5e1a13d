"""What ties an RLEP success pool (`replay/pool.py`) to a run: its tokenizer and its prompts.

A pool's rollouts are token ids, and RLEP replays a prompt's successes by the prompt's identity,
a hash of its token ids (`experience.py:prompt_uid`). Both hold only for the tokenizer and the
prompt texts the pool was built with, so the pool builder and the trainer compute them here, the
way upstream tokenizes a prompt for vLLM (`openrlhf/utils/agent.py`, `execute`).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import numpy as np

from openrlhf_replay.datasets.prompt_files import UnreadableFile, file_rows
from openrlhf_replay.trainer.ppo_utils.prompt_identity import prompt_uid
from replay import ReplayConfig
from replay.pool import SuccessPool, SuccessPoolError, load_pool, pool_mismatch

# transformers is imported where a tokenizer is loaded: the launcher's checks import this module
# before anything heavy is needed.


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


def upstream_preprocess_data():
    """Upstream's `openrlhf.datasets.prompts_dataset.preprocess_data` (its prompt templating),
    loaded from its file alone: the `openrlhf.datasets` package imports most of OpenRLHF."""
    root = Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0])
    spec = importlib.util.spec_from_file_location("_openrlhf_prompts_dataset", root / "datasets" / "prompts_dataset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.preprocess_data


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


def dry_run_pool_errors(args) -> list[str]:
    """The trainer's start-up check of `--replay.success_pool` (`check_success_pool`), made from
    the launch arguments for the dry run: for one local prompt file and a tokenizer found on this
    machine. Otherwise (or when the pool itself is unreadable, which the launcher reports) nothing."""
    from transformers import AutoTokenizer

    config = ReplayConfig.from_namespace(args)
    dataset = (args.data.prompt_dataset or "").split("@")[0].strip()
    if not config.success_pool or "," in (args.data.prompt_dataset or "") or not os.path.isfile(dataset):
        return []
    try:
        pool = load_pool(config.success_pool)
        # A dry run never waits on the network: a hub id is checked only from the local cache.
        tokenizer = AutoTokenizer.from_pretrained(args.actor.model_name_or_path, local_files_only=True)
        prompts = training_prompts(args, dataset, tokenizer)
    except (SuccessPoolError, UnreadableFile, OSError, ValueError):
        return []
    budget = max_prompt_len(args.data.max_len, args.rollout.max_new_tokens)
    return [f"--replay.success_pool: {e}" for e in
            pool_mismatch(pool, tokenizer_fingerprint(tokenizer), prompt_uids(tokenizer, prompts, budget))]


def training_prompts(args, dataset: str, tokenizer) -> list[str]:
    """The run's training prompts from one local prompt file, after upstream's templates and its
    --data.max_samples cut, as its dataset holds them."""
    rows = [row for _, row in file_rows(dataset)][: int(min(args.data.max_samples, 1e12))]
    chat = tokenizer.apply_chat_template if args.data.apply_chat_template else None
    preprocess_data = upstream_preprocess_data()
    return [preprocess_data(row, args.data.input_template, args.data.input_key, args.data.label_key, chat)[0]
            for row in rows]
