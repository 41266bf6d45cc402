"""What vla-eval adds to the server's WebSocket port: its harness's path and its HTTP control plane.

vla-eval's client speaks first on its connection and reads only vla-eval frames, so it cannot share the
robots' path as a first-frame dialect (the native session greets every connection there with its
``metadata`` frame): its sessions get ``/v1/vla-eval`` (:class:`~.session.VlaEvalSession`).
``policy_server.cli.assemble_server`` hands these to the server (:class:`policy_server.routes.EdgeEndpoints`) unless
``--no-vla-eval``.

The control plane: vla-eval's own model servers answer ``GET /health`` with ``200 {"status": "ok"}`` once
they can serve (its tooling uses it as the readiness probe), and ``GET /config`` with their configuration
(``{"applied": {}, "config": {...}}``; ``?key=value`` changes whitelisted settings there). Here
``/health`` (open, like ``/healthz``) is ``200 ok`` once the model is loaded and warm (``503 loading``
before, ``503 stopping`` while shutting down), and ``/config`` is read-only: a query is refused with
``422`` and its keys named, as vla-eval's servers refuse keys they do not know. Both are also served
under ``/v1/vla-eval/``. :func:`health_answer` and :func:`config_answer` compute the answers (status,
JSON body); the server writes them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from websockets.asyncio.server import ServerConnection

from robot_clients.protocol import ProtocolError

from ..context import ServerContext
from ..routes import EdgeEndpoints, HttpEndpoint, SessionEndpoint
from ..sessions.base import Session
from .session import VlaEvalSession
from .settings import VLA_EVAL_PATH, VlaEvalSettings

HEALTH_PATHS = ("/health", VLA_EVAL_PATH + "/health")
CONFIG_PATHS = ("/config", VLA_EVAL_PATH + "/config")


def health_answer(context: ServerContext[Any]) -> tuple[int, dict[str, Any]]:
    if context.stopping:
        return 503, {"status": "stopping"}
    if not context.ready:
        return 503, {"status": "loading"}
    return 200, {"status": "ok"}


def config_answer(context: ServerContext[Any], settings: VlaEvalSettings, query: str) -> tuple[int, dict[str, Any]]:
    """The endpoint's configuration; ``query`` (the request's query string) must be empty here."""
    keys = sorted(parse_qs(query, keep_blank_values=True))
    if keys:
        errors = [f"read-only: {key} (set it with the server's --vla-eval-* flags, or per episode)" for key in keys]
        return 422, {"errors": errors}
    current: dict[str, Any] = {
        "max_batch_size": context.settings.max_batch,
        "max_wait_time": context.settings.max_batch_wait_ms / 1e3,
        "chunk": settings.plan.chunk,
        "ask_ahead": settings.plan.ask_ahead,
        "execute": settings.plan.execute,
        "strict_state": settings.strict_state,
        "mapping": settings.mapping.describe(),
    }
    description = context.description
    if description is not None:
        try:
            config, _ = settings.episode(description, {})
            resolved = config.resolved(description)
            current.update({key: resolved[key] for key in ("domain_name", "action_horizon", "view_point", "state_dim")})
        except ProtocolError as error:
            current["error"] = error.text()
    return 200, {"applied": {}, "config": current}


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
