"""Prompts a run loads, and the largest number of them that fills whole rollout batches.

Every step of an episode must generate a whole rollout batch: upstream hands the last, partial
batch of an episode over as a step of its own (7,474 DeepScaleR prompts = 58 x 128 + 50: a step
of 400 rollouts), and its micro-batches then do not split evenly over the data-parallel ranks,
which crashes the replay integration and leaves upstream's own ranks with unequal work. The
policy, for every condition alike (the upstream GRPO baseline included): a run trains on whole
batches of prompts only, the first `--data.max_samples` = floor(prompts / batch) x batch of them.
The launch scripts pass that value (`python -m openrlhf_replay.cli.prompts`); the validator (for
every script) and the replay launcher refuse a command that would leave a partial batch.

    python -m openrlhf_replay.cli.prompts --batch 128 data.json[,more.jsonl]   # prints 7424

Counts rows as upstream's loader (`datasets`' json reader) does: a JSON array's elements, or a
JSON-lines file's non-blank lines. Other sources (hub datasets, parquet, folders) are not
counted: `count_rows` returns None and nothing is printed.

`prompt_file_problems` reads every row of those files before Ray starts, where upstream would
fail minutes later inside a Ray worker (or train on nothing): a line that is not JSON, a row
without the prompt or label key, an empty prompt, a label that is not a string or number, or a
file without rows is an error naming the file, the line and the fix. Rows without a gold answer
(null or empty: what math-verify cannot parse, in practice) and repeated prompts are counted in a
note, and the run goes on. Other golds are not parsed here (~10 ms each, over a minute for the
7,474 DeepScaleR prompts): a sample graded against one math-verify cannot parse (`$`, `\\text{}`)
is scored 0 and counted as `grade_error` by `evaluation/reward.py`.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

from openrlhf_replay.datasets.prompt_files import UnreadableFile, file_rows

COUNTED_SUFFIXES = (".json", ".jsonl")
SHOWN = 5  # rows listed per kind of problem; the rest are counted


def count_rows(path: str) -> int | None:
    """Rows of a local .json / .jsonl prompt file; None for anything else, or a file that is not
    valid JSON (`prompt_file_problems` says where)."""
    if not path.endswith(COUNTED_SUFFIXES) or not os.path.isfile(path):
        return None
    try:
        return len(file_rows(path))
    except UnreadableFile:
        return None


def prompt_file_problems(args) -> tuple[list[str], list[str]]:
    """(errors, notes) about the rows of the local .json / .jsonl files in `--data.prompt_dataset`."""
    errors, notes = [], []
    label_key = args.data.label_key
    for part in (args.data.prompt_dataset or "").split(","):
        path = part.split("@")[0].strip()
        if path.endswith(COUNTED_SUFFIXES) and os.path.isfile(path):
            stat = os.stat(path)
            found = _check_file(path, stat.st_mtime_ns, stat.st_size, args.data.input_key, label_key,
                                bool(args.data.apply_chat_template))
            errors += found[0]
            notes += found[1]
    return errors, notes


@functools.lru_cache(maxsize=8)  # the validator and the launcher ask twice, for errors and notes
def _check_file(path: str, mtime_ns: int, size: int, input_key: str, label_key: str | None,
                chat: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    try:
        rows = file_rows(path)
    except UnreadableFile as e:
        return (f"{e}: fix that line (upstream's loader would refuse the whole file)",), ()
    if not rows:
        return (f"{path} holds no prompts: fill it, or point --data.prompt_dataset at the right file",), ()
    bad: dict[str, list[int]] = {}
    no_gold, first_seen, repeats = [], {}, []
    for line, row in rows:
        problem = _row_problem(row, input_key, label_key, chat)
        if problem:
            bad.setdefault(problem, []).append(line)
            continue
        if label_key is not None and (row[label_key] is None or not str(row[label_key]).strip()):
            no_gold.append(line)
        key = json.dumps(row[input_key], sort_keys=True)
        if key in first_seen:
            repeats.append(f"line {line} repeats line {first_seen[key]}")
        first_seen.setdefault(key, line)
    errors = [f"{path}: {problem} (line{'s' if len(lines) > 1 else ''} {_lines(lines)})"
              for problem, lines in bad.items()]
    notes = []
    if no_gold:
        notes.append(f"{path}: {len(no_gold)} row(s) without a gold answer ({label_key!r} null or empty; line(s) "
                     f"{_lines(no_gold)}): there is nothing to grade their samples against, so they teach nothing; "
                     "fill or remove them")
    if repeats:
        notes.append(f"{path}: {len(repeats)} prompt(s) appear more than once ({', '.join(repeats[:SHOWN])}"
                     f"{', ...' if len(repeats) > SHOWN else ''}): each copy is trained on in every episode")
    return tuple(errors), tuple(notes)


def _row_problem(row, input_key: str, label_key: str | None, chat: bool) -> str | None:
    """What keeps upstream's loader from using this row, with the fix; None when it is usable."""
    if not isinstance(row, dict):
        return f"a row is a {type(row).__name__}, not a JSON object: write one object per prompt"
    if input_key not in row:
        return (f"no {input_key!r} key in a row (keys: {', '.join(sorted(row)[:6])}): add the prompt there, "
                f"or pass --data.input_key <the key that holds it>")
    prompt = row[input_key]
    if chat and isinstance(prompt, list):  # chat messages, for --data.apply_chat_template
        if not prompt:
            return f"the prompt ({input_key!r}) is an empty list of messages: write it, or remove the row"
    elif not isinstance(prompt, str):
        return (f"the prompt ({input_key!r}) is a {type(prompt).__name__}, not a string"
                f"{' or a list of chat messages' if chat else ''}: write it as text")
    elif not prompt.strip():
        return f"the prompt ({input_key!r}) is empty: write it, or remove the row"
    if label_key is None:
        return None
    if label_key not in row:
        return (f"no {label_key!r} key in a row (keys: {', '.join(sorted(row)[:6])}): add the gold answer "
                f"there, or pass --data.label_key <the key that holds it>")
    label = row[label_key]
    if label is not None and (isinstance(label, bool) or not isinstance(label, (str, int, float))):
        return (f"the gold answer ({label_key!r}) is a {type(label).__name__}: write it as one string "
                "(the reward gets it as it is)")
    return None


def _lines(lines: list[int]) -> str:
    shown = ", ".join(map(str, lines[:SHOWN]))
    return shown if len(lines) <= SHOWN else f"{shown} and {len(lines) - SHOWN} more"


def loaded_prompts(dataset: str, max_samples: float) -> int | None:
    """Prompts upstream's `prepare_datasets` loads from `--data.prompt_dataset` (comma-separated
    files, each cut to max_samples, then the whole cut to max_samples); None if any is uncounted."""
    counts = [count_rows(part.split("@")[0].strip()) for part in dataset.split(",")]
    if not counts or None in counts:
        return None
    return int(min(max_samples, sum(min(max_samples, n) for n in counts)))


def whole_batches(prompts: int, batch: int) -> int:
    """The most prompts that fill whole batches of `batch`."""
    return prompts // batch * batch


def partial_batch_errors(args) -> list[str]:
    """The whole-batch policy (`openrlhf_replay.cli.prompts`): refuse prompts that would end each
    episode with a partial rollout batch."""
    if not args.data.prompt_dataset or args.data.prompt_probs:  # interleaved: no fixed count
        return []
    prompts = loaded_prompts(args.data.prompt_dataset, args.data.max_samples)
    batch = args.rollout.batch_size
    if prompts is None or prompts % batch == 0:
        return []
    whole = whole_batches(prompts, batch)
    if not whole:
        return [f"--data.prompt_dataset holds {prompts} prompts, fewer than one --rollout.batch_size {batch}"]
    return [f"{prompts} prompts = {prompts // batch} batches of --rollout.batch_size {batch} and {prompts % batch} left "
            f"over: each episode would end with a step of {prompts % batch} prompts, whose rollouts do not split like "
            f"the others over the GPUs; pass --data.max_samples {whole} (whole batches; the launch scripts do)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openrlhf_replay.cli.prompts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, required=True, help="prompts per rollout step (--rollout.batch_size)")
    parser.add_argument("dataset", help="--data.prompt_dataset: comma-separated .json / .jsonl files")
    args = parser.parse_args(argv)
    prompts = loaded_prompts(args.dataset, float("inf"))
    if prompts is not None:
        print(whole_batches(prompts, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
