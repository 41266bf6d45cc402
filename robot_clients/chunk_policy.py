"""Where action chunks come from: the one call an :class:`~robot_clients.action_chunker.ActionChunker` makes.

A chunk policy turns an observation (plus, for real-time chunking, the actions the robot will still
execute while it thinks) into a chunk of actions, H × D float32, in the robot's raw units. It is called
from the chunker's inference thread, never from the control loop, so it may block for as long as
inference takes.

:class:`RemoteChunkPolicy` asks the Cosmos3 policy server over the native realtime protocol. Anything
else with the same method (a local model, a recorded trajectory, a test double with a known latency)
can stand in for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # the chunker imports this module and must not load websockets with it
    from .policy_client import PolicyClient

# Observation fields the native protocol carries; anything else the environment reports (joint
# state, wrist cameras the model does not use, ...) stays on the robot.
NATIVE_OBSERVATION_FIELDS = ("image", "video", "prompt", "seed", "deadline_ms")


@runtime_checkable
class ChunkPolicy(Protocol):
    """Anything that answers an observation with a chunk of actions."""

    def infer_chunk(self, observation: Mapping[str, Any], prefix_actions: np.ndarray | None) -> np.ndarray:
        """Return an H × D float32 chunk whose action ``i`` is meant for ``i`` steps after ``observation``.

        ``prefix_actions`` (K × D, K < H), when given, are the actions the robot executes in the first K
        steps regardless of the answer; a policy that supports real-time chunking returns a chunk that
        starts with exactly them. Raise to report that no chunk will come for this observation.
        """
        ...

    # Optional: a policy may also have a ``session_state`` attribute (``"running"``, ``"paused"``,
    # ``"stopped"``); the chunker holds the robot whenever it is not ``"running"``.


class RemoteChunkPolicy:
    """Chunks from the policy server over ``/v1/actions/realtime``, through a blocking :class:`PolicyClient`.

    The client must be connected and configured (domain, horizon, prompt) by the caller; this class only
    sends observations. ``timeout`` bounds one round trip: a chunk that takes longer is no use to a
    robot that has already run out of actions, so the observation is cancelled and the chunker asks
    again with a fresh one.
    """

    def __init__(
        self, client: PolicyClient, *, timeout: float = 5.0, fields: tuple[str, ...] = NATIVE_OBSERVATION_FIELDS
    ) -> None:
        self.client = client
        self.timeout = timeout
        self.fields = fields

    def infer_chunk(self, observation: Mapping[str, Any], prefix_actions: np.ndarray | None) -> np.ndarray:
        frame = {key: observation[key] for key in self.fields if observation.get(key) is not None}
        if prefix_actions is not None and len(prefix_actions):
            frame["prefix_actions"] = np.ascontiguousarray(prefix_actions, dtype=np.float32)
        return self.client.infer(frame, timeout=self.timeout).actions

    @property
    def session_state(self) -> str:
        """What an operator set on the server: the chunker holds the robot unless ``"running"``."""
        return self.client.session_state
