"""Inputs for the chunker and control-loop tests: a policy with a known latency and a counting robot.

``SimulatedLatencyPolicy`` is the input of those tests, not the thing under test: it answers after a
fixed delay with a chunk whose action ``i`` encodes the step it is meant for (``obs["step"] + i``), plus a
per-chunk offset when asked, so a test can read off the executed actions whether each was the right one
for its tick and where a chunk switch jumped. It honours ``prefix_actions`` the way the server does for
real-time chunking (the chunk starts with them), unless told not to.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from robot_clients.control_loop import Environment


class Dropped(Exception):
    """Stands for robot_clients.client.ObservationDropped: the chunker only looks at ``reason``."""

    def __init__(self, reason: str = "superseded") -> None:
        super().__init__(reason)
        self.reason = reason


class SimulatedLatencyPolicy:
    def __init__(
        self,
        latency_s: float,
        horizon: int = 16,
        dim: int = 3,
        *,
        chunk_offsets: bool = False,
        honour_prefix: bool = True,
        fail_every: int = 0,
        seed: int = 0,
    ) -> None:
        self.latency_s = latency_s
        self.horizon = horizon
        self.dim = dim
        self.chunk_offsets = chunk_offsets
        self.honour_prefix = honour_prefix
        self.fail_every = fail_every
        self.rng = np.random.default_rng(seed)
        self.calls = 0
        self.prefixes: list[np.ndarray | None] = []
        self.lock = threading.Lock()

    def infer_chunk(self, observation, prefix_actions):
        with self.lock:
            self.calls += 1
            call = self.calls
            self.prefixes.append(None if prefix_actions is None else np.array(prefix_actions))
            offset = float(self.rng.uniform(-5.0, 5.0)) if self.chunk_offsets else 0.0
        time.sleep(self.latency_s)
        if self.fail_every and call > 1 and call % self.fail_every == 0:
            raise Dropped("superseded")
        steps = observation["step"] + np.arange(self.horizon, dtype=np.float32) + offset
        chunk = np.repeat(steps[:, None], self.dim, axis=1).astype(np.float32)
        if self.honour_prefix and prefix_actions is not None:
            chunk[: len(prefix_actions)] = prefix_actions
        return chunk


class CountingEnvironment(Environment):
    """A robot whose observation is its tick count and which remembers every action applied."""

    def __init__(self, episode_steps: int = 0) -> None:
        self.episode_steps = episode_steps
        self.step = 0
        self.applied: list[np.ndarray] = []
        self.resets = 0

    def reset(self) -> None:
        self.step = 0
        self.applied = []
        self.resets += 1

    def is_episode_complete(self) -> bool:
        return bool(self.episode_steps) and self.step >= self.episode_steps

    def get_observation(self) -> dict:
        return {"step": self.step}

    def apply_action(self, action: dict) -> None:
        self.applied.append(np.asarray(action["actions"]))
        self.step += 1
