"""Throughput of the evaluation harness: grading rate, and generation overhead over bare vLLM.

1. Grading: `Grader.grade_many` over a realistic mix of responses built from real benchmark
   rows (correct boxed solutions, boxed wrong answers, solutions cut off before their box,
   GSM8K-style "#### n" endings, long unboxed rambling); reported per worker, start-up excluded.
2. Generation: the harness's `VLLMBackend.generate` against a bare `vllm.LLM.generate` on the
   same rendered prompts, in the same engine (same settings), greedy, alternating the two for
   `--rounds` rounds after a warm-up; tokens/s of each from their own token counts.

    python benchmarks/eval_throughput.py [--model smollm2] [--prompts 32] [--max-new-tokens 128]

The last line printed is one JSON object with at least grade_per_s, harness_tok_s, bare_tok_s
and harness_over_bare (the target is >= 0.95).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluation import benchmarks  # noqa: E402
from infra.datasources import default_data_dir  # noqa: E402
from infra.models import resolve_model  # noqa: E402
from infra.datasources import load_hub  # noqa: E402
from infra.errors import UserError  # noqa: E402


def math500_solutions(data_dir: Path | None) -> list[str]:
    """MATH-500's reference solutions, in file order: the local file, else the hub's copy."""
    path = data_dir / "math500/test.jsonl" if data_dir is not None else None
    if path is not None and path.is_file():
        return [json.loads(line)["solution"] for line in path.read_text().splitlines() if line.strip()]
    hub = benchmarks.HUB_IDS["math500"]
    rows = load_hub(hub.path, hub.config, hub.split, missing=f"MATH-500: no file {path}",
                    provide="Pass --data-dir DIR with DIR/math500/test.jsonl (one JSON object per "
                            "line with `problem`, `answer` and `solution`).")
    return list(rows["solution"])


def response_mix(data_dir: Path | None, count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(response, gold) pairs in roughly the proportions a weak-to-mid model produces."""
    rng = random.Random(seed)
    math = benchmarks.load("math500", data_dir)
    gsm = benchmarks.load("gsm8k", data_dir)
    solutions = math500_solutions(data_dir)
    pairs = []
    for i in range(count):
        k = rng.randrange(len(math))
        problem, solution = math[k], solutions[k]
        kind = i % 10
        if kind < 3:  # correct, boxed
            pairs.append((solution, problem.answer))
        elif kind < 6:  # boxed, but another problem's answer
            wrong = math[(k + 1) % len(math)].answer
            pairs.append((f"{solution[:solution.rfind(chr(92) + 'boxed')]}\\boxed{{{wrong}}}",
                          problem.answer))
        elif kind < 8:  # truncated before the box
            pairs.append((solution[: len(solution) // 2], problem.answer))
        elif kind < 9:  # GSM8K style: "#### 72", no box
            g = gsm[rng.randrange(len(gsm))]
            pairs.append((f"Let's compute step by step. The total is {g.answer}.\n#### {g.answer}",
                          g.answer))
        else:  # long unboxed rambling, as truncated samples look
            pairs.append((" ".join(rng.choice(solutions)[:400] for _ in range(6)), problem.answer))
    return pairs


def grading_rate(pairs: list[tuple[str, str]], workers: int, timeout_s: float) -> dict:
    """Samples graded per second (total and per worker), worker start-up excluded."""
    from evaluation.grader import Grader

    with Grader(workers=workers, timeout_s=timeout_s) as grader:
        grader.grade_many(pairs[:workers * 2])  # workers started and math-verify imported
        start = time.perf_counter()
        verdicts = grader.grade_many(pairs)
        elapsed = time.perf_counter() - start
    counts = {v.value: sum(x is v for x in verdicts) for v in set(verdicts)}
    return {"grade_per_s": len(pairs) / elapsed / workers, "grade_total_per_s": len(pairs) / elapsed,
            "grade_workers": workers, "graded": len(pairs), "verdicts": counts}


def generation_rates(model: str, prompts_n: int, max_new_tokens: int, rounds: int,
                     data_dir: Path) -> dict:
    """Harness vs bare vLLM tokens/s on the same prompts and engine."""
    from vllm import SamplingParams

    from evaluation.generation import VLLMBackend
    from evaluation.prompting import resolve_template

    backend = VLLMBackend(model)
    try:
        template = resolve_template("auto", backend.tokenizer)
        problems = benchmarks.load("math500", data_dir)[:prompts_n]
        prompts = [template.render(p.problem) for p in problems]
        bare_params = SamplingParams(n=1, temperature=0.0, max_tokens=max_new_tokens)

        def harness() -> int:
            gens = backend.generate(prompts, n=1, temperature=0.0, max_new_tokens=max_new_tokens)
            return sum(g[0].n_tokens for g in gens)

        def bare() -> int:
            outputs = backend.llm.generate(prompts, bare_params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outputs)

        backend.generate(prompts, max_new_tokens=8)  # warm-up; every prompt prefix now cached
        rates: dict[str, list[float]] = {"harness": [], "bare": []}
        tokens: dict[str, int] = {}
        for r in range(rounds):
            for name, fn in (("harness", harness), ("bare", bare))[:: 1 if r % 2 == 0 else -1]:
                start = time.perf_counter()
                tokens[name] = fn()
                rates[name].append(tokens[name] / (time.perf_counter() - start))
    finally:
        backend.close()
    harness_tok_s, bare_tok_s = statistics.median(rates["harness"]), statistics.median(rates["bare"])
    return {"harness_tok_s": harness_tok_s, "bare_tok_s": bare_tok_s,
            "harness_over_bare": harness_tok_s / bare_tok_s, "rounds": rates,
            "tokens_per_round": tokens, "prompts": prompts_n, "max_new_tokens": max_new_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="model dir, or smollm2 (default)")
    parser.add_argument("--data-dir", default=default_data_dir(),
                        help="folder with <benchmark>/test.jsonl (default: the data folder's "
                        "benchmarks/, else the hub's copies)")
    parser.add_argument("--prompts", type=int, default=32, help="MATH-500 prompts per round")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per response")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed rounds of each, alternating order; medians are reported")
    parser.add_argument("--grade-samples", type=int, default=400, help="responses to grade")
    parser.add_argument("--grade-workers", type=int, default=2, help="grader processes")
    parser.add_argument("--grade-timeout", type=float, default=10.0, help="seconds per sample")
    args = parser.parse_args()
    data_dir = Path(args.data_dir) if args.data_dir else None
    result = {"model": args.model}
    try:
        result.update(grading_rate(response_mix(data_dir, args.grade_samples), args.grade_workers,
                                   args.grade_timeout))
        result.update(generation_rates(resolve_model(args.model), args.prompts,
                                       args.max_new_tokens, args.rounds, data_dir))
    except UserError as e:
        sys.exit(f"eval_throughput: {e}")
    print(json.dumps(result))


if __name__ == "__main__":  # vLLM's CPU engine re-imports __main__ in its subprocesses
    main()
