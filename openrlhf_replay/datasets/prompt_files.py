"""Prompt files read row by row as upstream's loader reads them (`datasets`' json reader: a JSON
array's elements, or a JSON-lines file's non-blank lines), each row with the line it starts on so
a message can name it. The launcher's checks (`cli/prompts.py`) and the trainer's success pool
(`trainer/ppo_utils/success_pool.py`) both read prompt files through here.
"""
from __future__ import annotations

import json
import re

_BETWEEN_ELEMENTS = re.compile(r"[\s,]*")


class UnreadableFile(ValueError):
    """A prompt file that upstream's JSON loader would refuse; the message names the line."""


def file_rows(path: str) -> list[tuple[int, object]]:
    """(line number, row) for each row of a .json array or a .jsonl file, as upstream reads them."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise UnreadableFile(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(rows, list):
            raise UnreadableFile(f"{path}: not a JSON array of rows")
        return list(zip(_element_lines(text), rows))
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((number, json.loads(line)))
            except json.JSONDecodeError as e:
                raise UnreadableFile(f"{path}:{number}: not JSON ({e.msg} at column {e.colno})") from None
    return out


def _element_lines(text: str):
    """The line on which each element of a (valid) JSON array starts."""
    decoder, pos, line = json.JSONDecoder(), text.index("[") + 1, 1 + text.count("\n", 0, text.index("["))
    while True:
        start = _BETWEEN_ELEMENTS.match(text, pos).end()
        if start >= len(text) or text[start] == "]":
            return
        line += text.count("\n", pos, start)
        yield line
        _, end = decoder.raw_decode(text, start)
        line += text.count("\n", start, end)
        pos = end
