"""The samples waiting for a grader worker (`grader.py:Grader`): oldest first, a lane of the fast
ones (cheap to grade) that a fast-lane worker takes from, and the deadlines of those that have one.

Not locked by itself: the Grader calls it under its own lock, the same lock that says whether the
pool is closed or broken, so no sample is queued after the queue was drained.
"""
from __future__ import annotations

import collections
import heapq
import math

from evaluation.grader_worker import Task


class TaskQueue:
    """Queued tasks by id, oldest first. A task leaves by `pop` (a worker takes it), `expire` (its
    deadline passed first) or `drain` (the pool stops); `push(first=True)` puts one back in front."""

    def __init__(self) -> None:
        self._tasks: collections.OrderedDict[int, Task] = collections.OrderedDict()
        # Ids of queued fast tasks, oldest first; an id whose task has left _tasks is skipped.
        self._fast_ids: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._deadlines: list[tuple[float, int]] = []  # heap of (deadline, task id); left tasks are skipped

    def __len__(self) -> int:
        return len(self._tasks)

    def push(self, task: Task, *, first: bool = False) -> None:
        """Queue `task` behind the others, or with `first` ahead of them (a task that a worker was
        handed but never read goes back to where it was: the head)."""
        self._tasks[task.id] = task
        if task.fast:
            self._fast_ids[task.id] = None
        if first:
            self._tasks.move_to_end(task.id, last=False)
            if task.fast:
                self._fast_ids.move_to_end(task.id, last=False)
        if task.deadline < math.inf:
            heapq.heappush(self._deadlines, (task.deadline, task.id))

    def pop(self, fast_only: bool) -> Task | None:
        """The oldest queued task (the oldest fast one with `fast_only`), taken off the queue."""
        if not fast_only:
            if not self._tasks:
                return None
            _, task = self._tasks.popitem(last=False)
            self._fast_ids.pop(task.id, None)
            return task
        while self._fast_ids:
            task = self._tasks.pop(self._fast_ids.popitem(last=False)[0], None)
            if task is not None:
                return task
        return None

    def expire(self, now: float) -> list[Task]:
        """The queued tasks whose deadline is at or before `now`, taken off the queue."""
        expired = []
        while self._deadlines and self._deadlines[0][0] <= now:
            task_id = heapq.heappop(self._deadlines)[1]
            task = self._tasks.pop(task_id, None)
            self._fast_ids.pop(task_id, None)
            if task is not None:  # else a worker took it in time
                expired.append(task)
        return expired

    def next_deadline(self) -> float | None:
        """The nearest deadline of the heap (maybe of a task gone since: an early wake-up only)."""
        return self._deadlines[0][0] if self._deadlines else None

    def drain(self) -> list[Task]:
        """Every queued task, oldest first; the queue is left empty."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        self._fast_ids.clear()
        self._deadlines.clear()
        return tasks
