"""The worker's seam for engines that can be lost (a Ray replica): ``EngineLost`` and ``on_engine_lost``.

The real worker and the real tiny model; the engine is wrapped so that it is "lost" (raises
``EngineLost``, as the Ray backend's remote engine does when its replica dies) on chosen calls. What is
checked: the work of a lost call is handed to ``on_engine_lost`` and answered to nobody (neither an
error nor a drop: it will be served elsewhere), a batch is not retried one by one on a lost engine, a
video task lets the loss through instead of failing its job, and a worker without a handler fails the
work with ``engine_error`` instead of dying.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from cosmos3_runtime.requests import ActionRequest, VideoRequest
from policy_server.engine.request_queue import EngineLost, PendingObservation, RequestQueue
from policy_server.engine.worker import BatchPolicy, EngineWorker
from policy_server.videos.runner import VideoRolloutTask

pytestmark = pytest.mark.timeout(120)

DOMAIN = "fractal"
IMAGE = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)


class _Owner:
    """Collects what the worker answers, on the event loop."""

    def __init__(self) -> None:
        self.results: list = []
        self.dropped: list = []

    def on_result(self, item, outcome) -> None:
        self.results.append((item.seq, outcome))

    def on_dropped(self, item, reason) -> None:
        self.dropped.append((item.seq, reason))


class _LosableEngine:
    """The real engine, lost (``EngineLost``) on the calls whose number is in ``lost_calls``."""

    def __init__(self, engine, lost_calls: set[int]) -> None:
        self.engine = engine
        self.lost_calls = lost_calls
        self.calls = 0

    def _call(self, fn, argument):
        self.calls += 1
        if self.calls in self.lost_calls:
            raise EngineLost(f"engine lost on call {self.calls}")
        return fn(argument)

    def predict_actions(self, request):
        return self._call(self.engine.predict_actions, request)

    def predict_actions_batch(self, requests):
        return self._call(self.engine.predict_actions_batch, requests)

    def start_video(self, request):
        rollout = self.engine.start_video(request)
        outer = self

        class Rollout:
            progress = 0.0

            def step(self):
                return outer._call(lambda _: rollout.step(), None)

            def result(self):
                return rollout.result()

        return Rollout()

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _observation(session: str, seq: int, owner) -> PendingObservation:
    request = ActionRequest(domain_name=DOMAIN, image=IMAGE, action_horizon=8)
    return PendingObservation(session_id=session, seq=seq, request=request, owner=owner, received_at=time.monotonic())


async def _until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def _running(worker: EngineWorker) -> None:
    worker.start()
    await worker.wait_ready()


async def test_a_lost_batch_goes_to_on_engine_lost_whole_and_unanswered(tiny_engine):
    loop = asyncio.get_running_loop()
    queue = RequestQueue()
    engine = _LosableEngine(tiny_engine("distilled"), lost_calls={1})
    handed_back: list = []
    worker = EngineWorker(
        lambda: engine,
        queue,
        loop,
        warmup=False,
        batching=BatchPolicy(max_batch=2, max_wait_ms=500),
        on_engine_lost=lambda items, tasks: handed_back.append((items, tasks)),
    )
    owner = _Owner()
    try:
        await _running(worker)
        first, second = _observation("a", 0, owner), _observation("b", 0, owner)
        queue.put(first)
        queue.put(second)
        await _until(lambda: handed_back)
        # One engine call, lost: the batch is not run again one by one on the engine that was lost.
        assert engine.calls == 1
        assert handed_back == [([first, second], [])]
        # The worker carries on: the next observation is served.
        queue.put(_observation("a", 1, owner))
        await _until(lambda: owner.results)
    finally:
        queue.close()
        await asyncio.to_thread(worker.stop, 30)
    assert [seq for seq, _ in owner.results] == [1] and owner.results[0][1].chunk is not None
    assert owner.dropped == []
    assert worker.failed == 0 and worker.completed == 1


async def test_a_video_task_lets_the_loss_through_to_on_engine_lost(tiny_engine):
    loop = asyncio.get_running_loop()
    queue = RequestQueue()
    engine = _LosableEngine(tiny_engine("distilled"), lost_calls={2})  # its second denoising step
    handed_back: list = []
    worker = EngineWorker(
        lambda: engine,
        queue,
        loop,
        warmup=False,
        on_engine_lost=lambda items, tasks: handed_back.append((items, tasks)),
    )
    video = VideoRolloutTask(
        "video_1",
        VideoRequest(domain_name=DOMAIN, image=IMAGE, actions=np.zeros((8, 10), np.float32)),
        loop,
        on_started=lambda job_id: None,
    )
    try:
        await _running(worker)
        queue.put_background(video)
        await _until(lambda: handed_back)
        await _until(lambda: not worker.busy)
    finally:
        queue.close()
        await asyncio.to_thread(worker.stop, 30)
    assert handed_back == [([], [video])]
    assert not video.done.done()  # neither failed nor dropped: it is to run again elsewhere


async def test_without_a_handler_lost_work_fails_with_engine_error(tiny_engine):
    loop = asyncio.get_running_loop()
    queue = RequestQueue()
    engine = _LosableEngine(tiny_engine("distilled"), lost_calls={1})
    worker = EngineWorker(lambda: engine, queue, loop, warmup=False)
    owner = _Owner()
    try:
        await _running(worker)
        queue.put(_observation("a", 0, owner))
        await _until(lambda: owner.results)
        queue.put(_observation("a", 1, owner))
        await _until(lambda: len(owner.results) == 2)
    finally:
        queue.close()
        await asyncio.to_thread(worker.stop, 30)
    (seq0, lost), (seq1, served) = owner.results
    assert (seq0, seq1) == (0, 1)
    assert lost.chunk is None and lost.error.code == "engine_error" and "lost" in lost.error.message
    assert served.chunk is not None
    assert worker.failed == 1 and worker.completed == 1
