"""The project without the workspace's `../shared` data folder: each default path that reads it
falls back to the Hugging Face hub copy it names, and when that cannot be had either, stops with a
message naming the missing file, its format and how to provide it (no traceback).

A fresh clone is stood in for by a copy of the code in a folder with no `shared/` beside it, or by
pointing `OPENRLHF_REPLAY_DATA` at a missing folder. The hub cannot be reached from this machine:
where its use is checked, `datasets.load_dataset` is replaced by a stub that records the call;
elsewhere `HF_HUB_OFFLINE=1` makes the attempt fail at once instead of after ~30 s of retries.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evaluation import benchmarks
from infra.datasources import DATA_ENV, DataUnavailableError, default_data_dir
from infra.models import build_tiny_qwen3
from openrlhf_replay.cpu import quickstart

ROOT = Path(__file__).resolve().parents[2]
CODE = ("evaluation", "infra", "openrlhf_replay", "replay", "examples", "benchmarks")
SMALL = dict(vocab_size=300, hidden_size=64, num_hidden_layers=1, num_attention_heads=1,
             num_key_value_heads=1, head_dim=64, intermediate_size=128)
GSM8K_ROWS = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(8)]


def _offline_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (DATA_ENV, "DATA", "MODEL", "SHARED_DIR", "RAY_ADDRESS")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **extra)
    return env


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The repository's code in <tmp>/clone/repo: nothing named shared/ beside it."""
    repo = tmp_path_factory.mktemp("clone") / "repo"
    for name in CODE:
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
    assert not (repo.parent / "shared").exists()
    return repo


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """Enough of a model directory for the checks that run before a model is loaded."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """`datasets.load_dataset` replaced: records (path, config, split) and returns `hub.rows`, or
    raises ConnectionError when `hub.rows` is None. The data folder points nowhere."""
    import datasets

    class Hub:
        rows: list | None = None
        calls: list = []

    def load_dataset(path, config=None, split=None, **kwargs):
        Hub.calls.append((path, config, split))
        if Hub.rows is None:
            raise ConnectionError(f"Couldn't reach '{path}' on the Hub (stub)")
        return Hub.rows

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "no-data"))
    Hub.calls = []
    return Hub


def test_defaults_read_the_hub_copies_they_name(hub, tmp_path):
    hub.rows = GSM8K_ROWS
    assert default_data_dir() is None  # no local benchmarks/ in the data folder
    problems = benchmarks.load("gsm8k", default_data_dir())
    assert [p.answer for p in problems[:2]] == ["0", "2"] and hub.calls == [("openai/gsm8k", "main", "test")]

    model = build_tiny_qwen3(tmp_path / "tiny", **SMALL)  # its tokenizer corpus: GSM8K train
    assert hub.calls[-1] == ("openai/gsm8k", "main", "train")
    assert json.loads((model / ".build_complete.json").read_text())["corpus"] == "hub:openai/gsm8k/main/train"

    out = tmp_path / "prompts.jsonl"
    assert quickstart.prepare_data(quickstart.HUB, out, 3) == 3
    assert hub.calls[-1] == ("openai/gsm8k", "main", "train")
    assert json.loads(out.read_text().splitlines()[0])["label"] == "0"


def test_without_the_hub_each_default_says_how_to_provide_its_data(hub, tmp_path, capsys):
    with pytest.raises(DataUnavailableError) as e:
        build_tiny_qwen3(tmp_path / "tiny", **SMALL)
    assert "GSM8K training data: no file" in str(e.value) and f"set {DATA_ENV}" in str(e.value)
    assert "`question` and `answer`" in str(e.value)

    assert quickstart.main(["prepare-data", "--source", "hub", "--out", str(tmp_path / "p.jsonl"), "--n", "2"]) == 2
    err = capsys.readouterr().err
    assert "pass DATA=/path/to/gsm8k_train.jsonl" in err and "Traceback" not in err

    (problem,) = quickstart.benchmark_data_problems()
    assert "benchmark 'math500': no local file" in problem and "HuggingFaceH4/MATH-500" in problem
    assert "--data-dir DIR with DIR/math500/test.jsonl" in problem and "EVAL=0" in problem

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import eval_throughput
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    with pytest.raises(DataUnavailableError, match="--data-dir DIR with DIR/math500/test.jsonl"):
        eval_throughput.math500_solutions(None)
    assert ("HuggingFaceH4/MATH-500", None, "test") in hub.calls


def test_evaluation_in_a_clone_without_data_says_how_to_provide_it(clone, model_dir, tmp_path):
    result = subprocess.run([sys.executable, "-m", "evaluation", "run", "--model", str(model_dir),
                             "--output-dir", str(tmp_path / "out"), "--backend", "hf"],
                            cwd=clone, env=_offline_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "error: benchmark 'math500': no local file (no --data-dir)" in result.stderr
    assert "one JSON object per line with `problem` and `answer`" in result.stderr
    assert "Traceback" not in result.stderr


def test_launch_scripts_in_a_clone_without_data_stop_with_the_format(clone, tmp_path):
    env = _offline_env(DRY_RUN="1", PYTHON=sys.executable, RUNS_DIR=str(tmp_path / "runs"))
    result = subprocess.run(["bash", str(clone / "examples/scripts/train_grpo_replay.sh")], cwd=clone, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert f"no training prompts at {clone}/../shared/data/train/deepscaler_math_train.json" in result.stderr
    assert "Set DATA=<file>: a JSON array or JSON lines" in result.stderr and "INPUT_KEY=problem" in result.stderr


def test_the_quickstart_without_data_stops_before_training(tmp_path, model_dir):
    script = ROOT / "examples/scripts/quickstart_cpu.sh"
    env = _offline_env(**{DATA_ENV: str(tmp_path / "no-data")}, RUN_DIR=str(tmp_path / "run"),
                       OPENRLHF_REPLAY_MODEL_CACHE=str(tmp_path / "models"))

    def quickstart_run(**settings):
        return subprocess.run(["bash", str(script)], env={**env, **settings}, capture_output=True, text=True,
                              timeout=300)

    evaluated = quickstart_run(MODEL="tiny")  # the check of the benchmarks comes first
    assert evaluated.returncode == 1 and "benchmark 'math500': no local file" in evaluated.stdout + evaluated.stderr
    assert "Or skip the evaluation: EVAL=0" in evaluated.stdout + evaluated.stderr
    tiny = quickstart_run(MODEL="tiny", EVAL="0")  # the tiny model's tokenizer corpus
    assert tiny.returncode == 1 and "GSM8K training data: no file" in tiny.stderr
    given = quickstart_run(MODEL=str(model_dir), EVAL="0", DATA="gsm8k")  # GSM8K prompts instead of arithmetic
    assert given.returncode == 1 and "pass DATA=/path/to/gsm8k_train.jsonl" in given.stderr
    assert "Traceback" not in evaluated.stderr + tiny.stderr + given.stderr
    assert not (tmp_path / "run" / "train.log").exists()  # nothing started
