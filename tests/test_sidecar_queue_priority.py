"""The request queue's background lane: video work waits behind every observation, never before one."""

from __future__ import annotations

import threading
import time

import numpy as np

from cosmos3_runtime.requests import ActionRequest
from policy_server.request_queue import PendingObservation, QueueClosed, RequestQueue


class _Task:
    def __init__(self, name: str) -> None:
        self.name = name
        self.owner = self

    def run(self, engine):
        return self.name


def _observation(session: str, seq: int = 0) -> PendingObservation:
    request = ActionRequest(domain_name="d", image=np.zeros((4, 4, 3), np.uint8))
    return PendingObservation(session_id=session, seq=seq, request=request, owner=None, received_at=time.monotonic())


def test_background_task_waits_while_an_observation_waits():
    queue = RequestQueue()
    queue.put_background(_Task("video-1"))
    queue.put(_observation("robot"))
    assert queue.take_background() is None  # the robot's observation goes first
    assert queue.take(timeout=0).session_id == "robot"
    assert queue.take_background().name == "video-1"
    assert queue.take_background() is None


def test_background_tasks_run_in_submission_order():
    queue = RequestQueue()
    for name in ("a", "b", "c"):
        queue.put_background(_Task(name))
    assert queue.background_waiting == 3
    assert len(queue) == 0  # len() counts observations only
    assert [queue.take_background().name for _ in range(3)] == ["a", "b", "c"]


def test_take_wakes_for_background_work_without_reporting_closed():
    queue = RequestQueue()
    woke = {}

    def worker():
        woke["item"] = queue.take(timeout=5)
        woke["closed"] = queue.closed

    thread = threading.Thread(target=worker)
    thread.start()
    time.sleep(0.05)
    queue.put_background(_Task("video"))
    thread.join(2)
    assert not thread.is_alive(), "take() did not wake up for background work"
    assert woke == {"item": None, "closed": False}


def test_close_hands_back_waiting_background_tasks():
    queue = RequestQueue()
    task = _Task("video")
    queue.put_background(task)
    queue.put(_observation("robot"))
    left = queue.close()
    assert task in left and len(left) == 2
    assert queue.background_waiting == 0
    try:
        queue.put_background(_Task("late"))
    except QueueClosed:
        pass
    else:
        raise AssertionError("put_background accepted work after close()")
