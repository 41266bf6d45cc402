"""The WebSocket server: routes, ``/healthz``, the engine worker's lifecycle, and graceful shutdown.

:class:`PolicyServer` listens first and loads the model second (on the engine worker thread), so
``GET /healthz`` answers from the first millisecond, with ``"status": "loading"`` until the model is
warm. WebSocket handshakes to ``/v1/actions/realtime`` are refused with HTTP 503 until then; clients
retry.

Shutdown (:meth:`PolicyServer.shutdown`, wired to SIGINT/SIGTERM by the CLI): stop listening, stop the
queue (waiting observations are answered ``dropped``/``shutdown``), let the running inference finish
and its chunk leave, then close every session with 1001 (going away), then stop the features.

The server itself serves the native and openpi protocols and nothing optional. Whoever assembles it
(``policy_server.assembly.cli``) hands it the dialects its robots' path also speaks
(:class:`policy_server.sessions.native.Dialect`), the paths features add to its port
(:class:`~policy_server.sessions.endpoints.EdgeEndpoints`: vla-eval's, for one), and attaches the features
(:class:`ServerFeature`: the recording, the HTTP sidecar); they see the server through its
:class:`~policy_server.context.ServerContext`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any, Protocol

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from cosmos3_runtime.description import ModelDescription
from robot_clients import protocol
from robot_clients.protocol import REALTIME_PATH, DropReason

from ..context import ServerContext
from ..dashboard_files import CONFIG_NAME, DASHBOARD_HEADERS, DASHBOARD_PATH, dashboard_asset, dashboard_config
from ..engine.backend import BackendFactory, EngineBackend
from ..engine.request_queue import PendingObservation, RequestQueue
from ..engine.watchdog import EngineWatchdog
from ..engine.worker import ActionEngine, BackgroundShare, BatchPolicy, EngineWorker
from ..foundation.auth import CHALLENGE, bearer_subprotocol, is_open_path
from ..foundation.camera_intake import served_frame_limits
from ..foundation.connection_limits import ACCEPT_BURST, PeerCounter, handshake_limited_connection
from ..foundation.connection_supervisor import (
    MAX_QUEUED_FRAMES,
    SOCKET_SEND_BUFFER_BYTES,
    WRITE_LIMIT_BYTES,
    close_connection,
)
from ..foundation.log_hygiene import printable
from ..metadata import SERVER_NAME, health
from ..server_settings import ServerSettings
from ..sessions.base import Session
from ..sessions.endpoints import NO_ENDPOINTS, EdgeEndpoints
from ..sessions.native import Dialect, NativeSession
from ..sessions.observer import (
    DEFAULT_INTERVAL_S,
    OBSERVER_MAX_MESSAGE_BYTES,
    ObserverSession,
    SnapshotCache,
    authorize,
)
from ..sessions.openpi import OpenpiSession
from .websocket_routes import Route, check_endpoints, path_of, route

__all__ = ["PolicyServer", "ServerFeature"]

logger = logging.getLogger(__name__)


class ServerFeature(Protocol):
    """An optional part attached to the server by whoever assembles it (the recording, the HTTP sidecar).

    It is built with the server's :class:`~policy_server.context.ServerContext`. :meth:`start` runs once
    the engine backend exists (``context.worker``) and before the WebSocket port opens, in the order the
    features were attached (a feature that cannot start fails the server's start); :meth:`stop` runs at
    the end of shutdown, after every session has closed, in the reverse order.
    """

    async def start(self) -> None: ...

    async def stop(self, grace_s: float) -> None: ...


class PolicyServer:
    """Serves one engine to many WebSocket sessions. Use as ``async with PolicyServer(...) as s:``.

    Its sessions, features and backend see it through :attr:`context` only.

    The engine runs on the local worker thread (``load_engine`` is called there), or, given ``backend``
    (a :class:`~policy_server.engine.backend.BackendFactory`, e.g. the Ray backend's), wherever that
    backend runs it; the backend then also supplies the queue. ``dialects``: the other protocols served
    on ``/v1/actions/realtime``, chosen by a connection's first frame. ``endpoints``: the features' own
    paths on the port (a :class:`ValueError` if one is a path of the server's).
    """

    def __init__(
        self,
        load_engine: Callable[[], ActionEngine] | None,
        settings: ServerSettings | None = None,
        backend: BackendFactory | None = None,
        dialects: tuple[Dialect, ...] = (),
        endpoints: EdgeEndpoints = NO_ENDPOINTS,
    ) -> None:
        check_endpoints(endpoints)
        self.settings = settings or ServerSettings()
        self._load_engine = load_engine
        self._backend = backend
        self.dialects = dialects
        self.endpoints = endpoints
        self.context: ServerContext[Session] = ServerContext(
            self.settings, backend.make_queue() if backend is not None else RequestQueue()
        )
        self.features: list[ServerFeature] = []
        self.observer_snapshots = SnapshotCache(max_age_s=DEFAULT_INTERVAL_S)
        self._ws_server: Server | None = None
        self._stopped = asyncio.Event()
        self.watchdog: EngineWatchdog | None = None

    def attach(self, feature: ServerFeature) -> None:
        """Attach a feature (before :meth:`start`)."""
        self.features.append(feature)

    # -- lifecycle ------------------------------------------------------------------------------------

    def _select_subprotocol(self, _connection: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
        # A browser that sent its token as the subprotocol `bearer.<token>` needs it selected back.
        chosen = bearer_subprotocol(offered) if self.settings.auth_tokens is not None else None
        return Subprotocol(chosen) if chosen is not None else None

    async def start(self) -> None:
        """Listen, then start loading the model in the background. Returns as soon as the port is open."""
        loop = asyncio.get_running_loop()
        context = self.context
        worker: EngineBackend
        if self._backend is not None:
            worker = self._backend.make_backend(context, context.queue, loop)
        else:
            assert self._load_engine is not None, "a load_engine function or a backend"
            assert isinstance(context.queue, RequestQueue), "a local engine serves the server's own queue"
            worker = EngineWorker(
                self._load_engine,
                context.queue,
                loop,
                torch_threads=self.settings.torch_threads,
                warmup=self.settings.warmup,
                batching=BatchPolicy(
                    self.settings.max_batch,
                    self.settings.max_batch_wait_ms,
                    overlap_host_prep=self.settings.overlap_host_prep,
                ),
                background=BackgroundShare(self.settings.video_step_interval_s),
            )
        context.worker = worker
        # Before listening: a feature that cannot start (a taken HTTP port, a recording directory that
        # cannot be made) fails the start before any model loading begins.
        started: list[ServerFeature] = []
        try:
            for feature in self.features:
                await feature.start()
                started.append(feature)
            self._ws_server = await serve(
                self._handle_connection,
                self.settings.host,
                self.settings.port,
                process_request=self._process_request,
                open_timeout=self.settings.handshake_timeout_s,
                backlog=ACCEPT_BURST,
                create_connection=handshake_limited_connection(
                    PeerCounter(self.settings.max_pending_handshakes, self.settings.max_pending_handshakes_per_peer)
                ),
                max_size=self.settings.max_message_bytes,
                # Compression costs 30-40 ms per camera frame and buys nothing on incompressible pixels.
                compression=None,
                # What the transport buffers before `send` waits; replies then wait in each connection's
                # bounded outbox (policy_server.foundation.outbox), so a client that stops reading costs a
                # bounded amount.
                write_limit=WRITE_LIMIT_BYTES,
                max_queue=MAX_QUEUED_FRAMES,
                ping_interval=self.settings.ping_interval,
                ping_timeout=self.settings.ping_timeout,
                server_header=SERVER_NAME,
                ssl=self.settings.ssl_context,
                select_subprotocol=self._select_subprotocol,
            )
        except BaseException:  # a taken port: what did start is stopped again, then the start fails
            for feature in reversed(started):
                await feature.stop(self.settings.shutdown_grace_s)
            raise
        context.port = self._ws_server.sockets[0].getsockname()[1]
        worker.start()
        context.supervisor.start()
        # Only the local worker can restart its engine; a backend's replicas are replaced by their own platform.
        self.watchdog = EngineWatchdog(
            worker if isinstance(worker, EngineWorker) else None, self.settings.engine_timeout_s
        )
        self.watchdog.start()
        scheme = "wss" if self.settings.ssl_context is not None else "ws"
        tokens = self.settings.auth_tokens
        logger.info(
            "listening on %s://%s:%d%s (%s)",
            scheme,
            self.settings.host,
            self.port,
            REALTIME_PATH,
            f"bearer token required, {len(tokens)} accepted" if tokens is not None else "no authentication",
        )

    async def wait_ready(self) -> ModelDescription:
        """Wait for the model to be loaded and warm; raise if it failed to load."""
        assert self.context.worker is not None, "start() first"
        description = await self.context.worker.wait_ready()
        self.context.description = description
        self.context.frame_limits = served_frame_limits(
            description, self.settings.max_decoded_bytes, self.settings.max_image_side
        )
        side = self.context.frame_limits.max_image_side
        if self.settings.max_message_bytes < side * side * 3 + 2**20:
            logger.warning(
                "a %dx%d camera frame does not fit --max-message-mib %.1f: the frame limit wins (1009)",
                side,
                side,
                self.settings.max_message_bytes / 2**20,
            )
        logger.info("ready: serving %s (%s)", description.model, description.variant)
        if self.settings.openpi is not None:
            try:  # the operator's --openpi-* flags, checked against the model once, loudly
                self.settings.openpi.session_config(description)
            except protocol.ProtocolError as exc:
                logger.error("openpi endpoint misconfigured (%s); openpi clients will be told so", exc.message)
        return description

    @property
    def port(self) -> int:
        """The WebSocket port."""
        assert self.context.port is not None, "start() first"
        return self.context.port

    async def shutdown(self) -> None:
        """Stop accepting, finish what is running, close every session with 1001, stop the features. Idempotent."""
        context = self.context
        if context.stopping:
            await self._stopped.wait()
            return
        context.stopping = True
        logger.info("shutting down: %d session(s), %d waiting", len(context.sessions), len(context.queue))
        await context.supervisor.stop()
        if self.watchdog is not None:
            self.watchdog.stop()  # a slow last inference at shutdown is waited for, not restarted
        if self._ws_server is not None:
            self._ws_server.server.close()  # stop listening; open sessions carry on for now
        for item in context.queue.close():
            # The two branches read the same: each tells the type checker which owner type takes the item.
            if isinstance(item, PendingObservation):
                item.owner.on_dropped(item, DropReason.SHUTDOWN)
            else:
                item.owner.on_dropped(item, DropReason.SHUTDOWN)
        if context.worker is not None:
            finished = await asyncio.to_thread(context.worker.stop, self.settings.shutdown_grace_s)
            if not finished:
                logger.warning("the running inference did not finish within %.0f s", self.settings.shutdown_grace_s)
        await asyncio.sleep(0)  # let the worker's last call_soon_threadsafe callbacks run
        await asyncio.gather(*(s.drain(timeout=2.0) for s in list(context.sessions.values())))
        if self._ws_server is not None:
            # Each connection closed by us first: websockets' own close() waits forever for a client that
            # does not read (its write buffer never drains); close_connection drops it after a grace.
            grace = self.settings.session_limits.close_grace_s
            await asyncio.gather(
                *(close_connection(c, 1001, "server shutting down", grace) for c in self._ws_server.connections)
            )
            self._ws_server.close(close_connections=True, code=1001, reason="server shutting down")
            await self._ws_server.wait_closed()
        # After the worker (the video job it just finished gets stored) and the sessions (each has ended
        # its recorded episode).
        for feature in reversed(self.features):
            await feature.stop(self.settings.shutdown_grace_s)
        self._stopped.set()
        logger.info("shut down")

    async def __aenter__(self) -> PolicyServer:
        await self.start()
        await self.wait_ready()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    # -- HTTP on the WebSocket port --------------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = path_of(request.path)
        kind = route(path, openpi=self.settings.openpi is not None, endpoints=self.endpoints)
        context = self.context
        if kind is Route.HEALTH:
            tokens = self.settings.auth_tokens
            query = request.path.partition("?")[2]
            authorized = tokens is not None and tokens.check(request.headers.get_all, query).ok
            status, body = health(context, authorized=authorized)
            return _json_response(connection, HTTPStatus(status), body)
        if kind is Route.EDGE_HTTP and self.endpoints.http[path].open:
            return self._edge_http_response(connection, request)
        if kind is Route.DASHBOARD:
            return self._dashboard_response(connection, path)
        # Everything below is a WebSocket upgrade: a page of another site must not open it (its browser
        # would carry the user's network position and any token in its URL).
        origins, hosts = request.headers.get_all("Origin"), request.headers.get_all("Host")
        refusal = (
            "more than one Origin header"
            if len(origins) > 1
            else context.origins.refusal(
                origins[0] if origins else None, hosts[0] if len(hosts) == 1 else None, context.own_ports()
            )
        )
        if refusal is not None:
            logger.info(
                "refused a handshake to %s from %s: %s", printable(path[:200]), connection.remote_address, refusal
            )
            return connection.respond(HTTPStatus.FORBIDDEN, refusal + "\n")
        sock = connection.transport.get_extra_info("socket")
        if sock is not None:  # replies wait in the bounded outbox, not in megabytes of kernel buffer
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SEND_BUFFER_BYTES)
        if self.settings.auth_tokens is not None and not is_open_path(path):
            # Before anything else (even the 404 for an unknown path): no token, no information.
            result = self.settings.auth_tokens.check(request.headers.get_all, request.path.partition("?")[2])
            if not result.ok:
                logger.info(
                    "refused a handshake to %s from %s: %s",
                    printable(path[:200]),
                    connection.remote_address,
                    result.reason,
                )
                response = connection.respond(HTTPStatus.UNAUTHORIZED, result.reason + "\n")
                response.headers["WWW-Authenticate"] = CHALLENGE
                return response
        if kind is Route.EDGE_HTTP:
            return self._edge_http_response(connection, request)
        if kind is Route.OBSERVER:
            if context.stopping:
                return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "server is shutting down\n")
            if len(context.observers) >= self.settings.max_observers:
                return _limit_reached(connection, "observer", self.settings.max_observers)
            denied = authorize(request)  # the observer channel's one access check
            if denied is not None:
                return connection.respond(denied[0], denied[1] + "\n")
            # Observers send small JSON frames: the robots' frame limit would let one buffer gigabytes.
            # (websockets reads this attribute for every frame; set before the first one is parsed.)
            connection.protocol.max_message_size = OBSERVER_MAX_MESSAGE_BYTES
            return None
        if not kind.is_session:
            return connection.respond(
                HTTPStatus.NOT_FOUND, f"no endpoint at {path}; the policy endpoint is {REALTIME_PATH}\n"
            )
        if context.stopping:
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "server is shutting down\n")
        if not context.ready:
            response = connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "model is loading; retry shortly\n")
            response.headers["Retry-After"] = "1"
            return response
        if len(context.sessions) >= self.settings.max_sessions:
            return _limit_reached(connection, "session", self.settings.max_sessions)
        return None

    def _edge_http_response(self, connection: ServerConnection, request: Request) -> Response:
        """A feature's plain-HTTP endpoint (:class:`~policy_server.sessions.endpoints.HttpEndpoint`) answers the
        request."""
        path, _, query = request.path.partition("?")
        status, body = self.endpoints.http[path].answer(self.context, query)
        return _json_response(connection, HTTPStatus(status), body)

    # -- WebSocket sessions ----------------------------------------------------------------------------

    def _dashboard_response(self, connection: ServerConnection, path: str) -> Response:
        """The dashboard's static files, served on this port too (same origin as the observer channel)."""
        if path == DASHBOARD_PATH:  # relative asset URLs need the trailing slash
            response = connection.respond(HTTPStatus.MOVED_PERMANENTLY, "see /dashboard/\n")
            response.headers["Location"] = DASHBOARD_PATH + "/"
            response.headers.update(DASHBOARD_HEADERS)
            return response
        name = path[len(DASHBOARD_PATH) + 1 :]
        if name == CONFIG_NAME:
            response = _json_response(connection, HTTPStatus.OK, dashboard_config(self.port))
            response.headers.update(DASHBOARD_HEADERS)
            return response
        asset = dashboard_asset(name)
        if asset is None:
            return connection.respond(HTTPStatus.NOT_FOUND, f"no dashboard file {name!r}\n")
        headers = Headers(
            [
                ("Content-Type", asset.content_type),
                ("Content-Length", str(len(asset.body))),
                ("Server", SERVER_NAME),
                *DASHBOARD_HEADERS.items(),
            ]
        )
        return Response(HTTPStatus.OK.value, "OK", headers, asset.body)

    async def _handle_connection(self, connection: ServerConnection) -> None:
        context = self.context
        target = connection.request.path if connection.request is not None else REALTIME_PATH
        kind = route(target, openpi=self.settings.openpi is not None, endpoints=self.endpoints)
        if kind is Route.OBSERVER:  # an operator's dashboard: watches and steers, never a session itself
            if len(context.observers) >= self.settings.max_observers:  # admitted together at the last slot
                await connection.close(1013, f"observer limit reached ({self.settings.max_observers}); retry later")
                return
            observer = ObserverSession(connection, context, self.observer_snapshots)
            context.observers[observer.id] = observer
            try:
                await observer.run()
            finally:
                context.observers.pop(observer.id, None)
            return
        if len(context.sessions) >= self.settings.max_sessions:
            # Handshakes that passed the check in _process_request together: the later ones go (1013).
            await connection.close(1013, f"session limit reached ({self.settings.max_sessions}); retry later")
            return
        session: Session
        if kind is Route.OPENPI and self.settings.openpi is not None:
            session = OpenpiSession(connection, context, self.settings.openpi)
        elif kind is Route.EDGE_SESSION:
            session = self.endpoints.sessions[path_of(target)].session(connection, context)
        else:
            session = NativeSession(connection, context, self.dialects)
        context.register(session)
        logger.info("session %s opened from %s", session.id, connection.remote_address)
        try:
            await session.run()
            if isinstance(session, NativeSession) and session.handover is not None:  # its first frame chose it
                context.unregister(session)
                dialect, first = session.handover
                session = dialect.session(connection, context, session.id, first, session.last_observation_at)
                context.register(session)
                logger.info("session %s speaks %s", session.id, dialect.name)
                await session.run()
        finally:
            context.unregister(session)
            logger.info(
                "session %s closed (code %s): %d answered, %d dropped",
                session.id,
                connection.close_code,
                session.answered,
                session.dropped,
            )


def _json_response(connection: ServerConnection, status: HTTPStatus, body: dict[str, Any]) -> Response:
    response = connection.respond(status, json.dumps(body) + "\n")
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = "application/json"
    return response


def _limit_reached(connection: ServerConnection, what: str, limit: int) -> Response:
    """503 with Retry-After: ``limit`` connections of this kind (``session``, ``observer``) are open."""
    response = connection.respond(
        HTTPStatus.SERVICE_UNAVAILABLE, f"{what} limit reached: {limit} {what}s are open; retry later\n"
    )
    response.headers["Retry-After"] = "5"
    return response
