"""A prompt's identity across steps and files: a hash of its token ids (numpy only, so the pool
builder can compute it without importing OpenRLHF's trainer)."""
from __future__ import annotations

import hashlib

import numpy as np


def prompt_uid(prompt_ids: np.ndarray) -> int:
    """A stable 63-bit identity for a prompt's token ids (the same prompt in a later epoch maps here)."""
    digest = hashlib.blake2b(np.ascontiguousarray(prompt_ids, np.int32).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
