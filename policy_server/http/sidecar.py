"""The HTTP sidecar's lifecycle: FastAPI on uvicorn, on its own port, in the WebSocket server's process
and event loop.

:class:`HttpSidecar` opens the video job store, starts the job runner, builds the app and serves it; at
shutdown it stops them in the reverse order. Model code never runs on the event loop, and neither does
SQLite: the store is opened, recovered and closed on helper threads (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
import time
from typing import Any

from ..connection_limits import PeerCounter, capped_to_descriptors
from ..context import ServerContext
from ..metrics import ServerMetrics, ServerStateReaders
from ..videos.job_store import VideoJobStatus, VideoJobStore
from ..videos.runner import VideoJobRunner
from .app import build_app
from .bodies import BodyBudget
from .context import SidecarParts
from .middleware import UNMATCHED
from .serving import UvicornServing, bound_socket
from .settings import SidecarSettings
from .turns import InFlightLimit

logger = logging.getLogger(__name__)


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
        return self._socket.getsockname()[1]

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
