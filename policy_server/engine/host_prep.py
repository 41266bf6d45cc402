"""The host's work on the next observations, done while the engine runs the current batch.

Every observation needs host work before its forwards can start: validation, and its frames resized and
normalised into the model's canvas (an engine's ``prepare_actions``). Done on the engine thread, that
work sits between two batches and the device waits for it. :class:`HostPrep` is a small thread that does
it instead for the observations waiting in the queue while the engine thread is inside an engine call
(:meth:`HostPrep.overlapping`); when the worker takes a batch it :meth:`HostPrep.claim` s what is ready
and prepares only the rest itself.

Nothing about which observation runs when changes: the prep thread only *looks* at the queue
(:meth:`~policy_server.engine.request_queue.RequestQueue.waiting`), never takes from it. Prepared inputs
belong to one :class:`~policy_server.engine.request_queue.PendingObservation` object, so an observation
superseded by a newer one of its session (latest wins), or cancelled, is never served from them: its
inputs are dropped at the next look, and the newer observation is prepared on its own. Deadlines, turns,
batching and the video share are the worker's as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from cosmos3_runtime.requests import ActionChunk, ActionRequest

from .batch_call import EngineCounters
from .cpu_threads import configure_worker_threads

if TYPE_CHECKING:
    from .request_queue import PendingObservation, RequestQueue

logger = logging.getLogger(__name__)


def splits_host_work(engine: object) -> bool:
    """Whether ``engine``'s class defines both halves of :class:`PreparingEngine`.

    The class, not the instance: a wrapper that forwards unknown attributes to an engine it wraps (one
    that delays, fails or loses calls in tests) but overrides only ``predict_actions_batch`` must be
    called through that override, not have its inner engine's halves used behind its back.
    """
    return all(callable(getattr(type(engine), name, None)) for name in ("prepare_actions", "predict_prepared"))


class PreparingEngine(Protocol):
    """An engine whose requests can be prepared ahead (``cosmos3_runtime.engine.Cosmos3Engine``).

    ``prepare_actions`` is host work and may run on any thread; ``predict_prepared`` runs on the engine's
    thread and answers each prepared request with its chunk or its error, in order.
    """

    def prepare_actions(self, request: ActionRequest) -> Any: ...

    def predict_prepared(self, prepared: list[Any]) -> list[ActionChunk | Exception]: ...


class HostPrep:
    """Prepares the next ``lookahead`` waiting observations while the engine thread runs a call.

    Start it, register nothing: it listens to ``queue`` itself. The engine thread wraps each engine call
    in :meth:`overlapping` and takes prepared inputs with :meth:`claim`. :meth:`stop` ends the thread.
    """

    def __init__(self, engine: PreparingEngine, queue: RequestQueue, lookahead: int, name: str) -> None:
        self._engine = engine
        self._queue = queue
        self._lookahead = max(1, lookahead)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._ready: dict[PendingObservation, Any] = {}  # by identity (PendingObservation compares by id)
        self._preparing: PendingObservation | None = None
        self._calls_running = 0  # engine calls in progress (a video step can hold a robot batch's call)
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._queue.add_listener(self._queue_changed)
        self._thread.start()

    def stop(self) -> None:
        """Stop preparing (an item being prepared now finishes first); returns at once."""
        self._queue.remove_listener(self._queue_changed)
        with self._lock:
            self._stopped = True
            self._ready.clear()
            self._changed.notify_all()

    @contextmanager
    def overlapping(self) -> Iterator[None]:
        """Around an engine call on the engine thread: waiting observations are prepared meanwhile."""
        with self._lock:
            self._calls_running += 1
            self._changed.notify_all()
        try:
            yield
        finally:
            with self._lock:
                self._calls_running -= 1

    def claim(self, batch: list[PendingObservation]) -> list[Any | None]:
        """The prepared inputs of each observation of ``batch`` (None: not prepared), handed over once.

        If one of them is being prepared right now, waits for it: the engine thread would only do the
        same work again."""
        with self._lock:
            while self._preparing is not None and any(item is self._preparing for item in batch):
                self._changed.wait()
            return [self._ready.pop(item, None) for item in batch]

    def holds(self, item: PendingObservation) -> bool:
        """Whether inputs prepared for ``item`` are held, ready to be claimed."""
        with self._lock:
            return self._ready.get(item) is not None

    # -- the prep thread ---------------------------------------------------------------------------

    def _queue_changed(self) -> None:
        """Called by the queue (after it let go of its lock, on any thread) when an observation arrives."""
        with self._lock:
            self._changed.notify_all()

    def _next(self) -> PendingObservation | None:
        """Wait until an engine call runs and a waiting observation is not prepared yet; None once stopped."""
        with self._lock:
            while not self._stopped:
                if self._calls_running:
                    waiting = self._queue.waiting(self._lookahead)
                    # Inputs of an observation no longer waiting and never taken (superseded, cancelled)
                    # are dropped; those of one taken stay until the engine thread claims them.
                    for item in [item for item in self._ready if item.taken_at is None and item not in waiting]:
                        del self._ready[item]
                    todo = next((item for item in waiting if item not in self._ready), None)
                    if todo is not None:
                        self._preparing = todo
                        return todo
                self._changed.wait()
            return None

    def _run(self) -> None:
        # One torch thread: the preparation of one frame is small, and the engine thread's pool has every
        # core but one (cpu_threads); a second full pool here would take cores from the forward it overlaps.
        configure_worker_threads(1)
        while (item := self._next()) is not None:
            started = time.monotonic()
            try:
                prepared = self._engine.prepare_actions(item.request)
            except Exception:  # noqa: BLE001 - the engine thread prepares it itself and reports the failure
                logger.exception("preparing seq %s of session %s ahead failed", item.seq, item.session_id)
                prepared = None
            self._queue.charge(item, time.monotonic() - started)  # its turn pays for it (request_queue)
            with self._lock:
                self._preparing = None
                if not self._stopped:  # None (it failed) is kept too, so it is not tried again
                    self._ready[item] = prepared
                self._changed.notify_all()


def host_inputs(
    engine: object,
    taken: list[tuple[PendingObservation, Any]],
    counters: EngineCounters,
    charge: Callable[[PendingObservation, float], None] | None = None,
) -> list[Any] | None:
    """Each taken observation's prepared inputs: those made ahead (claimed), the rest made now on the
    engine thread (the engine idle meanwhile), each one's time passed to ``charge`` (its turn pays for
    it); None for an engine that does not split its work, or if preparing raised (a bug, not a bad
    request: the request path then reports it per observation)."""
    if not splits_host_work(engine):
        return None
    inputs = []
    for item, prepared in taken:
        if prepared is None:
            counters.inline_preps += 1
            started = time.monotonic()
            try:
                prepared = engine.prepare_actions(item.request)
            except Exception:  # noqa: BLE001 - see above
                logger.exception("preparing seq %s of session %s failed", item.seq, item.session_id)
                return None
            if charge is not None:
                charge(item, time.monotonic() - started)
        else:
            counters.overlapped_preps += 1
        inputs.append(prepared)
    return inputs


class IdleGaps:
    """How long the engine sits idle between two calls while an observation waits: what the overlap removes.

    The worker calls :meth:`call_ended` when an engine call (or a video step) ends and
    :meth:`call_starting` just before the next batch's call; a gap runs from the later of the last
    call's end and the batch's oldest arrival. Counted in ``counters.idle_gaps`` and ``idle_gap_s``;
    the recent ones, in seconds, in :attr:`samples`.
    """

    def __init__(self, counters: EngineCounters) -> None:
        self.counters = counters
        self.samples: deque[float] = deque(maxlen=1024)
        self._ended_at: float | None = None  # None before the first call

    def call_ended(self) -> None:
        self._ended_at = time.monotonic()

    def call_starting(self, batch: list[PendingObservation]) -> None:
        if self._ended_at is None:
            return
        gap = time.monotonic() - max(self._ended_at, min(item.enqueued_at for item in batch))
        if gap >= 0:
            self.counters.idle_gaps += 1
            self.counters.idle_gap_s += gap
            self.samples.append(gap)
