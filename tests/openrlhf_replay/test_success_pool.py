"""An RLEP pool belongs to one tokenizer and one prompt set: the dry run and the trainer's start
refuse another's, and accept the pool built for the run (real tokenizer, upstream's templates)."""
import json

import numpy as np
import pytest

from openrlhf_replay.trainer.ppo_utils.success_pool import (
    check_success_pool,
    dry_run_pool_errors,
    max_prompt_len,
    prompt_uids,
    tokenizer_fingerprint,
)
from replay.pool import POOL_VERSION, SuccessPool, SuccessPoolError, save_pool
from replay.record import RolloutBatch

SMALL = dict(vocab_size=400, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, intermediate_size=128)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from infra.models import build_tiny_qwen3

    corpus = [f"Sam has {a} apples and buys {a + 1} more. The answer is \\boxed{{{2 * a + 1}}}." for a in range(40)]
    return build_tiny_qwen3(tmp_path_factory.mktemp("tok") / "tiny", corpus=corpus, **SMALL)


def _prompt_file(path, first: int) -> list[str]:
    texts = [f"Sam has {a} apples and buys {a + 1} more. How many?" for a in range(first, first + 8)]
    path.write_text("".join(json.dumps({"prompt": t, "label": "1"}) + "\n" for t in texts))
    return texts


def _pool_for(tokenizer, prompts: list[str], fingerprint: str | None = None) -> SuccessPool:
    """A pool as the builder writes one for these prompt texts: one success per prompt."""
    budget = max_prompt_len(128, 16)
    uids = prompt_uids(tokenizer, prompts, budget)
    ids = [tokenizer(text=p, add_special_tokens=False)["input_ids"] for p in prompts]
    rollouts = RolloutBatch.from_lists(ids, [[5, 6]] * len(ids), [[True, True]] * len(ids), [[-1.0, -1.0]] * len(ids),
                                       [1.0] * len(ids), [0.0] * len(ids), uids.tolist(), list(range(len(ids))),
                                       POOL_VERSION)
    return SuccessPool(rollouts, uids, fingerprint or tokenizer_fingerprint(tokenizer), {"prompts": "p.jsonl"})


def test_a_pool_is_checked_against_the_runs_tokenizer_and_prompts(tmp_path, tokenizer_dir, make_args):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    texts = _prompt_file(tmp_path / "train.jsonl", 0)
    _prompt_file(tmp_path / "other.jsonl", 100)
    chat = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts]
    good, plain = tmp_path / "good.npz", tmp_path / "plain.npz"
    save_pool(good, _pool_for(tokenizer, chat))
    save_pool(plain, _pool_for(tokenizer, texts))  # built without the chat template
    foreign = tmp_path / "foreign.npz"
    save_pool(foreign, _pool_for(tokenizer, chat, fingerprint="0" * 64))

    def errors(pool, data="train.jsonl"):
        args = make_args("--actor.model_name_or_path", tokenizer_dir, "--data.prompt_dataset", tmp_path / data,
                         "--data.input_key", "prompt", "--data.label_key", "label", "--data.apply_chat_template",
                         "--data.max_len", 128, "--rollout.max_new_tokens", 16, "--replay.mode", "success",
                         "--replay.success_pool", pool)
        return dry_run_pool_errors(args)

    assert errors(good) == []
    [e] = errors(plain)
    assert "another prompt set: 8 of the run's 8 training prompts were never decoded" in e
    assert "--data.apply_chat_template" in e
    [e] = errors(good, data="other.jsonl")
    assert "another prompt set" in e and "rebuild it with build_success_pool" in e
    [e] = errors(foreign)
    assert "another tokenizer" in e
    # The trainer's own check at start, on the prompt texts its dataset holds.
    check_success_pool(_pool_for(tokenizer, chat), tokenizer, chat, max_prompt_len(128, 16))
    with pytest.raises(SuccessPoolError, match="another prompt set"):
        check_success_pool(_pool_for(tokenizer, chat[:4]), tokenizer, chat, max_prompt_len(128, 16))
    assert np.array_equal(prompt_uids(tokenizer, chat), prompt_uids(tokenizer, chat, 10_000))
