"""Whose turn the engine takes: robots, HTTP clients and video rollouts under load (issue 18, items 8 and 9).

Structural checks on the real engine worker and the real tiny model: the order the worker takes work
in, never how fast it is. "Robots continuously waiting" is made exact: the engine wrapper queues each
robot's next observation on the worker thread the moment the robot's call starts, so at every decision
the worker makes, every robot has an observation waiting.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from cosmos3_runtime.requests import ActionRequest, VideoRequest
from policy_server.engine.request_queue import PendingObservation, RequestQueue
from policy_server.engine.worker import BackgroundShare, EngineWorker
from policy_server.videos.runner import VideoRolloutTask

pytestmark = pytest.mark.timeout(180)

DOMAIN = "fractal"
IMAGE = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)


class _Owner:
    """The owner of queued observations; outcomes arrive on the event loop and are only counted."""

    def __init__(self) -> None:
        self.results = 0

    def on_result(self, item, outcome) -> None:
        assert outcome.chunk is not None, outcome
        self.results += 1

    def on_dropped(self, item, reason) -> None:
        raise AssertionError(f"dropped {item.session_id}: {reason}")


def _observation(session: str, seq: int, owner, turn=None) -> PendingObservation:
    # The prompt names the session, so the recording engine can tell whose request it runs.
    request = ActionRequest(domain_name=DOMAIN, image=IMAGE, prompt=session, action_horizon=8)
    return PendingObservation(
        session_id=session, seq=seq, request=request, owner=owner, received_at=time.monotonic(), turn=turn
    )


class _RecordingEngine:
    """The real engine; records every engine call in order (who, when) and keeps robots waiting."""

    def __init__(self, engine, queue: RequestQueue, robots: dict[str, _Owner]) -> None:
        self.engine = engine
        self.queue = queue
        self.robots = robots
        self.seq = {name: 1 for name in robots}
        self.log: list[tuple[str, tuple, float, float]] = []  # (kind, sessions, started, ended)
        self.waiting_at_video_steps: list[int] = []

    def _robots_send_again(self, requests_of: list[str]) -> None:
        for name in requests_of:
            if name in self.robots and not self.queue.closed:
                self.queue.put(_observation(name, self.seq[name], self.robots[name]))
                self.seq[name] += 1

    def predict_actions_batch(self, requests):
        sessions = tuple(request.prompt for request in requests)
        self._robots_send_again(list(sessions))
        started = time.monotonic()
        try:
            return self.engine.predict_actions_batch(requests)
        finally:
            self.log.append(("robot", sessions, started, time.monotonic()))

    def predict_actions(self, request):
        return self.predict_actions_batch([request])[0]

    def start_video(self, request):
        rollout = self.engine.start_video(request)
        recorder = self

        class Rollout:
            def step(self):
                recorder.waiting_at_video_steps.append(len(recorder.queue))
                started = time.monotonic()
                try:
                    return rollout.step()
                finally:
                    recorder.log.append(("video", (), started, time.monotonic()))

            def result(self):
                return rollout.result()

        return Rollout()

    def __getattr__(self, name):
        return getattr(self.engine, name)


async def test_a_video_job_advances_and_completes_while_robots_wait_continuously(tiny_engine):
    """The attack: robots always have an observation waiting. Before the fix the video job never got
    the engine (the background lane ran only while no observation waited). Now: it starts once it has
    waited one interval, gets one step per interval (counted from the end of its last step), never more
    than one robot batch starts after its turn fell due, and robots are served between every two steps
    (a robot's added wait is one step)."""
    loop = asyncio.get_running_loop()
    queue = RequestQueue()
    robots = {"robot-a": _Owner(), "robot-b": _Owner()}
    engine = _RecordingEngine(tiny_engine("distilled"), queue, robots)
    interval = 0.25
    worker = EngineWorker(lambda: engine, queue, loop, warmup=False, background=BackgroundShare(interval))
    try:
        worker.start()
        await worker.wait_ready()
        for name, owner in robots.items():
            queue.put(_observation(name, 0, owner))
        while not engine.log:
            await asyncio.sleep(0.005)  # robots are being served: the load is on
        video = VideoRolloutTask(
            "video_1",
            VideoRequest(domain_name=DOMAIN, image=IMAGE, actions=np.zeros((8, 10), np.float32)),
            loop,
            on_started=lambda job_id: None,
        )
        queue.put_background(video)
        queued_at = time.monotonic()
        result = await asyncio.wait_for(video.done, 60)
    finally:
        queue.close()
        await asyncio.to_thread(worker.stop, 30)

    assert result is not None and result.error is None and result.frames is not None
    assert all(waiting >= 1 for waiting in engine.waiting_at_video_steps), engine.waiting_at_video_steps
    steps = [(started, ended) for kind, _, started, ended in engine.log if kind == "video"]
    assert len(steps) >= 3  # denoising steps, then the decode
    robot_calls = [(started, ended) for kind, _, started, ended in engine.log if kind == "robot"]
    # Due times: one interval after the job was queued, then one interval after each step ended.
    due = [queued_at + interval] + [ended + interval for _, ended in steps[:-1]]
    previous = [queued_at] + [ended for _, ended in steps[:-1]]
    for (step_started, _), due_at, since in zip(steps, due, previous):
        # Robot batches served since the previous step (or the submission), including the one running then.
        robots_between = [started for started, ended in robot_calls if ended > since and started < step_started]
        late = [started for started in robots_between if started >= due_at]
        assert len(late) <= 1, f"{len(late)} robot batches started after the video's turn fell due"
        assert robots_between, "two video steps ran back to back while robots waited"
    assert all(owner.results > 0 for owner in robots.values())


async def test_without_a_share_the_video_waits_for_the_robots(tiny_engine):
    """``BackgroundShare(0)`` keeps the strict priority (robots always first): under the same load the
    job does not start. The share is what makes it finish."""
    loop = asyncio.get_running_loop()
    queue = RequestQueue()
    robots = {"robot-a": _Owner()}
    engine = _RecordingEngine(tiny_engine("distilled"), queue, robots)
    worker = EngineWorker(lambda: engine, queue, loop, warmup=False, background=BackgroundShare(0))
    worker.start()
    await worker.wait_ready()
    try:
        queue.put(_observation("robot-a", 0, robots["robot-a"]))
        video = VideoRolloutTask(
            "video_1",
            VideoRequest(domain_name=DOMAIN, image=IMAGE, actions=np.zeros((8, 10), np.float32)),
            loop,
            on_started=lambda job_id: None,
        )
        queue.put_background(video)
        deadline = time.monotonic() + 60
        while robots["robot-a"].results < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert robots["robot-a"].results >= 4 and video.started_at is None
    finally:
        queue.close()
        await asyncio.to_thread(worker.stop, 30)


class _ChargesRecorded(RequestQueue):
    """The real queue, recording what each turn is charged (host preparation and engine time alike)."""

    def __init__(self) -> None:
        super().__init__()
        self.charged: dict[str, float] = {}

    def charge(self, item: PendingObservation, seconds: float) -> None:
        self.charged[item.session_id] = self.charged.get(item.session_id, 0.0) + seconds
        super().charge(item, seconds)


async def test_each_turn_pays_for_its_engine_time(tiny_engine):
    """Turns are fair in engine time as well as in host time: the worker charges each observation's turn its
    share of the engine call, so a session that is served more often than the others (one that always has an
    observation waiting, while robots in closed loop are between two of theirs) leads them and yields
    (``RequestQueue``'s module docstring; ``benchmarks/attack_websocket.py costly-frames`` measures it)."""
    loop = asyncio.get_running_loop()
    queue = _ChargesRecorded()
    worker = EngineWorker(lambda: tiny_engine("distilled"), queue, loop, warmup=False)
    owner = _Owner()
    try:
        worker.start()
        await worker.wait_ready()
        queue.put(_observation("robot", 0, owner))
        deadline = time.monotonic() + 60
        while owner.results < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        engine_s = worker.counters.busy_s
    finally:
        queue.close()
        await asyncio.to_thread(worker.stop, 30)
    assert owner.results == 1
    # Its preparation and its engine call: at least the engine call, which took most of the busy time.
    assert queue.charged["robot"] >= 0.5 * engine_s > 0, (queue.charged, engine_s)
