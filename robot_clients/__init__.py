"""Light clients of the Cosmos3 policy server. Depends only on numpy, msgpack and websockets.

- :class:`PolicyClient`: blocking, for control loops.
- :class:`AsyncPolicyClient`: asyncio.
- :mod:`robot_clients.wire_codec`: the msgpack + numpy frame codec shared with the server;
  :mod:`robot_clients.protocol` and :mod:`robot_clients.client_frames`: the protocol's names, codes and
  frames, shared with the server too.

The clients are imported when first named (``robot_clients.PolicyClient``), not when the package is: a
module that needs only the codec or the protocol (the server, a chunker running a local policy) never
loads websockets. :mod:`robot_clients.client_state` is the clients' protocol state without I/O.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public names, and the module each is defined in: the clients (I/O) in robot_clients.client, what their
# calls return and raise in robot_clients.client_state (the protocol state without I/O).
_CLIENTS = ("AsyncPolicyClient", "PolicyClient")
__all__ = [
    "ActionChunk",
    "AsyncPolicyClient",
    "ClientStats",
    "ConnectionLost",
    "MalformedServerFrame",
    "ObservationDropped",
    "PolicyClient",
    "PolicyClientError",
    "ServerError",
    "SessionPaused",
    "SessionStopped",
]

if TYPE_CHECKING:
    from .client import AsyncPolicyClient, PolicyClient
    from .client_state import (
        ActionChunk,
        ClientStats,
        ConnectionLost,
        MalformedServerFrame,
        ObservationDropped,
        PolicyClientError,
        ServerError,
        SessionPaused,
        SessionStopped,
    )


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = ".client" if name in _CLIENTS else ".client_state"  # what a call returns or raises
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
