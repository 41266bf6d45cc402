"""ControlLoop: fixed-rate episodes with Environment / Agent / Subscriber, and what it reports."""

from __future__ import annotations

import time

import numpy as np
from chunk_fixtures import CountingEnvironment, SimulatedLatencyPolicy

from robot_clients.chunker import ActionChunker, ChunkerConfig
from robot_clients.control_loop import Agent, ChunkingAgent, ControlLoop, Subscriber


class RecordingSubscriber(Subscriber):
    def __init__(self) -> None:
        self.events: list[str] = []
        self.steps: list[tuple[int, float]] = []

    def on_episode_start(self) -> None:
        self.events.append("start")

    def on_step(self, observation: dict, action: dict) -> None:
        self.steps.append((observation["step"], float(action["actions"][0])))

    def on_episode_end(self) -> None:
        self.events.append("end")


def test_chunked_episode_runs_at_the_control_rate_and_reports_chunks():
    env = CountingEnvironment(episode_steps=60)
    subscriber = RecordingSubscriber()
    chunker = ActionChunker(
        SimulatedLatencyPolicy(latency_s=0.03, horizon=16), ChunkerConfig(strategy="rtc", control_hz=40.0)
    )
    with chunker:
        report = ControlLoop(env, ChunkingAgent(chunker), [subscriber], control_hz=40.0).run_episode()

    assert report.steps == 60 and len(env.applied) == 60 and len(report.records) == 59
    assert subscriber.events == ["start", "end"]
    # Every tick executed the action meant for it, and the subscriber saw the same pairs.
    assert [step for step, _ in subscriber.steps] == list(range(60))
    assert all(step == value for step, value in subscriber.steps)
    # The loop holds its rate (the sleeps are on an absolute clock; bounds are generous for shared CPUs).
    assert 30.0 <= report.achieved_hz <= 41.0
    assert report.duration_s >= 58 / 40.0
    assert report.startup_s >= 0.03  # the first tick waited for the first chunk
    chunks = report.chunker
    assert chunks is not None and chunks["stalls"] == 0 and chunks["chunks"] >= 4
    assert chunks["chunk_latency_p50_ms"] >= 30.0 and chunks["chunk_latency_p99_ms"] >= chunks["chunk_latency_p50_ms"]
    summary = report.summary()
    assert summary["achieved_hz"] == report.achieved_hz and summary["stalls"] == 0


def test_episode_limits_and_reset_between_episodes():
    env = CountingEnvironment()
    chunker = ActionChunker(
        SimulatedLatencyPolicy(latency_s=0.01, horizon=8), ChunkerConfig(strategy="replace", control_hz=50.0)
    )
    loop = ControlLoop(env, ChunkingAgent(chunker), control_hz=50.0, max_episode_steps=25)
    with chunker:
        reports = loop.run(num_episodes=2)
    assert [r.steps for r in reports] == [25, 25]
    assert env.resets == 3  # before each episode, and once at the end (a real robot goes home)
    # Stats are per episode: the chunker's counters started afresh for the second one.
    assert reports[1].chunker["steps"] == 25

    timed = ControlLoop(
        CountingEnvironment(),
        ChunkingAgent(ActionChunker(SimulatedLatencyPolicy(latency_s=0.01, horizon=8), ChunkerConfig(control_hz=50.0))),
        control_hz=50.0,
        max_episode_s=0.3,
    )
    report = timed.run_episode()
    timed.agent.chunker.close()
    assert 10 <= report.steps <= 17


def test_a_slow_step_is_counted_and_does_not_cause_a_burst():
    class SlowEveryTenth(Agent):
        def __init__(self) -> None:
            self.calls = 0

        def get_action(self, observation: dict) -> dict:
            self.calls += 1
            if self.calls % 10 == 0:
                time.sleep(0.08)  # four periods at 50 Hz
            return {"actions": np.zeros(2, dtype=np.float32)}

        def reset(self) -> None:
            self.calls = 0

    report = ControlLoop(CountingEnvironment(episode_steps=40), SlowEveryTenth(), control_hz=50.0).run_episode()
    assert report.overruns == 4 and report.missed_ticks >= 8
    assert report.step_ms_max >= 80.0
    # After a slow tick the next one starts on the schedule, not immediately several times in a row.
    gaps = np.diff([r.started_s for r in report.records])
    assert np.sum(gaps < 0.01) <= 2
