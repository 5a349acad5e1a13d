"""The lab's archive of finished runs (benchmarks/lab/se_archive.py): what makes two runs the same
run, and that merging never loses a record. The whole sweep restores from one in
tests/benchmarks/test_sample_efficiency.py (the quick sweep)."""
import gzip
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks/lab"))

import se_archive  # noqa: E402


def _script(out: Path) -> str:
    return (f"#!/usr/bin/env bash\ncd {ROOT}\n{sys.executable} -m openrlhf_replay.cli.train_ppo_ray "
            f"--actor.model_name_or_path {ROOT}/runs/sample_efficiency_models/mixed-abc "
            f"--data.prompt_dataset {out}/data/train.jsonl --train.seed 3\n")


def _finished_run(out: Path, cond: str, seed: int, accuracy: float, done: bool = True) -> None:
    run_dir = out / "runs" / f"{cond}_seed{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "command.sh").write_text(_script(out).replace("--train.seed 3", f"--train.seed {seed}"))
    (run_dir / "run.json").write_text(json.dumps({"condition": cond, "seed": seed, "evals": [{"accuracy": accuracy}]}))
    if done:
        (run_dir / "DONE").write_text("now\n")


def test_a_fingerprint_ignores_where_the_run_was_made_and_sees_the_command_and_the_weights(tmp_path):
    here, there = tmp_path / "a" / "out", tmp_path / "elsewhere"
    same = se_archive.fingerprint(_script(here), here, "w1")
    assert se_archive.fingerprint(_script(there), there, "w1") == same  # another output dir
    assert se_archive.fingerprint(_script(here), here, "w2") != same  # another warm start
    assert se_archive.fingerprint(_script(here).replace("seed 3", "seed 4"), here, "w1") != same
    assert se_archive.fingerprint(_script(here), there, "w1") != same  # its data file is not <out>'s


def test_save_merges_finished_runs_and_a_later_checkout_restores_them(tmp_path):
    first, second, archive = tmp_path / "first", tmp_path / "second", tmp_path / "kept" / "archive.json.gz"
    _finished_run(first, "none", 1, 0.2)
    _finished_run(first, "uniform", 1, 0.3)
    _finished_run(first, "age0", 1, 0.1, done=False)  # trained, not graded: not a finished run
    assert se_archive.save(archive, first, "w") == 2
    _finished_run(second, "none", 2, 0.25)
    _finished_run(second, "uniform", 1, 0.35)  # the same run again: its newer record replaces the old
    assert se_archive.save(archive, second, "w") == 3 and not archive.with_name("archive.json.gz.tmp").exists()
    kept = se_archive.load(archive)
    assert sorted((c, s) for c, s, _ in kept) == [("none", 1), ("none", 2), ("uniform", 1)]
    fp = se_archive.fingerprint(_script(tmp_path / "third").replace("seed 3", "seed 1"), tmp_path / "third", "w")
    record = kept["uniform", 1, fp]
    assert record["evals"] == [{"accuracy": 0.35}]
    run_dir = tmp_path / "third" / "runs" / "uniform_seed1"
    se_archive.restore(run_dir, "the script\n", record)
    assert (run_dir / "DONE").is_file() and json.loads((run_dir / "run.json").read_text()) == record
    assert (run_dir / "command.sh").read_text() == "the script\n"


def test_a_file_that_is_not_an_archive_is_refused(tmp_path):
    summary_runs = tmp_path / "runs.json.gz"
    with gzip.open(summary_runs, "wt") as f:
        json.dump([{"condition": "none", "seed": 1}], f)
    with pytest.raises(SystemExit, match="no fingerprint"):
        se_archive.load(summary_runs)
    assert se_archive.load(tmp_path / "missing.json.gz") == {} and se_archive.load(None) == {}


def test_the_weights_hash_reads_the_model_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * (3 << 20))
    first = se_archive.weights_sha(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"x" * (3 << 20) + b"y")
    assert se_archive.weights_sha(tmp_path) != first and len(first) == 64
