"""Crash-safe, resumable storage of per-sample records in one JSONL file.

Records are appended a batch at a time (one write, flush, fsync), so a killed writer loses at
most the batch it was writing, and the only damage it can leave is a torn last line. `load`
drops such a line and truncates the file back to the last complete record before anything is
appended; a malformed line anywhere else is corruption and is refused.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Iterable

from infra.errors import UserError

logger = logging.getLogger(__name__)

SampleKey = tuple[str, str, int]
"""(benchmark, problem_id, sample_index): what identifies a sample across runs."""


def sample_key(record: dict) -> SampleKey:
    """The identity of a sample record."""
    return record["benchmark"], str(record["problem_id"]), int(record["sample_index"])


class SampleStore:
    """An append-only JSONL file of sample records, keyed by `sample_key`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> dict[SampleKey, dict]:
        """Read every complete record (first copy wins), repairing a torn tail in place."""
        return self._scan(repair=True)

    def read(self) -> dict[SampleKey, dict]:
        """Read every complete record like `load`, but never write: for readers such as
        `compare`, which must not change another run's files."""
        return self._scan(repair=False)

    def _scan(self, repair: bool) -> dict[SampleKey, dict]:
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        verb = "dropping" if repair else "ignoring"  # a reader leaves the file as it is
        records: dict[SampleKey, dict] = {}
        good_end, start, line_no = 0, 0, 0
        while start < len(data):
            end = data.find(b"\n", start)
            line_no += 1
            line = data[start:] if end < 0 else data[start:end]
            try:
                record = json.loads(line) if line.strip() else None
                key = sample_key(record) if record is not None else None
            except (ValueError, KeyError, TypeError) as e:
                if end < 0 or not data[end + 1:].strip():
                    logger.warning("%s: %s torn last line %d (a killed writer)", self.path,
                                   verb, line_no)
                    break
                raise UserError(f"{self.path}:{line_no} is not a sample record ({e}) and is not "
                                "the last line: the file is corrupt. Move it aside to start over.")
            if end < 0:  # valid JSON but no newline: still a torn write, its batch is incomplete
                logger.warning("%s: %s unterminated last line %d", self.path, verb, line_no)
                break
            if key is not None:
                records.setdefault(key, record)
            good_end = start = end + 1
        if repair and good_end < len(data):
            with open(self.path, "r+b") as handle:
                handle.truncate(good_end)
                os.fsync(handle.fileno())
        return records

    def append(self, records: Iterable[dict]) -> None:
        """Durably append records: one write, then flush and fsync."""
        payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        if not payload:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
