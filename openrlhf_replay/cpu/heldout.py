"""The quickstart's before/after evaluation on held-out problems of the task it trains on.

The model before training (its starting directory) and after it are each sampled on the same
held-out problems with the same per-sample seeds, at the training rollouts' temperature and token
limit, through the evaluation harness's vLLM backend and grader. Each evaluation's graded samples
go to `<out>/before.jsonl` and `<out>/after.jsonl` (one `SampleRecord` a line); the paired
difference comes from `evaluation.analysis.paired_comparison` on those files (bootstrap 95%
interval over problems and samples, sign test), and `<out>/table.md` holds the table printed.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from evaluation.analysis import paired_comparison, problem_outcomes
from evaluation.generation import derive_seed, make_backend
from evaluation.grader import Grader
from evaluation.records import SampleRecord

BENCHMARK = "heldout"
LEVEL = 0.95


def held_out(pool: list[dict], train_prompts: Path, n: int, seed: int) -> list[dict]:
    """`n` problems of `pool` whose prompt is not among the training file's prompts, drawn at
    random with `seed` (all of them when `n` is 0). Refuses a request larger than what is left."""
    seen = {json.loads(line)["prompt"] for line in train_prompts.read_text("utf-8").splitlines() if line.strip()}
    left = [row for row in pool if row["prompt"] not in seen]
    if n > len(left):
        raise ValueError(f"{n} held-out problems asked for, but only {len(left)} of the {len(pool)} problems are "
                         f"not in {train_prompts}: ask for at most {len(left)}")
    random.Random(seed).shuffle(left)
    return left[:n] if n else left


def evaluate(model: str | Path, problems: list[dict], out: Path, *, samples: int, temperature: float,
             max_new_tokens: int, seed: int) -> list[dict]:
    """Sample `samples` responses to each problem from `model` (vLLM, the problem's prompt in the
    model's chat template, as OpenRLHF renders it for training), grade them against the labels,
    write the graded `SampleRecord`s to `out` (JSON lines) and return them."""
    with make_backend("vllm", model) as backend:
        prompts = [backend.tokenizer.apply_chat_template([{"role": "user", "content": p["prompt"]}],
                                                         tokenize=False, add_generation_prompt=True)
                   for p in problems]
        # The same seed per problem before and after training, so the two evaluations' differences
        # come from the weights rather than from the draw.
        generations = backend.generate(prompts, n=samples, temperature=temperature, top_p=1.0,
                                       max_new_tokens=max_new_tokens,
                                       seed=[derive_seed(seed, BENCHMARK, p["id"]) for p in problems])
    rows = [(p, prompt, j, g) for p, prompt, gens in zip(problems, prompts, generations) for j, g in enumerate(gens)]
    with Grader() as grader:
        graded = grader.grade_many_detailed([(g.text, p["label"]) for p, _, _, g in rows])
    records = [SampleRecord(benchmark=BENCHMARK, problem_id=p["id"], sample_index=j, prompt=prompt, response=g.text,
                            response_tokens=g.n_tokens, truncated=g.truncated, verdict=v.verdict.value,
                            extracted=v.extracted, gold=p["label"]).to_dict()
               for (p, prompt, j, g), v in zip(rows, graded)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def compare(before: list[dict], after: list[dict], seed: int = 0) -> dict:
    """Accuracies before and after, and the paired difference (after - before) with its 95%
    interval and p-value, all as fractions, from the two evaluations' graded samples."""
    base, run = problem_outcomes(before), problem_outcomes(after)
    if set(base) != {BENCHMARK} or set(run) != {BENCHMARK}:
        raise ValueError(f"expected {BENCHMARK!r} samples only, got {sorted(base)} and {sorted(run)}")
    d = paired_comparison(base, run, averaged=(), seed=seed, level=LEVEL).per_benchmark[BENCHMARK]
    b, a = base[BENCHMARK].take(run[BENCHMARK].problem_ids), run[BENCHMARK]
    return {"problems": d.n_shared, "samples_per_problem": int(a.n_samples.max()),
            "before": b.accuracy, "after": a.accuracy, "diff": d.diff, "ci": list(d.ci),
            "p": d.p_value, "test": d.test, "resolved_ci": bool(d.ci[0] > 0 or d.ci[1] < 0),
            "improved": len(d.gained), "worsened": len(d.lost)}


def table(result: dict, what: str) -> str:
    """The before/after table (markdown) of a `compare` result; `what` names the problems."""
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    signed = lambda x: f"{100 * x:+.1f}"  # noqa: E731
    lo, hi = result["ci"]
    verdict = ("the interval excludes 0: training changed the accuracy" if result["resolved_ci"]
               else "the interval includes 0: no change resolved")
    return "\n".join([
        f"Before and after training, on {result['problems']} held-out problems ({what}) x "
        f"{result['samples_per_problem']} sample{'s' if result['samples_per_problem'] != 1 else ''}:",
        "",
        "| model | accuracy |",
        "|---|---|",
        f"| before training | {pct(result['before'])} |",
        f"| after training | {pct(result['after'])} |",
        f"| difference (after - before) | {signed(result['diff'])} points, 95% CI [{signed(lo)}, {signed(hi)}], "
        f"p = {result['p']:.2g} ({result['test']}) |",
        "",
        f"{verdict}; problems better after / worse after: {result['improved']} / {result['worsened']}.",
    ]) + "\n"
