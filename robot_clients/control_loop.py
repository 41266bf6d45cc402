"""A control loop at a fixed rate, in the shape openpi users know: Environment, Agent, Subscriber.

openpi's ``openpi_client.runtime`` splits a robot program into an :class:`Environment` (the robot or
simulator: observations out, actions in), an :class:`Agent` (decides the action) and
:class:`Subscriber` s (recorders, visualizers). :class:`ControlLoop` is its runtime, with two changes a
real-time controller needs:

* ticks are scheduled on an absolute clock (``start + n * period``), so per-step jitter does not
  accumulate into a slower rate; a step that overruns its period does not cause a burst of catch-up
  steps: the schedule moves on and the missed ticks are counted;
* every episode returns an :class:`EpisodeReport`: the control rate achieved, per-step timing, and, for
  a :class:`ChunkingAgent`, chunk latency, boundary stalls and dropped observations.

An operator's pause (teleop dashboard) holds the robot inside the :class:`ChunkingAgent`'s chunker, tick
after tick at the same rate; an operator's stop ends the episode (``stopped_by_operator`` in the report).

The first step of an episode waits for the first chunk (model warm-up, connection); it is reported as
``startup_s`` and left out of the rate and step-time figures.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .chunker import ActionChunker, ChunkerSummary

logger = logging.getLogger(__name__)


class Environment(abc.ABC):
    """The robot (or simulator): observations out, actions in. Same contract as openpi's."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Put the environment in its initial state (called before every episode)."""

    @abc.abstractmethod
    def is_episode_complete(self) -> bool:
        """True when the episode is over (success, failure or the environment's own time limit)."""

    @abc.abstractmethod
    def get_observation(self) -> dict[str, Any]:
        """The current observation; fresh arrays every call (an agent may keep them while it thinks)."""

    @abc.abstractmethod
    def apply_action(self, action: dict[str, Any]) -> None:
        """Apply one action (``action["actions"]``: one row of a chunk) and advance one control period."""


class Agent(abc.ABC):
    """Decides the action for an observation. Same contract as openpi's."""

    @abc.abstractmethod
    def get_action(self, observation: dict[str, Any]) -> dict[str, Any]:
        """The action for this tick, as ``{"actions": np.ndarray}``."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget the episode (called before every episode)."""


class Subscriber(abc.ABC):
    """Watches the loop (recording, plotting). Same contract as openpi's; must be quick in ``on_step``."""

    @abc.abstractmethod
    def on_episode_start(self) -> None: ...

    @abc.abstractmethod
    def on_step(self, observation: dict[str, Any], action: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    def on_episode_end(self) -> None: ...


class ChunkingAgent(Agent):
    """An agent that executes chunks from a policy through an :class:`ActionChunker`."""

    def __init__(self, chunker: ActionChunker) -> None:
        self.chunker = chunker

    def get_action(self, observation: dict[str, Any]) -> dict[str, Any]:
        return {"actions": self.chunker.next_action(observation)}

    def reset(self) -> None:
        self.chunker.reset(clear_stats=True)


@dataclass
class StepRecord:
    """Timing of one tick, in seconds from the episode's start (``*_ms`` in milliseconds)."""

    step: int
    scheduled_s: float  # when the tick was due
    started_s: float  # when it started: scheduled_s plus scheduling jitter
    agent_ms: float  # inside agent.get_action
    step_ms: float  # the whole tick: observation, agent, apply_action, subscribers


@dataclass
class EpisodeReport:
    """What one episode achieved. ``chunker`` is the chunker's summary for a :class:`ChunkingAgent`."""

    steps: int
    duration_s: float
    target_hz: float
    achieved_hz: float
    startup_s: float
    step_ms_p50: float
    step_ms_p99: float
    step_ms_max: float
    jitter_ms_p99: float  # how late ticks started, p99
    overruns: int  # ticks that took longer than one period
    missed_ticks: int  # ticks skipped because a tick overran
    chunker: ChunkerSummary | None = None
    stopped_by_operator: bool = False  # an operator stopped the policy session (the robot held, then ended)
    records: list[StepRecord] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        values = {k: v for k, v in self.__dict__.items() if k not in ("records", "chunker")}
        values.update(self.chunker or {})
        return values


class ControlLoop:
    """Runs episodes of ``environment`` driven by ``agent`` at ``control_hz``.

    An episode ends when the environment says so, after ``max_episode_steps`` ticks, or after
    ``max_episode_s`` seconds (0 / None: no limit).
    """

    def __init__(
        self,
        environment: Environment,
        agent: Agent,
        subscribers: Sequence[Subscriber] = (),
        *,
        control_hz: float = 20.0,
        max_episode_steps: int = 0,
        max_episode_s: float | None = None,
    ) -> None:
        if not control_hz > 0:
            raise ValueError(f"control_hz must be > 0, got {control_hz}")
        self.environment = environment
        self.agent = agent
        self.subscribers = list(subscribers)
        self.control_hz = control_hz
        self.max_episode_steps = max_episode_steps
        self.max_episode_s = max_episode_s
        self._stop = False

    def stop(self) -> None:
        """End the current episode after the tick in progress (callable from another thread)."""
        self._stop = True

    def run(self, num_episodes: int = 1) -> list[EpisodeReport]:
        """Run ``num_episodes`` episodes, then reset the environment (a real robot goes home)."""
        reports = [self.run_episode() for _ in range(num_episodes)]
        self.environment.reset()
        return reports

    def run_episode(self) -> EpisodeReport:
        env, agent = self.environment, self.agent
        period = 1.0 / self.control_hz
        env.reset()
        agent.reset()
        for subscriber in self.subscribers:
            subscriber.on_episode_start()
        self._stop = False

        records: list[StepRecord] = []
        overruns = missed = 0
        episode_start = time.monotonic()
        startup_s = 0.0
        next_tick = episode_start
        step = 0
        while not self._stop:
            started = time.monotonic()
            observation = env.get_observation()
            agent_started = time.monotonic()
            action = agent.get_action(observation)
            agent_ms = (time.monotonic() - agent_started) * 1e3
            env.apply_action(action)
            for subscriber in self.subscribers:
                subscriber.on_step(observation, action)
            ended = time.monotonic()

            if step == 0:
                # The first tick waited for the first chunk: start the clock after it.
                startup_s = ended - episode_start
                next_tick = ended
            else:
                records.append(
                    StepRecord(
                        step, next_tick - episode_start, started - episode_start, agent_ms, (ended - started) * 1e3
                    )
                )
                if ended - started > period:
                    overruns += 1
            step += 1
            if env.is_episode_complete() or (self.max_episode_steps and step >= self.max_episode_steps):
                break
            if isinstance(agent, ChunkingAgent) and agent.chunker.session_state == "stopped":
                break  # an operator ended the session: no more chunks will come
            if self.max_episode_s and ended - episode_start - startup_s >= self.max_episode_s:
                break

            next_tick += period
            now = time.monotonic()
            if now > next_tick + period:
                # More than a whole period late: skip the missed ticks instead of bursting through them.
                skipped = int((now - next_tick) // period)
                missed += skipped
                next_tick += skipped * period
            if next_tick > now:
                time.sleep(next_tick - now)

        for subscriber in self.subscribers:
            subscriber.on_episode_end()
        report = self._report(records, step, startup_s, overruns, missed)
        if isinstance(agent, ChunkingAgent):
            report.stopped_by_operator = agent.chunker.session_state == "stopped"
        return report

    def _report(
        self, records: list[StepRecord], steps: int, startup_s: float, overruns: int, missed: int
    ) -> EpisodeReport:
        step_ms = np.array([r.step_ms for r in records]) if records else np.zeros(1)
        jitter_ms = np.array([(r.started_s - r.scheduled_s) * 1e3 for r in records]) if records else np.zeros(1)
        if len(records) >= 2:
            span = records[-1].started_s - records[0].started_s
            achieved = (len(records) - 1) / span if span > 0 else 0.0
            duration = span + 1.0 / self.control_hz
        else:
            achieved, duration = 0.0, 0.0
        chunker = None
        if isinstance(self.agent, ChunkingAgent):
            chunker = self.agent.chunker.stats.summary()
        return EpisodeReport(
            steps=steps,
            duration_s=duration,
            target_hz=self.control_hz,
            achieved_hz=achieved,
            startup_s=startup_s,
            step_ms_p50=float(np.percentile(step_ms, 50)),
            step_ms_p99=float(np.percentile(step_ms, 99)),
            step_ms_max=float(step_ms.max()),
            jitter_ms_p99=float(np.percentile(jitter_ms, 99)),
            overruns=overruns,
            missed_ticks=missed,
            chunker=chunker,
            records=records,
        )
