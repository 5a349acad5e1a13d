"""The sample-efficiency lab's task and warm start: two-digit addition with a boxed answer.

Why this task: on this machine (2 cores, no GPU) a run must finish in a few minutes through the
real pipeline, so the policy is a 0.53M-parameter Qwen3 (`evaluation.models.build_tiny_qwen3`:
2 layers, hidden 128, with a byte-level tokenizer trained on the task so every digit is one
token). Plain supervised training on "What is a + b?" -> "\\boxed{a+b}" (under a minute) stops
at the first check (every 10 steps) whose held-out greedy accuracy reaches a target (default
0.3; accuracy jumps once addition "clicks", so it lands at 0.445 here): partly learned, with
room for GRPO to improve within a few dozen steps, and a reward (math-verify on the boxed answer, `evaluation/reward.py`)
that is exact. The held-out problems (pairs never used for training, by supervised or RL steps)
are graded by the evaluation harness's own backend and grader.

Everything is seeded and cached: the warm-started model is built once per recipe.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# OpenRLHF's `--data.input_template` ({} = the problem); the harness gets the same text with
# `{problem}`, so training and evaluation prompts are byte-identical.
PROMPT_TEMPLATE = "{}\nAnswer: "
HARNESS_TEMPLATE = PROMPT_TEMPLATE.replace("{}", "{problem}")


@dataclass(frozen=True)
class TaskConfig:
    """Which problems exist and how they are split."""

    low: int = 10
    """Smallest operand (inclusive)."""
    high: int = 99
    """Largest operand (inclusive)."""
    heldout_size: int = 200
    """Problems reserved for held-out evaluation, never trained on."""
    split_seed: int = 0
    """Seed of the shuffle that splits all (a, b) pairs into held-out and training pairs."""

    def __post_init__(self) -> None:
        pairs = (self.high - self.low + 1) ** 2
        if self.low < 0 or self.high <= self.low:
            raise ValueError(f"operands {self.low}..{self.high}: need 0 <= low < high")
        if not 0 < self.heldout_size < pairs // 2:
            raise ValueError(f"heldout_size={self.heldout_size}: need 0 < it < half of the {pairs} pairs")


def problem_text(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def response_text(a: int, b: int) -> str:
    return f"\\boxed{{{a + b}}}"


def split_pairs(cfg: TaskConfig) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(held-out pairs, training pairs): a seeded shuffle of every (a, b), disjoint."""
    pairs = [(a, b) for a in range(cfg.low, cfg.high + 1) for b in range(cfg.low, cfg.high + 1)]
    random.Random(cfg.split_seed).shuffle(pairs)
    return pairs[:cfg.heldout_size], pairs[cfg.heldout_size:]


def write_prompt_file(path: Path, pairs: list[tuple[int, int]]) -> Path:
    """JSONL of {"prompt", "answer"} rows: OpenRLHF's `--data.prompt_dataset` for the RL runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for a, b in pairs:
            f.write(json.dumps({"prompt": problem_text(a, b), "answer": str(a + b)}) + "\n")
    tmp.replace(path)
    return path


# ----------------------------------------------------------------------- held-out evaluation

@dataclass(frozen=True)
class HeldoutResult:
    accuracy: float
    """Share of held-out problems graded correct (greedy, one sample each)."""
    mean_response_tokens: float
    """Generated tokens per response, the stop token included (the harness's count)."""
    n: int
    """Problems evaluated."""
    seconds: float
    """Wall time of generation + grading."""


def evaluate_heldout(model_dir: Path | str, pairs: list[tuple[int, int]], *,
                     max_new_tokens: int = 16, backend: str = "hf") -> HeldoutResult:
    """Greedy accuracy on `pairs` with the harness's backend (`make_backend`) and grader.

    `hf` (transformers generate) is used by default: for a sub-million-parameter model it
    answers 200 problems in seconds, where starting a vLLM engine takes tens of seconds.
    Grading goes through the harness's bounded path, the process-wide pool that
    `evaluation.grader.grade` and `evaluation/reward.py` use (`shared_grader`: at most 10 s of
    a worker per answer). It is fetched before generating so that, on the first call, its
    workers start while the model generates; later calls reuse it.
    """
    from evaluation.generation import make_backend
    from evaluation.grader import Verdict, shared_grader

    t0 = time.perf_counter()
    grader = shared_grader()
    prompts = [HARNESS_TEMPLATE.replace("{problem}", problem_text(a, b)) for a, b in pairs]
    options = {"dtype": "float32", "batch_rows": 256} if backend == "hf" else {}
    with make_backend(backend, model_dir, **options) as engine:
        gens = [g[0] for g in engine.generate(prompts, n=1, temperature=0.0, max_new_tokens=max_new_tokens)]
    verdicts = grader.grade_many([(g.text, str(a + b)) for g, (a, b) in zip(gens, pairs)])
    correct = sum(v is Verdict.CORRECT for v in verdicts)
    return HeldoutResult(accuracy=correct / len(pairs),
                         mean_response_tokens=sum(g.n_tokens for g in gens) / len(gens),
                         n=len(pairs), seconds=time.perf_counter() - t0)


# ------------------------------------------------------------------------------- warm start

@dataclass(frozen=True)
class WarmStartConfig:
    """The supervised warm start: stop at the first check whose held-out accuracy >= target."""

    target_accuracy: float = 0.3
    max_steps: int = 4000
    batch_size: int = 64
    lr: float = 1e-3
    eval_every: int = 10
    """Accuracy jumps fast once addition "clicks" (0.17 -> 0.65 within 50 steps, seen here)."""
    seed: int = 0
    vocab_size: int = 300
    """Byte-level alphabet (256) + specials + a few dozen merges: digits stay single tokens."""
    hidden_size: int = 128
    num_hidden_layers: int = 2
    intermediate_size: int = 512
    """~0.5M parameters: a training step on this shared 2-core machine takes tens of ms."""


def _sft_batch(tokenizer, pairs, rng: random.Random, batch_size: int):
    """(input_ids, labels) with the prompt masked out of the loss: (B, T) each."""
    import torch

    rows = []
    for a, b in (pairs[rng.randrange(len(pairs))] for _ in range(batch_size)):
        prompt = tokenizer(PROMPT_TEMPLATE.format(problem_text(a, b)))["input_ids"]
        answer = tokenizer(response_text(a, b))["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt + answer, [-100] * len(prompt) + answer))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    return input_ids, labels


def warm_start(out_dir: Path, task: TaskConfig, cfg: WarmStartConfig, log=print) -> Path:
    """Build (once, cached by recipe) the supervised warm-started model at `out_dir`."""
    from evaluation.models import _build_once, build_tiny_qwen3

    heldout, train = split_pairs(task)
    recipe = {"task": asdict(task), "warm_start": asdict(cfg), "version": 1}
    corpus = [PROMPT_TEMPLATE.format(problem_text(a, b)) + response_text(a, b) for a, b in train]

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        base = build_tiny_qwen3(out_dir.parent / f"{out_dir.name}.random", corpus=corpus,
                                vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                                num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=32,
                                intermediate_size=cfg.intermediate_size, seed=cfg.seed)
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        # One thread: the model is tiny, and on a shared machine a second OpenMP thread that
        # spins on a preempted peer made steps ~10x slower (measured here).
        torch.set_num_threads(1)
        torch.manual_seed(cfg.seed)
        rng = random.Random(cfg.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
        history, t0 = [], time.perf_counter()
        for step in range(1, cfg.max_steps + 1):
            model.train()
            input_ids, labels = _sft_batch(tokenizer, train, rng, cfg.batch_size)
            # right padding with <|endoftext|>, which the task's texts never contain
            loss = model(input_ids=input_ids, attention_mask=(input_ids != tokenizer.pad_token_id).long(),
                         labels=labels).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % cfg.eval_every == 0 or step == cfg.max_steps:
                model.save_pretrained(tmp, safe_serialization=True)
                tokenizer.save_pretrained(tmp)
                model.generation_config.save_pretrained(tmp)
                result = evaluate_heldout(tmp, heldout)
                history.append({"step": step, "loss": loss.item(), "heldout_acc": result.accuracy,
                                "seconds": time.perf_counter() - t0})
                log(f"warm start: step {step} ({time.perf_counter() - t0:.0f} s) loss {loss.item():.3f} held-out acc {result.accuracy:.3f}")
                if result.accuracy >= cfg.target_accuracy:
                    break
        (tmp / "warm_start.json").write_text(json.dumps({"recipe": recipe, "history": history}, indent=1))

    return _build_once(out_dir, recipe, build)
