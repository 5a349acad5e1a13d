"""Breakdown tables: metadata read from the real benchmark rows, grouping by hand-built records."""
import pytest

from evaluation import benchmarks
from evaluation.breakdown import (PER_BENCHMARK, breakdown_tables, length_bucket,
                                  problem_metadata)


def test_metadata_ids_match_the_loader(data_dir):
    for name, field, n in (("math500", "level", 500), ("math500", "subject", 500),
                           ("olympiadbench", "subfield", 675), ("minerva_math", "subject", 272)):
        meta = problem_metadata(name, data_dir)
        ids = [p.id for p in benchmarks.load(name, data_dir)]
        assert set(meta) == set(ids) and sum(field in m for m in meta.values()) == n, name
    math500 = problem_metadata("math500", data_dir)
    assert math500["test/algebra/2584.json"] == {"level": "3", "subject": "Algebra"}
    assert problem_metadata("gsm8k", data_dir) == {}  # no metadata fields in its rows
    assert problem_metadata("gsm8k", None) == {}


@pytest.mark.parametrize("tokens, bucket", [(0, "<128"), (127, "<128"), (128, "128-255"),
                                            (1023, "512-1023"), (4096, "4096-8191"),
                                            (16384, ">=16384")])
def test_length_bucket(tokens, bucket):
    assert length_bucket(tokens) == bucket


def rec(pid, j, ok, tokens=50, truncated=False, **meta):
    return dict(benchmark="math500", problem_id=pid, sample_index=j, prompt="q", response="r",
                response_tokens=tokens, truncated=truncated, extracted="1", gold="1",
                verdict="correct" if ok else "incorrect", **meta)


def test_breakdown_tables_by_hand():
    samples = [rec("a", 0, True, 50, level="10"), rec("a", 1, False, 300, True, level="10"),
               rec("b", 0, True, 60, level="2"), rec("b", 1, True, 70, level="2"),
               rec("c", 0, False, 200)]                      # an old record: no level stored
    tables = breakdown_tables(samples, {"math500": {"c": {"level": "2", "subject": "Geometry"}}})
    per = tables[PER_BENCHMARK][0]
    assert per["group"] == "math500" and per["problems"] == 3 and per["samples"] == 5
    assert per["accuracy"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert per["truncation_rate"] == pytest.approx(0.2) and per["mean_tokens"] == 136
    level = tables["math500 by level"]
    assert [r["group"] for r in level] == ["2", "10"]  # numeric order
    assert level[0]["problems"] == 2 and level[0]["accuracy"] == pytest.approx(0.5)  # b 1, c 0
    assert tables["math500 by subject"] == [
        {"group": "Geometry", "problems": 1, "samples": 1, "accuracy": 0.0,
         "truncation_rate": 0.0, "mean_tokens": 200.0}]
    assert "math500 by subfield" not in tables
    length = {r["group"]: r for r in tables["math500 by response tokens"]}
    assert list(length) == ["<128", "128-255", "256-511"]
    assert length["<128"]["samples"] == 3 and length["<128"]["accuracy"] == pytest.approx(1.0)
    assert length["256-511"]["truncation_rate"] == 1.0
