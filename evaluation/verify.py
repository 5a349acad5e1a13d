"""The verdict for one response against one gold answer: math-verify's parse, then its verify.

In-process and unbounded, with math-verify's own `signal.alarm` timeouts off (they fail off the
main thread); `evaluation.grader` runs it in worker processes within a time limit.

Answer extraction (`extract_answer`): math-verify's own extraction over the whole response, after
`evaluation.extraction.prepare_response` has tidied it: boxes before the final run of boxes are
unboxed (the final box wins; several boxes joined by commas or "and" are one answer, graded as
math-verify grades them), empty boxes removed, mixed numbers ("4 4/9") made one fraction, a plain-
text final-answer expression ("The answer is 2x") put in `$...$` so it is read whole, and a few
notations math-verify misreads rewritten (e-notation, `\\mathrm{e}`, `\\bigl(`, "[90]"). An
extraction with unbalanced braces (cut inside an expression) is never compared; when math-verify
finds nothing usable, the last complete box is parsed alone. The gold is wrapped in `$...$`.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from enum import Enum

from evaluation.benchmarks import extract_boxed
from evaluation.extraction import is_balanced, prepare_gold, prepare_response


class Verdict(str, Enum):
    """The outcome of grading one sample; the value is what records and reports store."""

    CORRECT = "correct"
    INCORRECT = "incorrect"
    UNPARSEABLE = "unparseable"
    """Nothing could be extracted from the response (no box, and math-verify found nothing)."""
    TIMEOUT = "timeout"
    """The grader could not finish: past the wall-clock limit, or its worker process died."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Graded:
    """A verdict with the answer it was reached on."""

    verdict: Verdict
    extracted: str | None
    """math-verify's normalised LaTeX of the extracted answer; None if nothing was extracted
    (or the sample timed out)."""


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeouts are off; here that is by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def _parse(text: str) -> list:
    """math-verify's parse with its signal-based timeout off."""
    from math_verify import parse  # imported lazily: keeps `import evaluation.grader` light

    return parse(text, parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    # Cached: every one of a problem's n samples is graded against the same gold.
    return tuple(_parse(prepare_gold(gold)))


def _checked(parsed: list) -> tuple[list, str | None]:
    """(parse result, its normalised answer string), or ([], None) when nothing was extracted or
    the extraction was cut inside an expression (unbalanced braces): that is never compared."""
    if not parsed:
        return [], None
    # With fallback_mode="first_match", parse appends the matched string after any expression.
    text = next((p for p in parsed if isinstance(p, str)), None)
    text = text if text is not None else str(parsed[0])
    return (parsed, text) if is_balanced(text) else ([], None)


def extract_answer(response: str) -> tuple[list, str | None]:
    """(math-verify parse result, normalised answer string) for `response`; ([], None) when
    nothing can be extracted.

    math-verify's own extraction runs on the prepared response (`extraction.prepare_response`),
    so several boxes, "final answer is" sentences and its other anchors count as it counts them.
    When it finds nothing, or only a cut expression, the last complete box is parsed alone.
    """
    text = prepare_response(response)
    parsed, extracted = _checked(_parse(text))
    if not parsed:
        boxed = extract_boxed(text, skip_empty=True)
        if boxed and boxed.strip():
            parsed, extracted = _checked(_parse(f"\\boxed{{{boxed}}}"))
    return parsed, extracted


def grade_detailed(response: str, gold: str) -> Graded:
    """Grade one response against one gold answer, in-process and without a time limit (what
    the workers run; `grade` is the bounded call)."""
    from math_verify import verify

    gold_parsed = list(_parse_gold(gold))
    if not gold_parsed:  # a data error, never a wrong answer: raise whatever the response is
        raise ValueError(f"gold answer {gold!r} cannot be parsed by math-verify")
    parsed, extracted = extract_answer(response)
    if not parsed:
        return Graded(Verdict.UNPARSEABLE, None)
    ok = verify(gold_parsed, parsed, timeout_seconds=None)
    return Graded(Verdict.CORRECT if ok else Verdict.INCORRECT, extracted)
