"""The worker prepares the next observations' host inputs while the engine runs the current batch.

The real worker, queue and tiny model; robots in closed loop are owners that queue their next
observation when their chunk arrives. What is checked: with the overlap on, waiting observations are
prepared during the running call (counted; the idle gap it shrinks between consecutive engine calls is
measured by ``benchmarks/host_prep_overlap.py``), and the realtime rules still hold for prepared observations: a
superseded one is never served (its newer observation runs with its own inputs), an expired one is
dropped, a cancelled one is not served.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import numpy as np
import pytest

from cosmos3_runtime.requests import ActionRequest
from policy_server.engine.request_queue import PendingObservation, RequestQueue
from policy_server.engine.worker import BatchPolicy, EngineWorker
from robot_clients.protocol import DropReason

pytestmark = pytest.mark.timeout(300)

DOMAIN = "bridge_orig_lerobot"
# A camera's frame: its host preprocessing (resize into the 256 tier's canvas) is large enough to see.
FRAME_SHAPE = (480, 640, 3)


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, FRAME_SHAPE, dtype=np.uint8)


def _observation(session: str, seq: int, owner, image: np.ndarray, **fields) -> PendingObservation:
    request = ActionRequest(domain_name=DOMAIN, image=image, seed=seq, action_horizon=8)
    return PendingObservation(
        session_id=session, seq=seq, request=request, owner=owner, received_at=time.monotonic(), **fields
    )


class _Robot:
    """A robot in closed loop: its next observation goes into the queue when its chunk arrives."""

    request_kind = "realtime"

    def __init__(self, name: str, queue: RequestQueue, observations: int, done: asyncio.Event, robots: list) -> None:
        self.name, self.queue, self.left, self.done, self.robots = name, queue, observations, done, robots
        self.observations = observations
        self.outcomes: list = []
        self.image = _image(100 + len(robots))

    def send(self) -> None:
        self.left -= 1
        self.queue.put(_observation(self.name, self.left, self, self.image))

    def on_result(self, item, outcome) -> None:
        self.outcomes.append(outcome)
        if self.left:
            self.send()
        elif all(len(robot.outcomes) == robot.observations for robot in self.robots):
            self.done.set()

    def on_dropped(self, item, reason) -> None:
        raise AssertionError(f"{self.name} seq {item.seq} dropped: {reason}")


async def _closed_loop(engine, overlap: bool, robots: int = 3, observations: int = 6):
    queue, done, fleet = RequestQueue(), asyncio.Event(), []
    worker = EngineWorker(
        lambda: engine,
        queue,
        asyncio.get_running_loop(),
        warmup=False,
        batching=BatchPolicy(max_batch=1, overlap_host_prep=overlap),
    )
    worker.start()
    await worker.wait_ready()
    fleet.extend(_Robot(f"robot-{i}", queue, observations, done, fleet) for i in range(robots))
    for robot in fleet:
        robot.send()
    await asyncio.wait_for(done.wait(), 240)
    queue.close()
    await asyncio.get_running_loop().run_in_executor(None, worker.stop, 30)
    return worker, [outcome for robot in fleet for outcome in robot.outcomes]


async def test_waiting_observations_are_prepared_during_the_forward_and_the_gap_shrinks(tiny_engine):
    engine = tiny_engine("distilled")
    engine.predict_actions(ActionRequest(domain_name=DOMAIN, image=_image(0), seed=0, action_horizon=8))  # warm
    total = 3 * 6
    on, on_outcomes = await _closed_loop(engine, overlap=True)
    off, off_outcomes = await _closed_loop(engine, overlap=False)
    assert all(o.error is None for o in on_outcomes + off_outcomes)
    # Off: every observation's host inputs were made on the engine thread, between two calls.
    assert (off.counters.inline_preps, off.counters.overlapped_preps) == (total, 0)
    # On: made during the call before, except where nothing ran yet (the very first observation) or the
    # next observation arrived too late to be ready (a loaded machine); most overlap.
    assert on.counters.inline_preps + on.counters.overlapped_preps == total
    assert on.counters.overlapped_preps >= total // 2, on.counters
    assert on.counters.idle_gaps == off.counters.idle_gaps == total - 1  # a gap before every call but the first
    # The gap it shrinks is a wall time: benchmarks/host_prep_overlap.py measures it, both ways side by side.
    assert on.host_prep is None and off.host_prep is None  # stopped with the worker


class _Collector:
    request_kind = "realtime"

    def __init__(self) -> None:
        self.results: dict[int, object] = {}
        self.dropped: dict[int, str] = {}
        self.arrived = threading.Event()

    def on_result(self, item, outcome) -> None:
        self.results[item.seq] = outcome
        self.arrived.set()

    def on_dropped(self, item, reason) -> None:
        self.dropped[item.seq] = reason


async def _until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_prepared_observations_superseded_expired_or_cancelled_are_never_served(tiny_engine):
    engine = tiny_engine("distilled")
    stale, fresh = _image(1), _image(2)
    owner = _Collector()
    running = _observation("runner", 1, owner, _image(3))
    superseded = _observation("robot", 10, owner, stale)
    newer = _observation("robot", 11, owner, fresh)
    expiring = _observation("late", 20, owner, _image(4), deadline_at=time.monotonic() + 3600)
    cancelled = _observation("quitter", 30, owner, _image(5))
    expected = engine.predict_actions(newer.request).actions
    assert np.abs(engine.predict_actions(superseded.request).actions - expected).max() > 1e-3

    # The first engine call holds in its first forward until released, so the others wait behind it.
    release, held = threading.Event(), threading.Event()

    def hold(*_):
        if not release.is_set():
            held.set()
            release.wait(60)

    handle = engine.pipe.transformer.register_forward_pre_hook(hold)
    queue = RequestQueue()
    worker = EngineWorker(
        lambda: engine,
        queue,
        asyncio.get_running_loop(),
        warmup=False,
        batching=BatchPolicy(max_batch=4, overlap_host_prep=True),
    )
    try:
        worker.start()
        await worker.wait_ready()
        queue.put(running)
        await _until(held.is_set)
        for item in (superseded, expiring, cancelled):
            queue.put(item)
        await _until(lambda: all(worker.host_prep.holds(i) for i in (superseded, expiring, cancelled)))
        assert queue.put(newer) is superseded  # latest wins, with the stale one already prepared
        assert queue.cancel("quitter") is cancelled
        expiring.deadline_at = time.monotonic()  # its deadline passes while it waits, prepared
        await _until(lambda: worker.host_prep.holds(newer))  # the newer one is prepared on its own
        assert not worker.host_prep.holds(superseded) and not worker.host_prep.holds(cancelled)
        release.set()
        await _until(lambda: 11 in owner.results)
    finally:
        release.set()
        handle.remove()
        queue.close()
        await asyncio.get_running_loop().run_in_executor(None, worker.stop, 30)
    assert set(owner.results) == {1, 11} and owner.dropped == {20: DropReason.DEADLINE}
    assert np.abs(owner.results[11].chunk.actions - expected).max() <= 2e-5
    assert worker.counters.overlapped_preps == 1  # the newer observation, prepared while the first call ran


async def test_a_hung_call_abandoned_by_the_watchdog_takes_its_host_prep_with_it(tiny_checkpoint):
    """The watchdog's restart: the abandoned thread's prep thread stops, the fresh engine gets its own,
    and an observation prepared by the old one (for the old engine) is prepared again and served."""
    from cosmos3_runtime.engine import Cosmos3Engine
    from robot_clients.protocol import ErrorCode

    release, held, engines = threading.Event(), threading.Event(), []

    def load():
        engine = Cosmos3Engine.load(tiny_checkpoint("distilled"))
        if not engines:  # the first engine hangs in its first forward

            def hang(*_):
                held.set()
                release.wait(60)

            engine.pipe.transformer.register_forward_pre_hook(hang)
        engines.append(engine)
        return engine

    owner, queue = _Collector(), RequestQueue()
    worker = EngineWorker(
        load, queue, asyncio.get_running_loop(), warmup=False, batching=BatchPolicy(max_batch=2, overlap_host_prep=True)
    )
    waiting = _observation("robot", 2, owner, _image(7))
    try:
        worker.start()
        await worker.wait_ready()
        queue.put(_observation("stuck", 1, owner, _image(6)))
        await _until(held.is_set)
        queue.put(waiting)
        first_prep = worker.host_prep
        await _until(lambda: first_prep.holds(waiting))
        worker.abandon_hung_call(1.0)
        assert owner.results[1].error.code == ErrorCode.ENGINE_TIMEOUT
        assert worker.host_prep is not first_prep and not first_prep.holds(waiting)  # stopped, inputs dropped
        await _until(lambda: 2 in owner.results, timeout=120)
    finally:
        release.set()
        queue.close()
        await asyncio.get_running_loop().run_in_executor(None, worker.stop, 30)
    assert owner.results[2].error is None and len(engines) == 2
    expected = engines[1].predict_actions(waiting.request).actions
    assert np.abs(owner.results[2].chunk.actions - expected).max() <= 2e-5


def _overlapping_worker(checkpoint, queue: RequestQueue, name: str) -> EngineWorker:
    """A worker on the tiny checkpoint, one observation a call, preparing the next on its prep thread."""
    from cosmos3_runtime.engine import Cosmos3Engine

    return EngineWorker(
        lambda: Cosmos3Engine.load(checkpoint),
        queue,
        asyncio.get_running_loop(),
        warmup=False,
        batching=BatchPolicy(max_batch=1, overlap_host_prep=True),
        name=name,
    )


async def test_a_stopped_worker_leaves_no_prep_thread_behind(tiny_checkpoint):
    """As in the server, the worker owns the engine and the prep thread holds it too. Once the worker has
    stopped, the prep thread has exited: the engine's tensors are never freed by a daemon thread while the
    interpreter shuts down (that aborts the process: "terminate called without an active exception")."""
    owner, queue = _Collector(), RequestQueue()
    worker = _overlapping_worker(tiny_checkpoint("distilled"), queue, "stopping-worker")
    worker.start()
    await worker.wait_ready()
    assert worker.host_prep is not None
    for seq in (1, 2):
        queue.put(_observation(f"robot-{seq}", seq, owner, _image(seq)))
    await _until(lambda: sorted(owner.results) == [1, 2])
    queue.close()
    assert await asyncio.to_thread(worker.stop, 60)
    assert [t.name for t in threading.enumerate() if t.name.startswith("stopping-worker")] == []


async def test_a_worker_whose_prep_thread_cannot_start_still_becomes_ready_and_serves(tiny_checkpoint, monkeypatch):
    """A process at its thread limit cannot start the prep thread (``RuntimeError: can't start new thread``).
    The worker says it is ready all the same and prepares each observation inline: a robot is served more
    slowly, never not at all, and nobody waits forever on ``wait_ready``."""
    from policy_server.engine import worker as worker_module

    def no_thread(self) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(worker_module.HostPrep, "start", no_thread)
    owner, queue = _Collector(), RequestQueue()
    worker = _overlapping_worker(tiny_checkpoint("distilled"), queue, "threadless-worker")
    worker.start()
    await asyncio.wait_for(worker.wait_ready(), 120)
    assert worker.host_prep is None
    for seq in (1, 2):
        queue.put(_observation(f"robot-{seq}", seq, owner, _image(seq)))
    await _until(lambda: sorted(owner.results) == [1, 2])
    queue.close()
    assert await asyncio.to_thread(worker.stop, 60)
