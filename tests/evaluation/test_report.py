"""report.md, the comparison table (markdown, CSV, plots) and its AES column."""
import csv
import io

import pytest

from evaluation import cli, report
from evaluation.benchmarks import DEFAULT_BENCHMARKS
from evaluation.metrics import aes, summarize

PNG = b"\x89PNG\r\n\x1a\n"


def make_summary(correct: dict[str, list[int]], tokens: int, n: int = 2) -> dict:
    """A run summary as `run` writes it, from real metrics over synthetic sample records.

    `correct[b][i]` is how many of problem i's n samples are correct on benchmark b.
    """
    records = [dict(benchmark=b, problem_id=str(i), sample_index=j, prompt="p", response="r",
                    response_tokens=tokens + j, truncated=False, extracted="1", gold="1",
                    verdict="correct" if j < c else "incorrect")
               for b, per_problem in correct.items() for i, c in enumerate(per_problem)
               for j in range(n)]
    per = summarize(records)
    return {"benchmarks": per, "macro_average": report.macro(per), "run": {"model": "m"},
            "wall_time_s": 1.0}


def test_comparison_rows_average_tokens_and_aes():
    base = make_summary({b: [1, 0] for b in DEFAULT_BENCHMARKS}, tokens=100)   # acc 0.25
    better = make_summary({b: [2, 1] for b in DEFAULT_BENCHMARKS}, tokens=50)  # acc 0.75
    worse = make_summary({b: [1, 0] if b != "math500" else [0, 0] for b in DEFAULT_BENCHMARKS},
                         tokens=200)
    columns, averaged, rows = report.comparison_rows([("base", base), ("better", better),
                                                      ("worse", worse)])
    assert columns == list(DEFAULT_BENCHMARKS) == averaged
    assert [r["avg"] for r in rows] == pytest.approx([0.25, 0.75, 0.2])
    assert [r["tokens"] for r in rows] == pytest.approx([100.5, 50.5, 200.5])
    assert rows[0]["aes"] == 0
    assert rows[1]["aes"] == pytest.approx(aes(0.75, 50.5, 0.25, 100.5))
    assert rows[1]["aes"] == pytest.approx((100.5 - 50.5) / 100.5 + 3 * 2.0)
    assert rows[2]["aes"] == pytest.approx((100.5 - 200.5) / 100.5 - 5 * 0.2)


def test_comparison_files(tmp_path):
    base = make_summary({"math500": [1, 0], "gsm8k": [2, 2]}, tokens=10)
    other = make_summary({"math500": [2, 2], "gsm8k": [0, 0], "aime24": [1, 1]}, tokens=20)
    rows = report.write_comparison(tmp_path, [("base", base), ("other", other)])
    md = (tmp_path / "compare.md").read_text()
    assert md.splitlines()[0] == "| run | math500 | aime24 | gsm8k | avg(1) | tokens | AES |"
    assert "| base | 25.0 | - | 100.0 | 25.0 | 10.5 | 0.000 |" in md  # avg over math500 only
    table = list(csv.reader(io.StringIO((tmp_path / "compare.csv").read_text())))
    assert [r[0] for r in table] == ["run", "base", "other"]
    assert float(table[2][4]) == 100.0 and float(table[2][6]) == pytest.approx(rows[1]["aes"], abs=1e-4)
    for name in ("compare_accuracy.png", "compare_tokens.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG)


def test_run_markdown_has_every_metric():
    summary = make_summary({"math500": [1, 2, 0], "amc23": [0, 0, 0]}, tokens=30, n=4)
    md = report.run_markdown(summary)
    assert "pass@1 % | pass@2 % | pass@4 %" in md and "maj@n %" in md
    assert "| math500 | 3 | 4 | 25.0 |" in md and "| amc23 | 3 | 4 | 0.0 |" in md
    assert "2-benchmark macro average" in md


def test_compare_cli_on_two_real_runs(tiny_model, data_dir, tmp_path):
    dirs = []
    for seed in (0, 1):
        out = tmp_path / f"seed{seed}"
        assert cli.main(["run", "--model", str(tiny_model), "--output-dir", str(out),
                         "--backend", "hf", "--benchmarks", "gsm8k,math500", "--limit", "2",
                         "--temperature", "1.0", "--seed", str(seed), "--max-new-tokens", "8",
                         "--data-dir", str(data_dir), "--grader-workers", "1"]) == 0
        dirs.append(out)
    assert cli.main(["compare", "--baseline", str(dirs[0]), "--runs", str(dirs[1]),
                     "--output", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp/compare.md").read_text()
    assert md.splitlines()[0] == "| run | math500 | gsm8k | avg(1) | tokens | AES |"
    assert "| seed0 |" in md and "| seed1 |" in md
    assert len((tmp_path / "cmp/compare.csv").read_text().splitlines()) == 3
    assert (tmp_path / "cmp/compare_accuracy.png").read_bytes().startswith(PNG)
