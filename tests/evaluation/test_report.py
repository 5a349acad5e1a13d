"""report.md, the comparison (markdown, CSVs, plots) with its CIs, paired tests and AES."""
import csv
import io
import json

import pytest

from evaluation import cli, comparison, comparison_files, report
from evaluation.benchmarks import DEFAULT_BENCHMARKS
from evaluation.metrics import aes, summarize
from infra.errors import UserError

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


def make_run(label: str, correct: dict[str, list[int]], tokens: int, n: int = 2,
             **provenance) -> comparison.RunData:
    """A `comparison.RunData` from the same synthetic records as `make_summary`."""
    summary = make_summary(correct, tokens, n)
    summary["run"]["n_samples"] = n
    records = [dict(benchmark=b, problem_id=str(i), sample_index=j, prompt="p", response="r",
                    response_tokens=tokens + j, truncated=False, extracted="1", gold="1",
                    verdict="correct" if j < c else "incorrect")
               for b, per_problem in correct.items() for i, c in enumerate(per_problem)
               for j in range(n)]
    return comparison.RunData(label, summary, records, provenance or None)


def test_comparison_files(tmp_path):
    base = make_run("base", {"math500": [1, 0], "gsm8k": [2, 2]}, tokens=10)
    other = make_run("other", {"math500": [2, 2], "gsm8k": [0, 0], "aime24": [1, 1]}, tokens=20)
    result = comparison.build([base, other])
    comparison_files.write(tmp_path, result)
    md = (tmp_path / "compare.md").read_text()
    assert "| run | math500 | aime24 | gsm8k | avg(1) | tokens | AES |" in md
    assert "| base | 25.0 [0.0, 75.0] | - | 100.0 [100.0, 100.0] | 25.0 [0.0, 75.0] | 10.5 |" in md
    assert "| other | math500 | 2 | +75.0 |" in md and "sign test" in md
    assert "`other`, gsm8k: gained 0; lost 2 (`0`, `1`)" in md
    assert "`base`, `other` have no provenance record" in md  # runs from before it existed
    table = list(csv.reader(io.StringIO((tmp_path / "compare.csv").read_text())))
    assert table[0][:7] == ["run", "math500", "aime24", "gsm8k", "avg(1)", "tokens", "AES"]
    assert [r[0] for r in table] == ["run", "base", "other"]
    assert float(table[2][4]) == 100.0  # columns read by position before CIs existed
    assert float(table[2][6]) == pytest.approx(result.rows[1]["aes"], abs=1e-4)
    assert table[0][7:11] == ["tokens_benchmarks", "math500_ci_lo", "math500_ci_hi", "aime24_ci_lo"]
    paired = list(csv.DictReader(io.StringIO((tmp_path / "compare_paired.csv").read_text())))
    assert [(r["benchmark"], r["gained"], r["lost"]) for r in paired] == [
        ("math500", "2", "0"), ("gsm8k", "0", "2"), ("avg(1)", "2", "0")]
    assert paired[1]["lost_ids"] == "0 1" and paired[1]["resolved"] == "no"
    for name in ("compare_accuracy.png", "compare_tokens.png", "compare_paired.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG)
    assert (tmp_path / "compare_breakdown.csv").read_text().startswith("run,table,group")


def test_comparison_across_seeds(tmp_path):
    runs = [make_run(f"{cond}_seed{s}", {b: [c, 0, 1] for b in DEFAULT_BENCHMARKS}, tokens=10)
            for cond, cs in (("grpo", (0, 1, 0)), ("replay", (2, 2, 1)))
            for s, c in zip((1, 2, 3), cs)]
    result = comparison.build(runs)
    assert [g.condition for g in result.groups] == ["grpo", "replay"]
    test = result.seed_tests["replay"]["avg"]
    assert (test["positive"], test["negative"], test["p_value"]) == (3, 0, 0.25)
    comparison_files.write(tmp_path, result)
    md = (tmp_path / "compare.md").read_text()
    assert "## Across seeds" in md
    assert "| replay | avg | 3 | +16.7 | 3 / 0 | 0.25 | no | 0.25 |" in md
    assert (tmp_path / "compare_seeds.csv").read_text().startswith("condition,seeds,metric")


def test_load_run_reads_only_what_the_summary_counts(tmp_path, caplog):
    run = make_run("r", {"gsm8k": [1, 0, 2]}, tokens=5)
    run.summary["problems"] = {"gsm8k": ["2", "0"]}  # a later, smaller --limit: problem 1 left out
    kept = [r for r in run.records if r["problem_id"] != "1"]
    run.summary["benchmarks"] = summarize(kept)
    lines = "".join(json.dumps(r) + "\n" for r in run.records)
    (tmp_path / "samples.jsonl").write_text(lines + '{"torn')
    (tmp_path / "summary.json").write_text(json.dumps(run.summary))
    loaded = comparison.load_run(tmp_path, run.summary)
    assert [(r["problem_id"], r["sample_index"]) for r in loaded.records] == [
        ("2", 0), ("2", 1), ("0", 0), ("0", 1)]
    assert (tmp_path / "samples.jsonl").read_text().endswith('{"torn')  # compare never writes
    assert "ignoring torn last line" in caplog.text
    run.summary["benchmarks"]["gsm8k"]["n_samples"] = 6
    with pytest.raises(UserError, match="rerun the run's `run` command"):
        comparison.load_run(tmp_path, run.summary)


def test_run_markdown_has_every_metric():
    summary = make_summary({"math500": [1, 2, 0], "amc23": [0, 0, 0]}, tokens=30, n=4)
    md = report.run_markdown(summary)
    assert "pass@1 % | pass@2 % | pass@4 % | g-pass@4_0.5 % | g-pass@4_0.75 % | g-pass@4_1.0 %" in md
    assert "maj@n %" in md
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
    assert "| run | math500 | gsm8k | avg(1) | tokens | AES |" in md
    assert "| seed0 | 0.0 [0.0, 0.0] |" in md and "| seed1 |" in md
    assert "| seed1 | math500 | 2 | +0.0 | [+0.0, +0.0] | McNemar | 1 | no | 0 | 0 |" in md
    assert "generation.seed: 0 vs 1" in md  # the runs differ in more than the model
    assert len((tmp_path / "cmp/compare.csv").read_text().splitlines()) == 3
    assert (tmp_path / "cmp/compare_accuracy.png").read_bytes().startswith(PNG)


def test_compare_warns_on_settings_but_not_on_a_models_own_chat_template():
    def run(label, template, torch):
        r = make_run(label, {"math500": [1, 0]}, tokens=10,
                     prompt={"kind": template.split(":")[0], "sha256": template},
                     software={"torch": torch}, model={"sha256": label})
        r.summary["run"].update(prompt_template=template, max_new_tokens=256)
        return r
    chat = comparison.build([run("a", "chat:111", "2.1"), run("b", "chat:222", "2.1")])
    assert chat.warnings == []  # chat prompts differ with the model's tokenizer: expected
    plain = comparison.build([run("a", "plain:111", "2.1"), run("b", "plain:222", "2.2")])
    assert len(plain.warnings) == 1
    for key in ("generation.prompt_template: plain:111 vs plain:222", "prompt.sha256",
                "software.torch: 2.1 vs 2.2"):
        assert key in plain.warnings[0]
    assert "model" not in plain.warnings[0].split("more than the model")[1]
