"""`SampleRecord`: one graded model response, the unit that generation writes and metrics read."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

VERDICTS = ("correct", "incorrect", "unparseable", "timeout")
"""The values of `evaluation.verify.Verdict`, repeated here so records need no grader import."""

METADATA_FIELDS = ("level", "subject", "subfield")
"""Optional per-problem fields copied from the benchmark row, for breakdowns."""


@dataclass(frozen=True)
class SampleRecord:
    """One sampled response to one benchmark problem, with its grade. Checked on creation."""

    benchmark: str
    """Benchmark name, e.g. "math500"."""
    problem_id: str
    """`Problem.id` of the problem answered."""
    sample_index: int
    """0-based index of this sample among the problem's n samples."""
    prompt: str
    """The exact text given to the model (chat template applied)."""
    response: str
    """The generated text, without the prompt."""
    response_tokens: int
    """Number of generated tokens."""
    truncated: bool
    """True when generation stopped at the token limit (finish reason "length")."""
    verdict: str
    """One of VERDICTS; a `Verdict` member is accepted and stored as its value."""
    extracted: str | None
    """The answer the grader extracted (`Graded.extracted`), None if none."""
    gold: str
    """The gold answer graded against (`Problem.answer`)."""
    level: str | None = None
    """The problem's difficulty level where the benchmark row has one (MATH-500: "1" to "5")."""
    subject: str | None = None
    """The problem's subject where the row has one (MATH-500 `subject`, Minerva's course `type`)."""
    subfield: str | None = None
    """The problem's subfield where the row has one (OlympiadBench `subfield`)."""

    def __post_init__(self) -> None:
        for name in ("benchmark", "problem_id", "prompt", "response", "gold"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"SampleRecord.{name} must be a str, got "
                                f"{type(getattr(self, name)).__name__}")
        for name in ("sample_index", "response_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SampleRecord.{name} must be an int >= 0, got {value!r}")
        if not isinstance(self.truncated, bool):
            raise TypeError(f"SampleRecord.truncated must be a bool, got {self.truncated!r}")
        if isinstance(self.verdict, str):  # a Verdict member is stored as its plain value
            object.__setattr__(self, "verdict", str(self.verdict))
        if self.verdict not in VERDICTS:
            raise ValueError(f"SampleRecord.verdict must be one of {VERDICTS}, "
                             f"got {self.verdict!r}")
        for name in ("extracted", *METADATA_FIELDS):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"SampleRecord.{name} must be a str or None, got {value!r}")

    @property
    def correct(self) -> bool:
        return self.verdict == "correct"

    def to_dict(self) -> dict:
        """A JSON-ready dict of the fields above; metadata fields only when set."""
        row = dataclasses.asdict(self)
        for name in METADATA_FIELDS:  # most benchmarks have none: no empty fields on their lines
            if row[name] is None:
                del row[name]
        return row

    @classmethod
    def from_dict(cls, row: dict) -> "SampleRecord":
        """Build from a dict (e.g. a JSONL line); keys beyond the fields are ignored.

        The metadata fields are optional, so records written before they existed still load.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in row and n not in METADATA_FIELDS]
        if missing:
            raise ValueError(f"sample record lacks field(s) {missing}; has {sorted(row)}")
        return cls(**{n: row[n] for n in names if n in row})
