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
``/v1/vla-eval``       a vla-eval harness (:class:`~policy_server.vla_eval.session.VlaEvalSession`), unless
                       the server runs with ``--no-vla-eval``
``/health``            plain HTTP: vla-eval's readiness probe (:mod:`policy_server.vla_eval.control`)
``/config``            plain HTTP: vla-eval's configuration endpoint, read-only here (same module)
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
from .vla_eval.control import CONFIG_PATHS, HEALTH_PATHS
from .vla_eval.settings import VLA_EVAL_PATH


class Route(enum.Enum):
    HEALTH = "health"
    DASHBOARD = "dashboard"
    OBSERVER = "observer"
    NATIVE = "native"
    OPENPI = "openpi"
    VLA_EVAL = "vla_eval"
    VLA_EVAL_HEALTH = "vla_eval_health"
    VLA_EVAL_CONFIG = "vla_eval_config"
    UNKNOWN = "unknown"

    @property
    def is_session(self) -> bool:
        """A robot session (native, openpi, vla-eval): counted against ``--max-sessions``, opened once ready."""
        return self in (Route.NATIVE, Route.OPENPI, Route.VLA_EVAL)


ROUTES: dict[str, Route] = {
    HEALTH_PATH: Route.HEALTH,
    OBSERVE_PATH: Route.OBSERVER,
    REALTIME_PATH: Route.NATIVE,
    **{path: Route.OPENPI for path in OPENPI_PATHS},
    VLA_EVAL_PATH: Route.VLA_EVAL,
    **{path: Route.VLA_EVAL_HEALTH for path in HEALTH_PATHS},
    **{path: Route.VLA_EVAL_CONFIG for path in CONFIG_PATHS},
}
_VLA_EVAL_ROUTES = (Route.VLA_EVAL, Route.VLA_EVAL_HEALTH, Route.VLA_EVAL_CONFIG)


def route(target: str, openpi: bool, vla_eval: bool = True) -> Route:
    """What serves the request target ``target`` (its query string ignored); ``openpi``, ``vla_eval``: those
    endpoints are on."""
    path = target.split("?", 1)[0]
    if path == DASHBOARD_PATH or path.startswith(DASHBOARD_PATH + "/"):
        return Route.DASHBOARD
    found = ROUTES.get(path, Route.UNKNOWN)
    if found is Route.OPENPI and not openpi or found in _VLA_EVAL_ROUTES and not vla_eval:
        return Route.UNKNOWN
    return found
