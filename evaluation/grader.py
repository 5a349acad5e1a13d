"""Grading model responses against gold answers with math-verify, always within a time limit.

`grade(response, gold)` gives the verdict, or TIMEOUT when there is none within `timeout_s` of
the call (default `DEFAULT_TIMEOUT_S`, 10 s). It grades in `shared_grader()`, a process-wide pool
of worker processes started on the first call: their start-up (importing math-verify, ~1.5 s on
an idle 2-core AMD EPYC) counts within that first call's limit. It works from many threads at
once, in forked and spawned processes (a forked child starts its own pool), in Ray actors, and
from scripts without an `if __name__ == "__main__":` guard.

`Grader` is the batch API (`python -m evaluation run`, `evaluation/reward.py`, the lab): a sample
gets at most `timeout_s` of a worker's time, counted from when a worker takes it; past that it
gets TIMEOUT and its worker is killed and replaced. A worker that dies mid-sample also gives
TIMEOUT. Every sample gets exactly one verdict.

Workers are `python -c` subprocesses, not `multiprocessing` children: they never re-run the
caller's `__main__` (which made a spawn pool fail in unguarded scripts and re-import whatever the
caller's script imports), inherit no file descriptor but their socket to the pool, and are
SIGKILLed by Linux when the pool's dispatcher thread ends, so none outlives its parent.
`grade_detailed` is the step they run: in-process, unbounded, with math-verify's own
`signal.alarm` timeouts off (they fail off the main thread).

Answer extraction (`extract_answer`): math-verify's own extraction over the whole response, after
`evaluation.extraction.prepare_response` has tidied it: boxes before the final run of boxes are
unboxed (the final box wins; several boxes joined by commas or "and" are one answer, graded as
math-verify grades them), empty boxes removed, mixed numbers ("4 4/9") made one fraction, and a few
notations math-verify misreads rewritten (e-notation, `\\mathrm{e}`, `\\bigl(`, "[90]"). An
extraction with unbalanced braces (cut inside an expression) is never compared; when math-verify
finds nothing usable, the last complete box is parsed alone. The gold is wrapped in `$...$`.

`shared_grader()` (behind `grade()`) also keeps a fast-lane worker that takes only samples whose
gold and last box are plain numbers, so a plain answer is never queued behind pathological ones.
"""
from __future__ import annotations

import atexit
import collections
import concurrent.futures
import functools
import heapq
import itertools
import logging
import math
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Iterable

from evaluation.benchmarks import extract_boxed
from evaluation.extraction import is_balanced, looks_plain, prepare_gold, prepare_response

logger = logging.getLogger(__name__)


class Verdict(str, Enum):
    """The outcome of grading one sample; the value is what records and reports store."""

    CORRECT = "correct"
    INCORRECT = "incorrect"
    UNPARSEABLE = "unparseable"
    """Nothing could be extracted from the response (no box, and math-verify found nothing)."""
    TIMEOUT = "timeout"
    """The grader could not finish: past the wall-clock limit, or its worker process died."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Graded:
    """A verdict with the answer it was reached on."""

    verdict: Verdict
    extracted: str | None
    """math-verify's normalised LaTeX of the extracted answer; None if nothing was extracted
    (or the sample timed out)."""


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeouts are off; here that is by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def _parse(text: str) -> list:
    """math-verify's parse with its signal-based timeout off."""
    from math_verify import parse  # imported lazily: keeps `import evaluation.grader` light

    return parse(text, parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    # Cached: every one of a problem's n samples is graded against the same gold.
    return tuple(_parse(prepare_gold(gold)))


def _checked(parsed: list) -> tuple[list, str | None]:
    """(parse result, its normalised answer string), or ([], None) when nothing was extracted or
    the extraction was cut inside an expression (unbalanced braces): that is never compared."""
    if not parsed:
        return [], None
    # With fallback_mode="first_match", parse appends the matched string after any expression.
    text = next((p for p in parsed if isinstance(p, str)), None)
    text = text if text is not None else str(parsed[0])
    return (parsed, text) if is_balanced(text) else ([], None)


def extract_answer(response: str) -> tuple[list, str | None]:
    """(math-verify parse result, normalised answer string) for `response`; ([], None) when
    nothing can be extracted.

    math-verify's own extraction runs on the prepared response (`extraction.prepare_response`),
    so several boxes, "final answer is" sentences and its other anchors count as it counts them.
    When it finds nothing, or only a cut expression, the last complete box is parsed alone.
    """
    text = prepare_response(response)
    parsed, extracted = _checked(_parse(text))
    if not parsed:
        boxed = extract_boxed(text, skip_empty=True)
        if boxed and boxed.strip():
            parsed, extracted = _checked(_parse(f"\\boxed{{{boxed}}}"))
    return parsed, extracted


def grade_detailed(response: str, gold: str) -> Graded:
    """Grade one response against one gold answer, in-process and without a time limit (what
    the workers run; `grade` is the bounded call)."""
    from math_verify import verify

    gold_parsed = list(_parse_gold(gold))
    if not gold_parsed:  # a data error, never a wrong answer: raise whatever the response is
        raise ValueError(f"gold answer {gold!r} cannot be parsed by math-verify")
    parsed, extracted = extract_answer(response)
    if not parsed:
        return Graded(Verdict.UNPARSEABLE, None)
    ok = verify(gold_parsed, parsed, timeout_seconds=None)
    return Graded(Verdict.CORRECT if ok else Verdict.INCORRECT, extracted)


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
    """The verdict for one response (see `grade_detailed`), or TIMEOUT if none within `timeout_s`.

    The limit counts from this call: waiting for a free worker and, on a process's first call,
    the pool's start-up (~1.5 s) are inside it. A sample whose gold and last box are plain numbers
    also has the pool's fast-lane worker, which pathological samples never hold. A gold answer math-verify cannot parse raises
    ValueError; workers that cannot start raise GraderStartupError.
    """
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
    """The process-wide `Grader` behind `grade()`, with its workers starting.

    Made on first use, and again when it was closed, broke, or belongs to the parent of a forked
    child. Calling it early hides the workers' start-up behind other work.
    """
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.usable:
            _shared = Grader(workers=SHARED_POOL_WORKERS, timeout_s=DEFAULT_TIMEOUT_S,
                             fast_lane=True)
            _shared.start()
        return _shared


@atexit.register
def _close_shared() -> None:
    if _shared is not None and _shared.usable:
        _shared.close()


# ---- worker processes ---------------------------------------------------------------------

_REPO = str(Path(__file__).resolve().parents[1])
# The worker's whole command line. `python -c` puts the caller's working directory first on
# sys.path; this checkout goes there instead, so the worker imports this `evaluation` package
# and nothing shadows math-verify's imports.
_BOOT = ("import sys; sys.path[:] = [{repo!r}] + [p for p in sys.path if p not in ('', '.')]; "
         "from evaluation.grader import _worker_main; "
         "_worker_main(int(sys.argv[1]), int(sys.argv[2]))")


def _worker_main(fd: int, parent_pid: int) -> None:
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
class _Task:
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


class _Worker:
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
        self.task: _Task | None = None
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
        self._pending: collections.OrderedDict[int, _Task] = collections.OrderedDict()
        # Ids of queued fast tasks, oldest first; an id whose task has left _pending is skipped.
        self._fast_ids: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._deadlines: list[tuple[float, int]] = []  # heap of (deadline, task id), queued tasks
        self._ids = itertools.count()
        self._workers: list[_Worker] = []  # replaced and changed only by the dispatcher
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
            task = _Task(next(self._ids), future, response, gold, limit,
                         math.inf if deadline is None else deadline, fast)
            self._pending[task.id] = task
            if fast:
                self._fast_ids[task.id] = None
            if deadline is not None:
                heapq.heappush(self._deadlines, (deadline, task.id))
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
            workers.extend(_Worker() for _ in range(self.n_workers))
            if self.fast_lane:
                workers.append(_Worker(fast_lane=True))
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
                    workers[i] = _Worker(fast_lane=w.fast_lane)
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
                pending, self._pending = list(self._pending.values()), collections.OrderedDict()
                self._fast_ids.clear()
            for task in pending:
                task.future.set_exception(error)

    def _expire_queued(self) -> None:
        """TIMEOUT for queued tasks whose deadline passed before a worker was free for them."""
        now, expired = time.monotonic(), []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                task_id = heapq.heappop(self._deadlines)[1]
                task = self._pending.pop(task_id, None)
                self._fast_ids.pop(task_id, None)
                if task is not None:  # else it was taken by a worker in time
                    expired.append(task)
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
                task = self._next_task(w.fast_lane)
            if task is None:
                continue
            try:
                w.conn.send((task.id, task.response, task.gold))
            except OSError:  # the worker just died: _service replaces it
                self._requeue(task)
                continue
            w.task, w.took = task, False
            w.deadline = min(time.monotonic() + task.limit_s, task.deadline)

    def _next_task(self, fast_only: bool) -> _Task | None:
        """Pop the oldest queued task (the oldest fast one with `fast_only`); call under the lock."""
        if not fast_only:
            if not self._pending:
                return None
            _, task = self._pending.popitem(last=False)
            self._fast_ids.pop(task.id, None)
            return task
        while self._fast_ids:
            task = self._pending.pop(self._fast_ids.popitem(last=False)[0], None)
            if task is not None:
                return task
        return None

    def _requeue(self, task: _Task) -> None:
        """Put a task no worker has read back at the head of the queue, under its deadline."""
        with self._lock:
            self._pending[task.id] = task
            self._pending.move_to_end(task.id, last=False)
            if task.fast:
                self._fast_ids[task.id] = None
                self._fast_ids.move_to_end(task.id, last=False)
            if task.deadline < math.inf:
                heapq.heappush(self._deadlines, (task.deadline, task.id))

    def _wait_s(self) -> float | None:
        """Seconds until the nearest task deadline or start-up limit; None if there is none."""
        deadlines = [w.deadline for w in self._workers if w.task] + [
            w.started + self.STARTUP_LIMIT_S for w in self._workers if not w.ready]
        with self._lock:
            if self._deadlines:
                deadlines.append(self._deadlines[0][0])
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _service(self, w: _Worker, readable: bool) -> str:
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

    def _exited(self, w: _Worker) -> str:
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
