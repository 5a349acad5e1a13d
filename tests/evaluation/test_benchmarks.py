"""Gold-answer derivation on the real benchmark files, and malformed-row handling."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evaluation.benchmarks import (DEFAULT_BENCHMARKS, HUB_IDS, BenchmarkFormatError, Problem,
                                   load, load_with_report)

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("OPENRLHF_REPLAY_DATA", REPO.parent / "shared" / "data"))
BENCH_DIR = DATA / "benchmarks"
needs_data = pytest.mark.skipif(
    not (BENCH_DIR / "math500" / "test.jsonl").is_file(),
    reason=f"benchmark files not found under {BENCH_DIR} (set OPENRLHF_REPLAY_DATA to the "
           "shared data folder)")

ROW_COUNTS = {"math500": 500, "aime24": 30, "amc23": 40, "minerva_math": 272,
              "olympiadbench": 675, "aime25": 30, "gsm8k": 1319}


def test_names():
    assert DEFAULT_BENCHMARKS == ("math500", "aime24", "amc23", "minerva_math", "olympiadbench")
    assert set(HUB_IDS) == set(ROW_COUNTS)
    with pytest.raises(ValueError, match="unknown benchmark 'math5000'.*math500"):
        load("math5000", BENCH_DIR)


@needs_data
@pytest.mark.parametrize("name", list(ROW_COUNTS))
def test_row_counts_ids_and_golds_parse(name):
    from math_verify import parse

    problems = load(name, BENCH_DIR)
    assert len(problems) == ROW_COUNTS[name]
    assert len({p.id for p in problems}) == len(problems)
    assert all(isinstance(p, Problem) and p.benchmark == name and p.problem.strip()
               for p in problems)
    unparsed = [p.answer for p in problems if not parse(f"${p.answer}$", parsing_timeout=None)]
    assert unparsed == []
    assert not any("$" in p.answer.replace(r"\$", "") for p in problems)


@needs_data
def test_spot_check_golds():
    amc = load("amc23", BENCH_DIR)
    assert amc[0].answer == "27" and amc[0].id == "0"  # JSON 27.0
    math500 = load("math500", BENCH_DIR)
    assert math500[0].id == "test/precalculus/807.json"
    assert math500[0].answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert load("aime24", BENCH_DIR)[0].answer == "204"
    aime25 = load("aime25", BENCH_DIR)
    assert aime25[0].answer == "70"  # JSON int
    # SOURCES.md: three aime25 problems stored \f and \t as control characters; repaired.
    assert not any(c in p.problem for p in aime25 for c in "\x0c\t")
    texts = " ".join(p.problem for p in aime25)
    assert r"$\frac{m}{n}$ for relatively prime" in texts and r"$\triangle DEF$" in texts
    minerva = {p.id: p.answer for p in load("minerva_math", BENCH_DIR)}
    assert minerva["0"] == "1.6"  # ... 7200=\boxed{1.6} \mathrm{~cm}
    assert minerva["1"] == "4.5e33"
    # The source boxes this answer as `x_{0} \cos (\omega t)+$ $\dot{x}_{0} ...`: the stray `$ $`
    # would make math-verify read only the second term.
    assert minerva["72"] == r"x_{0} \cos (\omega t)+ \dot{x}_{0} \sin (\omega t) / \omega"
    olympiad = load("olympiadbench", BENCH_DIR)
    assert olympiad[0].answer == "2"
    several = next(p for p in olympiad if p.answer.startswith("(0,1,1),(0,-1,-1)"))
    # One final_answer item holding several $...$ segments: every delimiter removed.
    assert r"(1,1,0),(-1,-1,0),\left(\frac{1}{\sqrt{3}}" in several.answer
    gsm8k = load("gsm8k", BENCH_DIR)
    assert [p.answer for p in gsm8k[:4]] == ["18", "3", "70000", "540"]
    assert gsm8k[0].id == "0"


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name, bad_line, message", [
    ("math500", '{"problem": "p", "answer": "1", "unique_id": "b"', "invalid JSON"),
    ("math500", '{"problem": "p", "unique_id": "b"}', "missing field 'answer'"),
    ("amc23", '{"problem": "p", "answer": null, "id": 1}', "missing field 'answer'"),
    ("amc23", '{"problem": "p", "answer": true, "id": 1}', "type bool"),
    ("minerva_math", '{"problem": "p", "solution": "so 3", "idx": 1}', "no \\\\boxed"),
    ("minerva_math", '{"problem": "p", "solution": "\\\\boxed{}", "idx": 1}', "no \\\\boxed"),
    ("olympiadbench", '{"question": "p", "final_answer": [], "id": 1}', "non-empty list"),
    ("gsm8k", '{"question": "p", "answer": "it is 5"}', "no '####'"),
    ("aime24", '["not", "an", "object"]', "expected a JSON object"),
    ("aime24", '{"problem": "p", "answer": "025", "id": 0}', "duplicate id '0'"),
])
def test_malformed_row_names_file_and_line(tmp_path, name, bad_line, message):
    good = {"math500": '{"problem": "p", "answer": "1", "unique_id": "a%d"}',
            "amc23": '{"problem": "p", "answer": 2.5, "id": %d}',
            "minerva_math":
                '{"problem": "p", "solution": "x=\\\\boxed{\\\\frac{1}{2}}", "idx": %d}',
            "olympiadbench": '{"question": "p", "final_answer": ["$3$"], "id": %d}',
            "gsm8k": '{"question": "p", "answer": "so\\n#### 1,234", "n": %d}',
            "aime24": '{"problem": "p", "answer": "025", "id": %d}'}[name]
    lines = [good % 0, "", good % 1, bad_line, good % 2]  # line 4 is bad
    path = write_jsonl(tmp_path / name / "test.jsonl", lines)
    with pytest.raises(BenchmarkFormatError, match=rf"test\.jsonl:4: .*{message}") as err:
        load(name, tmp_path)
    assert str(path) in str(err.value)

    problems, n_skipped = load_with_report(name, tmp_path, skip_malformed=True)
    assert n_skipped == 1 and len(problems) == 3
    assert len(load(name, tmp_path, skip_malformed=True)) == 3
    gold = {"math500": "1", "amc23": "2.5", "minerva_math": r"\frac{1}{2}", "olympiadbench": "3",
            "gsm8k": "1234", "aime24": "025"}[name]
    assert {p.answer for p in problems} == {gold}


def test_skip_is_logged(tmp_path, caplog):
    write_jsonl(tmp_path / "aime24" / "test.jsonl",
                ['{"problem": "p", "answer": "1", "id": 0}', "{oops"])
    assert len(load("aime24", tmp_path, skip_malformed=True)) == 1
    assert "skipped 1 malformed row" in caplog.text


def test_olympiad_several_answers_joined(tmp_path):
    write_jsonl(tmp_path / "olympiadbench" / "test.jsonl",
                ['{"question": "q", "final_answer": ["$x=1$", "$y=2$"], "id": 7}'])
    assert load("olympiadbench", tmp_path)[0].answer == "x=1, y=2"


def test_missing_file_offline_says_pass_data_dir(tmp_path):
    # Offline the hub fallback must fail with a message naming --data-dir; HF_HUB_OFFLINE makes
    # `datasets` fail at once instead of after its network retries.
    code = ("from evaluation.benchmarks import load\n"
            f"load('math500', {str(tmp_path)!r})\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "BenchmarkUnavailableError" in proc.stderr and "--data-dir" in proc.stderr


def test_problem_is_frozen():
    p = Problem(id="1", problem="q", answer="2", benchmark="aime24")
    with pytest.raises(AttributeError):
        p.answer = "3"
