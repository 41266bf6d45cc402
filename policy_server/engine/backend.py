"""What the server needs of whatever runs the engine: the local worker thread, or replicas elsewhere.

The server talks to its engine through two things only: a request queue (:class:`QueueLike`) and an
:class:`EngineBackend` that takes work from it and runs it: the local
:class:`~policy_server.engine.worker.EngineWorker` (``--backend local``, the default) or engine replicas
(``--backend ray``). A backend other than the local worker comes with its own queue, so the server asks a
:class:`BackendFactory` for both, handing it the narrow :class:`BackendHost` face of itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cosmos3_runtime.description import ModelDescription

    from .request_queue import EngineOutcome, EngineTask, PendingObservation
    from .worker import WorkerState


class EngineBackend(Protocol):
    """The engine as the server, the HTTP sidecar and the metrics see it.

    Lifecycle: :meth:`start` (returns at once; loading happens in the background), ``await``
    :meth:`wait_ready`, then work flows through the queue; at shutdown the server closes the queue and
    calls :meth:`stop`. Counters are totals since the start, over every engine the backend runs.
    """

    state: WorkerState
    description: ModelDescription | None
    thread_settings: dict[str, object]
    # Seconds spent running the engine; busy_since is when the running call started (None when idle).
    busy_s: float
    busy_since: float | None
    completed: int
    failed: int
    dropped_deadline: int
    batches: int
    batched_items: int
    # Set by the HTTP sidecar before start(); called on a backend thread after every batch.
    on_batch_done: Callable[[list[PendingObservation], list[EngineOutcome]], None] | None

    def start(self) -> None: ...

    async def wait_ready(self) -> ModelDescription: ...

    def stop(self, timeout: float | None = None) -> bool: ...

    @property
    def busy(self) -> bool:
        """Whether an engine runs work someone waits for (an observation still wanted, a video job)."""
        ...

    @property
    def orphaned(self) -> bool:
        """Whether an engine is finishing a call nobody waits for any more, and none runs wanted work."""
        ...

    def topology(self) -> dict[str, Any]:
        """Where the engine runs: ``{"backend": ..., "replicas": [{"replica": ..., "state": ...}, ...]}``."""
        ...


class QueueLike(Protocol):
    """The request queue's interface as sessions and the sidecar use it (RequestQueue provides it)."""

    def put(self, item: PendingObservation) -> PendingObservation | None: ...

    def put_background(self, task: EngineTask[Any]) -> None: ...

    def holds_back_decoding(self, session_id: Hashable, turn: Hashable | None = None) -> bool: ...

    def cancel(self, session_id: Hashable, seq: int | None = None) -> PendingObservation | None: ...

    def close(self) -> list[PendingObservation | EngineTask[Any]]: ...

    @property
    def closed(self) -> bool: ...

    @property
    def background_waiting(self) -> int: ...

    def __len__(self) -> int: ...


class EngineSharing(Protocol):
    """The server settings a backend shares its engines by (``ServerSettings`` has them)."""

    max_batch: int
    max_batch_wait_ms: float
    video_step_interval_s: float


class BackendHost(Protocol):
    """What a backend sees of the server that runs it (the server's wider session host provides it)."""

    @property
    def sessions(self) -> Mapping[str, Any]:
        """The open sessions, by id."""
        ...

    @property
    def settings(self) -> EngineSharing: ...

    def notify_sessions(self, event: str, details: dict[Hashable, dict[str, Any]]) -> None:
        """On the event loop: a ``session_event`` named ``event`` to each open session in ``details``
        (session id -> that session's fields of the event) whose protocol has session events."""
        ...


class BackendFactory(Protocol):
    """Makes a non-local backend and the queue it serves (see :class:`~policy_server.ray.backend.RayBackendFactory`)."""

    def make_queue(self) -> QueueLike: ...

    def make_backend(self, host: BackendHost, queue: QueueLike, loop: asyncio.AbstractEventLoop) -> EngineBackend: ...
