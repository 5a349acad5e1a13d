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
"""
from __future__ import annotations

import argparse
import json
import os
import sys

COUNTED_SUFFIXES = (".json", ".jsonl")


def count_rows(path: str) -> int | None:
    """Rows of a local .json / .jsonl prompt file; None for anything else."""
    if not path.endswith(COUNTED_SUFFIXES) or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        head = f.read(4096).lstrip()
        f.seek(0)
        if head.startswith("["):
            return len(json.load(f))
        return sum(1 for line in f if line.strip())


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
