"""The quickstart's held-out problems and its before/after table, on hand-made graded samples
(the real run is in tests/scripts/test_quickstart.py)."""
import json

import pytest

from evaluation.analysis import paired_comparison, problem_outcomes
from openrlhf_replay.cpu import heldout
from openrlhf_replay.cpu.quickstart import arithmetic_pool, prepare_data


def test_held_out_problems_are_every_problem_the_training_file_lacks(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prepare_data("arithmetic", prompts, 16)
    trained = {json.loads(line)["prompt"] for line in prompts.read_text().splitlines()}
    pool = arithmetic_pool()
    assert len(pool) == len({p["prompt"] for p in pool}) == 324  # four kinds x 81 operand pairs
    every = heldout.held_out(pool, prompts, 0, seed=1)
    assert len(every) == 324 - len(trained) and not {p["prompt"] for p in every} & trained
    assert [p["id"] for p in heldout.held_out(pool, prompts, 10, seed=1)] == [p["id"] for p in every[:10]]
    assert heldout.held_out(pool, prompts, 10, seed=1) != heldout.held_out(pool, prompts, 10, seed=2)
    with pytest.raises(ValueError, match=f"only {len(every)} of the 324"):
        heldout.held_out(pool, prompts, len(every) + 1, seed=1)


def _records(correct: dict[str, list[bool]]) -> list[dict]:
    return [{"benchmark": "heldout", "problem_id": pid, "sample_index": j, "prompt": pid, "response": "",
             "response_tokens": 3, "truncated": False, "verdict": "correct" if ok else "incorrect",
             "extracted": None, "gold": "1"} for pid, oks in correct.items() for j, ok in enumerate(oks)]


def test_the_table_prints_the_paired_difference_of_the_two_evaluations():
    before = _records({f"p{i}": [i % 4 == 0, False] for i in range(40)})       # 10 of 80 right
    after = _records({f"p{i}": [i % 4 == 0, i % 2 == 0] for i in range(40)})   # 30 of 80 right
    result = heldout.compare(before, after)
    assert result["before"] == 10 / 80 and result["after"] == 30 / 80 and result["diff"] == pytest.approx(0.25)
    d = paired_comparison(problem_outcomes(before), problem_outcomes(after), averaged=()).per_benchmark["heldout"]
    assert result["ci"] == list(d.ci) and result["p"] == d.p_value and d.ci[0] > 0 and result["resolved_ci"]
    assert (result["improved"], result["worsened"]) == (20, 0)
    text = heldout.table(result, "one-step arithmetic")
    assert "| before training | 12.5% |" in text and "| after training | 37.5% |" in text
    assert f"+25.0 points, 95% CI [{100 * d.ci[0]:+.1f}, {100 * d.ci[1]:+.1f}], p = {d.p_value:.2g}" in text
    assert "the interval excludes 0" in text
    same = heldout.compare(before, before)
    assert same["diff"] == 0 and not same["resolved_ci"] and "includes 0" in heldout.table(same, "x")
