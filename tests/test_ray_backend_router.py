"""The replica router on its own (no Ray): pinning to the least-loaded replica, failover, video spread.

These are the rules the Ray backend relies on; they run in milliseconds, so they are checked here in
detail and the Ray tests only check that the real thing follows them.
"""

from __future__ import annotations

import time

import pytest

from policy_server.engine.request_queue import PendingObservation, QueueClosed
from policy_server.ray.backend import NoReplicaAvailable, ReplicaRouter


class Task:
    """A background task stand-in (the router only stores it)."""

    owner = None

    def run(self, engine, between_steps=lambda: None):
        return None


def obs(session: str, seq: int) -> PendingObservation:
    return PendingObservation(session_id=session, seq=seq, request=None, owner=None, received_at=time.monotonic())


def test_new_sessions_go_to_the_least_loaded_replica_and_stay_there():
    open_sessions = {"a", "b", "c"}
    router = ReplicaRouter(2, lambda: open_sessions)
    for session in ("a", "b", "c"):
        router.put(obs(session, 0))
    assert [router.replica_of(s) for s in ("a", "b", "c")] == [0, 1, 0]
    assert router.sessions_per_replica() == [2, 1]
    router.put(obs("b", 1))  # latest wins, on its own replica
    assert len(router.queue_of(1)) == 1 and router.replica_of("b") == 1
    open_sessions.discard("a")  # closed sessions stop counting
    router.put(obs("d", 0))
    open_sessions.add("d")
    assert router.replica_of("d") == 0


def test_lost_replica_moves_its_sessions_and_hands_back_its_work():
    router = ReplicaRouter(3)
    for session in ("a", "b", "c", "d"):
        router.put(obs(session, 0))
    router.put_background(Task())
    failover = router.replica_lost(0)
    assert set(failover.moved) == {"a", "d"}
    assert all(target in (1, 2) for target in failover.moved.values())
    assert {o.session_id for o in failover.observations} == {"a", "d"}
    assert len(failover.background) == 1
    assert router.replica_lost(0).moved == {}  # idempotent
    for item in failover.observations:
        assert router.requeue(item) is None
    assert router.replica_of("a") in (1, 2)
    assert len(router) == 4


def test_requeue_never_replaces_a_newer_observation():
    router = ReplicaRouter(2)
    router.put(obs("a", 0))
    stale = obs("a", 5)
    router.replica_lost(0)
    router.put(obs("a", 6))  # the robot's next observation arrived before the re-queue
    assert router.requeue(stale) is stale
    assert router.queue_of(1).take(timeout=0).seq == 6


def test_video_jobs_spread_over_live_replicas():
    router = ReplicaRouter(2)
    for _ in range(4):
        router.put_background(Task())
    assert [router.queue_of(i).background_waiting for i in (0, 1)] == [2, 2]
    router.replica_lost(1)
    router.put_background(Task())
    assert router.queue_of(0).background_waiting == 3


def test_no_live_replica_refuses_then_a_replaced_one_serves():
    router = ReplicaRouter(1)
    router.put(obs("a", 0))
    router.replica_lost(0)
    with pytest.raises(NoReplicaAvailable):
        router.put(obs("a", 1))
    queue = router.replica_back(0)
    router.put(obs("a", 2))
    assert queue.take(timeout=0).seq == 2
    router.close()
    with pytest.raises(QueueClosed):
        router.put(obs("a", 3))
