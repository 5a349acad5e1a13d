"""RLEP's offline experience pool: verified successes of a seed checkpoint, in one file.

RLEP (Kwai-Klear/RLEP) collects its pool before training: a seed checkpoint decodes every
training question, and the trajectories that reach a verified answer are kept per question.
`python -m openrlhf_replay.cli.build_success_pool` writes such a pool; `--replay.success_pool`
loads it into the replay store at the start of a run.

File format: a replay state file (`replay/checkpoint.py:save_state`: an uncompressed npz of the
arrays plus the metadata as JSON and a SHA-256 over both, written atomically, no pickle) holding

- `format` ("openrlhf-replay/success-pool") and `format_version` (1);
- `rollouts`: the successes as a `RolloutBatch` (prompt and response token ids, the action mask,
  the seed's sampling log-probs as behaviour log-probs, reward, prompt identity
  `prompt_uid(prompt ids)`, version -1: generated before step 0; advantages 0, never used: RLEP
  recomputes them in the enlarged group);
- `decoded_prompt_uids`: the identity of every prompt the seed decoded, solved or not;
- `tokenizer`: a fingerprint of the tokenizer's vocabulary (`tokenizer_fingerprint` in the
  integration), and `build`: how the pool was built (model, prompt file, samples, reward, ...).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from replay.checkpoint import ReplayCheckpointError, load_state, save_state, state_digest
from replay.record import RolloutBatch

POOL_FORMAT = "openrlhf-replay/success-pool"
POOL_FORMAT_VERSION = 1
POOL_VERSION = -1  # policy version of pool rollouts: generated before the run's step 0
_FIX = "build it with `python -m openrlhf_replay.cli.build_success_pool` (see --help)"


class SuccessPoolError(ValueError):
    """A success pool file cannot be used; the message names the file, the problem and the fix."""


@dataclass(frozen=True, eq=False)
class SuccessPool:
    """A loaded pool: its successes, the prompts that were decoded and how it was built."""

    rollouts: RolloutBatch
    decoded_prompt_uids: np.ndarray  # (P,) int64, every prompt the seed decoded
    tokenizer: str  # fingerprint of the tokenizer the token ids belong to
    build: dict[str, Any]  # model, prompt file, samples per prompt, reward, ...
    path: str = ""

    @property
    def digest(self) -> str:
        """A short digest of the pool's contents (not its path): a replay checkpoint records it."""
        return state_digest(_state(self))

    def successes_per_prompt(self) -> dict[int, int]:
        """{prompt uid: successes in the pool}."""
        uids, counts = np.unique(self.rollouts.prompt_uids, return_counts=True)
        return dict(zip(uids.tolist(), counts.tolist()))


def _state(pool: SuccessPool) -> dict[str, Any]:
    return {
        "format": POOL_FORMAT, "format_version": POOL_FORMAT_VERSION,
        "rollouts": {f.name: getattr(pool.rollouts, f.name) for f in dataclasses.fields(RolloutBatch)},
        "decoded_prompt_uids": np.asarray(pool.decoded_prompt_uids, np.int64),
        "tokenizer": pool.tokenizer, "build": dict(pool.build),
    }


def save_pool(path: str | os.PathLike, pool: SuccessPool, *, overwrite: bool = False) -> None:
    """Write `pool` to `path` atomically. An existing file is replaced only with `overwrite`, and
    never when it is something other than a pool file (a mistyped path must not destroy data)."""
    path = os.fspath(path)
    if os.path.exists(path):
        if not overwrite:
            raise SuccessPoolError(f"{path} exists; pass --overwrite to replace it, or choose another --out")
        try:
            load_pool(path)
        except SuccessPoolError as e:
            raise SuccessPoolError(f"{path} exists and is not a readable success pool ({e}); refusing to "
                                   "overwrite it: remove it yourself or choose another --out") from None
    if len(pool.rollouts) and np.any(pool.rollouts.versions != POOL_VERSION):
        raise ValueError(f"pool rollouts must have version {POOL_VERSION} (generated before the run)")
    save_state(path, _state(pool))


def load_pool(path: str | os.PathLike) -> SuccessPool:
    """Read a pool file written by `save_pool`; SuccessPoolError names the file and the fix when it
    is missing, corrupt, of another format or version, malformed, or holds no success."""
    path = os.fspath(path)
    try:
        state = load_state(path)
    except ReplayCheckpointError as e:
        raise SuccessPoolError(f"success pool {e}; {_FIX}") from None
    if state.get("format") != POOL_FORMAT:
        raise SuccessPoolError(f"{path} is not a success pool (format {state.get('format')!r}, expected "
                               f"{POOL_FORMAT!r}; a replay checkpoint is not a pool); {_FIX}")
    if state.get("format_version") != POOL_FORMAT_VERSION:
        raise SuccessPoolError(f"{path}: pool format version {state.get('format_version')!r}, this code reads "
                               f"{POOL_FORMAT_VERSION}; rebuild it with this code's build_success_pool")
    try:
        rollouts = RolloutBatch(**state["rollouts"])
        decoded = np.asarray(state["decoded_prompt_uids"], np.int64).reshape(-1)
        pool = SuccessPool(rollouts, decoded, str(state["tokenizer"]), dict(state["build"]), path)
    except (KeyError, TypeError, ValueError) as e:
        raise SuccessPoolError(f"{path}: malformed success pool ({e}); {_FIX}") from None
    if not len(rollouts):
        raise SuccessPoolError(f"{path} holds no successes (the seed solved none of the {len(decoded)} prompts it "
                               "decoded): RLEP would replay nothing. Build it from a stronger checkpoint or with "
                               "more --samples-per-prompt")
    if not np.isin(rollouts.prompt_uids, decoded).all():
        raise SuccessPoolError(f"{path}: malformed success pool (successes of prompts it did not decode); {_FIX}")
    return pool


def pool_mismatch(pool: SuccessPool, tokenizer: str, prompt_uids: np.ndarray) -> list[str]:
    """Why `pool` does not belong to a run with this tokenizer fingerprint and these training
    prompts (their `prompt_uid`s), each with the fix; empty when it does. Every training prompt
    must have been decoded by the seed, or RLEP's pool would silently lack it."""
    where = pool.path or "the success pool"
    fix = (f"rebuild it with build_success_pool from the run's --actor.model_name_or_path tokenizer and "
           f"--data.prompt_dataset (it was built from {pool.build.get('prompts', '?')!r} with "
           f"{pool.build.get('model', '?')!r})")
    if pool.tokenizer != tokenizer:
        return [f"{where} was built with another tokenizer (fingerprint {pool.tokenizer[:12]}, this run's is "
                f"{tokenizer[:12]}): its token ids mean other words here; {fix}"]
    missing = np.setdiff1d(np.asarray(prompt_uids, np.int64), pool.decoded_prompt_uids)
    if len(missing):
        return [f"{where} was built from another prompt set: {len(missing)} of the run's "
                f"{len(np.unique(prompt_uids))} training prompts were never decoded for it (with the same "
                f"prompt file, check --data.input_template / --data.apply_chat_template); {fix}"]
    return []
