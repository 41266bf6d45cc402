"""The HTTP sidecar: FastAPI on uvicorn, on its own port, in the WebSocket server's process and event loop.

Routes (``docs/http_api.md`` is the user-facing description; ``/openapi.json`` the schema):

* ``/v1/videos`` - ``forward_dynamics`` rollouts as persistent asynchronous jobs
  (:mod:`policy_server.videos.job_store`, run by :mod:`policy_server.videos.runner`);
* ``POST /v1/actions/generations`` - one chunk of actions per request, for clients without a WebSocket;
* ``GET /v1/actions/metadata`` - what the loaded checkpoint offers, from the engine's ``describe()``;
* ``/healthz`` (alive), ``/readyz`` (model loaded and warm), ``/metrics`` (Prometheus).

Both kinds of work enter the server's one request queue: action generations as observations (each
client's requests share one turn, like one robot's, with a bounded number in flight: :mod:`.turns`),
video jobs in the background lane that the engine worker serves while no observation waits, plus a
bounded share under robot load. The sidecar never runs model code on the event loop; request decoding,
SQLite and MP4 encoding run on helper threads (``asyncio.to_thread``).

:class:`HttpSidecar` owns the uvicorn server (started with our own bound socket, so port 0 works and no
signal handlers are installed: the CLI owns SIGINT/SIGTERM), the job store, the runner and the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Path as PathParam, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from robot_clients.protocol import DropReason, ErrorCode, FrameLimits
from robot_clients.wire_codec import packb

from ..auth import FORBIDDEN_ORIGIN_CODE, UNAUTHORIZED_CODE, BearerAuthMiddleware, OriginCheckMiddleware
from ..connection_limits import ACCEPT_BURST, PeerCounter, capped_to_descriptors
from ..engine.description import ModelDescription
from ..engine.request_queue import PendingObservation, QueueClosed
from ..metrics import PROMETHEUS_CONTENT_TYPE, ServerMetrics, ServerStateReaders
from ..sessions.config import settings_used
from ..videos.encoding import MP4_MEDIA_TYPE
from ..videos.job_store import VideoJobStore
from ..videos.jobs import JobNotFound, RetentionPolicy, StorageFull, VideoJob, VideoJobStatus
from ..videos.runner import VideoJobRunner
from . import codecs as http_codecs, requests as http_requests, turns as http_turns
from .codecs import Upload
from .connections import ConnectionLimits, guarded_protocol
from .dashboard import mount_dashboard
from .errors import ApiError, HttpErrorCode
from .schemas import (
    ActionArray,
    ActionGeneration,
    ActionGenerationItem,
    ActionGenerationParams,
    ActionMetadata,
    ActionUsage,
    ErrorDetail,
    ErrorResponse,
    Health,
    Readiness,
    VideoCreateParams,
    VideoDeleted,
    VideoJobList,
    VideoJobObject,
)

from ..metadata import health, http_action_metadata
from ..sessions.host import SessionHost

logger = logging.getLogger(__name__)

# A 65-frame 256x256 clip as JSON nested lists is ~40 MB; as msgpack or an MP4 upload far less. 64 MiB
# bounds what one request can make the server buffer.
DEFAULT_MAX_BODY_BYTES = 64 * 2**20
# Two of the largest bodies at once; robots' requests are kilobytes.
DEFAULT_MAX_BUFFERED_BODY_BYTES = 2 * DEFAULT_MAX_BODY_BYTES
DEFAULT_ACTION_TIMEOUT_S = 120.0
_UNMATCHED = "(unmatched)"
_ERROR_RESPONSES = {
    400: {"model": ErrorResponse, "description": "invalid request (see `error.code` and `error.field`)"},
    503: {"model": ErrorResponse, "description": "the model is loading or the server is stopping"},
}


@dataclass
class SidecarSettings:
    """Where the sidecar listens, where jobs live, and its limits."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8001
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    action_timeout_s: float = DEFAULT_ACTION_TIMEOUT_S
    # Action generations one client (token, or peer address without auth) may have in flight; more: 429.
    max_actions_in_flight: int = http_turns.DEFAULT_MAX_IN_FLIGHT
    # Pixels one request may decode to, and elements a JSON/msgpack body may hold (.codecs).
    max_decoded_bytes: int = http_codecs.DEFAULT_MAX_DECODED_BYTES
    max_json_values: int = http_codecs.DEFAULT_MAX_JSON_VALUES
    # Header and body deadlines, connection caps, TCP_NODELAY (.connections).
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # Body bytes all requests together may hold while they are read and parsed (BodyBudget).
    max_buffered_body_bytes: int = DEFAULT_MAX_BUFFERED_BODY_BYTES


class OneShotActionWaiter:
    """The owner of an action generation's observation: resolves a future instead of sending a frame."""

    request_kind = "action_generation"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future = loop.create_future()

    def on_result(self, item: PendingObservation, outcome: Any) -> None:
        if not self.future.done():
            self.future.set_result(outcome)

    def on_dropped(self, item: PendingObservation, reason: str) -> None:
        if not self.future.done():
            self.future.set_result(reason)


class SidecarMiddleware:
    """Pure ASGI: bounds request bodies, times every request for the metrics, and turns a bug of ours
    into a typed 500 (with a log reference) instead of a traceback."""

    def __init__(self, app: Callable, *, metrics: ServerMetrics, max_body_bytes: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        state = {"status": 500, "sent": False}
        limit = self.max_body_bytes

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                state["status"], state["sent"] = message["status"], True
            await send(message)

        received = 0

        async def receive_wrapper() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(HttpErrorCode.PAYLOAD_TOO_LARGE, f"the body is larger than {limit} bytes")
            return message

        try:
            declared = _content_length(scope)
            if declared is not None and declared > limit:
                error = ApiError(HttpErrorCode.PAYLOAD_TOO_LARGE,
                                 f"the body is {declared} bytes; this server accepts at most {limit}")
                self.metrics.observe_http_error(_endpoint(scope), error.code)
                await _error_response(error)(scope, receive, send_wrapper)
            else:
                await self.app(scope, receive_wrapper, send_wrapper)
        except ClientDisconnect:  # the client went away mid-body (or its body deadline closed it): nobody to answer
            state["status"] = 499
        except Exception:  # noqa: BLE001 - a bug of ours: log it, answer with a reference only
            reference = uuid.uuid4().hex[:12]
            logger.exception("HTTP %s %s failed (ref %s)", scope.get("method"), scope.get("path"), reference)
            if not state["sent"]:
                error = ApiError(HttpErrorCode.INTERNAL_ERROR,
                                 f"the server failed on this request; the log has details (ref {reference})")
                self.metrics.observe_http_error(_endpoint(scope), error.code)
                await _error_response(error)(scope, receive, send_wrapper)
        finally:
            self.metrics.observe_http(_endpoint(scope), scope.get("method", ""), state["status"],
                                      time.monotonic() - started)


def _content_length(scope: dict) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _endpoint(scope: dict) -> str:
    """The route template (``/v1/videos/{video_id}``), never the raw path: bounded label cardinality."""
    route = scope.get("route")
    return getattr(route, "path", None) or _UNMATCHED


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class HttpSidecar:
    """The sidecar of one :class:`~policy_server.server.PolicyServer`: start, then shut down after the worker."""

    def __init__(self, server: SessionHost, settings: SidecarSettings) -> None:
        self.server = server
        self.settings = settings
        self.store: VideoJobStore | None = None
        self.runner: VideoJobRunner | None = None
        self.metrics = ServerMetrics(ServerStateReaders(
            queue_depth=lambda: len(server.queue),
            background_depth=self._background_depth,
            sessions_open=lambda: len(server.sessions),
            dropped_observations=lambda: server.dropped_observations,
            engine_busy_seconds=self._engine_busy_seconds,
            video_jobs_by_status=lambda: self.store.count_by_status() if self.store else {},
            ready=lambda: server.ready,
            replicas=lambda: server.worker.topology().get("replicas", []) if server.worker is not None else [],
        ))
        self.actions_in_flight = http_turns.InFlightLimit(settings.max_actions_in_flight)
        self.app = build_app(self)
        self._uvicorn: Any = None
        self._socket: socket.socket | None = None
        self._main_loop: asyncio.Task | None = None
        self.connection_counter: PeerCounter | None = None
        self.body_budget = BodyBudget(max(settings.max_buffered_body_bytes, settings.max_body_bytes))

    def _background_depth(self) -> int:
        # Jobs waiting in SQLite plus the one handed to the worker but not started yet.
        queued = self.store.count_by_status().get(VideoJobStatus.QUEUED.value, 0) if self.store else 0
        return queued + self.server.queue.background_waiting

    def _engine_busy_seconds(self) -> float:
        worker = self.server.worker
        if worker is None:
            return 0.0
        since = worker.busy_since
        return worker.busy_s + (time.monotonic() - since if since is not None else 0.0)

    @property
    def port(self) -> int:
        assert self._socket is not None, "start() first"
        return self._socket.getsockname()[1]

    async def start(self, engine_ready: Awaitable[Any]) -> None:
        """Open the job store (re-queueing interrupted jobs), listen, and start the job runner."""
        import uvicorn

        self.store = await asyncio.to_thread(VideoJobStore, self.settings.data_dir, self.settings.retention)
        try:
            await asyncio.to_thread(self.store.recover)
            recover_pending = False
        except (sqlite3.Error, OSError) as exc:  # a full disk: serve anyway; the runner retries when it has room
            logger.warning("video jobs could not be recovered at start (%s); retrying once the disk has room", exc)
            recover_pending = True
        if self.server.worker is not None:
            self.server.worker.on_batch_done = self.metrics.observe_batch
        self.runner = VideoJobRunner(self.store, self.server.queue, self.metrics, recover_pending=recover_pending)
        self.runner.start(engine_ready)

        sock = socket.socket(socket.AF_INET6 if ":" in self.settings.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.settings.host, self.settings.port))
        sock.listen(ACCEPT_BURST)
        sock.setblocking(False)
        self._socket = sock
        config = uvicorn.Config(
            # log_config=None: uvicorn's records go through the process's handlers (and their filters,
            # policy_server.log_hygiene), not a handler of its own.
            self.app, lifespan="off", log_level="warning", log_config=None, access_log=False, server_header=False,
            timeout_graceful_shutdown=5, http=self._protocol_class(), backlog=ACCEPT_BURST,
        )
        config.load()
        tls = self.server.settings.ssl_context
        if tls is not None:  # https with the WebSocket port's certificate (uvicorn reads config.ssl at startup)
            config.ssl = tls
        self._uvicorn = uvicorn.Server(config)
        self._uvicorn.lifespan = config.lifespan_class(config)
        # startup()/main_loop() rather than serve(): serve() would install its own signal handlers.
        await self._uvicorn.startup(sockets=[sock])
        self._main_loop = asyncio.create_task(self._uvicorn.main_loop(), name="http-sidecar")
        logger.info("HTTP sidecar listening on %s://%s:%d (video jobs in %s)", "https" if tls is not None else "http",
                    self.settings.host, self.port, self.settings.data_dir)

    def _protocol_class(self) -> type:
        """uvicorn's HTTP protocol with this sidecar's deadlines and connection caps. The cap leaves room,
        within the process's file-descriptor limit, for the robots' port (sessions, pending handshakes)."""
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        limits, robots = self.settings.connections, self.server.settings
        reserved = {"sessions": robots.max_sessions,
                    "pending handshakes": getattr(robots, "max_pending_handshakes", 0),
                    "observers": getattr(robots, "max_observers", 0)}
        cap = capped_to_descriptors(limits.max_connections, sum(reserved.values()), "HTTP connections", **reserved)
        self.connection_counter = PeerCounter(cap, limits.max_connections_per_peer)
        return guarded_protocol(AutoHTTPProtocol, limits, self.connection_counter,
                                on_refused=lambda code: self.metrics.observe_http_error(_UNMATCHED, code))

    async def shutdown(self, grace_s: float = 30.0) -> None:
        """Record the video job in hand (the worker has finished it), then stop serving HTTP."""
        if self.runner is not None:
            await self.runner.stop(grace_s)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            if self._main_loop is not None:
                await self._main_loop
            await self._uvicorn.shutdown(sockets=[self._socket] if self._socket else None)
        if self.store is not None:
            await asyncio.to_thread(self.store.close)

    # -- helpers for the routes ----------------------------------------------------------------------

    def require_ready(self) -> ModelDescription:
        if self.server.stopping:
            raise ApiError(HttpErrorCode.SHUTTING_DOWN, "the server is shutting down")
        if not self.server.ready:
            raise ApiError(HttpErrorCode.NOT_READY, "the model is loading; retry shortly", headers={"Retry-After": "1"})
        return self.server.description

    def media_limits(self, description: ModelDescription) -> FrameLimits:
        """The model's pixel and frame bounds plus this sidecar's decoding budget."""
        return description.limits.frame_limits(self.settings.max_decoded_bytes)

    def job_object(self, job: VideoJob) -> VideoJobObject:
        params = job.params
        resolved = params.get("resolved", {})
        expires = self.store.expires_at(job) if self.store else None
        return VideoJobObject(
            id=job.id,
            status=job.status.value,
            progress=job.progress,
            created_at=int(job.created_at),
            started_at=int(job.started_at) if job.started_at else None,
            completed_at=int(job.completed_at) if job.completed_at else None,
            expires_at=int(expires) if expires else None,
            model=params.get("model"),
            prompt=params.get("prompt", ""),
            domain_name=params["domain_name"],
            action_shape=params["action_shape"],
            fps=params["fps"],
            seed=params["seed"],
            num_steps=resolved.get("num_steps"),
            guidance_scale=resolved.get("guidance_scale"),
            resolution_tier=resolved.get("resolution_tier"),
            size=f"{job.width}x{job.height}" if job.width else None,
            frames=job.result_frames or None,
            seconds=round(job.result_frames / params["fps"], 3) if job.result_frames else None,
            bytes=job.result_bytes or None,
            attempts=job.attempts,
            error=ErrorDetail(code=job.error_code, message=job.error_message or "", field=job.error_field)
            if job.error_code else None,
        )

    async def get_job(self, video_id: str) -> VideoJob:
        try:
            return await asyncio.to_thread(self.store.get, video_id)
        except JobNotFound:
            raise ApiError(HttpErrorCode.NOT_FOUND, f"no video job {video_id!r}", "video_id") from None


class BodyBudget:
    """Bytes of request bodies (and uploads) the sidecar holds at once, over all requests.

    Each request is bounded by ``--max-body-mib``; this bounds them together, so that uploads stalled
    mid-body (each held until its body deadline) cannot add up to gigabytes. A request whose next chunk
    would pass the budget is answered 503 ``server_busy`` and its bytes are let go at once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> None:
        if self.held + size > self.limit:
            raise ApiError(HttpErrorCode.SERVER_BUSY,
                           f"the server is holding {self.held / 2**20:.0f} MiB of other requests' bodies, its limit "
                           f"(--http-max-buffered-mib {self.limit / 2**20:.0f}); retry shortly",
                           headers={"Retry-After": "5"})
        self.held += size

    def give_back(self, size: int) -> None:
        self.held = max(0, self.held - size)


class _BodyReader:
    """Reads a request's body into one buffer that grows with what arrives (never pre-sized from
    ``Content-Length``: a stalled upload holds only what it sent), taking its bytes from ``budget`` and
    counting JSON element marks chunk by chunk (``json_limit``), so 60 MiB of nested lists is refused
    after its first few megabytes. Give the bytes back with :meth:`release` once the body is parsed."""

    def __init__(self, budget: BodyBudget, json_limit: int | None = None) -> None:
        self.budget = budget
        self.json_limit = json_limit
        self.held = 0
        self.marks = 0

    def take(self, size: int) -> None:
        self.budget.take(size)
        self.held += size

    async def read(self, request: Request) -> bytearray:
        declared = _content_length(request.scope)
        buffer = bytearray()
        async for chunk in request.stream():
            self.take(len(chunk))
            if self.json_limit is not None:
                self.marks += http_codecs.count_json_marks(chunk)
                if self.marks > self.json_limit:  # "more than" the limit: the rest of the body is not read
                    raise http_codecs.too_many_json_values(self.json_limit, "the body")
            buffer += chunk
        if declared is not None and len(buffer) != declared:
            raise ApiError(HttpErrorCode.BAD_BODY, f"the body ended after {len(buffer)} of {declared} bytes")
        return buffer

    def release(self) -> None:
        self.budget.give_back(self.held)
        self.held = 0


async def _read_fields(request: Request, file_fields: dict[str, tuple[str, ...]], max_values: int,
                       budget: BodyBudget) -> tuple[dict[str, Any], str]:
    """The request's fields, whatever its format; also returns the body's media type. ``max_values``
    bounds the elements a JSON/msgpack body (or a multipart JSON text field) may hold; ``budget`` the
    body bytes held by all requests together."""
    kind = http_codecs.media_type(request.headers.get("content-type"))
    if kind == http_codecs.JSON_TYPE or kind in http_codecs.MSGPACK_TYPES:
        reader = _BodyReader(budget, max_values if kind == http_codecs.JSON_TYPE else None)
        try:
            body = await reader.read(request)
            decode = http_codecs.decode_json_body if kind == http_codecs.JSON_TYPE else http_codecs.decode_msgpack_body
            return await asyncio.to_thread(decode, body, max_values), kind
        finally:
            reader.release()
    if kind == http_codecs.MULTIPART_TYPE:
        # Starlette spools file parts beyond 1 MiB to disk while it parses; the uploads' bytes are taken
        # from the budget when they are read back (the caller decodes them before this request ends).
        form = await request.form(max_files=http_codecs.MAX_MULTIPART_FILES, max_fields=http_codecs.MAX_MULTIPART_FIELDS,
                                  max_part_size=http_codecs.MAX_MULTIPART_TEXT_BYTES)
        reader = _BodyReader(budget)
        try:
            items: list[tuple[str, Any]] = []
            for name, value in form.multi_items():
                if isinstance(value, str):
                    items.append((name, value))
                else:  # an UploadFile: keep the bytes and the declared type, drop the client's file name
                    reader.take(value.size or 0)
                    items.append((name, Upload(await value.read(), value.content_type or "")))
        finally:
            await form.close()
            reader.release()
        return http_codecs.decode_multipart_fields(items, file_fields, max_values), kind
    raise ApiError(
        HttpErrorCode.UNSUPPORTED_MEDIA_TYPE,
        f"Content-Type {kind or '(none)'!r} is not accepted; send application/json, application/msgpack or "
        "multipart/form-data",
    )


def _body_schema(model: type, files: dict[str, str]) -> dict[str, Any]:
    """OpenAPI requestBody for an endpoint that takes JSON, msgpack and multipart with file uploads."""
    schema = model.model_json_schema()
    multipart = {
        "type": "object",
        "properties": {
            **{name: {"type": "string", "description": f"{prop.get('description', '')} (as text)"}
               for name, prop in schema["properties"].items()},
            **{name: {"type": "string", "format": "binary", "description": description}
               for name, description in files.items()},
        },
        "required": schema.get("required", []),
    }
    return {
        "requestBody": {
            "required": True,
            "content": {
                http_codecs.JSON_TYPE: {"schema": schema},
                http_codecs.MSGPACK_TYPE: {"schema": schema},
                http_codecs.MULTIPART_TYPE: {"schema": multipart},
            },
        }
    }


def build_app(sidecar: HttpSidecar) -> FastAPI:
    """The FastAPI application of ``sidecar`` (routes, error handlers, middleware)."""
    app = FastAPI(
        title="Cosmos3 policy server: HTTP sidecar",
        version="1",
        description="forward_dynamics video jobs, one-shot action generations, metadata, health and metrics. "
                    "Realtime control uses the WebSocket on the other port (/v1/actions/realtime).",
    )
    metrics = sidecar.metrics

    # -- errors: one JSON shape for all of them ----------------------------------------------------------

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        metrics.observe_http_error(_endpoint(request.scope), exc.code)
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(part) for part in first.get("loc", ()) if part not in ("query", "path", "body")]
        field_name = ".".join(loc) or None
        return await api_error(request, ApiError(ErrorCode.INVALID_FIELD,
                                                 f"`{field_name}`: {first.get('msg', 'invalid value')}", field_name))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {
            404: HttpErrorCode.NOT_FOUND,
            405: HttpErrorCode.METHOD_NOT_ALLOWED,
            413: HttpErrorCode.PAYLOAD_TOO_LARGE,
        }.get(exc.status_code, HttpErrorCode.BAD_BODY)
        message = {
            HttpErrorCode.NOT_FOUND: f"no endpoint at {request.url.path}; see /docs or /openapi.json",
            HttpErrorCode.METHOD_NOT_ALLOWED: f"{request.method} is not allowed on {request.url.path}",
        }.get(code, str(exc.detail))
        return await api_error(request, ApiError(code, message, status=exc.status_code, headers=exc.headers))

    # -- videos ------------------------------------------------------------------------------------------

    @app.post(
        "/v1/videos", response_model=VideoJobObject, status_code=200, tags=["videos"],
        summary="Submit a forward_dynamics rollout (asynchronous job)",
        responses={**_ERROR_RESPONSES, 429: {"model": ErrorResponse, "description": "too many queued jobs"}},
        openapi_extra=_body_schema(VideoCreateParams, {"input_reference": "first frame: PNG, JPEG or WebP"}),
    )
    async def create_video(request: Request) -> VideoJobObject:
        description = sidecar.require_ready()
        fields, _ = await _read_fields(request, {"input_reference": http_codecs.IMAGE_UPLOAD_TYPES},
                                       sidecar.settings.max_json_values, sidecar.body_budget)
        submission = await asyncio.to_thread(http_requests.video_submission, fields, description,
                                             sidecar.media_limits(description))
        store = sidecar.store
        if await asyncio.to_thread(store.queued_count) >= store.retention.max_queued:
            raise ApiError(HttpErrorCode.QUEUE_FULL,
                           f"{store.retention.max_queued} video jobs are already queued; retry later",
                           headers={"Retry-After": "10"})
        try:
            job = await asyncio.to_thread(store.create, submission.params, submission.inputs)
        except StorageFull as exc:  # store.create removed its half-written files; nothing was recorded
            message = exc.message if exc.cap else (
                "the server's disk for video jobs is full; the job was not stored. Retry after finished jobs "
                "expire or are deleted")
            raise ApiError(HttpErrorCode.STORAGE_FULL, message, headers={"Retry-After": "60"}) from None
        sidecar.runner.notify()
        return sidecar.job_object(job)

    @app.get("/v1/videos", response_model=VideoJobList, tags=["videos"], summary="List video jobs")
    async def list_videos(
        limit: int = Query(20, ge=1, le=100, description="how many jobs to return"),
        after: str | None = Query(None, description="continue after this job id (from `last_id`)"),
        order: str = Query("desc", pattern="^(asc|desc)$", description="by creation time"),
    ) -> VideoJobList:
        try:
            jobs = await asyncio.to_thread(sidecar.store.list, limit=limit + 1, after=after,
                                           newest_first=order == "desc")
        except JobNotFound:
            raise ApiError(ErrorCode.INVALID_FIELD, f"`after`: no video job {after!r}", "after") from None
        page = jobs[:limit]
        return VideoJobList(
            data=[sidecar.job_object(job) for job in page],
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
            has_more=len(jobs) > limit,
        )

    video_id_param = PathParam(description="the job's id, as returned by POST /v1/videos")

    @app.get("/v1/videos/{video_id}", response_model=VideoJobObject, tags=["videos"], summary="One video job",
             responses={404: {"model": ErrorResponse}})
    async def get_video(video_id: str = video_id_param) -> VideoJobObject:
        return sidecar.job_object(await sidecar.get_job(video_id))

    @app.get(
        "/v1/videos/{video_id}/content", tags=["videos"], summary="The finished video (MP4, H.264)",
        response_class=FileResponse,
        responses={200: {"content": {MP4_MEDIA_TYPE: {}}, "description": "the MP4"},
                   404: {"model": ErrorResponse}, 409: {"model": ErrorResponse, "description": "not completed"}},
    )
    async def video_content(video_id: str = video_id_param) -> FileResponse:
        job = await sidecar.get_job(video_id)
        if job.status is VideoJobStatus.FAILED:
            raise ApiError(HttpErrorCode.VIDEO_FAILED,
                           f"video job {video_id} failed ({job.error_code}): {job.error_message}", "video_id")
        path = sidecar.store.video_path(video_id)
        if job.status is not VideoJobStatus.COMPLETED or not path.is_file():
            raise ApiError(HttpErrorCode.VIDEO_NOT_READY,
                           f"video job {video_id} is {job.status.value} ({job.progress}%); poll GET /v1/videos/{video_id}",
                           "video_id", headers={"Retry-After": "2"})
        return FileResponse(path, media_type=MP4_MEDIA_TYPE, filename=f"{video_id}.mp4")

    @app.delete("/v1/videos/{video_id}", response_model=VideoDeleted, tags=["videos"],
                summary="Delete a job and its files (a running job's result is discarded)",
                responses={404: {"model": ErrorResponse}})
    async def delete_video(video_id: str = video_id_param) -> VideoDeleted:
        try:
            deleted = await asyncio.to_thread(sidecar.store.delete, video_id)
        except JobNotFound:
            deleted = False
        if not deleted:
            raise ApiError(HttpErrorCode.NOT_FOUND, f"no video job {video_id!r}", "video_id")
        return VideoDeleted(id=video_id)

    # -- actions -----------------------------------------------------------------------------------------

    @app.post(
        "/v1/actions/generations", response_model=ActionGeneration, tags=["actions"],
        summary="One chunk of actions for one observation (policy or inverse_dynamics)",
        responses={**_ERROR_RESPONSES, 200: {"content": {http_codecs.MSGPACK_TYPE: {}},
                                             "description": "JSON, or msgpack when Accept asks for it"},
                   429: {"model": ErrorResponse, "description": "this client has too many requests in flight"}},
        openapi_extra=_body_schema(ActionGenerationParams, {"image": "PNG, JPEG or WebP", "video": "MP4/WebM clip"}),
    )
    async def generate_actions(request: Request) -> Any:
        client = http_turns.client_identity(request.scope)
        with sidecar.actions_in_flight.admit(client):  # before the body is read: a refusal costs nothing
            return await _generate_actions(request, client)

    async def _generate_actions(request: Request, client: str) -> Any:
        received = time.monotonic()
        description = sidecar.require_ready()
        fields, kind = await _read_fields(
            request, {"image": http_codecs.IMAGE_UPLOAD_TYPES, "video": http_codecs.VIDEO_UPLOAD_TYPES},
            sidecar.settings.max_json_values, sidecar.body_budget)
        as_msgpack = http_codecs.wants_msgpack(request.headers.get("accept"), kind)
        action_request = await asyncio.to_thread(http_requests.action_request, fields, description,
                                                 sidecar.media_limits(description))
        waiter = OneShotActionWaiter(asyncio.get_running_loop())
        item = PendingObservation(
            session_id=f"http-{uuid.uuid4().hex[:12]}", seq=0, request=action_request, owner=waiter,
            received_at=received, decode_ms=(time.monotonic() - received) * 1e3, turn=client,
        )
        try:
            sidecar.server.queue.put(item)
        except QueueClosed:
            raise ApiError(HttpErrorCode.SHUTTING_DOWN, "the server is shutting down") from None
        try:
            outcome = await asyncio.wait_for(asyncio.shield(waiter.future), sidecar.settings.action_timeout_s)
        except asyncio.TimeoutError:
            sidecar.server.queue.cancel(item.session_id)
            item.cancelled = True
            raise ApiError(HttpErrorCode.TIMEOUT,
                           f"no engine slot within {sidecar.settings.action_timeout_s:.0f} s; retry later") from None
        if isinstance(outcome, str):  # dropped
            code = HttpErrorCode.SHUTTING_DOWN if outcome == DropReason.SHUTDOWN else HttpErrorCode.TIMEOUT
            raise ApiError(code, f"the request was dropped ({outcome})")
        if outcome.chunk is None:
            raise ApiError.of(outcome.error)
        chunk = outcome.chunk
        generation = ActionGeneration(
            id=f"actgen_{uuid.uuid4().hex}",
            created=int(time.time()),
            model=description.model,
            data=[ActionGenerationItem(index=0, action=ActionArray(
                shape=list(chunk.actions.shape),
                values=http_requests.actions_payload(chunk.actions, as_msgpack),
                action_mode=chunk.action_mode,
                domain_name=chunk.domain_name,
                domain_id=chunk.domain_id,
                raw_action_dim=chunk.raw_action_dim,
                **settings_used(action_request, description),
            ))],
            usage=ActionUsage(
                num_steps=chunk.num_steps,
                seed=chunk.seed,
                batch_size=chunk.batch_size,
                queue_ms=item.queue_ms,
                model_ms=outcome.engine_ms,
                total_ms=(time.monotonic() - received) * 1e3,
            ),
        )
        if as_msgpack:
            body = generation.model_dump()
            body["data"][0]["action"]["values"] = generation.data[0].action.values  # keep the ndarray
            return Response(packb(body), media_type=http_codecs.MSGPACK_TYPE)
        return generation

    @app.get("/v1/actions/metadata", response_model=ActionMetadata, tags=["actions"],
             summary="What the loaded checkpoint offers", responses={503: {"model": ErrorResponse}})
    async def action_metadata() -> ActionMetadata:
        sidecar.require_ready()
        return ActionMetadata(**http_action_metadata(sidecar.server, dict(
            max_body_bytes=sidecar.settings.max_body_bytes,
            max_decoded_bytes=sidecar.settings.max_decoded_bytes,
            max_json_values=sidecar.settings.max_json_values,
            max_buffered_body_bytes=sidecar.body_budget.limit,
            http_header_timeout_s=sidecar.settings.connections.header_timeout_s,
            http_body_timeout_s=sidecar.settings.connections.body_timeout_s,
            http_max_connections_per_peer=sidecar.settings.connections.max_connections_per_peer,
            max_queued_video_jobs=sidecar.settings.retention.max_queued,
            max_action_generations_in_flight=sidecar.settings.max_actions_in_flight,
        ), dict(
            request_formats=[http_codecs.JSON_TYPE, http_codecs.MSGPACK_TYPE, http_codecs.MULTIPART_TYPE],
            response_formats=[http_codecs.JSON_TYPE, http_codecs.MSGPACK_TYPE],
            video_container=MP4_MEDIA_TYPE,
            video_retention={"max_age_s": sidecar.settings.retention.max_age_s,
                             "max_bytes": sidecar.settings.retention.max_bytes},
        )))

    # -- operations --------------------------------------------------------------------------------------

    @app.get("/healthz", response_model=Health, tags=["operations"], summary="Alive (answers while loading)",
             responses={503: {"model": Health, "description": "the engine failed to load"}})
    async def healthz() -> Any:
        status, body = health(sidecar.server, liveness=True)
        return JSONResponse(body, status_code=status)

    @app.get("/readyz", response_model=Readiness, tags=["operations"], summary="Model loaded and warmed up",
             responses={503: {"model": Readiness, "description": "not ready (yet)"}})
    async def readyz() -> Any:
        server = sidecar.server
        ready = server.ready and not server.stopping
        worker = server.worker
        status = "ready" if ready else ("stopping" if server.stopping else (worker.state.value if worker else "starting"))
        if status == "ready" and not ready:
            status = "warming_up"
        described = server.description
        body = Readiness(ready=ready, status=status, model=described.model if described is not None else None,
                         variant=described.variant if described is not None else None)
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

    @app.get("/metrics", tags=["operations"], summary="Prometheus metrics",
             response_class=Response, responses={200: {"content": {PROMETHEUS_CONTENT_TYPE: {}}}})
    async def prometheus_metrics() -> Response:
        return Response(await asyncio.to_thread(metrics.render), media_type=PROMETHEUS_CONTENT_TYPE)

    # The teleop dashboard's static files; its live data comes from /v1/observe on the WebSocket port.
    mount_dashboard(app, lambda: sidecar.server.port)

    app.add_middleware(SidecarMiddleware, metrics=metrics, max_body_bytes=sidecar.settings.max_body_bytes)
    tokens = sidecar.server.settings.auth_tokens
    if tokens is not None:  # added last: the outermost layer, so nothing runs for a request without a token
        app.add_middleware(BearerAuthMiddleware, tokens=tokens,
                           on_refused=lambda path: metrics.observe_http_error(_UNMATCHED, UNAUTHORIZED_CODE))
    # Outermost of all: a state-changing request from another site's page is refused before anything reads it.
    app.add_middleware(OriginCheckMiddleware, policy=sidecar.server.origins, own_ports=sidecar.server.own_ports,
                       on_refused=lambda path: metrics.observe_http_error(_UNMATCHED, FORBIDDEN_ORIGIN_CODE))
    return app
