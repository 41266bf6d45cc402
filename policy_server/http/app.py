"""The sidecar's FastAPI application, built from plain parts: its settings, the host, the job store, the turns.

:func:`build_app` adds one router per resource (:mod:`.routes`), the teleop dashboard's files, one error
shape for every failure (:mod:`.middleware`) and the outer layers every request passes first: the Origin
check, then the bearer token, then body bounds and timing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from ..auth import FORBIDDEN_ORIGIN_CODE, UNAUTHORIZED_CODE, BearerAuthMiddleware, OriginCheckMiddleware
from ..dashboard_files import CONFIG_NAME, DASHBOARD_HEADERS, DASHBOARD_PATH, dashboard_asset, dashboard_config
from .context import SidecarParts
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
    mount_dashboard(app, lambda: host.port or 0)

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


def mount_dashboard(app: Any, observer_port: Callable[[], int]) -> None:
    """Serve the dashboard on a FastAPI ``app`` (the HTTP sidecar) at ``/dashboard/``.

    ``observer_port`` gives the WebSocket port (where ``/v1/observe`` is) at request time. The routes are
    left out of the OpenAPI schema: they are a web page, not part of the HTTP API.
    """
    from fastapi import HTTPException  # only the sidecar loads FastAPI
    from fastapi.responses import JSONResponse, RedirectResponse, Response

    @app.get(DASHBOARD_PATH, include_in_schema=False)
    async def dashboard_root() -> Response:
        # Relative asset URLs need the slash.
        return RedirectResponse(DASHBOARD_PATH + "/", status_code=301, headers=DASHBOARD_HEADERS)

    @app.get(DASHBOARD_PATH + "/{name}", include_in_schema=False)
    @app.get(DASHBOARD_PATH + "/", include_in_schema=False)
    async def dashboard_file(name: str = "") -> Response:
        if name == CONFIG_NAME:
            return JSONResponse(dashboard_config(observer_port()), headers=DASHBOARD_HEADERS)
        asset = dashboard_asset(name)
        if asset is None:
            raise HTTPException(status_code=404)  # the sidecar's handler answers in its usual error shape
        return Response(asset.body, media_type=asset.content_type, headers=DASHBOARD_HEADERS)
