"""The math benchmarks: one loader, one `Problem` type, one gold-answer rule per benchmark.

Local files are laid out as `<data_dir>/<name>/test.jsonl`, one JSON object per line (fields:
`FILE_FORMATS`). Without a local file the loader falls back to the Hugging Face hub (`HUB_IDS`);
when that fails too (offline) the error names the file, its format and `--data-dir`.

Gold answers (docs/METHOD.md section 5):
- math500, aime24, aime25, amc23: the `answer` field; JSON numbers become strings, integral
  floats without their ".0" (AMC's 27.0 -> "27").
- minerva_math: the last brace-matched `\\boxed{...}` of `solution`, `$` delimiters removed.
- olympiadbench: the `final_answer` list, `$` delimiters removed, several answers joined ", ".
- gsm8k: the text after `####`, thousands separators removed.

A row that yields no gold raises `BenchmarkFormatError` (file and 1-based line), or, with
`skip_malformed=True`, is skipped and counted: `load_with_report` returns the count, `load` logs
it. A gold answer is never guessed.
"""
from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infra.datasources import DATA_ENV, DataUnavailableError, load_hub
from infra.errors import UserError

logger = logging.getLogger(__name__)

DEFAULT_BENCHMARKS = ("math500", "aime24", "amc23", "minerva_math", "olympiadbench")
"""The five benchmarks every evaluation reports, in report order."""


class BenchmarkFormatError(UserError):
    """A data row from which no trustworthy problem or gold answer can be read."""


class BenchmarkUnavailableError(UserError):
    """Neither a local file nor the Hugging Face hub could provide a benchmark."""


@dataclass(frozen=True)
class Problem:
    """One benchmark problem with its gold answer."""

    id: str
    """The row's own id field (`unique_id`, `id`, `idx`), else its 0-based row index."""
    problem: str
    """The problem statement, as the model will see it."""
    answer: str
    """The gold answer, a LaTeX string graded with math-verify."""
    benchmark: str
    """The benchmark name, a key of `HUB_IDS`."""


@dataclass(frozen=True)
class HubSource:
    """Where a benchmark lives on the Hugging Face hub (used only without a local file)."""

    path: str
    config: str | None
    split: str


HUB_IDS: dict[str, HubSource] = {
    "math500": HubSource("HuggingFaceH4/MATH-500", None, "test"),
    "aime24": HubSource("HuggingFaceH4/aime_2024", None, "train"),
    "aime25": HubSource("math-ai/aime25", None, "test"),
    "amc23": HubSource("math-ai/amc23", None, "test"),
    "minerva_math": HubSource("math-ai/minervamath", None, "test"),
    "olympiadbench": HubSource("math-ai/olympiadbench", None, "test"),
    "gsm8k": HubSource("openai/gsm8k", "main", "test"),
}
"""Hub copies, read through the same row parsers, so a schema that differs from the local files
fails loudly instead of yielding wrong golds."""

FILE_FORMATS: dict[str, str] = {
    "math500": "`problem` and `answer` (and `unique_id`)",
    "aime24": "`problem` and `answer`",
    "aime25": "`problem` and `answer`",
    "amc23": "`problem` and `answer`",
    "minerva_math": "`problem` and `solution` ending in \\boxed{<answer>}",
    "olympiadbench": "`question` and `final_answer` (a list of answers)",
    "gsm8k": "`question` and `answer` ending in '#### <answer>'",
}
"""What each benchmark's local file holds per line (the fields `_SPECS` reads)."""


class _RowError(ValueError):
    """Raised by the row parsers; `_load_rows` adds the file and line number."""


def extract_boxed(text: str, *, skip_empty: bool = False) -> str | None:
    """Return the content of the last brace-matched `\\boxed{...}` (or `\\fbox{...}`) in `text`.

    Nested braces are matched (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`), escaped ones (`\\{`)
    are not counted, and spaces between the command and its brace are allowed. A box left
    unclosed (a truncated response) is passed over for the previous closed one, and so is an
    empty one when `skip_empty`. None when no box qualifies.
    """
    for match in reversed(list(re.finditer(r"\\(?:boxed|fbox)\s*\{", text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{" and text[i - 1] != "\\":
                depth += 1
            elif text[i] == "}" and text[i - 1] != "\\":
                depth -= 1
                if depth == 0:
                    if not (skip_empty and not text[start:i].strip()):
                        return text[start:i]
                    break
    return None


def _field(row: dict, *names: str) -> object:
    """The first of `names` present in `row` with a non-null value."""
    for name in names:
        if row.get(name) is not None:
            return row[name]
    raise _RowError(f"missing field {' or '.join(repr(n) for n in names)}")


def _text(value: object, what: str) -> str:
    """`value` as a non-empty stripped string; numbers are written without a spurious '.0'."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _RowError(f"{what} has type {type(value).__name__}, expected a string or number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _RowError(f"{what} is {value}")
        value = str(int(value)) if value.is_integer() else repr(value)
    text = str(value).strip()
    if not text:
        raise _RowError(f"{what} is empty")
    return text


def _strip_dollars(text: str) -> str:
    """Remove unescaped `$` math delimiters (one gold is `\\boxed{a+$ $b}` in the source)."""
    return re.sub(r"(?<!\\)\$", "", text).strip()


def _gold_answer_field(row: dict) -> str:
    return _text(_field(row, "answer"), "answer")


def _gold_minerva(row: dict) -> str:
    # The local file has only `solution`; hub copies carry the extracted `answer` instead.
    if row.get("solution") is None:
        return _text(_field(row, "answer"), "answer")
    boxed = extract_boxed(_text(row["solution"], "solution"))
    gold = _strip_dollars(boxed) if boxed is not None else ""
    if not gold:
        raise _RowError("no \\boxed{...} answer in 'solution'")
    return gold


def _gold_olympiadbench(row: dict) -> str:
    answers = _field(row, "final_answer")
    if not isinstance(answers, list) or not answers:
        raise _RowError("'final_answer' is not a non-empty list")
    # Elements are `$x$`, or several `$a$,$b$` segments in one string.
    parts = [_strip_dollars(_text(a, "final_answer item")) for a in answers]
    if not all(parts):
        raise _RowError("'final_answer' has an empty item")
    return ", ".join(parts)


def gsm8k_gold(row: dict) -> str:
    """GSM8K's gold answer: the text after the last `####`, thousands separators removed."""
    answer = _text(_field(row, "answer"), "answer")
    if "####" not in answer:
        raise _RowError("'answer' has no '####' marker")
    gold = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", answer.rsplit("####", 1)[1]).strip()
    if not gold:
        raise _RowError("nothing after '####'")
    return gold


def _repair_control_escapes(text: str) -> str:
    # aime25 stores `\f` of `\frac` and `\t` of `\triangle` as control characters (SOURCES.md).
    return re.sub(r"\t(?=[A-Za-z])", r"\\t", text.replace("\x0c", "\\f"))


@dataclass(frozen=True)
class _Spec:
    problem_fields: tuple[str, ...]
    id_fields: tuple[str, ...]
    gold: Callable[[dict], str]
    repair: Callable[[str], str] = str


_SPECS: dict[str, _Spec] = {
    "math500": _Spec(("problem",), ("unique_id",), _gold_answer_field),
    "aime24": _Spec(("problem", "question"), ("id",), _gold_answer_field),
    "aime25": _Spec(("problem", "question"), ("id",), _gold_answer_field, _repair_control_escapes),
    "amc23": _Spec(("problem", "question"), ("id",), _gold_answer_field),
    "minerva_math": _Spec(("problem", "question"), ("idx", "id"), _gold_minerva),
    "olympiadbench": _Spec(("question", "problem"), ("id",), _gold_olympiadbench),
    "gsm8k": _Spec(("question",), (), gsm8k_gold),
}


def _parse_row(name: str, row: object, index: int) -> Problem:
    """One raw row -> Problem; `index` is the 0-based row index (the id when the row has none)."""
    if not isinstance(row, dict):
        raise _RowError(f"row is a {type(row).__name__}, expected a JSON object")
    spec = _SPECS[name]
    problem = spec.repair(_text(_field(row, *spec.problem_fields), "problem"))
    ids = [row[f] for f in spec.id_fields if row.get(f) is not None]
    return Problem(id=str(ids[0]) if ids else str(index), problem=problem,
                   answer=spec.gold(row), benchmark=name)


def _load_rows(name: str, rows, source: str, skip_malformed: bool) -> tuple[list[Problem], int]:
    """Parse `(line_number, raw_json_text_or_row)` pairs; returns (problems, n_skipped)."""
    problems, n_skipped, seen_ids = [], 0, set()
    for index, (line_no, raw) in enumerate(rows):
        try:
            if isinstance(raw, str):
                try:
                    raw = json.loads(raw)
                except json.JSONDecodeError as e:
                    raise _RowError(f"invalid JSON ({e.msg} at column {e.colno})") from None
            problem = _parse_row(name, raw, index)
            if problem.id in seen_ids:  # samples are keyed by (benchmark, id)
                raise _RowError(f"duplicate id {problem.id!r}")
            seen_ids.add(problem.id)
            problems.append(problem)
        except _RowError as e:
            if not skip_malformed:
                raise BenchmarkFormatError(
                    f"{source}:{line_no}: {e}. Fix the row, or pass --skip-malformed to skip it "
                    "(skipped rows are counted and reported)") from None
            n_skipped += 1
            logger.debug("skipping %s:%d: %s", source, line_no, e)
    return problems, n_skipped


def _hub_rows(name: str, path: Path | None):
    """Rows of the hub copy as (1-based row number, dict); raises BenchmarkUnavailableError."""
    hub = HUB_IDS[name]
    try:
        ds = load_hub(hub.path, hub.config, hub.split,
                      missing=f"benchmark {name!r}: no file {path}" if path else
                      f"benchmark {name!r}: no local file (no --data-dir)",
                      provide=f"Provide the file: --data-dir DIR with DIR/{name}/test.jsonl, one "
                              f"JSON object per line with {FILE_FORMATS[name]} (or set {DATA_ENV} to "
                              f"a folder holding benchmarks/{name}/test.jsonl).")
    except DataUnavailableError as e:
        raise BenchmarkUnavailableError(str(e)) from e.__cause__
    return [(i + 1, row) for i, row in enumerate(ds)]


def load_with_report(name: str, data_dir: str | Path | None, *,
                     skip_malformed: bool = False) -> tuple[list[Problem], int]:
    """Load benchmark `name`; returns (problems in file order, number of skipped malformed rows).

    Reads `<data_dir>/<name>/test.jsonl` when it exists, else the hub copy (`HUB_IDS`). Raises
    ValueError for an unknown name, BenchmarkFormatError for a malformed row (unless
    `skip_malformed`), BenchmarkUnavailableError when no source can be read.
    """
    if name not in _SPECS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(_SPECS)}")
    path = Path(data_dir) / name / "test.jsonl" if data_dir is not None else None
    if path is not None and path.is_file():
        with open(path, encoding="utf-8") as f:
            rows = [(no, line) for no, line in enumerate(f, start=1) if line.strip()]
        return _load_rows(name, rows, str(path), skip_malformed)
    if path is not None:
        logger.warning("%s not found; trying the Hugging Face hub (%s)", path, HUB_IDS[name].path)
    return _load_rows(name, _hub_rows(name, path), f"hub:{HUB_IDS[name].path}", skip_malformed)


def load(name: str, data_dir: str | Path | None, *, skip_malformed: bool = False) -> list[Problem]:
    """Load benchmark `name` as a list of Problems (see `load_with_report`).

    With `skip_malformed=True` the number of skipped rows is logged as a warning; call
    `load_with_report` to get it as a value.
    """
    problems, n_skipped = load_with_report(name, data_dir, skip_malformed=skip_malformed)
    if n_skipped:
        logger.warning("%s: skipped %d malformed row(s); %d problems loaded",
                       name, n_skipped, len(problems))
    return problems
