"""Text-level preparation of responses and golds for math-verify, and checks on what it extracts.

`prepare_response` rewrites a response before math-verify's own answer extraction runs on it:
- boxes (`\\boxed{}`, `\\fbox{}`, brace-matched): the final run of boxes (boxes with only joiners
  between them: commas, "and", `\\quad`, math delimiters, `\\text{...}`) is the answer and stays
  boxed, as `\\boxed`; a box before that run is an abandoned answer ("\\boxed{3}, wait, actually
  \\boxed{5}") and keeps only its content; an empty box (an echoed instruction) is removed. In a
  box, a sentence's period at the end is dropped and a lone e-notation number rewritten
  (`unscientific`). A box left unclosed (a cut response) is left as it is;
- a plain-text mixed number ("4 4/9", "-1 000 1/2") becomes one fraction, `\\frac{40}{9}`: math-
  verify 0.9.0 reads "4 4/9" as two numbers and keeps the last. One whose fraction is not proper
  ("11 7/6", "4 4/0") is no number at all and becomes "undefined";
- `\\mathrm{e}` (and `\\text{e}`, `\\operatorname{e}`) becomes `e`: math-verify drops `\\mathrm{...}`
  as a unit, which cut `1 + \\frac{1}{\\mathrm{e}}` to `1 + \\frac{1}{` and graded it equal to 1;
- delimiter sizing (`\\bigl(`, `\\Bigr]`) is dropped: math-verify 0.9.0 fails on it and then
  takes a number from inside the failed expression;
- a lone number in square brackets ("[90]", Geometry3K's answer format) loses the brackets;
- a number glued to a non-ASCII letter ("比例为13/28") is set apart by a space, and the word
  "answer" in a few other languages ("Réponse:", "答案") becomes "Answer", so that math-verify's
  number reading and its "answer" anchor work as they do in English.
- a plain-text expression with a variable ("2x", "3y+1", "y = 3x + 1") that is the final answer,
  being the last line or what follows "answer is"/"answer:" to the end of its line or sentence,
  goes into `$...$`: math-verify's plain-text reading takes only numbers and read "2x" as 2 (so
  "2x" matched a gold of 2, and not one of 2x), while its LaTeX reading takes the expression whole.

`is_balanced` tells a cut extraction (unbalanced braces), which is never compared.
`looks_plain` sorts out samples that are cheap to grade (for scheduling only).
"""
from __future__ import annotations

import re

from evaluation.benchmarks import extract_boxed

_SCIENTIFIC = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*[eE]\s*([-+]?\d+)\s*")
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# What may stand between boxes that together give one answer: spacing, commas, "and"/"or",
# math delimiters, \\text{...} and a variable's label ("y_2 =").
_JOINER = re.compile(r"(?:\s|[,;&$]|\\[,;:! ()\[\]]|\\q?quad|\\\\|\b(?:and|or)\b"
                     r"|\\(?:text|mbox|textbf)\s*\{[^{}]*\}|\b[a-zA-Z](?:_\{?\w+\}?)?\s*=)*")
_EULER = re.compile(r"\\(?:mathrm|text|textrm|operatorname|mathit)\s*\{\s*e\s*\}")
# A whole part (digits, or digits in spaced groups of three) then a fraction, one space apart; not
# part of a longer number, expression or fraction on either side ("11/10 4/9", "(11) 4/9").
_MIXED = re.compile(r"(?<![\w.,/)}\]^])(-?)(\d{1,3}(?: \d{3})+|\d+) (\d+)/(\d+)(?![\w/]|\.\d)")
# \bigl( and its kin only size a delimiter; math-verify 0.9.0 fails on them and then takes a number
# from inside the failed expression (the 0 of \sum_{k=0}).
_SIZING = re.compile(r"\\[Bb]igg?[lrm]?(?![a-zA-Z])")
# A lone number in square brackets, Geometry3K's answer format ("The angle is [90]."); not \[ ... \]
# display math, not an interval or a list.
_BRACKETED = re.compile(r"(?<!\\)\[\s*([-+]?\d+(?:\.\d+)?(?:/\d+)?(?:\s*degrees?)?)\s*\]")
# An ASCII digit or $ straight after a non-ASCII character ("比例为13/28"): math-verify only reads
# numbers that stand apart from letters, and \w includes every script's letters.
_GLUED = re.compile(r"(?<=[^\x00-\x7f])(?=[\d$])")
# The word "answer" in other languages, so math-verify's "answer" anchor finds the final answer.
_ANSWER_WORDS = re.compile(
    r"(?i)\b(?:réponse|respuesta|risposta|resposta|antwort|ответ|jawaban)\b|答案|الإجابة|उत्तर")
# What a plain-text expression is made of (ASCII digits and letters, operators, spaces); the rest
# of the test is in _plain_expression.
_EXPR_CHARS = re.compile(r"[0-9A-Za-z.+\-*/^()= ]+")
# The text after an "answer is" / "answer:" (or "**Answer:**") anchor, up to the end of its line
# or sentence.
_AFTER_ANSWER = re.compile(
    r"(?im)(\banswer(?:\s+is)?\s*(?::(?:\*\*)?)?[ \t]*)([^\n]*?)(?=\.?[ \t]*$|\.\s)")
_PLAIN_NUMBER = re.compile(r"\s*\$?\s*[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)\s*\$?\s*(?:\\?%)?\s*\.?\s*")


def unscientific(answer: str) -> str:
    """'4.5e33' -> '4.5 \\times 10^{33}'; anything but a lone e-notation number is unchanged.
    (math-verify reads "4.5e33" as 4.5 * e * 33.)"""
    match = _SCIENTIFIC.fullmatch(answer)
    return f"{match[1]} \\times 10^{{{match[2]}}}" if match else answer


def prepare_gold(gold: str) -> str:
    """The gold as `$...$` inline math for math-verify: on one line, e-notation and `\\mathrm{e}`
    rewritten."""
    return f"${unscientific(_EULER.sub('e', ' '.join(gold.split())))}$"


def prepare_response(response: str) -> str:
    """The response rewritten for math-verify's extraction (see the module docstring)."""
    text = _BRACKETED.sub(r"\1", _tidy_boxes(response))
    text = _EULER.sub("e", _MIXED.sub(_mixed_number, text))
    text = _GLUED.sub(" ", _SIZING.sub("", text))
    return _math_delimited(_ANSWER_WORDS.sub("Answer", text))


def _plain_expression(text: str) -> bool:
    """Whether `text` is a plain-text expression with a variable, such as "2x", "3y+1",
    "y = 3x + 1": only digits, single letters, operators and spaces; a letter, and a digit or an
    operator. Not a word ("5 apples"), nor a unit after a spaced number ("5 m", read as 5 before),
    nor a lone letter ("C", a choice)."""
    return bool(_EXPR_CHARS.fullmatch(text) and re.search(r"[A-Za-z]", text)
                and re.search(r"[\d+\-*/^=]", text)
                and not re.search(r"[A-Za-z]{2}|\d\s+[A-Za-z]", text))


def _delimited(span: str) -> str | None:
    """`span` with the plain-text expression in it put in `$...$`, a sentence's period left
    outside and markdown bold ("**2x**") dropped (math-verify's "final answer is" anchor takes
    `$...$` only right after "is"); None when `span` holds no such expression alone."""
    parts = re.fullmatch(r"(\s*)(?:\*\*)?(.*?)(?:\*\*)?(\s*\.?\s*)", span, re.DOTALL)
    return f"{parts[1]}${parts[2]}${parts[3]}" if _plain_expression(parts[2]) else None


def _math_delimited(text: str) -> str:
    """`text` with a plain-text final-answer expression put in `$...$` (module docstring): the
    expression after an "answer" anchor, and the last line when it is one."""
    text = _AFTER_ANSWER.sub(lambda m: m[1] + (_delimited(m[2]) or m[2]), text)
    head, newline, last = text.rstrip().rpartition("\n")
    last = _delimited(last)
    return text if last is None else head + newline + last


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the `}` that closes a brace opened just before `start`; None if it never closes.
    Escaped braces (`\\{`) are not counted."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] in "{}" and text[i - 1] != "\\":
            depth += 1 if text[i] == "{" else -1
            if depth == 0:
                return i
    return None


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of each complete outermost box, in order; stops at an unclosed one
    (a cut response), which is left for the balance check to catch."""
    boxes, pos = [], 0
    for match in _BOX_OPEN.finditer(text):
        if match.start() < pos:  # a box inside one already taken
            continue
        end = _closing_brace(text, match.end())
        if end is None:
            break
        boxes.append((match.start(), end + 1, text[match.end():end]))
        pos = end + 1
    return boxes


def _final_run(text: str, boxes: list[tuple[int, int, str]]) -> int:
    """Index into `boxes` of the first box of the final run: boxes with only joiners between
    them ("\\boxed{1}, \\boxed{2}", "\\boxed{a} \\quad \\text{and} \\quad \\boxed{b}")."""
    first = len(boxes) - 1
    while first > 0 and _JOINER.fullmatch(text[boxes[first - 1][1]:boxes[first][0]]):
        first -= 1
    return first


def _box_answer(content: str) -> str:
    """A box's content without spaces around it or a sentence's period at its end ("5.")."""
    return re.sub(r"\.\s*$", "", content.strip()).strip()


def _tidy_boxes(text: str) -> str:
    answers = [box for box in _boxes(text) if _box_answer(box[2])]
    run_start = answers[_final_run(text, answers)][0] if answers else len(text)
    out, pos = [], 0
    for start, end, content in _boxes(text):
        content = _box_answer(content)
        out.append(text[pos:start])
        if content and start >= run_start:
            out.append(f"\\boxed{{{unscientific(content)}}}")
        else:  # empty (an echoed instruction), or before the final run: an abandoned answer
            out.append(content)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _mixed_number(match: re.Match) -> str:
    sign, whole, numerator, denominator = match.groups()
    numerator, denominator = int(numerator), int(denominator)
    if not 0 <= numerator < denominator:
        return "undefined"
    value = int(whole.replace(" ", "")) * denominator + numerator
    latex = f"{sign}\\frac{{{value}}}{{{denominator}}}"
    # Inside inline math already (an odd number of unescaped $ before it) it needs no delimiters.
    dollars = len(re.findall(r"(?<!\\)\$", match.string[:match.start()]))
    return latex if dollars % 2 else f"${latex}$"


def is_balanced(latex: str) -> bool:
    """Whether every unescaped `{` in `latex` is closed, in order: an extraction that is not was
    cut inside an expression and must not be compared."""
    depth = 0
    for i, char in enumerate(latex):
        if char in "{}" and (i == 0 or latex[i - 1] != "\\"):
            depth += 1 if char == "{" else -1
            if depth < 0:
                return False
    return depth == 0


def looks_plain(response: str, gold: str) -> bool:
    """Whether the gold and the response's last box are plain numbers, so grading the pair is
    cheap. Scheduling may depend on this; a verdict never does."""
    if not _PLAIN_NUMBER.fullmatch(gold):
        return False
    boxed = extract_boxed(response, skip_empty=True)
    return boxed is not None and bool(_PLAIN_NUMBER.fullmatch(boxed))
