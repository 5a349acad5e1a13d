"""The processes one run started, found by a tag in their environment.

A run's environment reaches every process it starts (Ray's services and workers, vLLM's engine,
the grader pool), so a tag set there finds them all and nothing else, even while other tests'
runs go on beside it (the suite runs in two workers).
"""
from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

TAG_ENV = "OPENRLHF_REPLAY_TEST_TAG"


def new_tag(name: str) -> dict[str, str]:
    """Environment entries that tag a run named `name`."""
    return {TAG_ENV: f"{name}-{uuid.uuid4().hex[:8]}"}


def tagged_processes(tag: str) -> list[str]:
    """'pid command' of every live process whose environment holds this tag."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if f"{TAG_ENV}={tag}\0".encode() in (proc / "environ").read_bytes():
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ")[:100].decode(errors="replace")
                found.append(f"{proc.name} {command}")
    return found


def left_after(tag: str, ended: float, grace_s: float) -> list[str]:
    """The tagged processes still alive `grace_s` after `ended` (a time.monotonic()), waiting no
    longer than that for them to exit."""
    while True:
        left = tagged_processes(tag)
        if not left or time.monotonic() > ended + grace_s:
            return left
        time.sleep(0.5)
