"""`python -m openrlhf_replay.cli.build_success_pool`: RLEP's experience pool, built before training.

As in RLEP (Kwai-Klear/RLEP, README and `recipe/rlep/rlep_training.sh`): a seed checkpoint (e.g.
the end of a plain GRPO run) decodes every training prompt several times, a verifier grades each
response, and the verified successes form the pool that `--replay.success_pool POOL` replays
from the first step after the warm-up.

    python -m openrlhf_replay.cli.build_success_pool --model CKPT --prompts train.jsonl \\
        --input-key problem --label-key answer --input-template '...' --out pool.npz

Prompts are read and templated as the training run reads them (the same flags as
`--data.input_key`, `--data.label_key`, `--data.input_template`, `--data.apply_chat_template`,
`--data.max_samples`, upstream's `preprocess_data`) and tokenized as upstream tokenizes them for
vLLM, so a pool prompt is the run's prompt token for token. Generation runs in vLLM through the
repository's engine set-up (`evaluation/generation.py:VLLMBackend`, CPU or GPU); grading calls the
reward file the run uses (`--reward`, by default `evaluation/reward.py`: math-verify in worker
processes) with upstream's arguments. The pool file's format is described in `replay/pool.py`;
it is written atomically, an existing file is replaced only with `--overwrite`, and a file that
is not a pool is never replaced.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from evaluation.generation import VLLMBackend
from openrlhf_replay.cli.prompts import prompt_file_problems
from openrlhf_replay.datasets.prompt_files import file_rows
from openrlhf_replay.trainer.ppo_utils.success_pool import (max_prompt_len, prompt_token_ids, prompt_uids,
                                                            tokenizer_fingerprint, upstream_preprocess_data)
from replay.pool import POOL_VERSION, SuccessPool, SuccessPoolError, save_pool
from replay.record import RolloutBatch

# vLLM, torch and transformers are imported where the pool is decoded and graded, so `--help` and
# the argument checks answer at once.

DEFAULT_REWARD = Path(__file__).resolve().parents[2] / "evaluation" / "reward.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m openrlhf_replay.cli.build_success_pool", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the seed checkpoint (a Hugging Face model folder) that decodes")
    p.add_argument("--prompts", required=True, help="the training prompt file (.json / .jsonl), as --data.prompt_dataset")
    p.add_argument("--out", required=True, help="the pool file to write (an npz; see replay/pool.py)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it is an existing pool file")
    p.add_argument("--input-key", default="input", help="row key of the prompt, as --data.input_key")
    p.add_argument("--label-key", default="label", help="row key of the gold answer, as --data.label_key")
    p.add_argument("--input-template", default=None, help="prompt template with one {}, as --data.input_template")
    p.add_argument("--apply-chat-template", action="store_true",
                   help="wrap prompts in the tokenizer's chat template, as --data.apply_chat_template")
    p.add_argument("--max-samples", type=int, default=None, help="decode only the first N prompts, as --data.max_samples")
    p.add_argument("--samples-per-prompt", type=int, default=8, help="responses decoded per prompt (default 8)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0, as training)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0, as training)")
    p.add_argument("--max-len", type=int, default=2048, help="prompt + response tokens at most, as --data.max_len")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="response tokens at most, as --rollout.max_new_tokens")
    p.add_argument("--reward", default=str(DEFAULT_REWARD),
                   help="reward file with reward_func(queries, prompts, labels), as --reward.remote_url "
                        "(default: evaluation/reward.py, math-verify)")
    p.add_argument("--success-threshold", type=float, default=0.5,
                   help="a response is a success when its reward > this, as --replay.success_threshold")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (per prompt: seed + prompt index)")
    p.add_argument("--backend", choices=("vllm", "hf"), default="vllm",
                   help="vllm (default; the repository's engine set-up, CPU or GPU) or hf (transformers' "
                        "generate, one prompt at a time: for small models and tests)")
    p.add_argument("--dtype", default="auto", help="compute dtype (auto: vLLM's choice for the machine; "
                                                   "hf: the checkpoint's own)")
    p.add_argument("--grade-batch", type=int, default=256, help="responses per reward_func call (default 256)")
    return p


def read_prompts(a) -> tuple[list[str], list]:
    """(prompt texts after upstream's templates, gold labels) of the prompt file; SystemExit on a bad file."""
    from transformers import AutoTokenizer

    data = SimpleNamespace(prompt_dataset=a.prompts, input_key=a.input_key, label_key=a.label_key,
                           apply_chat_template=a.apply_chat_template)
    if not Path(a.prompts).is_file():
        sys.exit(f"build_success_pool: --prompts {a.prompts}: no such file")
    errors = prompt_file_problems(SimpleNamespace(data=data))[0]
    if errors:
        sys.exit("build_success_pool: cannot read the prompts:\n  - " + "\n  - ".join(errors))
    rows = [row for _, row in file_rows(a.prompts)][: a.max_samples]
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    chat = tokenizer.apply_chat_template if a.apply_chat_template else None
    preprocess_data = upstream_preprocess_data()
    pairs = [preprocess_data(row, a.input_template, a.input_key, a.label_key, chat) for row in rows]
    return [p for p, _ in pairs], [label for _, label in pairs]


def load_reward(path: str):
    """`reward_func` of a reward file, loaded by path as upstream loads `--reward.remote_url`."""
    spec = importlib.util.spec_from_file_location("reward_func", path)
    if spec is None or not Path(path).is_file():
        sys.exit(f"build_success_pool: --reward {path}: no such file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "reward_func"):
        sys.exit(f"build_success_pool: --reward {path} defines no reward_func(queries, prompts, labels)")
    return module.reward_func


def decode(a, prompt_ids: list[list[int]]) -> list[list[tuple[list[int], list[float]]]]:
    """For each prompt, its `samples_per_prompt` responses as (token ids, sampling log-probs)."""
    from vllm import SamplingParams

    backend = VLLMBackend(a.model, dtype=a.dtype, max_model_len=a.max_len, engine_seed=a.seed)
    try:
        params = [SamplingParams(n=a.samples_per_prompt, temperature=a.temperature, top_p=a.top_p, seed=a.seed + i,
                                 max_tokens=max(1, min(a.max_new_tokens, a.max_len - len(ids))), logprobs=1)
                  for i, ids in enumerate(prompt_ids)]
        outputs = backend.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    finally:
        backend.close()
    return [[(list(c.token_ids), [step[t].logprob for t, step in zip(c.token_ids, c.logprobs)])
             for c in sorted(out.outputs, key=lambda c: c.index)] for out in outputs]


def decode_hf(a, prompt_ids: list[list[int]]) -> list[list[tuple[list[int], list[float]]]]:
    """`decode` with transformers' `generate` (top-k off, as vLLM samples in training); the
    log-probs are the model's, after temperature and top-p, of the sampled tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype="auto" if a.dtype == "auto" else a.dtype)
    stops = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
                else [model.generation_config.eos_token_id])
    out = []
    for i, ids in enumerate(prompt_ids):
        torch.manual_seed(a.seed + i)
        x = torch.tensor([ids])
        with torch.no_grad():
            g = model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=a.temperature,
                               top_p=a.top_p, top_k=0, num_return_sequences=a.samples_per_prompt,
                               max_new_tokens=max(1, min(a.max_new_tokens, a.max_len - len(ids))),
                               output_scores=True, return_dict_in_generate=True)
        new = g.sequences[:, len(ids):]  # (n, T)
        logp = torch.stack(g.scores, 1).float().log_softmax(-1).gather(-1, new[..., None]).squeeze(-1)
        group = []
        for row, lp in zip(new.tolist(), logp.tolist()):
            end = next((t + 1 for t, tok in enumerate(row) if tok in stops), len(row))
            group.append((row[:end], lp[:end]))
        out.append(group)
    return out


def grade(a, tokenizer, prompts, labels, prompt_ids, responses) -> np.ndarray:
    """(P, n) rewards: `reward_func` on the decoded prompt + response (special tokens kept), the
    prompt text and the label, as upstream calls it."""
    reward_func = load_reward(a.reward)
    items = [(tokenizer.decode(prompt_ids[i] + ids, skip_special_tokens=False), prompts[i], labels[i])
             for i, group in enumerate(responses) for ids, _ in group]
    rewards = []
    for lo in range(0, len(items), a.grade_batch):
        part = items[lo: lo + a.grade_batch]
        out = reward_func([q for q, _, _ in part], [p for _, p, _ in part], [lab for _, _, lab in part])
        rewards += [float(r) for r in out["rewards"]]
    return np.asarray(rewards, np.float32).reshape(len(responses), a.samples_per_prompt)


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    a = build_parser().parse_args(argv)
    if a.samples_per_prompt < 1 or a.max_new_tokens < 1 or a.max_len < 2 or a.grade_batch < 1:
        sys.exit("build_success_pool: --samples-per-prompt, --max-new-tokens, --grade-batch must be >= 1 and "
                 "--max-len >= 2")
    if Path(a.out).exists() and not a.overwrite:
        sys.exit(f"build_success_pool: {a.out} exists; pass --overwrite to replace it, or choose another --out")
    t0 = time.monotonic()
    prompts, labels = read_prompts(a)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    budget = max_prompt_len(a.max_len, a.max_new_tokens)
    ids = [prompt_token_ids(tokenizer, p, budget) for p in prompts]
    responses = decode(a, ids) if a.backend == "vllm" else decode_hf(a, ids)
    rewards = grade(a, tokenizer, prompts, labels, ids, responses)
    uids = prompt_uids(tokenizer, prompts, budget)
    keep = [(i, j) for i in range(len(prompts)) for j in range(a.samples_per_prompt) if rewards[i, j] > a.success_threshold]
    if not keep:
        sys.exit(f"build_success_pool: none of the {rewards.size} responses to {len(prompts)} prompts is a success "
                 f"(reward > {a.success_threshold}); nothing written. Use a stronger --model, more "
                 "--samples-per-prompt, or check --reward and --label-key")
    rollouts = RolloutBatch.from_lists(
        [ids[i] for i, _ in keep], [responses[i][j][0] for i, j in keep],
        [[True] * len(responses[i][j][0]) for i, j in keep], [responses[i][j][1] for i, j in keep],
        [rewards[i, j] for i, j in keep], [0.0] * len(keep), [int(uids[i]) for i, _ in keep],
        [i for i, _ in keep], POOL_VERSION)
    build = {"model": str(a.model), "prompts": str(a.prompts), "samples_per_prompt": a.samples_per_prompt,
             "temperature": a.temperature, "top_p": a.top_p, "max_len": a.max_len, "max_new_tokens": a.max_new_tokens,
             "reward": str(a.reward), "success_threshold": a.success_threshold, "seed": a.seed,
             "backend": a.backend, "input_key": a.input_key, "input_template": a.input_template, "apply_chat_template": a.apply_chat_template}
    pool = SuccessPool(rollouts, uids, tokenizer_fingerprint(tokenizer), build)
    try:
        save_pool(a.out, pool, overwrite=a.overwrite)
    except SuccessPoolError as e:
        sys.exit(f"build_success_pool: {e}")
    solved = len({i for i, _ in keep})
    print(f"build_success_pool: {len(keep)} successes of {rewards.size} responses; {solved} of {len(prompts)} "
          f"prompts solved at least once -> {a.out} ({time.monotonic() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
