"""The lock-step baseline of ``cosmos3-eval``: a robot that waits for each chunk, as openpi's clients do.

openpi's ``WebsocketClientPolicy.infer`` blocks until the server answers, and its ``ActionChunkBroker`` then
hands out the chunk's actions from the first, ``execute_horizon`` of them, before it asks again. On a real
robot the world does not wait: while the client blocks, the arm holds its last command and the scene goes
on. :func:`run_lockstep_episode` runs exactly that against a simulated task: it asks, blocks, steps the
simulator through the ticks that passed while it waited (holding the last action), then executes the chunk's
first ``execute_horizon`` actions, one per tick. The first chunk of an episode is waited for with the world
still, as the chunker's first chunk is, so every mode starts from the same picture.

:class:`OpenpiLockstepClient` speaks openpi's protocol to the server's ``/openpi`` route (one msgpack map
each way, the server's metadata first); a local chunk policy (the scripted expert) can stand in for it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import wire_codec
from ..control_loop import Environment

# The openpi observation keys of the LIBERO convention (openpi's examples/libero/main.py), which the server
# reads by default: one third-person camera and the robot's state.
IMAGE_KEY = "observation/image"
STATE_KEY = "observation/state"


class OpenpiLockstepClient:
    """A blocking openpi-protocol client: connect, read the metadata, then one observation per answer."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        from websockets.sync.client import connect

        self._ws = connect(
            url.rstrip("/") + "/openpi", compression=None, max_size=None, proxy=None, open_timeout=timeout
        )
        self.timeout = timeout
        hello = self._ws.recv(timeout)
        if isinstance(hello, str):
            raise RuntimeError(f"the server refused the connection: {hello}")
        self.metadata = wire_codec.unpackb(hello)

    def infer(self, observation: Mapping[str, Any]) -> np.ndarray:
        """The chunk the server answers ``observation`` with (its ``image`` and ``state``)."""
        frame = {IMAGE_KEY: observation["image"], STATE_KEY: np.asarray(observation["state"], np.float32)}
        self._ws.send(wire_codec.packb(frame))
        reply = self._ws.recv(self.timeout)
        if isinstance(reply, str):  # openpi's servers answer an error as a text frame
            raise RuntimeError(f"the server refused the observation: {reply}")
        answer = wire_codec.unpackb(reply)
        return np.asarray(answer["actions"], dtype=np.float32)

    def close(self) -> None:
        self._ws.close()


@dataclass(frozen=True)
class LockstepReport:
    """One lock-step episode: chunk round trips (seconds, the injected delay included) and held ticks."""

    chunks: int
    latencies_s: list[float]
    held_steps: int


def run_lockstep_episode(
    env: Environment,
    infer: Callable[[Mapping[str, Any]], np.ndarray],
    *,
    execute_horizon: int,
    control_hz: float,
    delay_s: float = 0.0,
) -> LockstepReport:
    """One episode of ``env`` driven by blocking calls to ``infer`` (see the module docstring). ``delay_s``
    is added to every answer, as ``cosmos3-eval`` injects delay into the chunker's modes."""
    period = 1.0 / control_hz
    env.reset()
    latencies: list[float] = []
    held = 0
    last: np.ndarray | None = None
    while not env.is_episode_complete():
        observation = env.get_observation()
        started = time.monotonic()
        chunk = infer(observation)
        if delay_s:
            time.sleep(delay_s)
        waited = time.monotonic() - started
        latencies.append(waited)
        if last is not None:  # the world went on while the client waited: the arm held its last command
            for _ in range(math.ceil(waited / period)):
                if env.is_episode_complete():
                    break
                env.apply_action({"actions": last})
                held += 1
        for action in chunk[:execute_horizon]:
            if env.is_episode_complete():
                break
            env.apply_action({"actions": action})
            last = action
    return LockstepReport(len(latencies), latencies, held)
