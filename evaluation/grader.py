"""Grading model responses against gold answers with math-verify.

`grade` runs in-process with math-verify's own `signal.alarm` timeouts switched off (they fail
off the main thread); bounding its time is the caller's job. `Grader` runs `grade` in worker
processes with a wall-clock limit per sample: a sample past its limit gets TIMEOUT and its
worker is killed and replaced. Every sample gets exactly one verdict.

Answer extraction: the last non-empty brace-matched `\\boxed{}` of the response (a trailing
period inside it dropped); when there is none, math-verify's own extraction over the whole
response. A plain number in e-notation
("4.5e33", how 58 Minerva golds are written) is rewritten to `4.5 \\times 10^{33}` on both
sides, because math-verify reads "4.5e33" as 4.5 * e * 33.
"""
from __future__ import annotations

import collections
import functools
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import re
import socket
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from evaluation.benchmarks import extract_boxed

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


_SCIENTIFIC = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*[eE]\s*([-+]?\d+)\s*")


def _unscientific(answer: str) -> str:
    """'4.5e33' -> '4.5 \\times 10^{33}'; anything but a lone e-notation number is unchanged."""
    match = _SCIENTIFIC.fullmatch(answer)
    return f"{match[1]} \\times 10^{{{match[2]}}}" if match else answer


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
    # Cached: every one of a problem's n samples is graded against the same gold. Inline `$`
    # math cannot span lines, so newlines become spaces.
    return tuple(_parse(f"${_unscientific(' '.join(gold.split()))}$"))


def extract_answer(response: str) -> tuple[list, str | None]:
    """(math-verify parse result, normalised answer string) for `response`; ([], None) when
    nothing can be extracted."""
    boxed = extract_boxed(response, skip_empty=True)
    # A period closing the sentence sometimes lands inside the box ("\\boxed{5.}").
    boxed = re.sub(r"\.\s*$", "", boxed) if boxed is not None else None
    parsed = _parse(f"\\boxed{{{_unscientific(boxed)}}}") if boxed and boxed.strip() else []
    if not parsed:
        parsed = _parse(response)
    if not parsed:
        return [], None
    # With fallback_mode="first_match", parse appends the matched string after any expression.
    text = next((p for p in parsed if isinstance(p, str)), None)
    return parsed, text if text is not None else str(parsed[0])


def grade_detailed(response: str, gold: str) -> Graded:
    """Grade one response against one gold answer, in-process and without a time limit."""
    from math_verify import verify

    gold_parsed = list(_parse_gold(gold))
    if not gold_parsed:  # a data error, never a wrong answer: raise whatever the response is
        raise ValueError(f"gold answer {gold!r} cannot be parsed by math-verify")
    parsed, extracted = extract_answer(response)
    if not parsed:
        return Graded(Verdict.UNPARSEABLE, None)
    ok = verify(gold_parsed, parsed, timeout_seconds=None)
    return Graded(Verdict.CORRECT if ok else Verdict.INCORRECT, extracted)


def grade(response: str, gold: str) -> Verdict:
    """The verdict for one response (see `grade_detailed`); no time limit: use `Grader` for one."""
    return grade_detailed(response, gold).verdict


# ---- worker processes ---------------------------------------------------------------------

def _worker_main(conn) -> None:
    """Worker loop: say ready, then answer (task_id, response, gold) until told to stop."""
    try:
        import math_verify  # noqa: F401  (fail here, visibly, rather than on the first task)

        logging.getLogger("math_verify").setLevel(logging.ERROR)
        conn.send(("ready", None, None))
    except BaseException:
        conn.send(("failed", None, traceback.format_exc()))
        return
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        if task is None:
            return
        task_id, response, gold = task
        try:
            graded = grade_detailed(response, gold)
            conn.send((task_id, graded.verdict.value, graded.extracted))
        except Exception:
            conn.send((task_id, "error", traceback.format_exc()))


class _Worker:
    """One worker process with its pipe and the task it is busy with (if any)."""

    def __init__(self, ctx) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child_conn,), daemon=True,
                                name="evaluation-grader")
        self.proc.start()
        child_conn.close()
        self.started = time.monotonic()
        self.ready = False
        self.task: tuple[int, Future] | None = None
        self.deadline = float("inf")
        self.error = ""

    def stop(self, kill: bool) -> None:
        if not kill:
            try:
                self.conn.send(None)
                self.proc.join(timeout=2)
            except OSError:
                pass
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


class GraderStartupError(RuntimeError):
    """Grader worker processes fail to start (e.g. math-verify is not installed)."""


class Grader:
    """Grades many (response, gold) pairs in worker processes, each with a wall-clock limit.

    Use as a context manager. Thread-safe: `submit` and `grade_many` may be called from several
    threads at once; one dispatcher thread feeds `workers` processes ('spawn' by default). A
    sample past `timeout_s` gets TIMEOUT and its worker is killed and replaced (a new worker's
    start-up does not count against any sample's limit). A worker that dies mid-sample
    (segfault, OOM kill) also gives that sample TIMEOUT and is replaced. An exception inside
    `grade_detailed` (only an unparseable gold raises) is re-raised from the sample's future.
    If workers cannot start (`MAX_FAILED_STARTS` in a row), every queued and later sample fails
    with GraderStartupError. Counters: `n_timeouts`, `n_crashes`.
    """

    STARTUP_LIMIT_S = 120.0
    """A worker that has not imported math-verify by then counts as a failed start."""
    MAX_FAILED_STARTS = 3
    """Consecutive failed starts after which the Grader gives up."""

    def __init__(self, workers: int | None = None, timeout_s: float = 10.0,
                 start_method: str = "spawn") -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.n_workers = workers if workers is not None else min(4, os.cpu_count() or 1)
        if self.n_workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.timeout_s = timeout_s
        self.n_timeouts = 0
        self.n_crashes = 0
        self._ctx = multiprocessing.get_context(start_method)
        self._lock = threading.Lock()
        self._pending: collections.deque = collections.deque()  # (task_id, future, response, gold)
        self._ids = itertools.count()
        self._closing = False
        self._broken: BaseException | None = None
        self._thread: threading.Thread | None = None
        # Self-pipe: `submit` and `close` write a byte to wake the dispatcher from its wait().
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    # -- public API

    def __enter__(self) -> "Grader":
        self._ensure_started()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, response: str, gold: str) -> "Future[Graded]":
        """Queue one sample; the future resolves to its `Graded`."""
        future: Future = Future()
        future.set_running_or_notify_cancel()  # no cancelling: every sample gets a verdict
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if self._closing:
                raise RuntimeError("Grader is closed")
            self._pending.append((next(self._ids), future, response, gold))
        self._ensure_started()
        self._wake()
        return future

    def grade_many_detailed(self, pairs: Iterable[tuple[str, str]]) -> list[Graded]:
        """`Graded` for each (response, gold) pair, in input order."""
        futures = [self.submit(response, gold) for response, gold in pairs]
        return [f.result() for f in futures]

    def grade_many(self, pairs: Iterable[tuple[str, str]]) -> list[Verdict]:
        """The verdict for each (response, gold) pair, in input order."""
        return [g.verdict for g in self.grade_many_detailed(pairs)]

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

    # -- dispatcher: runs in its own thread and is the only code that touches workers

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._dispatch, daemon=True,
                                                name="evaluation-grader-dispatch")
                self._thread.start()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # a full pipe wakes the dispatcher anyway; a closed one means we are done

    def _dispatch(self) -> None:
        workers: list[_Worker] = []
        error: BaseException = RuntimeError("Grader closed before this sample was graded")
        try:
            workers.extend(_Worker(self._ctx) for _ in range(self.n_workers))
            failed_starts = 0
            while not self._closing:
                self._assign(workers)
                ready = multiprocessing.connection.wait(
                    [self._wake_r] + [w.conn for w in workers] + [w.proc.sentinel for w in workers],
                    timeout=self._wait_s(workers))
                if self._wake_r in ready:
                    try:
                        self._wake_r.recv(65536)
                    except BlockingIOError:
                        pass
                for i, w in enumerate(workers):
                    outcome = self._service(w, ready)
                    if outcome == "ok":
                        continue
                    failed_starts = failed_starts + 1 if outcome == "failed_start" else 0
                    w.stop(kill=True)
                    if failed_starts >= self.MAX_FAILED_STARTS:
                        raise GraderStartupError(
                            f"grader workers failed to start {failed_starts} times in a row; "
                            f"last error: {w.error}")
                    workers[i] = _Worker(self._ctx)
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
                    w.task[1].set_exception(RuntimeError("Grader closed while grading"))
                w.stop(kill=w.task is not None or not w.ready)
            with self._lock:
                pending, self._pending = list(self._pending), collections.deque()
            for _, future, _, _ in pending:
                future.set_exception(error)

    def _assign(self, workers: list[_Worker]) -> None:
        """Hand queued samples to ready, idle workers and start their clocks."""
        for w in workers:
            if not (w.ready and w.task is None):
                continue
            with self._lock:
                if not self._pending:
                    return
                task_id, future, response, gold = self._pending.popleft()
            try:
                w.conn.send((task_id, response, gold))
            except OSError:  # the worker just died: requeue; _service replaces it
                with self._lock:
                    self._pending.appendleft((task_id, future, response, gold))
                continue
            w.task, w.deadline = (task_id, future), time.monotonic() + self.timeout_s

    def _wait_s(self, workers: list[_Worker]) -> float | None:
        """Seconds until the nearest sample deadline or start-up limit; None if there is none."""
        deadlines = [w.deadline for w in workers if w.task] + [
            w.started + self.STARTUP_LIMIT_S for w in workers if not w.ready]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _service(self, w: _Worker, ready: list) -> str:
        """Handle one worker's message, death or deadline: 'ok', 'replace' or 'failed_start'."""
        dead = False
        if w.conn in ready:
            try:
                kind, value, extra = w.conn.recv()
            except (EOFError, OSError):
                dead = True
            else:
                if kind == "ready":
                    w.ready = True
                elif kind == "failed":
                    w.error = extra
                    return "failed_start"
                elif w.task and kind == w.task[0]:
                    future, w.task, w.deadline = w.task[1], None, float("inf")
                    if value == "error":
                        future.set_exception(RuntimeError(f"grading raised:\n{extra}"))
                    else:
                        future.set_result(Graded(Verdict(value), extra))
                return "ok"
        if dead or w.proc.sentinel in ready:
            w.proc.join(timeout=1)
            if not w.ready:
                w.error = (f"worker exited (code {w.proc.exitcode}) before it was ready; with the "
                           "'spawn' start method the main script needs an "
                           "`if __name__ == '__main__':` guard")
                return "failed_start"
            if w.task:
                self.n_crashes += 1
                logger.warning("grader worker died (exit code %s) mid-sample: verdict TIMEOUT",
                               w.proc.exitcode)
                w.task[1].set_result(Graded(Verdict.TIMEOUT, None))
                w.task = None
            return "replace"
        now = time.monotonic()
        if w.task and now >= w.deadline:
            self.n_timeouts += 1
            w.task[1].set_result(Graded(Verdict.TIMEOUT, None))
            w.task = None
            return "replace"
        if not w.ready and now >= w.started + self.STARTUP_LIMIT_S:
            w.error = f"worker not ready after {self.STARTUP_LIMIT_S:.0f} s"
            return "failed_start"
        return "ok"
