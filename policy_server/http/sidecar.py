"""The HTTP sidecar's lifecycle: FastAPI on uvicorn, on its own port, in the WebSocket server's process
and event loop.

Routes (``docs/http_api.md`` is the user-facing description; ``/openapi.json`` the schema):

* ``/v1/videos`` - ``forward_dynamics`` rollouts as persistent asynchronous jobs
  (:mod:`policy_server.videos.job_store`, run by :mod:`policy_server.videos.runner`);
* ``POST /v1/actions/generations`` - one chunk of actions per request, for clients without a WebSocket;
* ``GET /v1/actions/metadata`` - what the loaded checkpoint offers;
* ``/healthz`` (alive), ``/readyz`` (model loaded and warm), ``/metrics`` (Prometheus).

Both kinds of work enter the server's one request queue: action generations as observations (each
client's requests share one turn, like one robot's, with a bounded number in flight), video jobs in the
background lane that the engine worker serves while no observation waits, plus a bounded share under robot
load. The sidecar never runs model code on the event loop; request decoding, SQLite and MP4 encoding run on
helper threads (``asyncio.to_thread``).

Here the sidecar is assembled in one place: the outer layers every request passes
(:class:`SidecarMiddleware`, one error shape), the application (:func:`build_app`, one router per
resource, each handed the :class:`~.context.SidecarParts`), uvicorn serving it on a socket bound here
(:class:`UvicornServing`) and the lifecycle (:class:`HttpSidecar`, a ``ServerFeature``).

The socket is bound before uvicorn starts, so port 0 works and a taken port fails at once; uvicorn runs
with ``startup()``/``main_loop()`` rather than ``serve()``, which would install its own signal handlers
(the CLI owns SIGINT/SIGTERM).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
import ssl
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from robot_clients.protocol import ErrorCode

from ..context import ServerContext
from ..dashboard_files import CONFIG_NAME, DASHBOARD_HEADERS, DASHBOARD_PATH, dashboard_asset, dashboard_config
from ..foundation.api_errors import ApiError, HttpErrorCode
from ..foundation.auth import FORBIDDEN_ORIGIN_CODE, UNAUTHORIZED_CODE, BearerAuthMiddleware, OriginCheckMiddleware
from ..foundation.connection_limits import ACCEPT_BURST, PeerCounter, capped_to_descriptors
from ..metrics import ServerMetrics, ServerStateReaders
from ..sidecar_settings import SidecarConnectionLimits, SidecarSettings
from ..videos.job_store import VideoJobStatus, VideoJobStore
from ..videos.runner import VideoJobRunner
from .bodies import BodyBudget, content_length
from .connections import guarded_protocol
from .parts import SidecarParts
from .routes import actions, metadata, recordings, videos
from .turns import InFlightLimit

logger = logging.getLogger(__name__)

# -- every request's outer layer, and every error's one JSON shape ------------------------------

# The endpoint label of a request no route matched (and of connections refused before any route).
UNMATCHED = "(unmatched)"


def endpoint(scope: Scope) -> str:
    """The route template (``/v1/videos/{video_id}``), never the raw path: bounded label cardinality."""
    route = scope.get("route")
    path: str | None = getattr(route, "path", None)
    return path or UNMATCHED


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class SidecarMiddleware:
    """Pure ASGI: bounds request bodies, times every request for the metrics, and turns a bug of ours
    into a typed 500 (with a log reference) instead of a traceback."""

    def __init__(self, app: ASGIApp, *, metrics: ServerMetrics, max_body_bytes: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        state: dict[str, Any] = {"status": 500, "sent": False}
        limit = self.max_body_bytes

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"], state["sent"] = message["status"], True
            await send(message)

        received = 0

        async def receive_wrapper() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(HttpErrorCode.PAYLOAD_TOO_LARGE, f"the body is larger than {limit} bytes")
            return message

        try:
            declared = content_length(scope)
            if declared is not None and declared > limit:
                error = ApiError(
                    HttpErrorCode.PAYLOAD_TOO_LARGE,
                    f"the body is {declared} bytes; this server accepts at most {limit}",
                )
                self.metrics.observe_http_error(endpoint(scope), error.code)
                await error_response(error)(scope, receive, send_wrapper)
            else:
                await self.app(scope, receive_wrapper, send_wrapper)
        except ClientDisconnect:  # the client went away mid-body (or its body deadline closed it): nobody to answer
            state["status"] = 499
        except Exception:  # noqa: BLE001 - a bug of ours: log it, answer with a reference only
            reference = uuid.uuid4().hex[:12]
            logger.exception("HTTP %s %s failed (ref %s)", scope.get("method"), scope.get("path"), reference)
            if not state["sent"]:
                error = ApiError(
                    HttpErrorCode.INTERNAL_ERROR,
                    f"the server failed on this request; the log has details (ref {reference})",
                )
                self.metrics.observe_http_error(endpoint(scope), error.code)
                await error_response(error)(scope, receive, send_wrapper)
        finally:
            self.metrics.observe_http(
                endpoint(scope), scope.get("method", ""), state["status"], time.monotonic() - started
            )


def install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Answer every error of ``app`` in one JSON shape, counting each in ``metrics``."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        metrics.observe_http_error(endpoint(request.scope), exc.code)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(part) for part in first.get("loc", ()) if part not in ("query", "path", "body")]
        field_name = ".".join(loc) or None
        return await api_error(
            request,
            ApiError(ErrorCode.INVALID_FIELD, f"`{field_name}`: {first.get('msg', 'invalid value')}", field_name),
        )

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
        headers = dict(exc.headers or {})
        return await api_error(request, ApiError(code, message, status=exc.status_code, headers=headers))


# -- the application ----------------------------------------------------------------------------


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


def mount_dashboard(app: FastAPI, observer_port: Callable[[], int]) -> None:
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


# -- uvicorn on a socket bound here -------------------------------------------------------------


def bound_socket(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (IPv6 when ``host`` is an IPv6 address)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(ACCEPT_BURST)
    sock.setblocking(False)
    return sock


class UvicornServing:
    """One uvicorn server for ``app`` on ``sock``: :meth:`start`, then :meth:`stop`."""

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        *,
        limits: SidecarConnectionLimits,
        counter: PeerCounter,
        on_refused: Callable[[str], None],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        import uvicorn
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        self.socket = sock
        config = uvicorn.Config(
            # log_config=None: uvicorn's records go through the process's handlers (and their filters,
            # policy_server.foundation.log_hygiene), not a handler of its own.
            app,
            lifespan="off",
            log_level="warning",
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=5,
            backlog=ACCEPT_BURST,
            http=guarded_protocol(AutoHTTPProtocol, limits, counter, on_refused=on_refused),
        )
        config.load()
        if tls is not None:  # https with the WebSocket port's certificate (uvicorn reads config.ssl at startup)
            config.ssl = tls
        self._server = uvicorn.Server(config)
        self._server.lifespan = config.lifespan_class(config)
        self._main_loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._server.startup(sockets=[self.socket])
        self._main_loop = asyncio.create_task(self._server.main_loop(), name="http-sidecar")

    def connections(self) -> list[Any]:
        """The open connections: uvicorn's protocol objects, each with its ``transport``."""
        return list(self._server.server_state.connections)

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish (up to uvicorn's graceful timeout), close."""
        self._server.should_exit = True
        if self._main_loop is not None:
            await self._main_loop
        await self._server.shutdown(sockets=[self.socket])


# -- the lifecycle ------------------------------------------------------------------------------


class HttpSidecar:
    """The sidecar of the server whose context is ``host``: started before the server listens, stopped
    after its worker and sessions."""

    def __init__(self, host: ServerContext[Any], settings: SidecarSettings) -> None:
        self.host = host
        self.settings = settings
        self.store: VideoJobStore | None = None
        self.runner: VideoJobRunner | None = None
        self.metrics = ServerMetrics(
            ServerStateReaders(
                queue_depth=lambda: len(host.queue),
                background_depth=self._background_depth,
                sessions_open=lambda: len(host.sessions),
                dropped_observations=lambda: host.dropped_observations,
                engine_busy_seconds=self._engine_busy_seconds,
                video_jobs_by_status=lambda: self.store.count_by_status() if self.store else {},
                ready=lambda: host.ready,
                replicas=lambda: host.worker.topology().get("replicas", []) if host.worker is not None else [],
                recording=lambda: host.stats["recording"]() if "recording" in host.stats else None,
                unused_state=lambda: dict(host.unused_state),
            )
        )
        # Made from the settings when the sidecar starts (whoever attached it may still adjust them).
        self.actions_in_flight: InFlightLimit | None = None
        self.body_budget: BodyBudget | None = None
        self.connection_counter: PeerCounter | None = None
        self.app: Any = None
        self._socket: socket.socket | None = None
        self.serving: UvicornServing | None = None

    def _background_depth(self) -> int:
        # Jobs waiting in SQLite plus the one handed to the worker but not started yet.
        queued = self.store.count_by_status().get(VideoJobStatus.QUEUED.value, 0) if self.store else 0
        return queued + self.host.queue.background_waiting

    def _engine_busy_seconds(self) -> float:
        worker = self.host.worker
        if worker is None:
            return 0.0
        since = worker.busy_since
        return worker.busy_s + (time.monotonic() - since if since is not None else 0.0)

    @property
    def listening(self) -> bool:
        """Whether :meth:`start` has bound the port (so :attr:`port` can be read)."""
        return self._socket is not None

    @property
    def port(self) -> int:
        assert self._socket is not None, "start() first"
        port: int = self._socket.getsockname()[1]
        return port

    async def start(self) -> None:
        """Open the job store (re-queueing interrupted jobs), listen, and start the job runner (its jobs
        wait for the engine to be ready)."""
        worker = self.host.worker
        assert worker is not None, "the server makes its engine backend before it starts its features"
        self.store = await asyncio.to_thread(VideoJobStore, self.settings.data_dir, self.settings.retention)
        try:
            await asyncio.to_thread(self.store.recover)
            recover_pending = False
        except (sqlite3.Error, OSError) as exc:  # a full disk: serve anyway; the runner retries when it has room
            logger.warning("video jobs could not be recovered at start (%s); retrying once the disk has room", exc)
            recover_pending = True
        settings = self.settings
        self.actions_in_flight = turns = InFlightLimit(settings.max_actions_in_flight)
        self.body_budget = budget = BodyBudget(max(settings.max_buffered_body_bytes, settings.max_body_bytes))
        worker.on_batch_done = self.metrics.observe_batch
        self.runner = VideoJobRunner(self.store, self.host.queue, self.metrics, recover_pending=recover_pending)
        self.runner.start(worker.wait_ready())

        self.app = build_app(
            SidecarParts(
                settings=self.settings,
                host=self.host,
                metrics=self.metrics,
                body_budget=budget,
                turns=turns,
                store=self.store,
                runner=self.runner,
            )
        )
        self._socket = bound_socket(self.settings.host, self.settings.port)
        self.host.other_ports.append(self.port)  # a page served from here may open the WebSocket port
        tls = self.host.settings.ssl_context
        self.connection_counter = self._connection_counter()
        self.serving = UvicornServing(
            self.app,
            self._socket,
            limits=self.settings.connections,
            counter=self.connection_counter,
            on_refused=lambda code: self.metrics.observe_http_error(UNMATCHED, code),
            tls=tls,
        )
        await self.serving.start()
        logger.info(
            "HTTP sidecar listening on %s://%s:%d (video jobs in %s)",
            "https" if tls is not None else "http",
            self.settings.host,
            self.port,
            self.settings.data_dir,
        )

    def _connection_counter(self) -> PeerCounter:
        """The sidecar's connection caps. The total leaves room, within the process's file-descriptor
        limit, for the robots' port (sessions, pending handshakes, observers)."""
        limits, robots = self.settings.connections, self.host.settings
        reserved = {
            "sessions": robots.max_sessions,
            "pending handshakes": robots.max_pending_handshakes,
            "observers": robots.max_observers,
        }
        cap = capped_to_descriptors(limits.max_connections, sum(reserved.values()), "HTTP connections", **reserved)
        return PeerCounter(cap, limits.max_connections_per_peer)

    async def stop(self, grace_s: float = 30.0) -> None:
        """Record the video job in hand (the worker has finished it), then stop serving HTTP."""
        if self.runner is not None:
            await self.runner.stop(grace_s)
        if self.serving is not None:
            await self.serving.stop()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
