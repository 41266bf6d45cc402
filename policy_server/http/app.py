"""The sidecar's FastAPI application, built from plain parts: its settings, the host, the job store, the turns.

:func:`build_app` adds one router per resource (:mod:`.routes`), the teleop dashboard's files, one error
shape for every failure (:mod:`.middleware`) and the outer layers every request passes first: the Origin
check, then the bearer token, then body bounds and timing.
"""

from __future__ import annotations

from fastapi import FastAPI

from ..auth import FORBIDDEN_ORIGIN_CODE, UNAUTHORIZED_CODE, BearerAuthMiddleware, OriginCheckMiddleware
from .context import SidecarParts
from .dashboard import mount_dashboard
from .middleware import UNMATCHED, SidecarMiddleware, install_error_handlers
from .routes import actions, metadata, recordings, videos


def build_app(parts: SidecarParts) -> FastAPI:
    """The FastAPI application serving ``parts`` (routes, error handlers, middleware)."""
    app = FastAPI(
        title="Cosmos3 policy server: HTTP sidecar",
        version="1",
        description="forward_dynamics video jobs, one-shot action generations, metadata, health and metrics. "
        "Realtime control uses the WebSocket on the other port (/v1/actions/realtime).",
    )
    metrics, host = parts.metrics, parts.host
    install_error_handlers(app, metrics)
    for resource in (videos, actions, metadata, recordings):
        app.include_router(resource.router(parts))

    # The teleop dashboard's static files; its live data comes from /v1/observe on the WebSocket port.
    mount_dashboard(app, lambda: host.port)

    app.add_middleware(SidecarMiddleware, metrics=metrics, max_body_bytes=parts.settings.max_body_bytes)
    tokens = host.settings.auth_tokens
    if tokens is not None:  # added last: the outermost layer, so nothing runs for a request without a token
        app.add_middleware(
            BearerAuthMiddleware,
            tokens=tokens,
            on_refused=lambda path: metrics.observe_http_error(UNMATCHED, UNAUTHORIZED_CODE),
        )
    # Outermost of all: a state-changing request from another site's page is refused before anything reads it.
    app.add_middleware(
        OriginCheckMiddleware,
        policy=host.origins,
        own_ports=host.own_ports,
        on_refused=lambda path: metrics.observe_http_error(UNMATCHED, FORBIDDEN_ORIGIN_CODE),
    )
    return app
