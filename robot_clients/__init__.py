"""Light clients of the Cosmos3 policy server. Depends only on numpy, msgpack and websockets.

- :class:`PolicyClient`: blocking, for control loops.
- :class:`AsyncPolicyClient`: asyncio.
- :mod:`robot_clients.wire_codec`: the msgpack + numpy frame codec shared with the server.
"""

from .async_policy_client import AsyncPolicyClient, ClientStats
from .policy_client import PolicyClient
from .results import (
    ActionChunk, ConnectionLost, ObservationDropped, PolicyClientError, ServerError, SessionPaused, SessionStopped,
)

__all__ = [
    "ActionChunk",
    "AsyncPolicyClient",
    "ClientStats",
    "ConnectionLost",
    "ObservationDropped",
    "PolicyClient",
    "PolicyClientError",
    "ServerError",
    "SessionPaused",
    "SessionStopped",
]
