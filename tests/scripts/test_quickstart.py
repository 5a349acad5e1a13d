"""The README's first command, `examples/scripts/quickstart_cpu.sh`, run for real with a tiny
random Qwen3 (SmolLM2 would take several minutes more): the whole path to the results tables, and
a failure inside a Ray worker, which must end with its cause and fix and leave nothing running."""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from run_processes import TAG_ENV, left_after, new_tag, tagged_processes

from evaluation.analysis import paired_comparison, problem_outcomes

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples/scripts/quickstart_cpu.sh"
HELDOUT, HELDOUT_SAMPLES = 12, 2  # few, for the suite's time (the default: all 293 x 1)
EXIT_S = 15  # a run's processes (Ray's, vLLM's, the grader pool) must be gone this soon after it ended


def _env(tmp: Path, run_dir: Path, name: str, **settings) -> dict:
    """The quickstart's environment, with a tag that every process of the run inherits."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DATA", "MODEL")}
    env.update(OPENRLHF_REPLAY_MODEL_CACHE=str(tmp / "models"), RUN_DIR=str(run_dir), **new_tag(name))
    env.update(settings)
    return env


def _quickstart(tmp: Path, run_dir: Path, name: str, **settings) -> tuple[subprocess.CompletedProcess, list]:
    """Run the quickstart; its exit and the processes it left running."""
    env = _env(tmp, run_dir, name, STEPS="2", MAX_NEW_TOKENS="16", EVAL_LIMIT="1", EVAL_MAX_NEW_TOKENS="16",
               **settings)
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900)
    return proc, left_after(env[TAG_ENV], time.monotonic(), EXIT_S)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quickstart")
    proc, left = _quickstart(tmp, tmp / "run", "tiny", MODEL="tiny", HELDOUT=str(HELDOUT),
                             HELDOUT_SAMPLES=str(HELDOUT_SAMPLES))
    return {"tmp": tmp, "proc": proc, "run": tmp / "run", "left": left}


def test_the_quickstart_trains_checkpoints_evaluates_and_prints_the_table(tiny_run):
    proc, run = tiny_run["proc"], tiny_run["run"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "step 1/2" in out and "step 2/2" in out  # per-step progress lines
    for benchmark in ("math500", "aime24", "amc23", "minerva_math", "olympiadbench"):
        assert f"| {benchmark} | 1 | 1 |" in out
    assert "five-benchmark macro average" in out and f"training log      {run}/train.log" in out
    assert list((run / "checkpoints/_replay").glob("global_step2.npz"))
    assert (run / "model/config.json").is_file() and (run / "eval/summary.json").is_file()


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_output_ends_with_the_before_after_table_computed_from_both_evaluations(tiny_run):
    proc, run = tiny_run["proc"], tiny_run["run"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    before, after = _records(run / "heldout/before.jsonl"), _records(run / "heldout/after.jsonl")
    assert len(before) == len(after) == HELDOUT * HELDOUT_SAMPLES
    # the same held-out problems and prompts in both, none of them a training prompt
    assert [(r["problem_id"], r["prompt"]) for r in before] == [(r["problem_id"], r["prompt"]) for r in after]
    trained = {json.loads(line)["prompt"] for line in (run / "prompts.jsonl").read_text().splitlines()}
    assert len({r["problem_id"] for r in before}) == HELDOUT
    assert not any(prompt in r["prompt"] for prompt in trained for r in before)
    assert all("Answer with the number only" in r["prompt"] for r in before)  # in the model's chat template
    assert all(r["response_tokens"] <= 16 for r in before + after)  # the rollouts' MAX_NEW_TOKENS
    # the printed figures, recomputed here from the two files
    base, trained_outcomes = problem_outcomes(before), problem_outcomes(after)
    d = paired_comparison(base, trained_outcomes, averaged=()).per_benchmark["heldout"]
    acc = lambda rs: sum(r["verdict"] == "correct" for r in rs) / len(rs)  # noqa: E731
    lo, hi = d.ci
    assert abs(d.diff - (acc(after) - acc(before))) < 1e-12
    expected = [f"Before and after training, on {HELDOUT} held-out problems (one-step arithmetic) x "
                f"{HELDOUT_SAMPLES} samples:", "", "| model | accuracy |", "|---|---|",
                f"| before training | {100 * acc(before):.1f}% |", f"| after training | {100 * acc(after):.1f}% |",
                f"| difference (after - before) | {100 * d.diff:+.1f} points, 95% CI [{100 * lo:+.1f}, {100 * hi:+.1f}], "
                f"p = {d.p_value:.2g} ({d.test}) |", ""]
    tail = proc.stdout.rstrip("\n").split("\n")
    assert tail[-len(expected) - 1:-1] == expected, "\n".join(tail[-12:])
    assert tail[-1].endswith(f"problems better after / worse after: {len(d.gained)} / {len(d.lost)}.")
    # the one-line summary before the benchmarks' table
    assert (f"held-out accuracy {100 * acc(before):.1f}% before, {100 * acc(after):.1f}% after: "
            f"{100 * d.diff:+.1f} points") in out_before_table(proc.stdout)


def out_before_table(out: str) -> str:
    return out[:out.index("| benchmark")]


def test_the_quickstart_leaves_no_process_behind(tiny_run):
    assert tiny_run["left"] == []


def test_a_failure_inside_a_ray_worker_ends_with_its_cause_and_fix(tiny_run):
    tmp = tiny_run["tmp"]
    broken = tmp / "broken-model"
    shutil.copytree(tmp / "models/tiny-qwen3", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy cut short
    proc, left = _quickstart(tmp, tmp / "broken-run", "broken", MODEL=str(broken), EVAL="0")
    assert proc.returncode != 0
    assert "quickstart: FAILED: training stopped:" in proc.stderr, proc.stderr[-3000:]
    assert "fix: the model's files could not be read" in proc.stderr, proc.stderr[-3000:]
    assert f"full log: {tmp}/broken-run/train.log" in proc.stderr
    assert left == []


def test_ctrl_c_stops_the_run_and_leaves_no_process_behind(tiny_run):
    tmp = tiny_run["tmp"]
    env = _env(tmp, tmp / "stopped", "ctrl-c", MODEL="tiny", EVAL="0")
    # As from a terminal: the shell starts with SIGINT at its default. A shell that inherits it
    # ignored cannot trap it (this test once saw the run go on to its end after the signal, in a
    # full suite run; not reproduced alone).
    proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log = tmp / "stopped/train.log"
    deadline = time.monotonic() + 300
    while not (log.is_file() and "waiting for 1 vLLM engine" in log.read_text()):  # Ray and its actors are up
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.5)
    assert any("raylet" in line for line in tagged_processes(env[TAG_ENV]))  # the run's Ray is up
    proc.send_signal(signal.SIGINT)
    status, output = proc.wait(timeout=60), proc.stdout.read()
    assert status == 130 and "interrupted" in output, (
        f"exit {status}; SIGINT in this process: {signal.getsignal(signal.SIGINT)}; output:\n{output[-3000:]}")
    assert left_after(env[TAG_ENV], time.monotonic(), EXIT_S) == []


def test_help_lists_the_settings_and_arguments_are_refused():
    shown = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert shown.returncode == 0
    for setting in ("MODEL", "DATA", "RUN_DIR", "STEPS", "EVAL_LIMIT", "MAX_NEW_TOKENS", "TEMPERATURE", "LR", "SEED",
                    "HELDOUT", "HELDOUT_SAMPLES", "PROMPTS_PER_STEP", "SAMPLES_PER_PROMPT"):
        assert f"  {setting}" in shown.stdout or f" {setting} (" in shown.stdout, setting
    refused = subprocess.run(["bash", str(SCRIPT), "--steps", "3"], capture_output=True, text=True)
    assert refused.returncode == 2 and "environment variables" in refused.stderr
    for setting, value in (("SAMPLES_PER_PROMPT", "1"), ("PROMPTS_PER_STEP", "four"), ("STEPS", "0")):
        bad = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True,
                             env={**os.environ, setting: value, "RUN_DIR": "/nonexistent/never-made"})
        assert bad.returncode == 2 and f"{setting}={value}: give a whole number" in bad.stderr, bad.stderr
