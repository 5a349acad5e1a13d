"""`python -m evaluation run|sweep` end to end: outputs, resuming, refusals, real models."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from evaluation import benchmarks, cli
from evaluation.records import VERDICTS, SampleRecord
from infra.models import build_tiny_qwen3

TINY_ARGS = ["--backend", "hf", "--benchmarks", "math500,gsm8k", "--limit", "3",
             "--n-samples", "2", "--temperature", "0.6", "--top-p", "0.95",
             "--max-new-tokens", "24", "--batch-size", "2", "--grader-workers", "1"]


def keys(records):
    return [(r["benchmark"], r["problem_id"], r["sample_index"]) for r in records]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model, data_dir):
    """A finished 12-sample run of the tiny model (2 benchmarks x 3 problems x 2 samples)."""
    out = tmp_path_factory.mktemp("runs") / "tiny"
    args = ["run", "--model", str(tiny_model), "--output-dir", str(out),
            "--data-dir", str(data_dir), *TINY_ARGS]
    assert cli.main(args) == 0
    return out, args


def rerun(tiny_run, tmp_path, *extra):
    """Copy the finished run and run its command (plus `extra` flags) on the copy."""
    out, args = tiny_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    return copy, cli.main([a if a != str(out) else str(copy) for a in args] + list(extra))


def test_run_writes_records_summary_and_report(tiny_run, read_samples):
    out, _ = tiny_run
    records = read_samples(out)
    assert len(records) == 12 and len(set(keys(records))) == 12
    for r in records:
        SampleRecord.from_dict(r)  # the agreed schema, checked
        assert r["verdict"] in VERDICTS and 1 <= r["response_tokens"] <= 24
        assert r["prompt"].startswith("<|im_start|>user\n") and "\\boxed{}" in r["prompt"]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["benchmarks"]) == ["math500", "gsm8k"]
    assert all(s["n_samples"] == 6 and s["samples_per_problem"] == 2 and "pass@2" in s
               for s in summary["benchmarks"].values())
    config = json.loads((out / "run_config.json").read_text())
    assert config["generation"]["temperature"] == 0.6 and config["selection"]["limit"] == 3
    report = (out / "report.md").read_text()
    assert "| math500 | 3 | 2 |" in report and "| gsm8k | 3 | 2 |" in report


def test_torn_last_line_is_dropped_and_regenerated_identically(tiny_run, tmp_path, read_samples,
                                                              caplog):
    out, args = tiny_run
    original = (out / "samples.jsonl").read_text().splitlines(keepends=True)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "samples.jsonl").write_text("".join(original[:-1]) + original[-1][:40])
    assert cli.main([a if a != str(out) else str(copy) for a in args]) == 0
    assert "1 of 12 samples to generate" in caplog.text
    lines = (copy / "samples.jsonl").read_text().splitlines(keepends=True)
    assert lines[:-1] == original[:-1] and len(lines) == 12
    assert json.loads(lines[-1]) == json.loads(original[-1])  # seeded: the same sample again


def test_corrupt_middle_line_is_refused(tiny_run, tmp_path, capsys):
    out, args = tiny_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    lines = (copy / "samples.jsonl").read_text().splitlines(keepends=True)
    (copy / "samples.jsonl").write_text("".join(lines[:3] + ["{oops\n"] + lines[3:]))
    assert cli.main([a if a != str(out) else str(copy) for a in args]) == 2
    assert "samples.jsonl:4" in capsys.readouterr().err


@pytest.mark.parametrize("flag,value,named", [("--temperature", "0.7", "temperature"),
                                              ("--max-new-tokens", "25", "max_new_tokens"),
                                              ("--prompt-template", "plain", "prompt_template"),
                                              ("--n-samples", "3", "n_samples")])
def test_changed_generation_settings_are_refused(tiny_run, tmp_path, capsys, flag, value, named):
    copy, status = rerun(tiny_run, tmp_path, flag, value)
    assert status == 2
    err = capsys.readouterr().err
    assert f"{named}: stored" in err and "Traceback" not in err
    assert len((copy / "samples.jsonl").read_text().splitlines()) == 12  # untouched


def test_larger_limit_extends_the_run(tiny_run, tmp_path, read_samples, caplog):
    copy, status = rerun(tiny_run, tmp_path, "--limit", "4")
    assert status == 0 and "4 of 16 samples to generate" in caplog.text
    records = read_samples(copy)
    assert len(records) == 16 and len(set(keys(records))) == 16
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["benchmarks"]["gsm8k"]["n_problems"] == 4


def test_bad_input_gets_a_message_not_a_traceback(tiny_model, tmp_path, capsys):
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("keep me")
    cases = [
        (["run", "--model", str(tmp_path / "missing"), "--output-dir", str(tmp_path / "o")],
         "no such directory"),
        (["run", "--model", str(not_a_model), "--output-dir", str(tmp_path / "o")],
         "no config.json"),
        (["run", "--model", str(tiny_model), "--benchmarks", "math500,mmlu", "--output-dir",
          str(tmp_path / "o")], "unknown benchmark(s) mmlu; valid: math500, aime24"),
        (["run", "--model", str(tiny_model), "--output-dir", str(foreign)], "not empty"),
        (["run", "--model", str(tiny_model), "--n-samples", "0", "--output-dir",
          str(tmp_path / "o")], "--n-samples must be >= 1"),
        (["compare", "--baseline", str(foreign), "--runs", str(foreign)], "no summary.json"),
        (["sweep", "--checkpoints", str(foreign), "--output-dir", str(tmp_path / "s")],
         "no subdirectory holds a config.json"),
    ]
    for argv, message in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
    assert [p.name for p in foreign.iterdir()] == ["thesis.tex"]


def test_every_flag_is_explained():
    for command in ("run", "compare", "sweep"):
        result = subprocess.run([sys.executable, "-m", "evaluation", command, "--help"],
                                capture_output=True, text=True, check=True)
        flags = {"run": ["--model", "--benchmarks", "--output-dir", "--backend", "--n-samples",
                         "--temperature", "--top-p", "--max-new-tokens", "--limit", "--data-dir",
                         "--seed", "--batch-size", "--grader-workers", "--grade-timeout",
                         "--prompt-template"],
                 "compare": ["--baseline", "--runs", "--output"],
                 "sweep": ["--checkpoints", "--output-dir", "--limit"]}[command]
        for flag in flags:
            assert flag in result.stdout, (command, flag)


@pytest.mark.slow
def test_resume_after_killing_a_real_run(tiny_model, data_dir, tmp_path, run_cli, read_samples):
    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "evaluation", "run", "--model", str(tiny_model),
            "--output-dir", str(out), "--data-dir", str(data_dir), "--backend", "hf",
            "--benchmarks", "math500,gsm8k", "--limit", "8", "--n-samples", "2",
            "--temperature", "0.6", "--top-p", "0.95", "--max-new-tokens", "32",
            "--batch-size", "1", "--grader-workers", "1"]
    proc = subprocess.Popen(argv, cwd=cli.Path(cli.__file__).parents[1], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples, deadline = out / "samples.jsonl", time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if samples.exists() and samples.read_bytes().count(b"\n") >= 6:
                break
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its grader workers, mid-batch
        proc.wait()
    before = samples.read_bytes()
    n_before = before.count(b"\n")
    assert 6 <= n_before < 32, "the run was not killed mid-way"
    result = run_cli(*argv[3:])
    assert result.returncode == 0, result.stderr
    assert f"{32 - n_before} of 32 samples to generate" in result.stderr
    after = samples.read_bytes()
    assert after.startswith(before[:before.rfind(b"\n") + 1])  # finished lines kept as they were
    records = read_samples(out)
    expected = [(b, p.id, j) for b in ("math500", "gsm8k")
                for p in benchmarks.load(b, data_dir)[:8] for j in range(2)]
    assert len(records) == 32 and sorted(keys(records)) == sorted(expected)  # each exactly once
    summary = json.loads((out / "summary.json").read_text())
    assert [s["n_samples"] for s in summary["benchmarks"].values()] == [16, 16]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_smollm2_end_to_end(backend, smollm2, model_cache, data_dir, tmp_path, monkeypatch,
                            run_cli, read_samples):
    monkeypatch.setenv("OPENRLHF_REPLAY_MODEL_CACHE", str(model_cache))  # finds the fixture's copy
    out = tmp_path / backend
    result = run_cli("run", "--model", "smollm2", "--backend", backend, "--benchmarks",
                     "math500,gsm8k", "--limit", "1", "--max-new-tokens", "48",
                     "--output-dir", out, "--data-dir", data_dir, "--grader-workers", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_samples(out)
    assert len(records) == 2 and all(r["verdict"] in VERDICTS for r in records)
    assert all(1 <= r["response_tokens"] <= 48 and r["response"].strip() for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["model"] == str(smollm2) and summary["run"]["backend"] == backend
    assert set(summary["benchmarks"]) == {"math500", "gsm8k"}
    assert "| math500 | 1 | 1 |" in (out / "report.md").read_text()


@pytest.mark.slow
def test_sweep_evaluates_checkpoints_in_step_order(tmp_path, data_dir, read_samples):
    ckpts = tmp_path / "ckpt"
    small = dict(corpus=["Natalia sold 48 clips; the answer is \\boxed{72}."] * 40, vocab_size=300,
                 hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, intermediate_size=128)
    for step, seed in ((10, 1), (2, 2)):
        build_tiny_qwen3(ckpts / f"global_step{step}_hf", seed=seed, **small)
    (ckpts / "global_step2").mkdir()  # a DeepSpeed checkpoint: no config.json, skipped
    out = tmp_path / "sweep"
    argv = ["sweep", "--checkpoints", str(ckpts), "--output-dir", str(out), "--backend", "hf",
            "--benchmarks", "gsm8k", "--limit", "2", "--max-new-tokens", "8",
            "--data-dir", str(data_dir), "--grader-workers", "1"]
    assert cli.main(argv) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["global_step10_hf",
                                                                   "global_step2_hf"]
    assert [line.split(",")[0] for line in (out / "sweep.csv").read_text().splitlines()] == \
        ["step", "2", "10"]
    for png in ("sweep_accuracy.png", "sweep_tokens.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = (out / "global_step2_hf/samples.jsonl").read_bytes()
    assert len(read_samples(out / "global_step2_hf")) == 2
    assert cli.main(argv) == 0  # resumes: nothing regenerated
    assert (out / "global_step2_hf/samples.jsonl").read_bytes() == first
