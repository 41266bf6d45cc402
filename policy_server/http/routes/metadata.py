"""What the server offers and how it is: ``GET /v1/actions/metadata``, ``/healthz``, ``/readyz``, ``/metrics``.

The metadata body is built by one function, :func:`http_metadata`, from the typed model description and
the limits this server enforces; the route only calls it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...context import ServerContext
from ...metadata import engine_state, health, http_action_metadata, public_model_name, served_weights
from ...metrics import PROMETHEUS_CONTENT_TYPE
from ...sglang.actions import merge_metadata
from ...sglang.lockstep_session import sglang_keys
from ...sidecar_settings import SidecarSettings
from ...videos.encoding import MP4_MEDIA_TYPE
from .. import codecs as http_codecs
from ..parts import SidecarParts
from ..schemas import ActionMetadata, ErrorResponse, Health, Readiness, ServedWeightsInfo


def http_metadata(host: ServerContext[Any], settings: SidecarSettings, max_buffered_body_bytes: int) -> ActionMetadata:
    """The ``/v1/actions/metadata`` body: the model's description (the one builder in
    :mod:`policy_server.metadata`, shared with the WebSocket hello and openpi's metadata), with this
    sidecar's own limits and capabilities (``settings``) and SGLang's keys (``docs/sglang.md``) merged in."""
    return ActionMetadata(
        **merge_metadata(
            http_action_metadata(
                host,
                dict(
                    max_body_bytes=settings.max_body_bytes,
                    max_decoded_bytes=settings.max_decoded_bytes,
                    max_json_values=settings.max_json_values,
                    max_buffered_body_bytes=max_buffered_body_bytes,
                    http_header_timeout_s=settings.connections.header_timeout_s,
                    http_body_timeout_s=settings.connections.body_timeout_s,
                    http_max_connections_per_peer=settings.connections.max_connections_per_peer,
                    max_queued_video_jobs=settings.retention.max_queued,
                    max_action_generations_in_flight=settings.max_actions_in_flight,
                ),
                dict(
                    request_formats=[http_codecs.JSON_TYPE, http_codecs.MSGPACK_TYPE, http_codecs.MULTIPART_TYPE],
                    response_formats=[http_codecs.JSON_TYPE, http_codecs.MSGPACK_TYPE],
                    video_container=MP4_MEDIA_TYPE,
                    video_retention={
                        "max_age_s": settings.retention.max_age_s,
                        "max_bytes": settings.retention.max_bytes,
                    },
                ),
            ),
            sglang_keys(host),
        )
    )


def router(parts: SidecarParts) -> APIRouter:
    """The metadata route and the operations routes (health, readiness, Prometheus metrics)."""
    routes = APIRouter()
    host = parts.host

    @routes.get(
        "/v1/actions/metadata",
        response_model=ActionMetadata,
        tags=["actions"],
        summary="What the loaded checkpoint offers",
        responses={503: {"model": ErrorResponse}},
    )
    async def action_metadata() -> ActionMetadata:
        parts.require_ready()
        return http_metadata(host, parts.settings, parts.body_budget.limit)

    @routes.get(
        "/healthz",
        response_model=Health,
        tags=["operations"],
        summary="Alive (answers while loading)",
        responses={503: {"model": Health, "description": "the engine failed to load"}},
    )
    async def healthz(request: Request) -> Any:
        tokens = host.settings.auth_tokens
        authorized = tokens is not None and tokens.check(request.headers.getlist, request.url.query).ok
        status, body = health(host, liveness=True, authorized=authorized)
        return JSONResponse(body, status_code=status)

    @routes.get(
        "/readyz",
        response_model=Readiness,
        tags=["operations"],
        summary="Model loaded and warmed up",
        responses={503: {"model": Readiness, "description": "not ready (yet)"}},
    )
    async def readyz() -> Any:
        ready = host.ready and not host.stopping
        status = "ready" if ready else engine_state(host)
        if status == "ready" and not ready:
            status = "warming_up"
        described = host.description
        weights = served_weights(described)
        body = Readiness(
            ready=ready,
            status=status,
            model=public_model_name(described.model) if described is not None else None,
            variant=described.variant if described is not None else None,
            weights=ServedWeightsInfo(**weights) if weights is not None else None,
        )
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

    @routes.get(
        "/metrics",
        tags=["operations"],
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {PROMETHEUS_CONTENT_TYPE: {}}}},
    )
    async def prometheus_metrics() -> Response:
        return Response(await asyncio.to_thread(parts.metrics.render), media_type=PROMETHEUS_CONTENT_TYPE)

    return routes
