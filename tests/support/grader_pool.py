"""Waiting on a grader pool's workers from a test."""
import time


def grading_pids(grader, timeout_s: float = 30.0) -> list[int]:
    """The pids of `grader`'s workers that are grading a sample, once one has read its sample
    (a loaded machine can take seconds to schedule it)."""
    end = time.monotonic() + timeout_s
    while not (pids := grader.worker_pids(grading=True)):
        assert time.monotonic() < end, f"no worker read its sample in {timeout_s:.0f} s"
        time.sleep(0.05)
    return pids
