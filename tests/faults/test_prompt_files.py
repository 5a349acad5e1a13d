"""Prompt files with faults, checked before Ray starts (`openrlhf_replay.cli.prompts`): through the
dry run every launch script makes (`python -m openrlhf_replay.cli.validate`, which runs the real
launcher up to upstream's `train()`) and through the replay launcher itself. Upstream would load
such a file only inside a Ray worker, minutes later, and fail there or train on nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openrlhf_replay.cli.validate import Invalid, validate

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]


def _command(data: Path) -> list[str]:
    return ["python", "-m", "openrlhf_replay.cli.train_ppo_ray", "--actor.model_name_or_path", "some/model",
            "--data.prompt_dataset", str(data), "--data.input_key", "problem", "--data.label_key", "answer",
            "--reward.remote_url", str(ROOT / "evaluation/reward.py"), "--algo.kl.init_coef", "0",
            "--algo.advantage.estimator", "group_norm", "--rollout.batch_size", "4",
            "--rollout.n_samples_per_prompt", "4", "--rollout.micro_batch_size", "4", "--train.batch_size", "8",
            "--train.micro_batch_size", "4", "--actor.num_gpus_per_node", "1", "--vllm.num_engines", "1",
            "--actor.lr_scheduler", "constant", "--replay.mode", "advantage", "--replay.warmup", "1"]


def _jsonl(path: Path, rows: list, raw: dict[int, str] | None = None) -> Path:
    """Rows as JSON lines; `raw` replaces line i (0-based) with its text as it is."""
    lines = [json.dumps(r) for r in rows]
    for i, text in (raw or {}).items():
        lines[i] = text
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _errors(data: Path) -> list[str]:
    with pytest.raises(Invalid) as e:
        validate(_command(data))
    return e.value.errors


FAULTS = {
    # name: (rows edited in place, raw line replacements, expected fragments of the one error)
    "missing label key": (lambda rows: rows[5].pop("answer"), None,
                          ["no 'answer' key in a row (keys: problem)", "(line 6)", "--data.label_key"]),
    "empty prompt": (lambda rows: rows[2].update(problem="  "), None,
                     ["the prompt ('problem') is empty: write it, or remove the row (line 3)"]),
    "non-string gold": (lambda rows: rows[7].update(answer=["3", "4"]), None,
                        ["the gold answer ('answer') is a list: write it as one string", "(line 8)"]),
    "invalid JSON": (lambda rows: None, {3: '{"problem": "What is 3 + 3?", "answer": "6"'},
                     [":4: not JSON (Expecting ',' delimiter at column 44)", "fix that line"]),
    "prompt not text": (lambda rows: rows[0].update(problem={"text": "hi"}), None,
                        ["the prompt ('problem') is a dict, not a string: write it as text (line 1)"]),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_faulty_row_stops_the_launch_naming_the_file_the_line_and_the_fix(tmp_path, fault):
    edit, raw, expected = FAULTS[fault]
    rows = [dict(r) for r in ROWS]
    edit(rows)
    data = _jsonl(tmp_path / "prompts.jsonl", rows, raw)
    errors = [e for e in _errors(data) if str(data) in e]
    assert len(errors) == 1, errors
    for fragment in expected:
        assert fragment in errors[0], (fragment, errors[0])


def test_an_empty_file_stops_the_launch(tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("\n")
    assert f"{data} holds no prompts: fill it" in "\n".join(_errors(data))


def test_a_json_array_names_the_line_of_the_faulty_element(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[4]["answer"] = {"value": 8}
    data = tmp_path / "prompts.json"
    data.write_text(json.dumps(rows, indent=2))
    (error,) = [e for e in _errors(data) if str(data) in e]
    assert "(line 18)" in error  # 1 + 4 elements of 4 lines, then its opening brace


def test_missing_golds_and_repeated_prompts_are_counted_and_the_run_goes_on(tmp_path, capsys):
    rows = [dict(r) for r in ROWS]
    rows[1]["answer"], rows[6]["answer"] = None, ""
    rows[5]["problem"] = rows[0]["problem"]
    report = validate(_command(_jsonl(tmp_path / "prompts.jsonl", rows)))
    assert any("2 row(s) without a gold answer ('answer' null or empty; line(s) 2, 7)" in n for n in report.notes)
    assert any("1 prompt(s) appear more than once (line 6 repeats line 1)" in n for n in report.notes)


def test_the_launcher_refuses_before_ray_starts_without_a_traceback(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[5].pop("answer")
    data = _jsonl(tmp_path / "prompts.jsonl", rows)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    result = subprocess.run([sys.executable, *_command(data)[1:]], cwd=ROOT, env=dict(env, OPENRLHF_REPLAY_DEVICE="cuda"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"{data}: no 'answer' key in a row" in result.stderr and "(line 6)" in result.stderr
    assert "Traceback" not in result.stderr and "Started a local Ray" not in result.stdout + result.stderr


def test_the_default_training_data_passes_with_its_missing_golds_counted():
    data = Path(os.environ.get("OPENRLHF_REPLAY_DATA", ROOT.parent / "shared/data")) / "train/deepscaler_math_train.json"
    if not data.is_file():
        pytest.skip(f"{data} not found (docs/METHOD.md section 8)")
    command = _command(data)
    command[command.index("--rollout.batch_size") + 1] = "2"  # 7,474 prompts: whole batches of 2
    report = validate(command)
    assert any("4 row(s) without a gold answer" in note for note in report.notes), report.notes


def test_a_gold_math_verify_cannot_parse_scores_zero_and_is_counted():
    """Only empty golds are caught before Ray (parsing every gold takes ~10 ms each here): the
    reward scores a sample graded against any other one math-verify cannot parse 0, and counts it."""
    from evaluation.reward import reward_func

    out = reward_func(["Q: 1 + 1? A: \\boxed{2}"] * 2, ["Q: 1 + 1? A: "] * 2, ["2", "\\text{}"])
    assert out["rewards"].tolist() == [1.0, 0.0]
    assert out["extra_logs"]["grade_error"].tolist() == [0.0, 1.0]
