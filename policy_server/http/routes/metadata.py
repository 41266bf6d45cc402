"""What the server offers and how it is: ``GET /v1/actions/metadata``, ``/healthz``, ``/readyz``, ``/metrics``.

The metadata body is built by one function, :func:`http_metadata`, from the typed model description and
the limits this server enforces; the route only calls it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from ...engine.description import ModelDescription
from ...metrics import PROMETHEUS_CONTENT_TYPE
from ...videos.encoding import MP4_MEDIA_TYPE
from .. import codecs as http_codecs
from ..context import SidecarParts
from ..host import SidecarHost
from ..schemas import ActionMetadata, ErrorResponse, Health, Readiness
from ..settings import SidecarSettings


def http_metadata(d: ModelDescription, host: SidecarHost, settings: SidecarSettings,
                  max_buffered_body_bytes: int) -> ActionMetadata:
    """The ``/v1/actions/metadata`` body: the model's description, the endpoints serving each mode, and
    every limit and capability of this server (``settings``: the sidecar's; ``host.settings``: the
    WebSocket port's)."""
    robots = host.settings
    limits = dict(d.raw.get("limits", {}))
    limits.update(max_body_bytes=settings.max_body_bytes,
                  max_decoded_bytes=settings.max_decoded_bytes,
                  max_json_values=settings.max_json_values,
                  max_buffered_body_bytes=max_buffered_body_bytes,
                  http_header_timeout_s=settings.connections.header_timeout_s,
                  http_body_timeout_s=settings.connections.body_timeout_s,
                  http_max_connections_per_peer=settings.connections.max_connections_per_peer,
                  max_websocket_message_bytes=robots.max_message_bytes,
                  max_queued_video_jobs=settings.retention.max_queued,
                  max_action_generations_in_flight=settings.max_actions_in_flight)
    action_modes, video_modes = list(d.action_modes), list(d.video_modes)
    endpoints = {mode: "POST /v1/actions/generations" for mode in action_modes}
    endpoints.update({mode: "POST /v1/videos" for mode in video_modes})
    scheme = "wss" if robots.ssl_context is not None else "ws"
    endpoints["realtime"] = f"{scheme}://<host>:{host.port}/v1/actions/realtime"
    return ActionMetadata(
        model=d.model, variant=d.variant, is_distilled=d.is_distilled, is_edge=d.is_edge,
        modes=list(d.modes), action_modes=action_modes, video_modes=video_modes, endpoints=endpoints,
        domains={name: dict(domain.raw) for name, domain in d.domains.items()},
        action_horizon=d.raw.get("action_horizon", {}), resolution_tiers=list(d.resolution_tiers),
        view_points=list(d.view_points), defaults=d.raw.get("defaults", {}),
        distilled_sigmas=d.raw.get("distilled_sigmas"), limits=limits,
        capabilities={
            "realtime_websocket": True,
            "openpi_websocket": robots.openpi is not None,
            "action_generations": bool(action_modes),
            "video_jobs": bool(video_modes),
            "prefix_actions": "policy" in action_modes,
            "batching": robots.max_batch > 1,
            "request_formats": [http_codecs.JSON_TYPE, http_codecs.MSGPACK_TYPE, http_codecs.MULTIPART_TYPE],
            "response_formats": [http_codecs.JSON_TYPE, http_codecs.MSGPACK_TYPE],
            "video_container": MP4_MEDIA_TYPE,
            "video_retention": {"max_age_s": settings.retention.max_age_s,
                                "max_bytes": settings.retention.max_bytes},
        },
        device=d.device, dtype=d.dtype,
        topology=host.worker.topology() if host.worker is not None else {},
    )


def _engine_state(host: SidecarHost) -> str:
    """``stopping``, the engine worker's state (``loading``, ``ready``, ``failed``, ...), or ``starting``."""
    if host.stopping:
        return "stopping"
    return host.worker.state.value if host.worker is not None else "starting"


def router(parts: SidecarParts) -> APIRouter:
    """The metadata route and the operations routes (health, readiness, Prometheus metrics)."""
    routes = APIRouter()
    host = parts.host

    @routes.get("/v1/actions/metadata", response_model=ActionMetadata, tags=["actions"],
                summary="What the loaded checkpoint offers", responses={503: {"model": ErrorResponse}})
    async def action_metadata() -> ActionMetadata:
        return http_metadata(parts.require_ready(), host, parts.settings, parts.body_budget.limit)

    @routes.get("/healthz", response_model=Health, tags=["operations"], summary="Alive (answers while loading)",
                responses={503: {"model": Health, "description": "the engine failed to load"}})
    async def healthz() -> Any:
        engine = _engine_state(host)
        body = Health(status="ok" if engine != "failed" else "failed", engine=engine,
                      uptime_s=round(time.monotonic() - host.started_at, 3))
        return JSONResponse(body.model_dump(), status_code=200 if engine != "failed" else 503)

    @routes.get("/readyz", response_model=Readiness, tags=["operations"], summary="Model loaded and warmed up",
                responses={503: {"model": Readiness, "description": "not ready (yet)"}})
    async def readyz() -> Any:
        ready = host.ready and not host.stopping
        status = "ready" if ready else _engine_state(host)
        if status == "ready" and not ready:
            status = "warming_up"
        described = host.description
        body = Readiness(ready=ready, status=status, model=described.model if described is not None else None,
                         variant=described.variant if described is not None else None)
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

    @routes.get("/metrics", tags=["operations"], summary="Prometheus metrics",
                response_class=Response, responses={200: {"content": {PROMETHEUS_CONTENT_TYPE: {}}}})
    async def prometheus_metrics() -> Response:
        return Response(await asyncio.to_thread(parts.metrics.render), media_type=PROMETHEUS_CONTENT_TYPE)

    return routes
