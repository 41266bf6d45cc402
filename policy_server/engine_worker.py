"""The one thread that owns the engine: it loads the model, warms it up, and runs requests one by one.

The asyncio event loop never runs model code. It puts observations in the :class:`RequestQueue`; this
thread takes them in the queue's fair order, drops those whose deadline has passed, runs the rest
through ``engine.predict_actions`` and hands every outcome back to the event loop with
``loop.call_soon_threadsafe``: the session that owns the observation (``PendingObservation.owner``)
gets ``on_result(item, outcome)`` or ``on_dropped(item, reason)`` on the loop's thread, where it is safe
to touch sockets. A session that has gone away simply ignores the outcome: a client vanishing
mid-inference costs that one inference and nothing else.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from cosmos3_runtime.errors import RuntimeErrorBase
from cosmos3_runtime.requests import ActionChunk, ActionRequest

from .cpu_threads import configure_worker_threads
from .protocol import DropReason, ErrorCode
from .request_queue import PendingObservation, RequestQueue

logger = logging.getLogger(__name__)


class ActionEngine(Protocol):
    """What the worker needs of an engine (``cosmos3_runtime.engine.Cosmos3Engine`` provides it)."""

    def predict_actions(self, request: ActionRequest) -> ActionChunk: ...

    def warmup(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class WorkerState(str, enum.Enum):
    STARTING = "starting"
    LOADING = "loading"
    WARMING_UP = "warming_up"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass
class EngineOutcome:
    """What the engine made of one observation: a chunk, or an error to send to the client."""

    chunk: ActionChunk | None = None
    error_code: str | None = None
    error_message: str | None = None
    error_field: str | None = None
    engine_ms: float = 0.0
    done_at: float = 0.0


class EngineWorker:
    """Owns the engine on a dedicated thread. Start it, await :meth:`wait_ready`, then feed its queue.

    ``load_engine`` is called on the worker thread (the engine is created, used and dropped by one
    thread only). ``warmup`` runs the engine's own warm-up before the worker reports ready.
    """

    def __init__(
        self,
        load_engine: Callable[[], ActionEngine],
        queue: RequestQueue,
        loop: asyncio.AbstractEventLoop,
        *,
        torch_threads: int | None = None,
        warmup: bool = True,
    ) -> None:
        self._load_engine = load_engine
        self._queue = queue
        self._loop = loop
        self._torch_threads = torch_threads
        self._warmup = warmup
        self._ready = loop.create_future()
        self._thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self.state = WorkerState.STARTING
        self.description: dict[str, Any] | None = None
        self.thread_settings: dict[str, object] = {}
        self.current: PendingObservation | None = None
        self.completed = 0
        self.failed = 0
        self.dropped_deadline = 0

    # -- control, from the event loop ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    async def wait_ready(self) -> dict[str, Any]:
        """Wait until the model is loaded and warm; return its ``describe()``. Raises if loading failed."""
        return await asyncio.shield(self._ready)

    def stop(self, timeout: float | None = None) -> bool:
        """Wait for the running request (if any) to finish and the thread to exit. True if it exited.

        Close the queue first, or the worker will keep taking requests.
        """
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def busy(self) -> bool:
        return self.current is not None

    # -- the worker thread -------------------------------------------------------------------------

    def _post(self, callback: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the event loop is closed: the server is gone and nobody is waiting

    def _run(self) -> None:
        try:
            self.thread_settings = configure_worker_threads(self._torch_threads)
            logger.info("engine worker threads: %s", self.thread_settings)
            self.state = WorkerState.LOADING
            t0 = time.monotonic()
            engine = self._load_engine()
            self.description = engine.describe()
            logger.info("model loaded in %.1f s: %s", time.monotonic() - t0, self.description.get("model"))
            if self._warmup:
                self.state = WorkerState.WARMING_UP
                t0 = time.monotonic()
                engine.warmup()
                logger.info("model warmed up in %.1f s", time.monotonic() - t0)
        except BaseException as exc:  # noqa: BLE001 - any failure here means "not ready", reported once
            logger.exception("the engine failed to load")
            self.state = WorkerState.FAILED
            self._post(_set_exception, self._ready, exc)
            return
        self.state = WorkerState.READY
        self._post(_set_result, self._ready, self.description)
        try:
            self._serve(engine)
        finally:
            self.state = WorkerState.STOPPED

    def _serve(self, engine: ActionEngine) -> None:
        while True:
            item = self._queue.take()
            if item is None:  # queue closed: the server is stopping
                return
            if item.expired(time.monotonic()):
                self.dropped_deadline += 1
                self._post(item.owner.on_dropped, item, DropReason.DEADLINE)
                continue
            self.current = item
            try:
                outcome = self._predict(engine, item)
            finally:
                self.current = None
            self._post(item.owner.on_result, item, outcome)

    def _predict(self, engine: ActionEngine, item: PendingObservation) -> EngineOutcome:
        t0 = time.monotonic()
        try:
            chunk = engine.predict_actions(item.request)
        except RuntimeErrorBase as exc:
            # The engine's typed errors are the client's to see: a stable code, a message, a field.
            self.failed += 1
            code = exc.code if exc.code != "checkpoint_error" else ErrorCode.ENGINE_ERROR
            return EngineOutcome(
                error_code=code,
                error_message=exc.message,
                error_field=exc.field,
                engine_ms=(time.monotonic() - t0) * 1e3,
                done_at=time.monotonic(),
            )
        except Exception:  # noqa: BLE001 - an internal failure: log the traceback, tell the client little
            self.failed += 1
            reference = uuid.uuid4().hex[:12]
            logger.exception("engine failed on seq %s of session %s (ref %s)", item.seq, item.session_id, reference)
            return EngineOutcome(
                error_code=ErrorCode.ENGINE_ERROR,
                error_message=f"the model failed on this observation; the server log has details (ref {reference})",
                engine_ms=(time.monotonic() - t0) * 1e3,
                done_at=time.monotonic(),
            )
        self.completed += 1
        done = time.monotonic()
        return EngineOutcome(chunk=chunk, engine_ms=(done - t0) * 1e3, done_at=done)


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
