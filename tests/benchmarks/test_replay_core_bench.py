"""Smoke test of benchmarks/replay_core.py: the quick, project-only run finishes and its last
line is the JSON summary. No timing assertions: the figures are only checked to be positive."""
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "replay_core.py")
REQUIRED = ("step_ms", "floor_ms", "ratio_to_floor", "torchrl_step_ms", "speedup_vs_torchrl", "bytes_per_token")
MEASURED = ("step_ms", "floor_ms", "ratio_to_floor", "bytes_per_token")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, "--quick", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def _summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(figures: dict, live: int) -> None:
    for key in REQUIRED:
        assert key in figures, key
    for key in MEASURED:
        assert isinstance(figures[key], (int, float)) and math.isfinite(figures[key]) and figures[key] > 0, \
            (key, figures[key])
    assert figures["torchrl_step_ms"] is None and figures["speedup_vs_torchrl"] is None
    assert figures["live_rollouts"] == live
    assert figures["steps_measured"] >= 1


def test_quick_project_side_prints_the_summary_last():
    out = _summary(_run("--no-torchrl", "--steps", "3"))
    # full: capacity 1,000; paper: max_age 3 with 128 rollouts per step -> 4 x 128 live.
    _check(out, live=1_000)
    _check(out["paper"], live=512)
    assert out["config"] == "full"
    assert out["steps_measured"] == 3


def test_missing_torchrl_env_says_how_to_create_it_and_still_reports(tmp_path):
    proc = _run("--configs", "paper", "--steps", "2", "--torchrl-python", str(tmp_path / "no-such-python"))
    assert "setup_torchrl_env.sh" in proc.stderr
    out = _summary(proc)
    assert out["config"] == "paper"
    _check(out, live=512)


def test_require_torchrl_fails_without_the_env(tmp_path):
    proc = _run("--require-torchrl", "--torchrl-python", str(tmp_path / "no-such-python"))
    assert proc.returncode != 0
    assert "setup_torchrl_env.sh" in proc.stderr


def test_a_kl_column_costs_at_most_four_bytes_per_token_and_only_when_held():
    """docs/METHOD.md section 2, "KL": KL's per-token column is optional; without it the store stays
    within its 9 bytes per token."""
    plain, kl = (_summary(_run("--no-torchrl", "--steps", "1", "--configs", "full", *extra))
                 for extra in ((), ("--kl", "loss")))
    assert plain["workload"]["kl_column"] is None and kl["workload"]["kl_column"] == "ref_logprobs"
    assert plain["bytes_per_token"] <= 9
    assert 0 < kl["bytes_per_token"] - plain["bytes_per_token"] <= 4
