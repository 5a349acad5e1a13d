"""Grading model responses against gold answers with math-verify, always within a time limit.

`grade(response, gold)` gives the verdict, or TIMEOUT when there is none within `timeout_s` of
the call (default `DEFAULT_TIMEOUT_S`, 10 s). It grades in `shared_grader()`, a process-wide pool
of worker processes started on the first call: their start-up (importing math-verify, ~1.5 s on
an idle 2-core AMD EPYC) counts within that first call's limit. It works from many threads at
once, in forked and spawned processes (a forked child starts its own pool), in Ray actors, and
from scripts without an `if __name__ == "__main__":` guard.

`Grader` is the batch API (`python -m evaluation run`, `evaluation/reward.py`, the lab); every
sample gets exactly one verdict.

The verdict itself is `evaluation.verify.grade_detailed` (parse, then verify), run in worker
processes (`evaluation.grader_worker`); this module is the pool that bounds it in time, and
`evaluation.grader_queue` the samples waiting in it for a worker.

`shared_grader()` (behind `grade()`) also keeps a fast-lane worker that takes only samples whose
gold and last box are plain numbers, so a plain answer is never queued behind pathological ones.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import logging
import math
import multiprocessing.connection
import os
import socket
import subprocess
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Iterable

from evaluation.extraction import looks_plain
from evaluation.grader_queue import TaskQueue
from evaluation.grader_worker import GraderStartupError, Task, Worker
from evaluation.verify import Graded, Verdict

logger = logging.getLogger(__name__)


# ---- bounded grading: grade() and the process-wide pool ----------------------------------

DEFAULT_TIMEOUT_S = 10.0
"""`grade()`'s limit when a call gives none, and the per-sample limit of `shared_grader()` (read
when that pool starts). Assign to change it for the whole process."""
SHARED_POOL_WORKERS: int | None = None
"""General worker processes of `shared_grader()`; None: min(4, CPUs). Read when that pool starts.
The pool has one more, its fast-lane worker (see `Grader`)."""
_GRACE_S = 1.0
"""How long past its deadline `grade()` waits for the pool's TIMEOUT before giving it itself."""


def grade(response: str, gold: str, *, timeout_s: float | None = None) -> Verdict:
    """The verdict for one response (see `verify.grade_detailed`), or TIMEOUT if none within
    `timeout_s`, counted from this call: waiting for a free worker and, on a process's first call,
    the pool's start-up (~1.5 s) are inside it. A gold answer math-verify cannot parse raises
    ValueError; workers that cannot start raise GraderStartupError."""
    limit = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if not limit > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    deadline = time.monotonic() + limit
    future = shared_grader().submit(response, gold, timeout_s=limit, deadline=deadline)
    try:
        return future.result(timeout=limit + _GRACE_S).verdict
    except concurrent.futures.TimeoutError:  # the pool gives TIMEOUT at the deadline: never seen
        logger.warning("grader pool missed a deadline by over %.0f s: verdict TIMEOUT", _GRACE_S)
        return Verdict.TIMEOUT


_shared: Grader | None = None
_shared_lock = threading.Lock()


def shared_grader() -> Grader:
    """The process-wide `Grader` behind `grade()`, with its workers starting. Made on first use,
    and again when it was closed, broke, or belongs to the parent of a forked child. Calling it
    early hides the workers' start-up behind other work."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.usable:
            _shared = Grader(workers=SHARED_POOL_WORKERS, timeout_s=DEFAULT_TIMEOUT_S, fast_lane=True)
            _shared.start()
        return _shared


@atexit.register
def _close_shared() -> None:
    if _shared is not None and _shared.usable:
        _shared.close()


# Every Grader of this process, so a forked child can let go of them (see _after_fork_in_child).
_graders: weakref.WeakSet = weakref.WeakSet()


class Grader:
    """Grades many (response, gold) pairs in worker processes, each within a time limit.

    Use as a context manager (or call `start` and `close`). Thread-safe: `submit` and
    `grade_many` may be called from several threads at once; one dispatcher thread feeds
    `workers` processes. A sample gets at most `timeout_s` of a worker's time, counted from when
    a worker takes it (start-up and queueing do not count), then TIMEOUT; its worker is killed
    and replaced. `submit(..., deadline=)` also bounds the wait in the queue (what `grade()`
    uses). A worker that dies mid-sample (segfault, OOM kill) gives that sample TIMEOUT and is
    replaced; one that dies before reading its sample passes the sample on to another. An
    unparseable gold raises ValueError from the sample's future. If workers cannot start
    (`MAX_FAILED_STARTS` in a row), every queued and later sample fails with GraderStartupError.
    A Grader belongs to the process that made it: after a fork, make a new one (`grade()` and
    `shared_grader()` do). Counters: `n_timeouts`, `n_crashes`.

    With `fast_lane`, one more worker takes only samples that are cheap to grade (gold and last
    box plain numbers, `extraction.looks_plain`); the others take any sample, oldest first. The
    verdict never depends on which worker grades a sample.
    """

    STARTUP_LIMIT_S = 120.0
    """A worker that has not imported math-verify by then counts as a failed start."""
    MAX_FAILED_STARTS = 3
    """Consecutive failed starts after which the Grader gives up."""

    def __init__(self, workers: int | None = None, timeout_s: float = 10.0,
                 fast_lane: bool = False) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.n_workers = workers if workers is not None else min(4, os.cpu_count() or 1)
        if self.n_workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.timeout_s = timeout_s
        self.fast_lane = fast_lane
        self.n_timeouts = 0
        self.n_crashes = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._queue = TaskQueue()  # under self._lock
        self._ids = itertools.count()
        self._workers: list[Worker] = []  # replaced and changed only by the dispatcher
        self._closing = False
        self._broken: BaseException | None = None
        self._thread: threading.Thread | None = None
        # Self-pipe: `submit` and `close` write a byte to wake the dispatcher from its wait().
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        _graders.add(self)

    # -- public API

    def __enter__(self) -> "Grader":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def usable(self) -> bool:
        """True while samples can be submitted: made in this process, not closed, not broken."""
        return self._pid == os.getpid() and not self._closing and self._broken is None

    def start(self) -> None:
        """Start the workers now rather than on the first `submit`."""
        self._check_process()
        with self._lock:
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._dispatch, daemon=True,
                                                name="evaluation-grader-dispatch")
                self._thread.start()

    def submit(self, response: str, gold: str, *, timeout_s: float | None = None,
               deadline: float | None = None) -> "Future[Graded]":
        """Queue one sample; the future resolves to its `Graded`.

        `timeout_s` (default: the Grader's) bounds the sample's time in a worker. `deadline`, a
        `time.monotonic()` value, bounds the whole wait: a sample without a verdict by then gets
        TIMEOUT, whether it is still queued or in a worker.
        """
        self._check_process()
        limit = self.timeout_s if timeout_s is None else timeout_s
        if not limit > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        fast = self.fast_lane and looks_plain(response, gold)  # outside the lock: a regex scan
        future: Future = Future()
        future.set_running_or_notify_cancel()  # no cancelling: every sample gets a verdict
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if self._closing:
                raise RuntimeError("Grader is closed")
            self._queue.push(Task(next(self._ids), future, response, gold, limit,
                                  math.inf if deadline is None else deadline, fast))
        self.start()
        self._wake()
        return future

    def grade_many_detailed(self, pairs: Iterable[tuple[str, str]]) -> list[Graded]:
        """`Graded` for each (response, gold) pair, in input order."""
        futures = [self.submit(response, gold) for response, gold in pairs]
        return [f.result() for f in futures]

    def grade_many(self, pairs: Iterable[tuple[str, str]]) -> list[Verdict]:
        """The verdict for each (response, gold) pair, in input order."""
        return [g.verdict for g in self.grade_many_detailed(pairs)]

    def wait_until_ready(self, timeout_s: float = 120.0) -> None:
        """Start the workers if need be and block until every one has started (TimeoutError
        after `timeout_s`); `grade()`'s first call otherwise counts their start-up."""
        self.start()
        deadline = time.monotonic() + timeout_s
        expected = self.n_workers + self.fast_lane
        while not (len(self._workers) == expected and all(w.ready for w in list(self._workers))):
            if self._broken is not None:
                raise self._broken
            if time.monotonic() > deadline:
                raise TimeoutError(f"grader workers not ready after {timeout_s:.0f} s")
            time.sleep(0.02)

    @property
    def queued(self) -> int:
        """Samples waiting for a worker (not yet handed to one)."""
        return len(self._queue)

    def worker_pids(self, grading: bool = False) -> list[int]:
        """Process ids of the current workers (ready or starting); with `grading`, only of those
        that have read a sample and are grading it."""
        return [w.proc.pid for w in list(self._workers) if not grading or (w.task and w.took)]

    def close(self) -> None:
        """Stop the workers; samples still queued or in flight fail with RuntimeError."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            thread = self._thread
        self._wake()
        if thread is not None:
            thread.join()
        self._wake_r.close()
        self._wake_w.close()

    # -- helpers

    def _check_process(self) -> None:
        # A forked child has no dispatcher thread, and maybe a lock held by a thread it lacks:
        # without this check a submit there would wait forever.
        if self._pid != os.getpid():
            raise RuntimeError(f"this Grader belongs to process {self._pid} (this is a forked "
                               f"child, {os.getpid()}): make a new one here")

    def _release_after_fork(self) -> None:
        """In a forked child: mark this copy closed (with a fresh lock: the inherited one may be
        held by a thread the child lacks) and close its copies of the pool's sockets. The
        parent's workers are left alone; they are not the child's."""
        self._lock = threading.Lock()
        self._closing = True
        for w in list(self._workers):
            w.close_fds()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # a full socket wakes the dispatcher anyway; a closed one means we are done

    # -- dispatcher: runs in its own thread and is the only code that touches workers

    def _dispatch(self) -> None:
        workers = self._workers
        error: BaseException = RuntimeError("Grader closed before this sample was graded")
        try:
            workers.extend(Worker() for _ in range(self.n_workers))
            if self.fast_lane:
                workers.append(Worker(fast_lane=True))
            failed_starts = 0
            while not self._closing:
                self._expire_queued()
                self._assign()
                ready = multiprocessing.connection.wait(
                    [self._wake_r] + [w.conn for w in workers], timeout=self._wait_s())
                if self._wake_r in ready:
                    try:
                        self._wake_r.recv(65536)
                    except BlockingIOError:
                        pass
                for i, w in enumerate(workers):
                    outcome = self._service(w, w.conn in ready)
                    if outcome == "ok":
                        continue
                    failed_starts = failed_starts + 1 if outcome == "failed_start" else 0
                    w.stop()
                    if failed_starts >= self.MAX_FAILED_STARTS:
                        raise GraderStartupError(
                            f"grader workers failed to start {failed_starts} times in a row; "
                            f"last error: {w.error}")
                    workers[i] = Worker(fast_lane=w.fast_lane)
                if any(w.ready for w in workers):
                    failed_starts = 0
        except BaseException as e:  # never leave a future unresolved
            logger.error("grader dispatcher stopped: %s", e)
            error = e
            with self._lock:
                self._broken = e
        finally:
            for w in workers:
                if w.task:
                    w.task.future.set_exception(RuntimeError("Grader closed while grading"))
                w.stop()
            with self._lock:
                pending = self._queue.drain()
            for task in pending:
                task.future.set_exception(error)

    def _expire_queued(self) -> None:
        """TIMEOUT for queued tasks whose deadline passed before a worker was free for them."""
        with self._lock:
            expired = self._queue.expire(time.monotonic())
        for task in expired:
            self.n_timeouts += 1
            task.future.set_result(Graded(Verdict.TIMEOUT, None))

    def _assign(self) -> None:
        """Hand queued tasks to ready, idle workers and start their clocks: a fast-lane worker
        takes the oldest fast task, any other worker the oldest task."""
        for w in self._workers:
            if not (w.ready and w.task is None):
                continue
            with self._lock:
                task = self._queue.pop(w.fast_lane)
            if task is None:
                continue
            try:
                w.conn.send((task.id, task.response, task.gold))
            except OSError:  # the worker just died: _service replaces it
                self._requeue(task)
                continue
            w.task, w.took = task, False
            w.deadline = min(time.monotonic() + task.limit_s, task.deadline)

    def _requeue(self, task: Task) -> None:
        """Put a task no worker has read back at the head of the queue, under its deadline."""
        with self._lock:
            self._queue.push(task, first=True)

    def _wait_s(self) -> float | None:
        """Seconds until the nearest task deadline or start-up limit; None if there is none."""
        deadlines = [w.deadline for w in self._workers if w.task] + [
            w.started + self.STARTUP_LIMIT_S for w in self._workers if not w.ready]
        with self._lock:
            queued = self._queue.next_deadline()
        if queued is not None:
            deadlines.append(queued)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _service(self, w: Worker, readable: bool) -> str:
        """Handle one worker's message, exit or deadline: 'ok', 'replace' or 'failed_start'."""
        if readable:
            try:
                kind, value, extra = w.conn.recv()
            except (EOFError, OSError):
                return self._exited(w)
            if kind == "ready":
                w.ready = True
            elif kind == "took":
                w.took = w.task is not None and value == w.task.id
            elif kind == "failed":
                w.error = extra
                return "failed_start"
            elif w.task and kind == w.task.id:
                future, w.task, w.deadline = w.task.future, None, math.inf
                if value == "error":
                    future.set_exception(extra)
                else:
                    future.set_result(Graded(Verdict(value), extra))
            return "ok"
        now = time.monotonic()
        if w.task and now >= w.deadline:
            self.n_timeouts += 1
            w.task.future.set_result(Graded(Verdict.TIMEOUT, None))
            w.task = None
            return "replace"
        if not w.ready and now >= w.started + self.STARTUP_LIMIT_S:
            w.error = f"worker not ready after {self.STARTUP_LIMIT_S:.0f} s{w.stderr_tail()}"
            return "failed_start"
        return "ok"

    def _exited(self, w: Worker) -> str:
        """The worker's socket closed: it exited or was killed."""
        try:
            code = w.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            code = None  # closed its socket yet lives on: stop() kills it
        if not w.ready:
            w.error = f"worker exited (code {code}) before it was ready{w.stderr_tail()}"
            return "failed_start"
        if w.task and not w.took:  # killed before it read the task: not the sample's doing
            self._requeue(w.task)
        elif w.task:
            self.n_crashes += 1
            logger.warning("grader worker died (exit code %s) mid-sample: verdict TIMEOUT", code)
            w.task.future.set_result(Graded(Verdict.TIMEOUT, None))
        w.task = None
        return "replace"


def _after_fork_in_child() -> None:
    # The parent's pools are useless here (no dispatcher thread came along) and their locks may
    # be held by threads this child lacks: start afresh with a new lock and no shared pool.
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()
    for grader in list(_graders):
        grader._release_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
