"""Atomic, checksummed, pickle-free files for nested state dicts of numpy arrays and JSON values.

Layout: an uncompressed .npz whose members are the state's arrays plus `__meta__` (the state
as UTF-8 JSON, each array replaced by a reference to its member) and `__checksum__` (SHA-256
over the meta and every array's name, dtype, shape and bytes). Saving writes a temporary file
in the target's directory, fsyncs it and renames it over the target, so a crash at any point
leaves either the previous checkpoint or the new one, never a mix.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from typing import Any

import numpy as np

_META, _CHECKSUM, _ARRAY_REF = "__meta__", "__checksum__", "__array__"


class ReplayCheckpointError(RuntimeError):
    """A replay checkpoint file is missing, corrupt or incompatible; the message names the file."""


def save_state(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write `state` (nested dicts of arrays, str, numbers, bools, None, lists) to `path` atomically."""
    path = os.fspath(path)
    arrays: dict[str, np.ndarray] = {}
    meta = json.dumps(_split(state, "", arrays), sort_keys=True).encode()
    members = {**arrays, _META: np.frombuffer(meta, np.uint8),
               _CHECKSUM: np.frombuffer(_digest(meta, arrays).encode(), np.uint8)}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **members)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # Make the rename itself durable.
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def state_digest(state: dict[str, Any]) -> str:
    """A short SHA-256 of `state` as `save_state` would write it: equal for equal contents. Logged
    when the replay buffer is saved and restored, so a resume can be checked against both."""
    arrays: dict[str, np.ndarray] = {}
    meta = json.dumps(_split(state, "", arrays), sort_keys=True).encode()
    return _digest(meta, arrays)[:16]


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """Read a state written by `save_state`; ReplayCheckpointError names the file and the problem."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ReplayCheckpointError(f"{path}: no such replay checkpoint")
    try:
        with np.load(path, allow_pickle=False) as npz:
            members = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        raise ReplayCheckpointError(f"{path}: not a readable replay checkpoint ({type(e).__name__}: {e})") from e
    if _META not in members or _CHECKSUM not in members:
        raise ReplayCheckpointError(f"{path}: not a replay checkpoint (no {_META} / {_CHECKSUM} member)")
    meta = members.pop(_META).tobytes()
    stored = members.pop(_CHECKSUM).tobytes().decode(errors="replace")
    if _digest(meta, members) != stored:
        raise ReplayCheckpointError(f"{path}: checksum mismatch, the file is corrupt")
    try:
        return _join(json.loads(meta), members)
    except (ValueError, KeyError) as e:
        raise ReplayCheckpointError(f"{path}: malformed metadata ({e})") from e


def _digest(meta: bytes, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(meta)
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        if a.size:  # hashlib reads the array's buffer in place: no copy of large arrays
            h.update(a)
    return h.hexdigest()


def _split(node: Any, prefix: str, arrays: dict[str, np.ndarray]) -> Any:
    """JSON-able copy of `node` with each array moved into `arrays` under its dotted path."""
    if isinstance(node, np.ndarray):
        if node.dtype == object:
            raise TypeError(f"{prefix}: object arrays cannot be saved without pickle")
        arrays[prefix] = node
        return {_ARRAY_REF: prefix}
    if isinstance(node, dict):
        return {k: _split(v, f"{prefix}.{k}" if prefix else str(k), arrays) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_split(v, f"{prefix}.{i}", arrays) for i, v in enumerate(node)]
    if isinstance(node, np.generic):
        return node.item()
    return node


def _join(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(node, dict):
        if set(node) == {_ARRAY_REF}:
            return arrays[node[_ARRAY_REF]]
        return {k: _join(v, arrays) for k, v in node.items()}
    if isinstance(node, list):
        return [_join(v, arrays) for v in node]
    return node


def prune_states(folder: str | os.PathLike, prefix: str, keep: int) -> None:
    """Keep the `keep` latest `<prefix><step>.npz` files of `folder` (by step), remove the rest: a
    state file per checkpoint, as many as upstream keeps (`--ckpt.max_num`)."""
    files = [f for f in os.listdir(folder) if f.startswith(prefix) and f.endswith(".npz")
             and f[len(prefix):-len(".npz")].isdigit()]
    files.sort(key=lambda f: int(f[len(prefix):-len(".npz")]))
    for old in files[: max(len(files) - max(keep, 1), 0)]:
        os.remove(os.path.join(folder, old))
