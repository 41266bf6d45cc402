"""Every path of the WebSocket port and what serves it: the server's one routing table.

=====================  ============================================================================
path                   served by
=====================  ============================================================================
``/healthz``           plain HTTP: the health body (:func:`policy_server.metadata.health`)
``/dashboard/...``     plain HTTP: the teleop dashboard's static files (:mod:`policy_server.dashboard_files`)
``/v1/observe``        an observer (:class:`~policy_server.sessions.observer.ObserverSession`)
``/v1/actions/realtime``  a native session (:class:`~policy_server.sessions.native.NativeSession`), or
                       one of the dialects its first frame chooses (:class:`policy_server.sessions.native.Dialect`)
``/``, ``/openpi``     an openpi session (:class:`~policy_server.sessions.openpi.OpenpiSession`), unless
                       the server runs with ``--no-openpi``
a feature's path       what the server was assembled with (:class:`EdgeEndpoints`, below): a session
                       of the feature's protocol, or a plain-HTTP answer (``cosmos3-serve`` adds
                       vla-eval's ``/v1/vla-eval``, ``/health`` and ``/config``, unless ``--no-vla-eval``)
=====================  ============================================================================

Anything else is answered 404. The bearer token, the Origin check and the connection caps are the
server's (``PolicyServer._process_request``); which kind of connection a path opens is decided here only.

**A feature's paths** (:class:`EdgeEndpoints`, handed to the server by whoever assembles it; the core
names none of them). Most protocols of other projects share the robots' path as first-frame dialects
(:class:`.sessions.native.Dialect`). One whose client must not be sent the native ``metadata`` frame first
(vla-eval's harness: its client speaks first and reads only its own frames) needs a path of its own: a
:class:`SessionEndpoint`. A feature may also answer plain-HTTP ``GET`` requests on this port (vla-eval's
``/health`` and ``/config``, where its tooling looks for them): an :class:`HttpEndpoint`. The server keeps
its own checks in front of them: an HTTP endpoint marked ``open`` is answered before any check, like
``/healthz``; every other one after the Origin check and the bearer token; a session endpoint is a robot
session like the native one (``--max-sessions``, opened once the model is ready). An endpoint cannot take
a path the server serves itself (:func:`check_endpoints`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from websockets.asyncio.server import ServerConnection

from robot_clients.protocol import HEALTH_PATH, REALTIME_PATH

from .context import ServerContext
from .dashboard_files import DASHBOARD_PATH
from .sessions.base import Session
from .sessions.observer import OBSERVE_PATH
from .sessions.openpi import OPENPI_PATHS

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


class Route(enum.Enum):
    HEALTH = "health"
    DASHBOARD = "dashboard"
    OBSERVER = "observer"
    NATIVE = "native"
    OPENPI = "openpi"
    EDGE_SESSION = "edge_session"  # a feature's session endpoint
    EDGE_HTTP = "edge_http"  # a feature's plain-HTTP endpoint
    UNKNOWN = "unknown"

    @property
    def is_session(self) -> bool:
        """A robot session (native, openpi, a feature's): counted against ``--max-sessions``, opened once ready."""
        return self in (Route.NATIVE, Route.OPENPI, Route.EDGE_SESSION)


ROUTES: dict[str, Route] = {
    HEALTH_PATH: Route.HEALTH,
    OBSERVE_PATH: Route.OBSERVER,
    REALTIME_PATH: Route.NATIVE,
    **{path: Route.OPENPI for path in OPENPI_PATHS},
}


def path_of(target: str) -> str:
    """A request target's path (its query string cut off)."""
    return target.split("?", 1)[0]


def is_core_path(path: str) -> bool:
    """Whether the server serves ``path`` itself (no feature's endpoint may take it)."""
    return path in ROUTES or path == DASHBOARD_PATH or path.startswith(DASHBOARD_PATH + "/")


def check_endpoints(endpoints: EdgeEndpoints) -> None:
    """Refuse (:class:`ValueError`) a feature's endpoint at a path of the server's own."""
    taken = sorted(path for path in endpoints.paths if is_core_path(path))
    if taken:
        raise ValueError(f"{', '.join(taken)}: served by the server itself, not by a feature's endpoint")


def route(target: str, openpi: bool, endpoints: EdgeEndpoints = NO_ENDPOINTS) -> Route:
    """What serves the request target ``target`` (its query string ignored); ``openpi``: that endpoint is
    on; ``endpoints``: the features' paths."""
    path = path_of(target)
    if path == DASHBOARD_PATH or path.startswith(DASHBOARD_PATH + "/"):
        return Route.DASHBOARD
    found = ROUTES.get(path)
    if found is not None:
        return Route.UNKNOWN if found is Route.OPENPI and not openpi else found
    if path in endpoints.sessions:
        return Route.EDGE_SESSION
    if path in endpoints.http:
        return Route.EDGE_HTTP
    return Route.UNKNOWN
