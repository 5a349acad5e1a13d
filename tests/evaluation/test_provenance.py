"""Provenance: recorded by `run`, checked on resume (changed data or model refused, nothing
lost), logged when software changes, absent in old runs without breaking them, and compared."""
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from evaluation import cli, provenance

ARGS = ["--backend", "hf", "--benchmarks", "math500,gsm8k", "--limit", "2",
        "--max-new-tokens", "4", "--batch-size", "4", "--grader-workers", "1"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def small_data(tmp_path_factory, data_dir) -> Path:
    """The first 4 rows of math500 and gsm8k, as a --data-dir of our own."""
    root = tmp_path_factory.mktemp("data")
    for name in ("math500", "gsm8k"):
        (root / name).mkdir()
        lines = (data_dir / name / "test.jsonl").read_text().splitlines(keepends=True)[:4]
        (root / name / "test.jsonl").write_text("".join(lines))
    return root


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory, tiny_model) -> Path:
    """A copy of the tiny model that tests may change."""
    return Path(shutil.copytree(tiny_model, tmp_path_factory.mktemp("m") / "tiny"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, model_copy, small_data) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("runs") / "base"
    argv = ["run", "--model", str(model_copy), "--output-dir", str(out),
            "--data-dir", str(small_data), *ARGS]
    assert cli.main(argv) == 0
    return out, argv


def copy_run(finished, tmp_path, data=None, *extra) -> tuple[Path, list[str]]:
    """A copy of the finished run and its command pointed at the copy (and at `data`)."""
    out, argv = finished
    copy = Path(shutil.copytree(out, tmp_path / "run"))
    argv = [a if a != str(out) else str(copy) for a in argv]
    if data is not None:
        argv[argv.index("--data-dir") + 1] = str(data)
    return copy, argv + list(extra)


def test_provenance_is_recorded(finished, small_data, model_copy, read_samples):
    out, _ = finished
    record = json.loads((out / "run_config.json").read_text())["provenance"]
    bench = record["benchmarks"]["math500"]
    assert bench["sha256"] == sha256(small_data / "math500/test.jsonl") and bench["n_problems"] == 4
    assert len(bench["problems_sha256"]) == 64
    files = record["model"]["files"]
    assert files["model.safetensors"]["sha256"] == sha256(model_copy / "model.safetensors")
    assert "config.json" in files and "tokenizer.json" in files
    assert record["prompt"]["kind"] == "chat" and len(record["prompt"]["sha256"]) == 64
    assert record["grader"]["timeout_s"] == 10.0
    assert record["software"]["math-verify"] and record["software"]["torch"]
    assert record["harness"]["sources_sha256"]["grader.py"]
    assert record["hardware"]["effective_dtype"] in ("float32", "bfloat16", "auto")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"] == record and summary["problems"]["gsm8k"] == ["0", "1"]
    assert summary["benchmarks"]["math500"]["accuracy_ci"] == [0.0, 0.0]  # the random model
    assert "math500 by level" in summary["breakdown"]
    samples = read_samples(out)
    assert all("level" in r and "subject" in r for r in samples if r["benchmark"] == "math500")
    assert not any("level" in r for r in samples if r["benchmark"] == "gsm8k")
    assert "## Provenance" in (out / "report.md").read_text()
    assert "## math500 by subject" in (out / "breakdown.md").read_text()
    assert (out / "breakdown.csv").read_text().startswith("table,group,problems")


def test_changed_benchmark_file_is_refused_on_resume(finished, tmp_path, small_data, capsys):
    data = Path(shutil.copytree(small_data, tmp_path / "data"))
    path = data / "gsm8k/test.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3] + [lines[3].replace("####", "#### 1")]))  # an unused row
    copy, argv = copy_run(finished, tmp_path, data, "--limit", "3")
    before = snapshot(copy)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"benchmark file {path.resolve()} changed" in err and "Traceback" not in err
    assert "restore the original" in err and "new --output-dir" in err and "4 samples" in err
    assert snapshot(copy) == before  # nothing written, nothing lost


def test_changed_model_file_is_refused_on_resume(tiny_model, small_data, tmp_path, capsys):
    model = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    out = tmp_path / "run"
    argv = ["run", "--model", str(model), "--output-dir", str(out), "--data-dir",
            str(small_data), *ARGS, "--benchmarks", "gsm8k"]
    assert cli.main(argv + ["--limit", "1"]) == 0
    config = model / "generation_config.json"
    config.write_text(config.read_text().replace("{", '{"top_k": 5, ', 1))
    before = snapshot(out)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"model file {config} changed" in err and "new --output-dir" in err
    assert snapshot(out) == before


def test_other_software_is_recorded_not_refused(finished, tmp_path, caplog):
    copy, argv = copy_run(finished, tmp_path, None, "--limit", "3")
    config = json.loads((copy / "run_config.json").read_text())
    config["provenance"]["software"]["math-verify"] = "0.0.1"
    (copy / "run_config.json").write_text(json.dumps(config))
    assert cli.main(argv) == 0
    assert "resuming with settings that differ" in caplog.text
    config = json.loads((copy / "run_config.json").read_text())
    change = config["provenance_changes"][0]
    assert change["samples_before"] == 4
    assert change["changes"]["software.math-verify"][0] == "0.0.1"
    assert config["provenance"]["software"]["math-verify"] == "0.0.1"  # the start's, kept
    assert cli.main(argv) == 0  # nothing new generated: no second entry
    assert len(json.loads((copy / "run_config.json").read_text())["provenance_changes"]) == 1


def test_a_run_from_before_provenance_resumes(finished, tmp_path, read_samples):
    copy, argv = copy_run(finished, tmp_path, None, "--limit", "3")
    config = json.loads((copy / "run_config.json").read_text())
    del config["provenance"], config["provenance_changes"]
    (copy / "run_config.json").write_text(json.dumps(config))
    old = [{k: v for k, v in r.items() if k not in ("level", "subject")}
           for r in read_samples(copy)]
    (copy / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    (copy / "summary.json").unlink()
    assert cli.main(argv) == 0
    record = json.loads((copy / "run_config.json").read_text())["provenance"]
    assert record["samples_before_provenance"] == 4
    summary = json.loads((copy / "summary.json").read_text())
    assert sum(r["problems"] for r in summary["breakdown"]["math500 by level"]) == 3  # filled
    assert len(read_samples(copy)) == 6


def test_compare_warns_when_runs_differ_in_more_than_the_model(finished, tmp_path, caplog):
    out, argv = finished
    other = tmp_path / "other"
    assert cli.main([a if a != str(out) else str(other) for a in argv]
                    + ["--max-new-tokens", "5"]) == 0
    assert cli.main(["compare", "--baseline", str(out), "--runs", str(other), "--output",
                     str(tmp_path / "cmp")]) == 0
    assert "generation.max_new_tokens: 4 vs 5" in caplog.text
    md = (tmp_path / "cmp/compare.md").read_text()
    assert md.index("**Warning**") < md.index("## Accuracy")
    assert "`other` differs from the baseline `base` in more than the model" in md
    assert "## Provenance" in md
    saved = json.loads((tmp_path / "cmp/compare_provenance.json").read_text())
    assert saved["differences_from_baseline"]["other"] == {"generation.max_new_tokens": [4, 5]}


def test_differences_ignore_the_model_and_unrecorded_values():
    a = {"model": {"sha256": "a"}, "software": {"torch": "1", "vllm": None},
         "benchmarks": {"x": {"source": "/a", "sha256": "s"}}, "harness": {"git_commit": "c1"}}
    b = {"model": {"sha256": "b"}, "software": {"torch": "2", "vllm": "0.1"},
         "benchmarks": {"x": {"source": "/b", "sha256": "s"}}, "harness": {"git_commit": "c2"}}
    assert provenance.differences(a, b) == {"software.torch": ["1", "2"]}
