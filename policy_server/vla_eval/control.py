"""vla-eval's HTTP control plane on the WebSocket port: ``GET /health`` and ``GET /config``.

vla-eval's own model servers answer ``/health`` with ``200 {"status": "ok"}`` once they can serve (its
tooling uses it as the readiness probe), and ``/config`` with their configuration
(``{"applied": {}, "config": {...}}``; ``?key=value`` changes whitelisted settings there). Here
``/health`` is ``200 ok`` once the model is loaded and warm (``503 loading`` before, ``503 stopping``
while shutting down), and ``/config`` is read-only: a query is refused with ``422`` and its keys named,
as vla-eval's servers refuse keys they do not know. Both are also served under ``/v1/vla-eval/``.

This module computes the answers (status, JSON body); the server writes them (:mod:`.endpoints`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from robot_clients.protocol import ProtocolError

from ..context import ServerContext
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
