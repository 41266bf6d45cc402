"""The request queue's background lane: video work waits behind every observation, never before one."""

from __future__ import annotations

import threading
import time

import numpy as np

from cosmos3_runtime.requests import ActionRequest
from policy_server.engine.request_queue import PendingObservation, QueueClosed, RequestQueue


class _Task:
    def __init__(self, name: str) -> None:
        self.name = name
        self.owner = self

    def run(self, engine, between_steps=lambda: None):
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


async def test_a_robot_is_served_between_the_steps_of_a_running_video(tiny_engine):
    """A video rollout running on the worker gives way after each denoising step: an observation that
    arrives mid-video is answered before the video finishes, not after it."""
    import asyncio

    from cosmos3_runtime.requests import VideoRequest
    from policy_server.engine.worker import EngineWorker
    from policy_server.videos.runner import VideoRolloutTask

    loop = asyncio.get_running_loop()
    engine = tiny_engine("base")
    queue = RequestQueue()
    worker = EngineWorker(lambda: engine, queue, loop, warmup=False)
    worker.start()
    await worker.wait_ready()
    finished = []

    class Robot:
        def on_result(self, item, outcome):
            finished.append(("robot", outcome))

        def on_dropped(self, item, reason):
            finished.append(("robot-dropped", reason))

    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    video = VideoRolloutTask(
        "video_1",
        VideoRequest(
            domain_name="fractal", image=image, num_steps=30, guidance_scale=3.0, actions=np.zeros((8, 10), np.float32)
        ),
        loop,
        on_started=lambda job_id: None,
    )
    queue.put_background(video)
    while worker.current_task is None:
        await asyncio.sleep(0.005)
    queue.put(
        PendingObservation(
            session_id="robot",
            seq=0,
            owner=Robot(),
            received_at=time.monotonic(),
            request=ActionRequest(domain_name="fractal", image=image, num_steps=2, guidance_scale=1.0),
        )
    )
    result = await asyncio.wait_for(video.done, 120)
    queue.close()
    await asyncio.to_thread(worker.stop, 10)
    assert result.error is None and result.frames.shape[0] == 9
    assert [kind for kind, _ in finished] == ["robot"]
    robot_done = finished[0][1].done_at
    assert robot_done < video.started_at + result.engine_s  # answered while the video was still running
