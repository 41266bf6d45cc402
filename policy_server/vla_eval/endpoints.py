"""What vla-eval adds to the server's WebSocket port: its harness's path and its HTTP control plane.

vla-eval's client speaks first on its connection and reads only vla-eval frames, so it cannot share the
robots' path as a first-frame dialect (the native session greets every connection there with its
``metadata`` frame): its sessions get ``/v1/vla-eval`` (:class:`~.session.VlaEvalSession`). ``/health``
(open, like ``/healthz``: vla-eval's readiness probe) and ``/config`` are answered on the same port,
also under ``/v1/vla-eval/`` (:mod:`.control`). ``policy_server.cli.assemble_server`` hands these to the
server (:mod:`policy_server.endpoints`) unless ``--no-vla-eval``.
"""

from __future__ import annotations

from typing import Any

from websockets.asyncio.server import ServerConnection

from ..context import ServerContext
from ..endpoints import EdgeEndpoints, HttpEndpoint, SessionEndpoint
from ..sessions.base import Session
from .control import CONFIG_PATHS, HEALTH_PATHS, config_answer, health_answer
from .session import VlaEvalSession
from .settings import VLA_EVAL_PATH, VlaEvalSettings


def vla_eval_endpoints(settings: VlaEvalSettings) -> EdgeEndpoints:
    """vla-eval's session path and HTTP answers, served with ``settings``."""

    def session(connection: ServerConnection, context: ServerContext[Session]) -> Session:
        return VlaEvalSession(connection, context, settings)

    def config(context: ServerContext[Session], query: str) -> tuple[int, dict[str, Any]]:
        return config_answer(context, settings, query)

    def health(context: ServerContext[Session], query: str) -> tuple[int, dict[str, Any]]:
        return health_answer(context)

    return EdgeEndpoints.of(
        SessionEndpoint(VLA_EVAL_PATH, session),
        *(HttpEndpoint(path, health, open=True) for path in HEALTH_PATHS),
        *(HttpEndpoint(path, config) for path in CONFIG_PATHS),
    )
