"""Where data files are read from: a local data folder, else the Hugging Face hub copy.

The data folder holds `train/` (training prompts) and `benchmarks/<name>/test.jsonl`. It is
`$OPENRLHF_REPLAY_DATA` when set, else `../shared/data` beside the repository (the workspace this
project grew in; a fresh clone has none). A reader that finds no local file loads the hub copy
it names; when that fails too (offline, or the copy is gone) it raises `DataUnavailableError`,
whose message says which file is missing, its format, and how to provide it.
"""
from __future__ import annotations

import os
from pathlib import Path

from infra.errors import UserError

DATA_ENV = "OPENRLHF_REPLAY_DATA"
GSM8K_TRAIN_HUB = ("openai/gsm8k", "main", "train")
GSM8K_TRAIN_FILE = "train/gsm8k_train.jsonl"
GSM8K_FORMAT = "JSON lines, each with `question` and `answer` ending in '#### <answer>'"


class DataUnavailableError(UserError):
    """Neither a local file nor the hub copy could be read; the message says how to provide it."""


def data_root() -> Path:
    """The local data folder: `$OPENRLHF_REPLAY_DATA`, else `../shared/data` beside the repository."""
    value = os.environ.get(DATA_ENV)
    return Path(value).expanduser() if value else Path(__file__).resolve().parents[2] / "shared/data"


def load_hub(path: str, config: str | None, split: str, *, missing: str, provide: str):
    """The hub dataset `path` (`config`, `split`) as a `datasets.Dataset`. `missing` says which
    local file was not found, `provide` how to give one; both go into the error."""
    try:
        import datasets  # heavy: imported only when a local file is missing

        return datasets.load_dataset(path, config, split=split)
    except Exception as e:  # offline, gone, or a changed schema: all end the same way
        first_line = (str(e).strip().splitlines() or [""])[0][:300]
        raise DataUnavailableError(
            f"{missing}, and the Hugging Face hub copy {path} could not be loaded "
            f"({type(e).__name__}: {first_line}). {provide}") from e


def gsm8k_train_rows(path: str | Path | None = None):
    """(where, row) pairs of GSM8K's training split, as read. From `path` when given (it must
    exist); else from the data folder's `train/gsm8k_train.jsonl` when present, else from the hub
    (`openai/gsm8k`). A line that is not JSON raises DataUnavailableError naming it."""
    import json

    provide = (f"Provide the file ({GSM8K_FORMAT}): set {DATA_ENV} to a folder holding "
               f"{GSM8K_TRAIN_FILE}")
    local = Path(path) if path is not None else data_root() / GSM8K_TRAIN_FILE
    if path is not None and not local.is_file():
        raise DataUnavailableError(f"GSM8K training data {local}: no such file ({GSM8K_FORMAT})")
    if local.is_file():
        with open(local, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield f"{local} line {i}", json.loads(line)
                except ValueError as e:
                    raise DataUnavailableError(f"{local} line {i} is not JSON ({e}); the file must "
                                               f"be {GSM8K_FORMAT}") from None
        return
    yield from gsm8k_hub_rows(missing=f"GSM8K training data: no file {local}", provide=provide + ".")


def gsm8k_hub_rows(*, missing: str = "GSM8K training data: the hub's copy was asked for",
                   provide: str = f"Provide a file ({GSM8K_FORMAT})."):
    """(where, row) pairs of the hub's GSM8K training split (`openai/gsm8k`), or
    DataUnavailableError with `missing` and `provide` (see `load_hub`)."""
    rows = load_hub(*GSM8K_TRAIN_HUB, missing=missing, provide=provide)
    yield from ((f"hub:{GSM8K_TRAIN_HUB[0]} row {i}", row) for i, row in enumerate(rows, 1))


def default_data_dir() -> str | None:
    """`benchmarks/` of the data folder (`data_root`) when it exists; None
    (the hub's copies) otherwise."""
    folder = data_root() / "benchmarks"
    return str(folder) if folder.is_dir() else None
