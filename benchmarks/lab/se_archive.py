"""Finished runs kept between sessions: an archive of run records that a sweep resumes from.

A checkout's `runs/` folder does not outlive its machine (it is not committed), and a plan can
take more machine time than one session holds. With `--archive FILE.json.gz`, each call writes
every finished run of its output dir into FILE (merged with the records already there), and a
later call restores a planned run from FILE instead of training it again when the record's
fingerprint matches: the same launcher command (paths aside: the checkout, the output dir and
the interpreter) and the same warm-start weights, byte for byte. A warm start made on another
kind of CPU stops at another step with other weights, so its records do not match: those runs
are trained again, and the pairs by seed never mix two warm starts.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def weights_sha(model: Path) -> str:
    """The warm-started model's weights file, hashed."""
    digest = hashlib.sha256()
    with open(Path(model) / "model.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(script: str, out_dir: Path, weights: str) -> str:
    """A run's identity: its `command.sh` with the machine's paths replaced, and the weights."""
    for path, name in ((sys.executable, "<python>"), (str(out_dir), "<out>"), (str(REPO), "<repo>")):
        script = script.replace(path, name)
    return hashlib.sha256((script + "\n" + weights).encode()).hexdigest()[:16]


def load(path: Path | None) -> dict[tuple[str, int, str], dict]:
    """The archived records by (condition, seed, fingerprint); none when there is no file yet."""
    if path is None or not Path(path).is_file():
        return {}
    with gzip.open(path, "rt") as f:
        records = json.load(f)
    missing = [i for i, r in enumerate(records) if "fingerprint" not in r]
    if missing:
        raise SystemExit(f"--archive {path}: records {missing[:5]} have no fingerprint; it is not an archive "
                         "this lab wrote (a summary's runs.json.gz is not one)")
    return {(r["condition"], r["seed"], r["fingerprint"]): r for r in records}


def restore(run_dir: Path, script: str, record: dict) -> dict:
    """Write an archived run into its run folder as a finished run (command.sh, run.json, DONE)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "command.sh").write_text(script)
    (run_dir / "run.json").write_text(json.dumps(record, indent=1))
    (run_dir / "DONE").write_text("restored from the archive\n")
    return record


def save(path: Path, out_dir: Path, weights: str) -> int:
    """Merge every finished run of `out_dir` into the archive at `path` (a run's record replaces
    the archived one of the same fingerprint); the file is replaced whole, never left torn.
    Returns the number of records it holds."""
    records = load(path)
    for run_dir in sorted((out_dir / "runs").glob("*_seed*")):
        if not ((run_dir / "DONE").is_file() and (run_dir / "run.json").is_file()):
            continue
        record = json.loads((run_dir / "run.json").read_text())
        record["fingerprint"] = fingerprint((run_dir / "command.sh").read_text(), out_dir, weights)
        records[record["condition"], record["seed"], record["fingerprint"]] = record
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt") as f:
        json.dump([records[k] for k in sorted(records)], f)
    os.replace(tmp, path)
    return len(records)
