"""The narrow face of the server that sessions, the HTTP sidecar and engine backends see.

:class:`SessionHost` is everything a session (or the sidecar, or a backend) may use of the server: the
request queue, the loaded model's typed description and frame limits, the settings they read, whether
the server is ready or stopping, the registry of open sessions, the metadata it answers with, and a way
to tell sessions about something that happened on the server's side. ``PolicyServer`` implements it; only
the CLI (and tests) import ``PolicyServer`` itself, so nothing here depends on the server's module and the
server can import every session kind without a cycle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

from robot_clients.protocol import FrameLimits, SessionState

from ..auth import OriginPolicy, TokenSet
from ..engine.backend import EngineBackend, QueueLike
from ..engine.description import ModelDescription
from ..recording_setup import RecordingOptions, SessionRecorder
from .config import SessionConfig
from .controls import OperatorControl
from .openpi_settings import OpenpiSettings
from .rate_limits import RateLimit
from .supervisor import ConnectionSupervisor, SessionLimits
from .telemetry import SessionTelemetry


class HostSettings(Protocol):
    """The server's settings as sessions, the sidecar and backends read them (``ServerSettings``)."""

    max_message_bytes: int
    max_sessions: int
    max_batch: int
    max_batch_wait_ms: float
    video_step_interval_s: float
    ssl_context: Any
    openpi: OpenpiSettings | None
    auth_tokens: TokenSet | None
    observation_rate: RateLimit
    connection_limits: SessionLimits
    max_observers: int
    max_pending_handshakes: int  # with max_sessions and max_observers: the robots' port's descriptors
    observer_frame_rate: RateLimit
    recording: RecordingOptions | None  # --record-dir and the rest; None: nothing is recorded


class HostedSession(Protocol):
    """A robot session as the host's registry holds it (:class:`~policy_server.sessions.base.Session`).

    Everything observers, backends and the server read of a session is here, typed, the same for every
    session kind (a kind without telemetry or controls says so: ``telemetry`` None, ``controllable`` False).
    """

    id: str
    protocol: str  # "native", "openpi": which protocol the robot speaks
    controllable: bool  # operators may pause, resume, stop or re-prompt it
    config: SessionConfig | None
    state: SessionState
    state_reason: str
    telemetry: SessionTelemetry | None
    answered: int
    dropped: int
    recorded: bool  # its observations and replies are being recorded

    def set_recording(self, on: bool, reason: str = "") -> None: ...

    @property
    def remote(self) -> str | None:
        """The peer's ``host:port``."""
        ...

    def apply_control(self, control: OperatorControl) -> SessionState: ...

    def notify(self, event: str, details: Mapping[str, Any]) -> None: ...

    async def drain(self, timeout: float) -> None: ...


class SessionHost(Protocol):
    """What a session, the HTTP sidecar or a backend may use of the server (``PolicyServer`` provides it)."""

    settings: HostSettings
    queue: QueueLike
    # What the loaded model offers (None until it is loaded and warm), and the frame bounds it implies.
    description: ModelDescription | None
    frame_limits: FrameLimits
    # The engine (local worker or replicas); None before start().
    worker: EngineBackend | None
    supervisor: ConnectionSupervisor
    origins: OriginPolicy
    started_at: float
    stopping: bool
    recorder: SessionRecorder | None  # started with --record-dir; None: nothing can be recorded
    # Observations accepted with a robot state their domain does not condition on, by protocol.
    unused_state: Counter[str]

    @property
    def ready(self) -> bool:
        """The model is loaded and warm (and its description read)."""
        ...

    @property
    def port(self) -> int:
        """The WebSocket port."""
        ...

    def own_ports(self) -> list[int]: ...

    @property
    def sessions(self) -> Mapping[str, HostedSession]:
        """Open robot sessions by id (read-only: sessions come and go through register/unregister)."""
        ...

    def register(self, session: HostedSession) -> None: ...

    def unregister(self, session: HostedSession) -> None: ...

    @property
    def dropped_observations(self) -> int:
        """Observations answered ``dropped`` since the start, by open and closed sessions."""
        ...

    def metadata(self, session_id: str, kind: str) -> dict[str, Any]:
        """The hello a session of ``kind`` (``native``) sends first (policy_server.metadata)."""
        ...

    def notify_sessions(self, event: str, details: Mapping[str, Mapping[str, Any]]) -> None:
        """Tell each session named in ``details`` (session id -> that session's fields) that ``event``
        happened on the server's side (e.g. ``replica_moved``). Sessions whose protocol has no such frame
        (openpi) carry on without one; ids of sessions that have gone are skipped."""
        ...

    def health(self) -> dict[str, Any]:
        """The ``/healthz`` body (policy_server.metadata.health_body)."""
        ...
