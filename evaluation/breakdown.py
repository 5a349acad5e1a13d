"""Where a run's accuracy comes from: by level, subject and subfield, by response length, and
per benchmark with its truncation rate. Written per run as breakdown.md / breakdown.csv (and
into summary.json), and set side by side across runs by `compare`.

Problem metadata (`level`, `subject`, `subfield`) is read from the benchmark rows that carry it
(MATH-500 `level` and `subject`, OlympiadBench `subfield`, Minerva's course `type` as its
subject) and stored in each sample record, so a run directory is enough to break it down.
"""
from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping

from evaluation import benchmarks
from evaluation.records import METADATA_FIELDS, SampleRecord

logger = logging.getLogger(__name__)

ROW_FIELDS = {"level": ("level",), "subject": ("subject", "type"), "subfield": ("subfield",)}
"""For each metadata field, the benchmark-row fields it is read from (first one present)."""

LENGTH_EDGES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""Response-token bucket boundaries: fixed, so buckets line up across runs and models."""

PER_BENCHMARK = "per benchmark"
"""Title of the table with one row per benchmark (accuracy, truncation rate, mean tokens)."""


def problem_metadata(name: str, data_dir: str | Path | None) -> dict[str, dict[str, str]]:
    """{problem id: {field: value}} for benchmark `name` from its local file; {} without one.

    Ids are derived exactly as `benchmarks.load` derives them (the row's id field, else its
    0-based index among non-empty lines), so they match `Problem.id`. Hub copies are not read
    again for this: their runs simply have no metadata breakdown.
    """
    path = Path(data_dir) / name / "test.jsonl" if data_dir is not None else None
    if path is None or not path.is_file():
        return {}
    # The loader's own id rule; benchmarks.py keeps it private to its row parser.
    id_fields = benchmarks._SPECS[name].id_fields
    found: dict[str, dict[str, str]] = {}
    with open(path, encoding="utf-8") as handle:
        lines = [line for line in handle if line.strip()]
    for index, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # the loader refuses or skips this row; it has no samples
        if not isinstance(row, dict):
            continue
        ids = [row[f] for f in id_fields if row.get(f) is not None]
        meta = {}
        for field, sources in ROW_FIELDS.items():
            value = next((row[s] for s in sources if row.get(s) not in (None, "")), None)
            if value is not None and not isinstance(value, (dict, list)):
                meta[field] = str(value)
        if meta:
            found[str(ids[0]) if ids else str(index)] = meta
    return found


def length_bucket(tokens: int) -> str:
    """The response-length bucket of a sample: `<128`, `128-255`, ..., `>=16384`."""
    lower = 0
    for edge in LENGTH_EDGES:
        if tokens < edge:
            return f"<{edge}" if lower == 0 else f"{lower}-{edge - 1}"
        lower = edge
    return f">={LENGTH_EDGES[-1]}"


def _bucket_order(label: str) -> int:
    return int(label.lstrip("<>=").split("-")[0]) if label[0] != "<" else -1


def _group_order(values: Iterable[str]) -> list[str]:
    """Numeric labels in numeric order (levels 1..5), others alphabetically."""
    values = list(values)
    if all(v.isdigit() for v in values):
        return sorted(values, key=int)
    return sorted(values)


def _row(group: str, records: list[SampleRecord]) -> dict:
    """One table row: problems, samples, accuracy (avg@n over the group's problems), truncation
    rate and mean response tokens over its samples."""
    by_problem: dict[str, list[SampleRecord]] = defaultdict(list)
    for r in records:
        by_problem[r.problem_id].append(r)
    per_problem = [sum(r.correct for r in g) / len(g) for g in by_problem.values()]
    return {"group": group, "problems": len(by_problem), "samples": len(records),
            "accuracy": sum(per_problem) / len(per_problem),
            "truncation_rate": sum(r.truncated for r in records) / len(records),
            "mean_tokens": sum(r.response_tokens for r in records) / len(records)}


def breakdown_tables(samples: Iterable[SampleRecord | Mapping],
                     metadata: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None
                     ) -> dict[str, list[dict]]:
    """Breakdown tables {title: rows} from graded samples.

    - `per benchmark`: accuracy, truncation rate and mean tokens of each benchmark;
    - `<benchmark> by <field>` for each metadata field its records carry (or `metadata`
      {benchmark: {problem id: {field: value}}} supplies, for records written before the
      fields existed); problems without the field are left out of that table;
    - `<benchmark> by response tokens`: the samples in each length bucket. Accuracy there is
      over samples (a problem's samples can fall in different buckets), and it mixes cause and
      effect: wrong answers tend to be long, and truncated ones are long by construction.
    Every row: group, problems, samples, accuracy, truncation_rate, mean_tokens.
    """
    by_benchmark: dict[str, list[SampleRecord]] = defaultdict(list)
    for s in samples:
        record = s if isinstance(s, SampleRecord) else SampleRecord.from_dict(s)
        by_benchmark[record.benchmark].append(record)
    tables: dict[str, list[dict]] = {
        PER_BENCHMARK: [_row(b, records) for b, records in by_benchmark.items()]}
    for bench, records in by_benchmark.items():
        known = (metadata or {}).get(bench, {})
        for field in METADATA_FIELDS:
            groups: dict[str, list[SampleRecord]] = defaultdict(list)
            for r in records:
                value = getattr(r, field) or known.get(r.problem_id, {}).get(field)
                if value is not None:
                    groups[value].append(r)
            if groups:
                tables[f"{bench} by {field}"] = [_row(g, groups[g]) for g in _group_order(groups)]
        buckets: dict[str, list[SampleRecord]] = defaultdict(list)
        for r in records:
            buckets[length_bucket(r.response_tokens)].append(r)
        tables[f"{bench} by response tokens"] = [_row(b, buckets[b])
                                                  for b in sorted(buckets, key=_bucket_order)]
    return tables
