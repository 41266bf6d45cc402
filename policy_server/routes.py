"""Every path of the WebSocket port and what serves it: the server's one routing table.

=====================  ============================================================================
path                   served by
=====================  ============================================================================
``/healthz``           plain HTTP: the health body (:func:`policy_server.metadata.health`)
``/dashboard/...``     plain HTTP: the teleop dashboard's static files (:mod:`policy_server.dashboard_files`)
``/v1/observe``        an observer (:class:`~policy_server.sessions.observer.ObserverSession`)
``/v1/actions/realtime``  a native session (:class:`~policy_server.sessions.native.RealtimeSession`)
``/``, ``/openpi``     an openpi session (:class:`~policy_server.sessions.openpi.OpenpiSession`), unless
                       the server runs with ``--no-openpi``
=====================  ============================================================================

Anything else is answered 404. The bearer token, the Origin check and the connection caps are the
server's (``PolicyServer._process_request``); which kind of connection a path opens is decided here only.
"""

from __future__ import annotations

import enum

from robot_clients.protocol import HEALTH_PATH, REALTIME_PATH

from .dashboard_files import DASHBOARD_PATH
from .sessions.observer import OBSERVE_PATH
from .sessions.openpi import OPENPI_PATHS


class Route(enum.Enum):
    HEALTH = "health"
    DASHBOARD = "dashboard"
    OBSERVER = "observer"
    NATIVE = "native"
    OPENPI = "openpi"
    UNKNOWN = "unknown"

    @property
    def is_session(self) -> bool:
        """A robot session (native or openpi): counted against ``--max-sessions``, opened once ready."""
        return self in (Route.NATIVE, Route.OPENPI)


ROUTES: dict[str, Route] = {
    HEALTH_PATH: Route.HEALTH,
    OBSERVE_PATH: Route.OBSERVER,
    REALTIME_PATH: Route.NATIVE,
    **{path: Route.OPENPI for path in OPENPI_PATHS},
}


def route(target: str, openpi: bool) -> Route:
    """What serves the request target ``target`` (its query string ignored); ``openpi``: the openpi
    endpoint is on."""
    path = target.split("?", 1)[0]
    if path == DASHBOARD_PATH or path.startswith(DASHBOARD_PATH + "/"):
        return Route.DASHBOARD
    found = ROUTES.get(path, Route.UNKNOWN)
    return Route.UNKNOWN if found is Route.OPENPI and not openpi else found
