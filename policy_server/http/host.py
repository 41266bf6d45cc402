"""What the HTTP sidecar sees of the server it runs beside: a narrow, typed face, never ``PolicyServer``.

The sidecar puts action generations into the server's request queue, answers health and readiness from
its state, describes the WebSocket port in ``/v1/actions/metadata`` and reserves file descriptors for it.
:class:`SidecarHost` lists exactly what it reads; :class:`HostSettings` the server settings among that.

TODO(integrator, issue 15): once ``policy_server.sessions.host.SessionHost`` exists, type the sidecar
against it (``SidecarHost = SessionHost``, adding there what it lacks from this list) and delete this file.
"""

from __future__ import annotations

from typing import Any, Protocol, Sized

from ..auth import OriginPolicy, TokenSet
from ..engine.backend import EngineBackend, QueueLike
from ..engine.description import ModelDescription


class HostSettings(Protocol):
    """The WebSocket server's settings the sidecar needs."""

    # An ssl.SSLContext: the sidecar serves https with the WebSocket port's certificate (None: http).
    ssl_context: Any
    auth_tokens: TokenSet | None
    max_message_bytes: int
    # Connections the robots' port may hold, reserved within the process's file descriptors.
    max_sessions: int
    max_pending_handshakes: int
    max_observers: int
    # Batching is on when above 1; the openpi endpoint is served when not None.
    max_batch: int
    openpi: object | None


class SidecarHost(Protocol):
    """The server as the sidecar sees it (``PolicyServer`` implements it)."""

    settings: HostSettings
    queue: QueueLike
    worker: EngineBackend | None
    # What the loaded model offers; None until it is loaded and warm.
    description: ModelDescription | None
    sessions: Sized
    stopping: bool
    started_at: float
    origins: OriginPolicy

    @property
    def ready(self) -> bool: ...

    @property
    def port(self) -> int: ...

    @property
    def dropped_observations(self) -> int: ...

    def own_ports(self) -> list[int]: ...
