"""How the robot side holds for an operator: the chunker and the control loop against a policy whose
``session_state`` the test sets (the real client's behaviour is in test_session_controls.py)."""

from __future__ import annotations

import threading
import time

import pytest
from chunk_fixtures import CountingEnvironment, SimulatedLatencyPolicy

from robot_clients.chunker import ActionChunker, ChunkerConfig, ChunkerError
from robot_clients.control_loop import ChunkingAgent, ControlLoop


class OperatedPolicy(SimulatedLatencyPolicy):
    """A policy with a session an operator can pause: ``session_state`` is what the chunker reads."""

    session_state = "running"


def test_held_ticks_repeat_the_last_action_and_ask_for_nothing():
    policy = OperatedPolicy(latency_s=0.0, horizon=8, dim=2)
    with ActionChunker(policy, ChunkerConfig(strategy="replace", control_hz=100)) as chunker:
        for step in range(5):
            last = chunker.next_action({"step": step})
        policy.session_state = "paused"
        calls = policy.calls
        time.sleep(0.05)  # let a request still in flight finish: its chunk must not be used
        held = [chunker.next_action({"step": step}) for step in range(5, 15)]
        assert all((action == last).all() for action in held)
        assert policy.calls <= calls + 1 and chunker.stats.held_steps == 10 and chunker.stats.holds == 1

        policy.session_state = "running"
        executed = {}
        for step in range(15, 40):
            executed[step] = chunker.next_action({"step": step})[0]
            time.sleep(0.005)
        # After the resume the robot follows a fresh chunk, aligned with the ticks (action == its step).
        assert executed[39] == 39.0
        assert chunker.stats.held_steps == 10


def test_paused_before_the_first_action_waits_for_the_resume():
    policy = OperatedPolicy(latency_s=0.0, horizon=8, dim=2)
    policy.session_state = "paused"
    threading.Timer(0.2, lambda: setattr(policy, "session_state", "running")).start()
    with ActionChunker(policy, ChunkerConfig(control_hz=50)) as chunker:
        started = time.monotonic()
        assert chunker.next_action({"step": 0})[0] == 0.0
        assert time.monotonic() - started >= 0.15 and policy.calls >= 1


def test_stopped_before_the_first_action_is_an_error():
    policy = OperatedPolicy(latency_s=0.0, horizon=8)
    policy.session_state = "stopped"
    with ActionChunker(policy, ChunkerConfig(control_hz=50)) as chunker, pytest.raises(ChunkerError, match="stopped"):
        chunker.next_action({"step": 0})


def test_the_control_loop_ends_the_episode_when_an_operator_stops_the_session():
    policy = OperatedPolicy(latency_s=0.0, horizon=8, dim=2)
    threading.Timer(0.3, lambda: setattr(policy, "session_state", "stopped")).start()
    with ActionChunker(policy, ChunkerConfig(control_hz=50)) as chunker:
        report = ControlLoop(
            CountingEnvironment(), ChunkingAgent(chunker), control_hz=50, max_episode_s=10
        ).run_episode()
    assert report.stopped_by_operator and report.duration_s < 5
    assert report.summary()["stopped_by_operator"] is True
