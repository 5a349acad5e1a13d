"""Prompt templates: turn a benchmark problem into the exact text a model is given.

Three kinds, chosen with `--prompt-template`:

- `chat`: one user turn, ``"{problem}\\n" + BOXED_INSTRUCTION``, rendered with the tokenizer's
  own chat template (`apply_chat_template`, generation prompt added). For instruct models.
- `plain`: a raw completion prompt for base models (`PLAIN_TEMPLATE`): the problem, the same
  boxed-answer instruction, then ``Answer: Let's think step by step.`` for the model to continue.
- a path to a UTF-8 `.txt` file holding `{problem}`: the file is the whole prompt, with
  `{problem}` replaced literally (other braces, e.g. LaTeX, are left alone). No chat template
  is applied.

`auto` (the default) picks `chat` when the tokenizer has a chat template, else `plain`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.errors import UserError

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PLAIN_TEMPLATE = "Question: {problem}\n" + BOXED_INSTRUCTION + "\nAnswer: Let's think step by step."
PLACEHOLDER = "{problem}"
TEMPLATE_CHOICES = ("auto", "chat", "plain")


@dataclass(frozen=True)
class PromptTemplate:
    """A resolved template. `source` is the text that defines it, so two runs can be compared."""

    kind: str
    """`chat`, `plain` or `file`."""
    source: str
    """The chat template plus instruction (chat), `PLAIN_TEMPLATE` (plain), or the file's text."""
    tokenizer: Any = None
    """Needed by `chat` only."""

    @property
    def fingerprint(self) -> str:
        """Short hash of kind + source: equal fingerprints render every problem identically."""
        return hashlib.sha256(f"{self.kind}\0{self.source}".encode()).hexdigest()[:16]

    def render(self, problem: str) -> str:
        """The full prompt text for one problem."""
        if self.kind == "chat":
            messages = [{"role": "user", "content": f"{problem}\n{BOXED_INSTRUCTION}"}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)
        return self.source.replace(PLACEHOLDER, problem)


def resolve_template(spec: str, tokenizer: Any) -> PromptTemplate:
    """Resolve `auto|chat|plain|<path to .txt>` against a tokenizer (see the module docstring)."""
    chat_template = getattr(tokenizer, "chat_template", None)
    if spec == "auto":
        spec = "chat" if chat_template else "plain"
    if spec == "chat":
        if not chat_template:
            raise UserError("--prompt-template chat: this model's tokenizer has no chat template; "
                            "use --prompt-template plain (or auto) for base models.")
        return PromptTemplate("chat", f"{chat_template}\0{BOXED_INSTRUCTION}", tokenizer)
    if spec == "plain":
        return PromptTemplate("plain", PLAIN_TEMPLATE)
    path = Path(spec)
    if not path.is_file():
        raise UserError(f"--prompt-template {spec!r}: not one of {', '.join(TEMPLATE_CHOICES)} "
                        "and not an existing file.")
    text = path.read_text(encoding="utf-8")
    if PLACEHOLDER not in text:
        raise UserError(f"prompt template file {path} must contain {PLACEHOLDER}.")
    return PromptTemplate("file", text)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered prompt, without doubling a BOS the chat template already wrote.

    Both backends feed these ids to the model, so they see identical inputs.
    """
    bos = getattr(tokenizer, "bos_token", None)
    add_special = not (bos and text.startswith(bos))
    return tokenizer(text, add_special_tokens=add_special)["input_ids"]
