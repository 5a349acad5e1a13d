"""The sample-efficiency lab's task family and warm start: arithmetic with a boxed answer.

Why arithmetic: on this machine (2 cores, no GPU) a run must finish in about a minute through the
real pipeline, so the policy is a 0.53M-parameter Qwen3 (`infra.models.build_tiny_qwen3`:
2 layers, hidden 128, with a byte-level tokenizer trained on the task so every digit is one
token), and the reward (math-verify on the boxed answer, `evaluation/reward.py`) is exact.

Two families (`TaskConfig.family`):

- `mixed` (default): five difficulty bands, from two-digit plus one-digit addition (easy) to
  three-digit addition and two-digit times one-digit multiplication (hard). Prioritising
  rollouts by |advantage| only has something to choose between when difficulty varies: a rare
  success on a hard prompt, or a rare failure on an easy one, gets a large |A|. The held-out
  split and the RL prompt pool are stratified by band (equal counts per band).
- `add2`: "What is a + b?" with a, b in 10..99, the first edition's task; its split (all 8,100
  pairs shuffled once with seed 0, the first 200 held out) is reproduced exactly.

Supervised warm start: plain next-token training on the training problems (band drawn uniformly,
then a problem), stopping at the first check whose held-out greedy accuracy reaches a target:
partly learned, so GRPO has room to improve within a few dozen steps. The warm start is one model
shared by every condition and seed, cached by recipe.
"""
from __future__ import annotations

import json
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

# OpenRLHF's `--data.input_template` ({} = the problem); the harness gets the same text with
# `{problem}`, so training and evaluation prompts are byte-identical.
PROMPT_TEMPLATE = "{}\nAnswer: "
HARNESS_TEMPLATE = PROMPT_TEMPLATE.replace("{}", "{problem}")


@dataclass(frozen=True)
class Band:
    """One difficulty band: `a op b` with a, b in inclusive ranges (`-`: only b <= a)."""

    name: str
    op: str
    a_range: tuple[int, int]
    b_range: tuple[int, int]

    @property
    def size(self) -> int:
        """How many distinct problems the band has."""
        (a0, a1), (b0, b1) = self.a_range, self.b_range
        if self.op == "-":
            return sum(max(0, min(a, b1) - b0 + 1) for a in range(a0, a1 + 1))
        return (a1 - a0 + 1) * (b1 - b0 + 1)

    def problems(self, seed: int, cap: int) -> list["Problem"]:
        """Every problem of the band in a seeded random order; a band larger than `cap` gives
        `cap` distinct problems drawn at random instead (three-digit addition has 810,000)."""
        (a0, a1), (b0, b1) = self.a_range, self.b_range
        rng = random.Random(seed)
        if self.size <= cap:
            pairs = [(a, b) for a in range(a0, a1 + 1) for b in range(b0, b1 + 1) if self.op != "-" or b <= a]
            rng.shuffle(pairs)
        else:
            if self.op == "-":
                raise ValueError(f"band {self.name}: a subtraction band must have at most {cap} problems")
            nb = b1 - b0 + 1
            pairs = [(a0 + i // nb, b0 + i % nb) for i in rng.sample(range(self.size), cap)]
        return [Problem(a, self.op, b, self.name) for a, b in pairs]


@dataclass(frozen=True)
class Problem:
    """One arithmetic problem and the band it belongs to."""

    a: int
    op: str
    b: int
    band: str

    @property
    def text(self) -> str:
        return f"What is {self.a} {self.op} {self.b}?"

    @property
    def answer(self) -> str:
        return str({"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op])


FAMILIES: dict[str, tuple[Band, ...]] = {
    "mixed": (
        Band("add 2d+1d", "+", (10, 99), (1, 9)),
        Band("add 2d+2d", "+", (10, 99), (10, 99)),
        Band("sub 2d-2d", "-", (10, 99), (10, 99)),
        Band("add 3d+3d", "+", (100, 999), (100, 999)),
        Band("mul 2d*1d", "*", (10, 99), (2, 9)),
    ),
    "add2": (Band("add 2d+2d", "+", (10, 99), (10, 99)),),
}


@dataclass(frozen=True)
class TaskConfig:
    """Which problems exist and how they are split."""

    family: str = "mixed"
    """`mixed` (five difficulty bands) or `add2` (the first edition's two-digit addition)."""
    heldout_size: int = 500
    """Problems reserved for held-out evaluation, never trained on: an equal share per band."""
    split_seed: int = 0
    """Seed of the shuffle that splits each band's problems into held-out and training ones."""
    max_problems_per_band: int = 20000
    """A larger band is represented by this many problems drawn at random."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r}: use one of {', '.join(FAMILIES)}")
        if self.heldout_size % len(self.bands):
            raise ValueError(f"heldout_size={self.heldout_size} must split evenly over the "
                             f"{len(self.bands)} bands of {self.family}")
        smallest = min(min(b.size, self.max_problems_per_band) for b in self.bands)
        if not 0 < self.heldout_per_band < smallest // 2:
            raise ValueError(f"heldout_size={self.heldout_size}: {self.heldout_per_band} per band must be "
                             f"above 0 and below half of the smallest band ({smallest} problems)")

    @property
    def bands(self) -> tuple[Band, ...]:
        return FAMILIES[self.family]

    @property
    def heldout_per_band(self) -> int:
        return self.heldout_size // len(self.bands)


@dataclass(frozen=True)
class Split:
    """Held-out problems (band after band) and each band's training problems (disjoint)."""

    heldout: list[Problem]
    train: dict[str, list[Problem]] = field(default_factory=dict)

    def pool(self, size: int) -> list[Problem]:
        """The RL prompt pool: the first size / bands training problems of every band, taken in
        turn (a, b, c, ..., a, b, c, ...). `size` must split evenly over the bands."""
        bands = list(self.train)
        if size % len(bands) or size // len(bands) > min(len(p) for p in self.train.values()):
            raise ValueError(f"a pool of {size} prompts does not split evenly over {len(bands)} bands "
                             f"or is larger than a band's training problems")
        per_band = size // len(bands)
        return [self.train[b][i] for i in range(per_band) for b in bands]


def split_problems(cfg: TaskConfig) -> Split:
    """Each band's problems in a seeded order: the first `heldout_per_band` are held out."""
    heldout, train = [], {}
    for band in cfg.bands:
        problems = band.problems(cfg.split_seed, cfg.max_problems_per_band)
        heldout += problems[:cfg.heldout_per_band]
        train[band.name] = problems[cfg.heldout_per_band:]
    return Split(heldout, train)


def as_problem(item) -> Problem:
    """A Problem as is; an (a, b) pair of ints as the first edition's `a + b`."""
    if isinstance(item, Problem):
        return item
    a, b = item
    return Problem(a, "+", b, "add 2d+2d")


def write_prompt_file(path: Path, problems: Sequence[Problem]) -> Path:
    """JSONL of {"prompt", "answer", "band"} rows: OpenRLHF's `--data.prompt_dataset`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for p in problems:
            f.write(json.dumps({"prompt": p.text, "answer": p.answer, "band": p.band}) + "\n")
    tmp.replace(path)
    return path


# ----------------------------------------------------------------------- held-out evaluation

@dataclass(frozen=True)
class HeldoutResult:
    accuracy: float
    """The primary metric: the mean over problems of the share of `samples` answers graded
    correct, sampled at `temperature` (avg@k)."""
    accuracy_greedy: float
    """Share of problems whose greedy answer is graded correct."""
    mean_response_tokens: float
    """Generated tokens per sampled response, the stop token included (the harness's count)."""
    n: int
    """Problems evaluated."""
    samples: int
    """Sampled answers per problem."""
    temperature: float
    """Sampling temperature of the primary metric."""
    seconds: float
    """Wall time of generation + grading."""
    by_band: dict[str, float] = field(default_factory=dict)
    """The primary metric within each band (bands in the order they first appear)."""
    by_band_greedy: dict[str, float] = field(default_factory=dict)
    """Greedy accuracy within each band."""


def _sample_and_grade(model_dir, problems: list[Problem], runs: Sequence[tuple[int, float, int | list[int]]], *,
                      max_new_tokens: int) -> list[tuple[list[list[bool]], list[list[int]]]]:
    """For each (n, temperature, seed) of `runs`, n answers per problem from the harness's backend,
    graded by its bounded pool: (correct flags, token counts), each (problems, n). `seed`: one base
    seed, or one per problem. The model is loaded once and every answer graded in one batch."""
    from evaluation.generation import make_backend
    from evaluation.grader import shared_grader
    from evaluation.verify import Verdict

    # Fetched before generating so that, on the first call, the pool's workers start while the
    # model generates; later calls reuse it. At most 10 s of a worker per answer.
    grader = shared_grader()
    prompts = [HARNESS_TEMPLATE.replace("{problem}", p.text) for p in problems]
    # `hf` (transformers generate): for a sub-million-parameter model it answers hundreds of
    # problems in a second, where starting a vLLM engine takes tens of seconds.
    with make_backend("hf", model_dir, dtype="float32", batch_rows=256) as engine:
        gens = [engine.generate(prompts, n=n, temperature=temperature, max_new_tokens=max_new_tokens,
                                **({"seed": seed} if temperature > 0 else {}))  # greedy needs no seed
                for n, temperature, seed in runs]
    verdicts = iter(grader.grade_many([(g.text, p.answer) for run in gens for gs, p in zip(run, problems)
                                       for g in gs]))
    return [([[next(verdicts) is Verdict.CORRECT for _ in gs] for gs in run],
             [[g.n_tokens for g in gs] for gs in run]) for run in gens]


def _by_band(problems: Sequence[Problem], scores: Sequence[float]) -> dict[str, float]:
    bands: dict[str, list[float]] = {}
    for p, v in zip(problems, scores):
        bands.setdefault(p.band, []).append(v)
    return {b: sum(v) / len(v) for b, v in bands.items()}


def evaluate_heldout(model_dir: Path | str, problems: Sequence, *, samples: int = 8, temperature: float = 1.0,
                     seed: int = 0, max_new_tokens: int = 16) -> HeldoutResult:
    """Held-out accuracy on `problems` (Problems, or (a, b) pairs meaning a + b), overall and per
    band: avg@`samples` at `temperature` (the primary metric) and greedy, with the harness's
    backend (`make_backend("hf")`) and its bounded grading pool.

    A problem's samples are seeded from (`seed`, its text) alone, so every model evaluated on it
    draws the same random numbers: checkpoints of different conditions at the same step differ
    by their weights, not by sampling luck, and their paired differences carry less noise."""
    from evaluation.generation import derive_seed

    problems = [as_problem(p) for p in problems]
    if samples < 1 or temperature <= 0:
        raise ValueError(f"samples={samples}, temperature={temperature}: the primary metric needs "
                         "samples >= 1 at a temperature > 0 (greedy is measured beside it)")
    t0 = time.perf_counter()
    seeds = [derive_seed(seed, p.text) for p in problems]
    runs = [(1, 0.0, 0), (samples, temperature, seeds)]  # greedy, then the primary metric's samples
    (greedy, _), (sampled, tokens) = _sample_and_grade(model_dir, problems, runs, max_new_tokens=max_new_tokens)
    greedy = [c[0] for c in greedy]
    per_problem = [sum(c) / samples for c in sampled]
    return HeldoutResult(accuracy=sum(per_problem) / len(problems),
                         accuracy_greedy=sum(greedy) / len(problems),
                         mean_response_tokens=sum(map(sum, tokens)) / (len(problems) * samples),
                         n=len(problems), samples=samples, temperature=temperature,
                         seconds=time.perf_counter() - t0,
                         by_band=_by_band(problems, per_problem),
                         by_band_greedy=_by_band(problems, greedy))


def greedy_correct(model_dir: Path | str, problems: Sequence, *, max_new_tokens: int = 16) -> list[bool]:
    """Whether each problem's greedy answer is graded correct."""
    [(correct, _)] = _sample_and_grade(model_dir, [as_problem(p) for p in problems], [(1, 0.0, 0)],
                                       max_new_tokens=max_new_tokens)
    return [c[0] for c in correct]


def success_rates(model_dir: Path | str, problems: Sequence[Problem], *, n: int = 8, temperature: float = 1.0,
                  max_new_tokens: int = 16, seed: int = 0) -> list[float]:
    """Per-problem success rate over `n` sampled answers: what a GRPO group of `n` sees at the start."""
    [(correct, _)] = _sample_and_grade(model_dir, list(problems), [(n, temperature, seed)],
                                       max_new_tokens=max_new_tokens)
    return [sum(c) / n for c in correct]


def rate_histogram(problems: Sequence[Problem], rates: Sequence[float], n: int) -> dict[str, list[int]]:
    """Counts of problems at each success rate 0/n, 1/n, ..., n/n, per band and over "all"."""
    hist: dict[str, list[int]] = {"all": [0] * (n + 1)}
    for p, r in zip(problems, rates):
        k = round(r * n)
        hist.setdefault(p.band, [0] * (n + 1))[k] += 1
        hist["all"][k] += 1
    return hist


# ------------------------------------------------------------------------------- warm start

@dataclass(frozen=True)
class WarmStartConfig:
    """The supervised warm start: stop at the first check whose held-out accuracy >= target."""

    # One setting a line, as every config dataclass here: runs of them share a shape, not content.
    target_accuracy: float = 0.3
    max_steps: int = 4000
    batch_size: int = 64
    lr: float = 1e-3
    eval_every: int = 10
    """Accuracy jumps fast once a skill "clicks" (two-digit addition: 0.17 -> 0.65 within 50 steps)."""
    seed: int = 0
    vocab_size: int = 300
    """Byte-level alphabet (256) + specials + a few dozen merges."""
    split_digits: bool = True
    """Train the tokenizer on the texts with their digits removed, so that no merge holds a digit
    and every digit is one token (checked). False: the first edition's tokenizer, whose merges
    made some numbers partly one token (`10`..`17`, ` 38`, ...); kept for rerunning `add2`."""
    hidden_size: int = 128
    num_hidden_layers: int = 2
    intermediate_size: int = 512
    """~0.5M parameters: a training step on this shared 2-core machine takes tens of ms."""


def _sft_batch(tokenizer, train: Mapping[str, list[Problem]], rng: random.Random, batch_size: int):
    """(input_ids, labels) with the prompt masked out of the loss: (B, T) each. A band is drawn
    uniformly, then one of its problems (one band: no band draw, as the first edition)."""
    import torch

    bands = list(train.values())
    rows = []
    for _ in range(batch_size):
        problems = bands[rng.randrange(len(bands))] if len(bands) > 1 else bands[0]
        p = problems[rng.randrange(len(problems))]
        prompt = tokenizer(PROMPT_TEMPLATE.format(p.text))["input_ids"]
        answer = tokenizer(f"\\boxed{{{p.answer}}}")["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt + answer, [-100] * len(prompt) + answer))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    return input_ids, labels


def _check_digits_are_single_tokens(tokenizer) -> None:
    """Every token holding a digit is that digit alone: a merge like "12" would make some numbers
    one token and others two, a second, accidental axis of difficulty."""
    bad = [t for t in tokenizer.get_vocab() if any(c.isdigit() for c in t) and len(t) > 1]
    if bad:
        raise ValueError(f"the task tokenizer merged digits into {bad[:5]}: lower WarmStartConfig.vocab_size")


def warm_start(out_dir: Path, task: TaskConfig, cfg: WarmStartConfig, log=print) -> Path:
    """Build (once, cached by recipe) the supervised warm-started model at `out_dir`."""
    from infra.models import build_once, build_tiny_qwen3

    split = split_problems(task)
    recipe = {"task": asdict(task), "warm_start": asdict(cfg), "version": 2}
    corpus = [PROMPT_TEMPLATE.format(p.text) + f"\\boxed{{{p.answer}}}" for ps in split.train.values() for p in ps]
    if cfg.split_digits:
        corpus = [re.sub(r"[0-9]", "", text) for text in corpus]

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        base = build_tiny_qwen3(out_dir.parent / f"{out_dir.name}.random", corpus=corpus,
                                vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                                num_hidden_layers=cfg.num_hidden_layers,
                                num_attention_heads=cfg.hidden_size // 32,
                                num_key_value_heads=cfg.hidden_size // 64, head_dim=32,
                                intermediate_size=cfg.intermediate_size, seed=cfg.seed)
        tokenizer = AutoTokenizer.from_pretrained(base)
        if cfg.split_digits:
            _check_digits_are_single_tokens(tokenizer)
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
            input_ids, labels = _sft_batch(tokenizer, split.train, rng, cfg.batch_size)
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
                # the stopping rule reads greedy accuracy: cheap, and the targets were set on it
                correct = greedy_correct(tmp, split.heldout)
                accuracy, by_band = sum(correct) / len(correct), _by_band(split.heldout, correct)
                history.append({"step": step, "loss": loss.item(), "heldout_acc": accuracy,
                                "by_band": by_band, "seconds": time.perf_counter() - t0})
                bands = " ".join(f"{v:.2f}" for v in by_band.values())
                log(f"warm start: step {step} ({time.perf_counter() - t0:.0f} s) loss {loss.item():.3f} "
                    f"held-out greedy acc {accuracy:.3f}" + (f" (bands {bands})" if len(by_band) > 1 else ""))
                if accuracy >= cfg.target_accuracy:
                    break
        (tmp / "warm_start.json").write_text(json.dumps({"recipe": recipe, "history": history}, indent=1))

    return build_once(out_dir, recipe, build)
