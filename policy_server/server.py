"""The WebSocket server: routes, ``/healthz``, the engine worker's lifecycle, and graceful shutdown.

:class:`PolicyServer` listens first and loads the model second (on the engine worker thread), so
``GET /healthz`` answers from the first millisecond, with ``"status": "loading"`` until the model is
warm. WebSocket handshakes to ``/v1/actions/realtime`` are refused with HTTP 503 until then; clients
retry.

Shutdown (:meth:`PolicyServer.shutdown`, wired to SIGINT/SIGTERM by the CLI): stop listening, stop the
queue (waiting observations are answered ``dropped``/``shutdown``), let the running inference finish
and its chunk leave, then close every session with 1001 (going away).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Callable

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from robot_clients import protocol
from robot_clients.protocol import HEALTH_PATH, REALTIME_PATH, DropReason, FrameLimits

from .auth import CHALLENGE, OriginPolicy, TokenSet, bearer_subprotocol, is_open_path
from .connection_limits import (ACCEPT_BURST, DEFAULT_HANDSHAKE_TIMEOUT_S, DEFAULT_MAX_PENDING_HANDSHAKES,
                                DEFAULT_MAX_PENDING_HANDSHAKES_PER_PEER, PeerCounter, handshake_limited_connection)
from .engine.backend import BackendFactory, EngineBackend
from .engine.description import ModelDescription
from .engine.request_queue import RequestQueue
from .engine.watchdog import DEFAULT_ENGINE_TIMEOUT_S, EngineWatchdog
from .engine.worker import (DEFAULT_VIDEO_STEP_INTERVAL_S, ActionEngine, BackgroundShare, BatchPolicy, EngineWorker,
                            WorkerState)
from .http.dashboard import CONFIG_NAME, DASHBOARD_HEADERS, DASHBOARD_PATH, dashboard_asset, dashboard_config
from .log_hygiene import printable
from .sessions.config import STATE_PROFILE_FIELDS
from .sessions.native import RealtimeSession
from .sessions.observer import (
    DEFAULT_INTERVAL_S, DEFAULT_MAX_OBSERVERS, OBSERVE_PATH, OBSERVER_FRAME_RATE, OBSERVER_MAX_MESSAGE_BYTES,
    ObserverSession, SnapshotCache, authorize,
)
from .sessions.openpi import OPENPI_PATHS, OpenpiSession, OpenpiSettings
from .sessions.rate_limits import RateLimit
from .sessions.supervisor import (
    MAX_QUEUED_FRAMES, SOCKET_SEND_BUFFER_BYTES, WRITE_LIMIT_BYTES, SessionLimits, ConnectionSupervisor,
    close_connection,
)

if TYPE_CHECKING:
    from .http.sidecar import HttpSidecar, SidecarSettings

logger = logging.getLogger(__name__)


SERVER_NAME = "cosmos3-policy-server"

# A 720p RGB frame is 2.8 MB; a 65-frame 256x256 clip 12.8 MB. The default fits the largest single image
# the models accept (4096x4096x3 = 48 MiB, `limits.max_image_side`) plus the msgpack around it, so the
# two limits agree for one camera; several cameras or a clip in one frame are bounded by this limit
# first (docs/security.md), and it keeps one client from making the server buffer arbitrary amounts.
LARGEST_IMAGE_BYTES = 4096 * 4096 * 3
DEFAULT_MAX_MESSAGE_BYTES = LARGEST_IMAGE_BYTES + 2**20


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    torch_threads: int | None = None
    warmup: bool = True
    # Requests of different sessions that can share transformer calls run as one batch (1: off).
    max_batch: int = 4
    max_batch_wait_ms: float = 0.0
    # Keepalive pings run on the event loop, which never runs model code, so they flow during
    # inference; the timeout only has to cover the network, not the model.
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    # An ssl.SSLContext to serve wss:// (None: plain ws://).
    ssl_context: Any = None
    # How long shutdown waits for the running inference to finish before closing anyway.
    shutdown_grace_s: float = 30.0
    # openpi's protocol on `/` and `/openpi` (domain, horizon, mode, cameras); None turns it off.
    openpi: OpenpiSettings | None = field(default_factory=OpenpiSettings)
    # The HTTP sidecar (video jobs, one-shot actions, metrics) on its own port; None: WebSocket only.
    http: SidecarSettings | None = None
    # Bearer tokens that open every endpoint but /healthz and the dashboard's static files (policy_server.auth);
    # None: no authentication (the server is as open as the network it listens on).
    auth_tokens: TokenSet | None = None
    # Robot sessions (native + openpi) open at once; more are refused at the handshake with 503.
    max_sessions: int = 64
    # A connection must complete its handshake within this many seconds (websockets' open_timeout), and
    # at most this many (in all, and per peer address) may be waiting to (policy_server.connection_limits).
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    max_pending_handshakes: int = DEFAULT_MAX_PENDING_HANDSHAKES
    max_pending_handshakes_per_peer: int = DEFAULT_MAX_PENDING_HANDSHAKES_PER_PEER
    # Observations per second per session (token bucket); beyond it an observation is answered `rate_limited`.
    observation_rate: RateLimit = field(default_factory=RateLimit)
    # An engine call running longer than this fails its requests (`engine_timeout`) and the engine is
    # reloaded on a new worker thread (policy_server.engine.watchdog); 0 turns the watchdog off.
    engine_timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S
    # While robots wait, a video rollout still gets one denoising step this often (BackgroundShare); 0: never.
    video_step_interval_s: float = DEFAULT_VIDEO_STEP_INTERVAL_S
    # Outbox bounds, reply and idle timeouts of every connection (policy_server.sessions.supervisor).
    connection_limits: SessionLimits = field(default_factory=SessionLimits)
    # Observer channels (/v1/observe) open at once; more are refused at the handshake with 503.
    max_observers: int = DEFAULT_MAX_OBSERVERS
    # Frames per second an observer may send (subscribe, control); beyond, they are answered `rate_limited`.
    observer_frame_rate: RateLimit = field(default_factory=lambda: OBSERVER_FRAME_RATE)
    # Browser origins allowed besides the server's own (policy_server.auth.OriginPolicy; `*`: any).
    allowed_origins: tuple[str, ...] = ()


class PolicyServer:
    """Serves one engine to many WebSocket sessions. Use as ``async with PolicyServer(...) as s:``.

    The engine runs on the local worker thread (``load_engine`` is called there), or, given ``backend``
    (a :class:`~policy_server.engine.backend.BackendFactory`, e.g. the Ray backend's), wherever that
    backend runs it; the backend then also supplies the queue.
    """

    def __init__(self, load_engine: Callable[[], ActionEngine] | None, settings: ServerSettings | None = None,
                 backend: BackendFactory | None = None) -> None:
        self.settings = settings or ServerSettings()
        self._load_engine = load_engine
        self._backend = backend
        self.queue = backend.make_queue() if backend is not None else RequestQueue()
        self.sessions: dict[str, RealtimeSession | OpenpiSession] = {}
        self.observers: dict[str, ObserverSession] = {}
        self.observer_snapshots = SnapshotCache(max_age_s=DEFAULT_INTERVAL_S)
        self.origins = OriginPolicy(self.settings.allowed_origins)
        self.supervisor = ConnectionSupervisor(self, self.settings.connection_limits)
        # What the loaded model offers; None until it is loaded and warm.
        self.description: ModelDescription | None = None
        self.frame_limits = FrameLimits()
        self.worker: EngineBackend | None = None
        self.sidecar: HttpSidecar | None = None
        self.stopping = False
        self._closed_sessions_dropped = 0
        self.started_at = time.monotonic()
        self._ws_server: Server | None = None
        self._stopped = asyncio.Event()
        self.watchdog: EngineWatchdog | None = None

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, then start loading the model in the background. Returns as soon as the port is open."""
        loop = asyncio.get_running_loop()
        if self._backend is not None:
            self.worker = self._backend.make_backend(self, self.queue, loop)
        else:
            assert self._load_engine is not None, "a load_engine function or a backend"
            self.worker = EngineWorker(
                self._load_engine,
                self.queue,
                loop,
                torch_threads=self.settings.torch_threads,
                warmup=self.settings.warmup,
                batching=BatchPolicy(self.settings.max_batch, self.settings.max_batch_wait_ms),
                background=BackgroundShare(self.settings.video_step_interval_s),
            )
        self._ws_server = await serve(
            self._handle_connection,
            self.settings.host,
            self.settings.port,
            process_request=self._process_request,
            open_timeout=self.settings.handshake_timeout_s,
            backlog=ACCEPT_BURST,
            create_connection=handshake_limited_connection(
                PeerCounter(self.settings.max_pending_handshakes, self.settings.max_pending_handshakes_per_peer)),
            max_size=self.settings.max_message_bytes,
            # Compression costs 30-40 ms per camera frame and buys nothing on incompressible pixels.
            compression=None,
            # What the transport buffers before `send` waits; replies then wait in each connection's
            # bounded outbox (policy_server.sessions.outbox), so a client that stops reading costs a bounded amount.
            write_limit=WRITE_LIMIT_BYTES,
            max_queue=MAX_QUEUED_FRAMES,
            ping_interval=self.settings.ping_interval,
            ping_timeout=self.settings.ping_timeout,
            server_header=SERVER_NAME,
            ssl=self.settings.ssl_context,
            # A browser that sent its token as the subprotocol `bearer.<token>` needs it selected back.
            select_subprotocol=lambda _connection, offered: bearer_subprotocol(offered)
            if self.settings.auth_tokens is not None else None,
        )
        if self.settings.http is not None:
            # Imported here so a WebSocket-only server never loads FastAPI. Started before the worker so
            # that a taken HTTP port fails the start before any model loading begins.
            from .http.sidecar import HttpSidecar

            self.sidecar = HttpSidecar(self, self.settings.http)
            await self.sidecar.start(self.worker.wait_ready())
        self.worker.start()
        self.supervisor.start()
        self.watchdog = EngineWatchdog(self.worker, self.settings.engine_timeout_s)
        self.watchdog.start()  # only for a worker that can restart its engine (the local one)
        scheme = "wss" if self.settings.ssl_context is not None else "ws"
        tokens = self.settings.auth_tokens
        logger.info("listening on %s://%s:%d%s (%s)", scheme, self.settings.host, self.port, REALTIME_PATH,
                    f"bearer token required, {len(tokens)} accepted" if tokens is not None else "no authentication")

    async def wait_ready(self) -> ModelDescription:
        """Wait for the model to be loaded and warm; raise if it failed to load."""
        assert self.worker is not None, "start() first"
        description = ModelDescription.from_describe(await self.worker.wait_ready())
        self.description = description
        self.frame_limits = description.frame_limits
        side = self.frame_limits.max_image_side
        if self.settings.max_message_bytes < side * side * 3 + 2**20:
            logger.warning("a %dx%d camera frame does not fit --max-message-mib %.1f: the frame limit wins (1009)",
                           side, side, self.settings.max_message_bytes / 2**20)
        logger.info("ready: serving %s (%s)", description.model, description.variant)
        if self.settings.openpi is not None:
            try:  # the operator's --openpi-* flags, checked against the model once, loudly
                self.settings.openpi.session_config(description)
            except protocol.ProtocolError as exc:
                logger.error("openpi endpoint misconfigured (%s); openpi clients will be told so", exc.message)
        return description

    @property
    def port(self) -> int:
        assert self._ws_server is not None, "start() first"
        return self._ws_server.sockets[0].getsockname()[1]

    def own_ports(self) -> list[int]:
        """This server's ports (WebSocket, sidecar): a page on the same host and one of them is ours."""
        ports = [self.port] if self._ws_server is not None else []
        if self.sidecar is not None and self.sidecar._socket is not None:
            ports.append(self.sidecar.port)
        return ports

    @property
    def dropped_observations(self) -> int:
        """Observations answered ``dropped`` since the start, by open and closed sessions."""
        return self._closed_sessions_dropped + sum(s.dropped for s in list(self.sessions.values()))

    @property
    def ready(self) -> bool:
        return self.worker is not None and self.worker.state is WorkerState.READY and self.description is not None

    async def shutdown(self) -> None:
        """Stop accepting, finish what is running, close every session with 1001. Idempotent."""
        if self.stopping:
            await self._stopped.wait()
            return
        self.stopping = True
        logger.info("shutting down: %d session(s), %d waiting", len(self.sessions), len(self.queue))
        await self.supervisor.stop()
        if self.watchdog is not None:
            self.watchdog.stop()  # a slow last inference at shutdown is waited for, not restarted
        if self._ws_server is not None:
            self._ws_server.server.close()  # stop listening; open sessions carry on for now
        for item in self.queue.close():
            item.owner.on_dropped(item, DropReason.SHUTDOWN)
        if self.worker is not None:
            finished = await asyncio.to_thread(self.worker.stop, self.settings.shutdown_grace_s)
            if not finished:
                logger.warning("the running inference did not finish within %.0f s", self.settings.shutdown_grace_s)
        await asyncio.sleep(0)  # let the worker's last call_soon_threadsafe callbacks run
        if self.sidecar is not None:  # after the worker: the video job it just finished gets recorded
            await self.sidecar.shutdown(self.settings.shutdown_grace_s)
        await asyncio.gather(*(s.drain(timeout=2.0) for s in list(self.sessions.values())))
        if self._ws_server is not None:
            # Each connection closed by us first: websockets' own close() waits forever for a client that
            # does not read (its write buffer never drains); close_connection drops it after a grace.
            grace = self.settings.connection_limits.close_grace_s
            await asyncio.gather(*(close_connection(c, 1001, "server shutting down", grace)
                                   for c in self._ws_server.connections))
            self._ws_server.close(close_connections=True, code=1001, reason="server shutting down")
            await self._ws_server.wait_closed()
        self._stopped.set()
        logger.info("shut down")

    async def __aenter__(self) -> "PolicyServer":
        await self.start()
        await self.wait_ready()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    # -- HTTP on the WebSocket port --------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        worker = self.worker
        if self.stopping:
            status = "stopping"
        elif worker is None:
            status = "starting"
        else:
            status = worker.state.value
        return {
            "status": status,
            "model": self.description.model if self.description is not None else None,
            "variant": self.description.variant if self.description is not None else None,
            "protocol_version": protocol.PROTOCOL_VERSION,
            "sessions": len(self.sessions),
            "queue_depth": len(self.queue),
            "busy": bool(worker and worker.busy),
            "completed": worker.completed if worker else 0,
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "worker": worker.thread_settings if worker else {},
        }

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == HEALTH_PATH:
            health = self.health()
            ok = health["status"] not in ("failed", "stopping")
            return _json_response(connection, HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, health)
        if path == DASHBOARD_PATH or path.startswith(DASHBOARD_PATH + "/"):
            return self._dashboard_response(connection, path)
        # Everything below is a WebSocket upgrade: a page of another site must not open it (its browser
        # would carry the user's network position and any token in its URL).
        origins, hosts = request.headers.get_all("Origin"), request.headers.get_all("Host")
        refusal = "more than one Origin header" if len(origins) > 1 else self.origins.refusal(
            origins[0] if origins else None, hosts[0] if len(hosts) == 1 else None, self.own_ports())
        if refusal is not None:
            logger.info("refused a handshake to %s from %s: %s", printable(path[:200]), connection.remote_address,
                        refusal)
            return connection.respond(HTTPStatus.FORBIDDEN, refusal + "\n")
        sock = connection.transport.get_extra_info("socket")
        if sock is not None:  # replies wait in the bounded outbox, not in megabytes of kernel buffer
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SEND_BUFFER_BYTES)
        if self.settings.auth_tokens is not None and not is_open_path(path):
            # Before anything else (even the 404 for an unknown path): no token, no information.
            result = self.settings.auth_tokens.check(request.headers.get_all, request.path.partition("?")[2])
            if not result.ok:
                logger.info("refused a handshake to %s from %s: %s", printable(path[:200]), connection.remote_address,
                            result.reason)
                response = connection.respond(HTTPStatus.UNAUTHORIZED, result.reason + "\n")
                response.headers["WWW-Authenticate"] = CHALLENGE
                return response
        if path == OBSERVE_PATH:
            if self.stopping:
                return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "server is shutting down\n")
            if len(self.observers) >= self.settings.max_observers:
                return _limit_reached(connection, "observer", self.settings.max_observers)
            denied = authorize(request)  # the observer channel's one access check
            if denied is not None:
                return connection.respond(denied[0], denied[1] + "\n")
            # Observers send small JSON frames: the robots' frame limit would let one buffer gigabytes.
            # (websockets reads this attribute for every frame; set before the first one is parsed.)
            connection.protocol.max_message_size = OBSERVER_MAX_MESSAGE_BYTES
            return None
        openpi = self.settings.openpi is not None and path in OPENPI_PATHS
        if path != REALTIME_PATH and not openpi:
            return connection.respond(HTTPStatus.NOT_FOUND, f"no endpoint at {path}; the policy endpoint is {REALTIME_PATH}\n")
        if self.stopping:
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "server is shutting down\n")
        if not self.ready:
            response = connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "model is loading; retry shortly\n")
            response.headers["Retry-After"] = "1"
            return response
        if len(self.sessions) >= self.settings.max_sessions:
            return _limit_reached(connection, "session", self.settings.max_sessions)
        return None

    # -- WebSocket sessions ----------------------------------------------------------------------------

    def _dashboard_response(self, connection: ServerConnection, path: str) -> Response:
        """The dashboard's static files, served on this port too (same origin as the observer channel)."""
        if path == DASHBOARD_PATH:  # relative asset URLs need the trailing slash
            response = connection.respond(HTTPStatus.MOVED_PERMANENTLY, "see /dashboard/\n")
            response.headers["Location"] = DASHBOARD_PATH + "/"
            response.headers.update(DASHBOARD_HEADERS)
            return response
        name = path[len(DASHBOARD_PATH) + 1:]
        if name == CONFIG_NAME:
            response = _json_response(connection, HTTPStatus.OK, dashboard_config(self.port))
            response.headers.update(DASHBOARD_HEADERS)
            return response
        asset = dashboard_asset(name)
        if asset is None:
            return connection.respond(HTTPStatus.NOT_FOUND, f"no dashboard file {name!r}\n")
        headers = Headers([("Content-Type", asset.content_type), ("Content-Length", str(len(asset.body))),
                           ("Server", SERVER_NAME), *DASHBOARD_HEADERS.items()])
        return Response(HTTPStatus.OK.value, "OK", headers, asset.body)

    async def _handle_connection(self, connection: ServerConnection) -> None:
        path = connection.request.path.split("?", 1)[0] if connection.request is not None else REALTIME_PATH
        if path == OBSERVE_PATH:  # an operator's dashboard: watches and steers, never a session itself
            if len(self.observers) >= self.settings.max_observers:  # admitted together at the last slot
                await connection.close(1013, f"observer limit reached ({self.settings.max_observers}); retry later")
                return
            observer = ObserverSession(connection, self)
            self.observers[observer.id] = observer
            try:
                await observer.run()
            finally:
                self.observers.pop(observer.id, None)
            return
        if len(self.sessions) >= self.settings.max_sessions:
            # Handshakes that passed the check in _process_request together: the later ones go (1013).
            await connection.close(1013, f"session limit reached ({self.settings.max_sessions}); retry later")
            return
        if path in OPENPI_PATHS and self.settings.openpi is not None:
            session: RealtimeSession | OpenpiSession = OpenpiSession(connection, self, self.settings.openpi)
        else:
            session = RealtimeSession(connection, self)
        self.sessions[session.id] = session
        logger.info("session %s opened from %s", session.id, connection.remote_address)
        try:
            await session.run()
        finally:
            self.sessions.pop(session.id, None)
            self._closed_sessions_dropped += session.dropped
            logger.info(
                "session %s closed (code %s): %d answered, %d dropped",
                session.id, connection.close_code, session.answered, session.dropped,
            )

    def metadata_frame(self, session_id: str) -> dict[str, Any]:
        d = self.description
        assert d is not None, "sessions open once the model is ready"
        limits = dict(d.raw.get("limits", {}))
        limits["max_message_bytes"] = self.settings.max_message_bytes
        limits["max_sessions"] = self.settings.max_sessions
        rate = self.settings.observation_rate
        limits["max_observations_per_s"] = rate.rate_hz if rate.enabled else None
        limits["observation_burst"] = rate.burst if rate.enabled else None
        connection_limits = self.settings.connection_limits
        limits["reply_timeout_s"] = connection_limits.reply_timeout_s or None
        limits["idle_timeout_s"] = connection_limits.idle_timeout_s or None
        return {
            "type": protocol.METADATA,
            "protocol_version": protocol.PROTOCOL_VERSION,
            "server": SERVER_NAME,
            "session_id": session_id,
            "model": d.model,
            "variant": d.variant,
            "modes": list(d.realtime_modes),
            "capabilities": {
                "streaming": True,
                "latest_observation_wins": True,
                "max_waiting_per_session": 1,
                "cancel": True,
                "reset": True,
                "deadlines": True,
                "prefix_actions": True,
                "session_controls": True,
            },
            "defaults": d.raw.get("defaults", {}),
            "action_horizon": d.raw.get("action_horizon", {}),
            "resolution_tiers": list(d.resolution_tiers),
            "view_points": list(d.view_points),
            "domains": {
                name: {"domain_id": domain.domain_id, "raw_action_dim": domain.raw_action_dim,
                       "default_horizon": domain.default_horizon, "view_point": domain.view_point,
                       **{name: getattr(domain, name) for name in STATE_PROFILE_FIELDS}}
                for name, domain in d.domains.items()
            },
            "limits": limits,
            "device": d.device,
            "dtype": d.dtype,
        }


def _json_response(connection: ServerConnection, status: HTTPStatus, body: dict[str, Any]) -> Response:
    response = connection.respond(status, json.dumps(body) + "\n")
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = "application/json"
    return response


def _limit_reached(connection: ServerConnection, what: str, limit: int) -> Response:
    """503 with Retry-After: ``limit`` connections of this kind (``session``, ``observer``) are open."""
    response = connection.respond(HTTPStatus.SERVICE_UNAVAILABLE,
                                  f"{what} limit reached: {limit} {what}s are open; retry later\n")
    response.headers["Retry-After"] = "5"
    return response
