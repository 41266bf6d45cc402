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
a feature's path       what the server was assembled with (``EdgeEndpoints``): a session
                       of the feature's protocol, or a plain-HTTP answer (``cosmos3-serve`` adds
                       vla-eval's ``/v1/vla-eval``, ``/health`` and ``/config``, unless ``--no-vla-eval``)
=====================  ============================================================================

Anything else is answered 404. The bearer token, the Origin check and the connection caps are the
server's (``PolicyServer._process_request``); which kind of connection a path opens is decided here only.

**A feature's paths** (:mod:`policy_server.sessions.endpoints`: a session path, plain-HTTP answers) are handed
to the server by whoever assembles it; the core names none of them. An endpoint cannot take a path the server
serves itself (:func:`check_endpoints`).
"""

from __future__ import annotations

import enum

from robot_clients.protocol import HEALTH_PATH, REALTIME_PATH

from ..dashboard_files import DASHBOARD_PATH, OBSERVE_PATH
from ..sessions.endpoints import NO_ENDPOINTS, EdgeEndpoints
from ..sessions.openpi import OPENPI_PATHS


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
