"""What a feature adds to the WebSocket port (:class:`EdgeEndpoints`): a path served by sessions of its own
protocol, and plain-HTTP answers.

Most protocols of other projects share the robots' path as first-frame dialects
(:class:`.native.Dialect`). One whose client must not be sent the native ``metadata`` frame first
(vla-eval's harness: its client speaks first and reads only its own frames) needs a path of its own: a
:class:`SessionEndpoint`. A feature may also answer plain-HTTP ``GET`` requests on the port (vla-eval's
``/health`` and ``/config``, where its tooling looks for them): an :class:`HttpEndpoint`. Whoever assembles
the server hands these to it (``policy_server.assembly.cli.assemble_server``: vla-eval's), and the routing table
(:mod:`policy_server.assembly.websocket_routes`) sends their paths here. The server keeps its own checks in front of
them: an HTTP endpoint marked ``open`` is answered before any check, like ``/healthz``; every other one
after the Origin check and the bearer token; a session endpoint is a robot session like the native one
(``--max-sessions``, opened once the model is ready).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from websockets.asyncio.server import ServerConnection

from ..context import ServerContext
from .base import Session

# A connection accepted on a session endpoint's path, made into the session that serves it.
SessionFactory = Callable[[ServerConnection, ServerContext[Session]], Session]
# (the server's context, the request's query string) -> (HTTP status, JSON body).
HttpAnswer = Callable[[ServerContext[Session], str], tuple[int, dict[str, Any]]]


@dataclass(frozen=True)
class SessionEndpoint:
    """A WebSocket path served by sessions of a feature's own protocol."""

    path: str
    session: SessionFactory


@dataclass(frozen=True)
class HttpEndpoint:
    """A plain-HTTP ``GET`` answered on the WebSocket port with a JSON body."""

    path: str
    answer: HttpAnswer
    open: bool = False  # answered before the Origin check and the bearer token (a readiness probe)


@dataclass(frozen=True)
class EdgeEndpoints:
    """The features' paths on the WebSocket port, by path."""

    sessions: Mapping[str, SessionEndpoint] = field(default_factory=lambda: MappingProxyType({}))
    http: Mapping[str, HttpEndpoint] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, *endpoints: SessionEndpoint | HttpEndpoint) -> EdgeEndpoints:
        """The table of ``endpoints``; a path given twice is a :class:`ValueError`."""
        paths = [endpoint.path for endpoint in endpoints]
        twice = sorted({path for path in paths if paths.count(path) > 1})
        if twice:
            raise ValueError(f"more than one endpoint at {', '.join(twice)}")
        return cls(
            MappingProxyType({e.path: e for e in endpoints if isinstance(e, SessionEndpoint)}),
            MappingProxyType({e.path: e for e in endpoints if isinstance(e, HttpEndpoint)}),
        )

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(self.sessions) | frozenset(self.http)


NO_ENDPOINTS = EdgeEndpoints()
