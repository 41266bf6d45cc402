"""WebSocket dialects on ``/v1/actions/realtime``, chosen by a connection's first frame.

Other clients than ours speak on the robots' path: SGLang's lock-step clients (a first frame without
``type``, ``policy_server.sglang.lockstep_session``). Whoever assembles the server (``policy_server.cli``)
hands it the dialects it serves; the core names none of them. A client that must not be greeted with the
native ``metadata`` frame (one that speaks first and reads only its own frames) gets a path of its own
instead (:class:`policy_server.routes.SessionEndpoint`).

The contract of a :class:`Dialect`:

* On connect the native session sends its ``metadata`` frame, as native clients expect before they send
  anything; each dialect may add its own keys to it first (:meth:`Dialect.hello`), since its clients read
  the same frame.
* The connection's first frame is offered to each dialect in turn, before the native protocol parses it
  (:meth:`Dialect.claims` with a :class:`FirstFrame`: the raw message and what the wire codec made of it,
  or None when it is not a msgpack value the codec reads). The first dialect that claims it wins; no
  claim: the native protocol serves the connection. ``claims`` must be cheap, pure and never raise: it
  only inspects the frame.
* A claimed connection is handed over: the native session stops reading, lets what it queued (the
  metadata) leave, and leaves the registry; :meth:`Dialect.session` then makes the session that serves
  the connection from that first frame on (it must handle the first frame itself, for instance in its
  ``opened``), under the same session id (the metadata already told the client). The server registers
  and runs it like any other session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from websockets.asyncio.server import ServerConnection

from ..context import ServerContext
from .base import Session


@dataclass(frozen=True)
class FirstFrame:
    """A connection's first frame: as received, and decoded by the wire codec (None: it could not be)."""

    message: bytes | str
    decoded: Any
    received_at: float  # time.monotonic()


class Dialect(Protocol):
    """A protocol served on the robots' path beside the native one (see the module docstring)."""

    name: str  # for the logs: "sglang", "vla-eval"

    def hello(self, context: ServerContext[Session], metadata: dict[str, Any]) -> dict[str, Any]:
        """The native ``metadata`` frame with this dialect's keys added (or unchanged)."""
        ...

    def claims(self, first: FirstFrame) -> bool:
        """Whether ``first`` is this dialect's; pure, cheap, never raises."""
        ...

    def session(
        self,
        connection: ServerConnection,
        context: ServerContext[Session],
        session_id: str,
        first: FirstFrame,
        hello_sent_at: float,
    ) -> Session:
        """The session serving the handed-over connection, starting with ``first``."""
        ...
