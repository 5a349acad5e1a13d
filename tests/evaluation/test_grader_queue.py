"""The grader's queue on its own (`evaluation/grader_queue.py`): the order workers take samples in,
the fast lane, a sample put back in front, deadlines. No worker processes: the pool's behaviour
with them is tests/evaluation/test_grader.py."""
import math
from concurrent.futures import Future

from evaluation.grader_queue import TaskQueue
from evaluation.grader_worker import Task


def _task(task_id: int, *, fast: bool = False, deadline: float = math.inf) -> Task:
    return Task(task_id, Future(), f"\\boxed{{{task_id}}}", str(task_id), 10.0, deadline, fast)


def _ids(tasks) -> list[int]:
    return [t.id for t in tasks]


def test_any_worker_takes_the_oldest_and_a_fast_lane_worker_the_oldest_fast_one():
    queue = TaskQueue()
    for task in (_task(0), _task(1, fast=True), _task(2), _task(3, fast=True)):
        queue.push(task)
    assert queue.pop(fast_only=True).id == 1
    assert [queue.pop(fast_only=False).id for _ in range(2)] == [0, 2]
    assert queue.pop(fast_only=False).id == 3  # a fast task is any worker's too
    assert queue.pop(fast_only=True) is None and queue.pop(fast_only=False) is None and len(queue) == 0


def test_a_fast_task_taken_by_a_general_worker_leaves_the_fast_lane():
    queue = TaskQueue()
    queue.push(_task(0, fast=True))
    queue.push(_task(1, fast=True))
    assert queue.pop(fast_only=False).id == 0
    assert queue.pop(fast_only=True).id == 1 and queue.pop(fast_only=True) is None


def test_a_task_put_back_goes_ahead_of_the_others_in_both_lanes():
    queue = TaskQueue()
    for task in (_task(0, fast=True), _task(1, fast=True)):
        queue.push(task)
    taken = queue.pop(fast_only=False)
    queue.push(_task(2, fast=True))
    queue.push(taken, first=True)
    assert queue.pop(fast_only=True).id == 0
    assert _ids(queue.drain()) == [1, 2]


def test_only_queued_tasks_past_their_deadline_expire():
    queue = TaskQueue()
    for task in (_task(0, deadline=5.0), _task(1, deadline=1.0), _task(2), _task(3, deadline=2.0)):
        queue.push(task)
    assert queue.next_deadline() == 1.0
    assert queue.pop(fast_only=False).id == 0  # taken by a worker: its deadline is the worker's now
    assert _ids(queue.expire(now=5.0)) == [1, 3]
    assert queue.next_deadline() is None and _ids(queue.drain()) == [2] and len(queue) == 0
