"""The rehearsal's stand-in for RLEP's offline pool, for a command that names a pool file not
built yet.

The launch scripts replay a pool decoded from a checkpoint of the comparison's own GRPO run
(`examples/scripts/build_success_pool.sh`), and a rehearsal is run before any training, so the
file does not exist then. The rehearsal stands in for the seed policy as it stands in for vLLM:
every training prompt is decoded `n_samples_per_prompt` times, each response correct with the
prompt's own P(correct) (`standins.solve_probability`), and the successes form the pool. Its
responses carry the stand-in generator's prompt ids (what RLEP's draw matches fresh groups by);
the prompts it lists as decoded also include their ids under the rehearsal's tokenizer (what the
controller checks a pool against at start).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from openrlhf_replay.rehearsal.standins import Settings, solve_probability, stand_in_prompt_ids
from openrlhf_replay.trainer.ppo_utils.prompt_identity import prompt_uid
from openrlhf_replay.trainer.ppo_utils.success_pool import (max_prompt_len, prompt_uids, tokenizer_fingerprint,
                                                            training_prompts)
from replay.pool import POOL_VERSION, SuccessPool, save_pool
from replay.record import RolloutBatch


def missing_pool(argv: list[str]) -> tuple[list[str], str | None]:
    """(argv without its `--replay.success_pool X`, X) when X names no file; else (argv, None)."""
    flag = "--replay.success_pool"
    at = [i for i, word in enumerate(argv) if word == flag]
    if not at or at[-1] + 1 >= len(argv) or Path(argv[at[-1] + 1]).exists():
        return argv, None
    path = argv[at[-1] + 1]
    return [w for i, w in enumerate(argv) if i not in at and i - 1 not in at], path


def build_stand_in_pool(args, tokenizer_dir: Path, settings: Settings, path: Path) -> int:
    """Write the stand-in pool of the run `args` to `path`; returns its number of successes."""
    dataset = args.data.prompt_dataset.split("@")[0].strip()
    if "," in args.data.prompt_dataset:
        raise ValueError("a stand-in success pool is built from one prompt file; give the pool file itself, "
                         "or one --data.prompt_dataset")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompts = training_prompts(args, dataset, tokenizer)
    budget = max_prompt_len(args.data.max_len, args.rollout.max_new_tokens)
    vocab, n, cap = len(tokenizer), args.rollout.n_samples_per_prompt, args.rollout.max_new_tokens
    rng = np.random.default_rng([settings.seed, 1])  # apart from the generator's own draws
    rows = {"prompts": [], "responses": [], "uids": [], "groups": []}
    decoded = []
    for group, prompt in enumerate(dict.fromkeys(prompts)):
        ids = stand_in_prompt_ids(prompt, vocab, settings)
        uid = prompt_uid(np.asarray(ids, np.int32))
        decoded.append(uid)
        for _ in range(int((rng.random(n) < solve_probability(prompt, settings)).sum())):
            length = int(min(rng.geometric(1 / settings.response_tokens), cap))
            rows["prompts"].append(ids)
            rows["responses"].append(rng.integers(3, vocab, length).tolist())
            rows["uids"].append(uid)
            rows["groups"].append(group)
    k = len(rows["prompts"])
    if not k:
        raise ValueError(f"the stand-in seed solved none of the {len(decoded)} prompts: rehearse with a "
                         "--solve-rate above 0 (REHEARSE_SOLVE_RATE)")
    rollouts = RolloutBatch.from_lists(
        rows["prompts"], rows["responses"], [[True] * len(r) for r in rows["responses"]],
        [(-rng.exponential(size=len(r))).tolist() for r in rows["responses"]], [1.0] * k, [0.0] * k,
        rows["uids"], rows["groups"], POOL_VERSION)
    listed = np.union1d(np.asarray(decoded, np.int64), prompt_uids(tokenizer, prompts, budget))
    save_pool(path, SuccessPool(rollouts, listed, tokenizer_fingerprint(tokenizer),
                                {"model": "the rehearsal's stand-in seed policy", "prompts": dataset}))
    return k
