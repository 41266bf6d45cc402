"""The server's context: the one object the server builds and hands to its sessions, the HTTP sidecar, the
engine backends and the features attached at the edge.

It holds what they share and nothing else: the settings, the request queue, the loaded model's typed
description and frame limits, the engine backend, the connection supervisor, the Origin policy, whether
the server is stopping, the registry of open sessions, the recordings a session may start, and what the
features add to ``/healthz`` and ``/metrics``. :class:`~policy_server.assembly.server.PolicyServer` owns the
lifecycle (listening, starting and stopping the engine, shutdown) and keeps this object up to date; only
the command line imports the server itself, so the sessions, the sidecar and the backends depend on this
module alone.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from cosmos3_runtime.description import ModelDescription
from robot_clients.protocol import FrameLimits

from .engine.backend import EngineBackend, QueueLike
from .engine.worker import WorkerState
from .foundation.auth import OriginPolicy
from .foundation.connection_supervisor import ConnectionSupervisor, Supervised
from .server_settings import ServerSettings
from .session_events import SessionListener


class RegisteredSession(Supervised, Protocol):
    """What the registry itself uses of a session it holds (every kind of robot session has it): the
    supervisor's view of a connection, its drop count, and how it hears of server-side events."""

    @property
    def dropped(self) -> int: ...

    def notify(self, event: str, details: Mapping[str, Any]) -> None: ...


SessionT = TypeVar("SessionT", bound=RegisteredSession)


@dataclass(frozen=True)
class SessionRecordings:
    """How sessions are recorded, when a recording feature is attached (``recording.feature.RecordingFeature``).

    ``listener(session_id, protocol)`` is a new recording of that session, as a listener of its events;
    ``every_session``: each session is recorded from its first ``configure`` (else only those that opt in);
    ``root``: the directory the recordings are written to (the sidecar lists and replays them from there).
    """

    listener: Callable[[str, str], SessionListener]
    every_session: bool
    root: Path


class ServerContext(Generic[SessionT]):
    """What a session, the sidecar, a backend or a feature may use of the server (see the module docstring)."""

    def __init__(self, settings: ServerSettings, queue: QueueLike) -> None:
        self.settings = settings
        self.queue = queue
        # What the loaded model offers (None until it is loaded and warm), and the frame bounds it implies.
        self.description: ModelDescription | None = None
        self.frame_limits = FrameLimits()
        self.worker: EngineBackend | None = None  # the engine (local worker or replicas); None before start()
        self.origins = OriginPolicy(settings.allowed_origins)
        self.started_at = time.monotonic()
        self.stopping = False
        self.port: int | None = None  # the WebSocket port, once listening
        self.other_ports: list[int] = []  # the features' own ports (the sidecar's)
        self.recordings: SessionRecordings | None = None  # None: nothing can be recorded
        # What features add to the /healthz body and to /metrics, by name (the recording's state and counters).
        self.health_parts: dict[str, Callable[[], Any]] = {}
        self.stats: dict[str, Callable[[], dict[str, Any]]] = {}
        self._sessions: dict[str, SessionT] = {}
        self.sessions: Mapping[str, SessionT] = MappingProxyType(self._sessions)
        self.observers: dict[str, Supervised] = {}
        self.supervisor = ConnectionSupervisor(
            lambda: [*self._sessions.values(), *self.observers.values()], settings.session_limits
        )
        self._closed_sessions_dropped = 0
        # Observations whose robot state the served domain does not use, by protocol (`/metrics`).
        self.unused_state: Counter[str] = Counter()

    @property
    def ready(self) -> bool:
        """The model is loaded and warm (and its description read)."""
        return self.worker is not None and self.worker.state is WorkerState.READY and self.description is not None

    def own_ports(self) -> list[int]:
        """This server's ports (WebSocket, then the features'): a page on the same host and one of them is ours."""
        return ([self.port] if self.port is not None else []) + self.other_ports

    # -- the registry of open robot sessions ----------------------------------------------------------

    def register(self, session: SessionT) -> None:
        self._sessions[session.id] = session

    def unregister(self, session: SessionT) -> None:
        if self._sessions.pop(session.id, None) is not None:
            self._closed_sessions_dropped += session.dropped

    @property
    def dropped_observations(self) -> int:
        """Observations answered ``dropped`` since the start, by open and closed sessions."""
        return self._closed_sessions_dropped + sum(s.dropped for s in list(self._sessions.values()))

    def notify_sessions(self, event: str, details: Mapping[Any, Mapping[str, Any]]) -> None:
        """Tell each session named in ``details`` (session id -> that session's fields) that ``event``
        happened on the server's side (e.g. ``replica_moved``). Sessions whose protocol has no such frame
        (openpi) carry on without one; ids of sessions that have gone are skipped."""
        for session_id, fields in details.items():
            session = self._sessions.get(session_id)
            if session is not None:
                session.notify(event, fields)
