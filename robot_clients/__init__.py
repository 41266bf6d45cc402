"""Light clients of the Cosmos3 policy server. Depends only on numpy, msgpack and websockets.

- :class:`PolicyClient`: blocking, for control loops.
- :class:`AsyncPolicyClient`: asyncio.
- :mod:`robot_clients.wire_codec`: the msgpack + numpy frame codec shared with the server;
  :mod:`robot_clients.protocol` and :mod:`robot_clients.client_frames`: the protocol's names, codes and
  frames, shared with the server too.

The clients are imported when first named (``robot_clients.PolicyClient``), not when the package is: a
module that needs only the codec or the protocol (the server, a chunker running a local policy) never
loads websockets.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public names, all defined in robot_clients.client.
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

if TYPE_CHECKING:
    from .client import (
        ActionChunk,
        AsyncPolicyClient,
        ClientStats,
        ConnectionLost,
        ObservationDropped,
        PolicyClient,
        PolicyClientError,
        ServerError,
        SessionPaused,
        SessionStopped,
    )


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".client", __name__), name)
    globals()[name] = value
    return value
