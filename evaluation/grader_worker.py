"""The grader's worker processes: what runs inside one, and the pool's handle on one.

Workers are `python -c` subprocesses, not `multiprocessing` children: they never re-run the
caller's `__main__` (which made a spawn pool fail in unguarded scripts and re-import whatever the
caller's script imports), inherit no file descriptor but their socket to the pool, and are
SIGKILLed by Linux when the pool's dispatcher thread ends, so none outlives its parent. Each
runs `verify.grade_detailed` on the samples the pool hands it.
"""
from __future__ import annotations

import logging
import math
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from evaluation.verify import grade_detailed

logger = logging.getLogger("evaluation.grader")  # the pool's logger: its warnings read as the pool's

_REPO = str(Path(__file__).resolve().parents[1])
# The worker's whole command line. `python -c` puts the caller's working directory first on
# sys.path; this checkout goes there instead, so the worker imports this `evaluation` package
# and nothing shadows math-verify's imports.
_BOOT = ("import sys; sys.path[:] = [{repo!r}] + [p for p in sys.path if p not in ('', '.')]; "
         "from evaluation.grader_worker import worker_main; "
         "worker_main(int(sys.argv[1]), int(sys.argv[2]))")


def worker_main(fd: int, parent_pid: int) -> None:
    """A worker process: warm up, say ready, then answer (task_id, response, gold) until the
    pool's end of socket `fd` closes (or the pool kills it)."""
    conn = multiprocessing.connection.Connection(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it then stops us
    try:
        _die_with_parent(parent_pid)
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        # Imports math-verify and builds its LaTeX parser (~1 s): paid before any sample's clock.
        grade_detailed(r"\boxed{1}", "1")
        conn.send(("ready", None, None))
    except BaseException:
        conn.send(("failed", None, traceback.format_exc()))
        return
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return  # the pool went away
        task_id, response, gold = task
        conn.send(("took", task_id, None))  # from here on, a death is this sample's doing
        try:
            graded = grade_detailed(response, gold)
            reply = (task_id, graded.verdict.value, graded.extracted)
        except ValueError as e:  # an unparseable gold: the caller's data error, raised as is
            reply = (task_id, "error", ValueError(str(e)))
        except Exception:
            reply = (task_id, "error", RuntimeError(f"grading raised:\n{traceback.format_exc()}"))
        conn.send(reply)


def _die_with_parent(parent_pid: int) -> None:
    """Have Linux SIGKILL this worker when the thread that started it (the pool's dispatcher)
    ends, with its process or not: a worker deep in sympy never reads its socket's EOF."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


@dataclass
class Task:
    id: int
    future: Future
    response: str
    gold: str
    limit_s: float
    """Seconds of a worker's time, counted from when a worker takes the task."""
    deadline: float
    """time.monotonic() by which the task needs a verdict, queueing included (inf: none)."""
    fast: bool = False
    """Cheap to grade (`extraction.looks_plain`): a fast-lane worker may take it."""


class Worker:
    """One worker process, the pool's end of its socket, and the task it is busy with (if any)."""

    def __init__(self, fast_lane: bool = False) -> None:
        self.fast_lane = fast_lane
        """Takes only tasks marked fast, so pathological samples never hold it."""
        if not sys.executable:
            raise GraderStartupError("sys.executable is empty: no Python to start workers with")
        ours, theirs = socket.socketpair()
        self.stderr = tempfile.TemporaryFile()  # read back only if the worker fails to start
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT.format(repo=_REPO), str(theirs.fileno()),
                 str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
                pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            self.stderr.close()
            raise
        finally:
            theirs.close()
        self.conn = multiprocessing.connection.Connection(ours.detach())
        self.started = time.monotonic()
        self.ready = False
        self.task: Task | None = None
        self.took = False
        """Whether the worker has read `task`: if it dies before, the task goes to another."""
        self.deadline = math.inf
        self.error = ""

    def stderr_tail(self, chars: int = 2000) -> str:
        """The end of the worker's stderr, as a clause to append to an error message."""
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(0, self.stderr.tell() - chars))
        text = self.stderr.read().decode(errors="replace").strip()
        return f"; its stderr ends:\n{text}" if text else ""

    def stop(self) -> None:
        """Kill the worker, reap it, and close the pool's ends. Killing is safe at any time (a
        worker holds no state) and fast: a polite exit took ~0.8 s of interpreter tear-down."""
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # never seen; not worth hanging the pool over
                logger.warning("grader worker %d still there 5 s after SIGKILL", self.proc.pid)
        self.close_fds()

    def close_fds(self) -> None:
        self.conn.close()
        self.stderr.close()


class GraderStartupError(RuntimeError):
    """Grader worker processes fail to start (e.g. math-verify is not installed)."""
