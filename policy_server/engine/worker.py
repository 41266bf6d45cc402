"""The one thread that owns the engine: it loads the model, warms it up, and runs requests batch by batch.

It takes observations in the queue's fair order, several at once when their requests can share
transformer calls (:class:`BatchPolicy`), drops those whose deadline has passed, skips those nobody waits
for any more (their session closed while they were held for batch company: orphans; a call already running
whose every observation is orphaned is reported by :attr:`EngineWorker.orphaned`), runs the rest and posts
every outcome to its owner on the event loop (``loop.call_soon_threadsafe``). Background tasks run when no
observation waits, and otherwise get a bounded share (:class:`BackgroundShare`), so a video finishes under any
robot load while a robot waits at most one extra step per interval.

While an engine call runs, :class:`HostPrep` (a small thread) prepares the observations waiting next, so
the device does not wait for the host between batches. A batched call that fails is retried request by
request, so only the request at fault gets the error; an engine that went away (a Ray replica) raises
:class:`~.request_queue.EngineLost` and the call's work goes to ``on_engine_lost`` unanswered. A hung call is
abandoned (:meth:`EngineWorker.abandon_hung_call`): Python cannot kill a thread, so a new one loads a
fresh engine, and only the current thread may post outcomes, take work or touch the worker's state.

A hung call is noticed by the watchdog (:mod:`.watchdog`); the worker's torch threads follow the thread
policy (:mod:`.thread_policy`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, TypeVar

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.requests import ActionRequest, ActionResult
from robot_clients.protocol import CodedError, DropReason, ErrorCode

from .request_queue import EngineLost, EngineOutcome, EngineTask, PendingObservation, RequestQueue, engine_failure
from .thread_policy import configure_worker_threads

if TYPE_CHECKING:
    from cosmos3_runtime.frame_preprocessing import PreparedActions

logger = logging.getLogger(__name__)


T = TypeVar("T")


# -- how the worker shares the engine: which observations run together, how much background work gets -


@dataclass(frozen=True)
class BatchPolicy:
    """How the worker groups waiting observations of different sessions into one engine call.

    ``max_batch`` 1 turns batching off. ``max_wait_ms`` is the longest an observation may be held so
    others can join it; the default 0 only batches what is already waiting, so batching never adds
    latency, it only shares forwards when several robots wait at once.

    ``overlap_host_prep``: while a batch runs, a host thread prepares the next ``max_batch`` waiting
    observations (validation, frames into the model's canvas), so the engine does not wait for that
    work between batches (``HostPrep`` in :mod:`policy_server.engine.worker`).
    """

    max_batch: int = 4
    max_wait_ms: float = 0.0
    overlap_host_prep: bool = True

    @staticmethod
    def compatible(a: PendingObservation, b: PendingObservation) -> bool:
        """Same schedule (steps, guidance, interval, shift): the engine can run them through shared forwards.

        The requests carry an observation's own settings merged over its session's, so this compares
        what each will actually run with. The schedule is all that must match: every other setting of
        the request (``robot_clients.client_frames.REQUEST_SETTINGS``), and the prefix, is per item in a
        packed forward, and a batched chunk equals its unbatched run.

        And the same kind of owner: a robot session's observation never carries a one-shot HTTP request
        (one that waits for a shared turn) in its engine call. Where a batch costs more than one request
        (CPUs), that would make the robot pay for the client's work on top of waiting for its turn.
        """
        ra, rb = a.request, b.request
        return ra.schedule == rb.schedule and _robot(a) == _robot(b)


def _robot(item: PendingObservation) -> bool:
    """A robot's observation: on its session's own turn, or on its connection's (a policy session)."""
    return item.turn is None or item.turn_shares_call


# Under continuous robot load, a video rollout still gets one denoising step at least this often.
DEFAULT_VIDEO_STEP_INTERVAL_S = 1.0


@dataclass(frozen=True)
class BackgroundShare:
    """The engine's share for background work (video rollouts) while observations wait.

    Robots go first, but not forever. Once background work has waited ``interval_s`` for the engine
    (since its last step ended, or since it was queued), the worker gives it one step (a denoising
    step; at the end of a rollout, the decode) and then goes back to the waiting robots. So under any
    robot load a video advances at least one step per ``interval_s`` (plus the robot batch running when
    it fell due) and finishes, and a robot waits at most one extra step per ``interval_s``.
    ``interval_s`` 0: no share; background work runs only while no observation waits, and can starve.
    """

    interval_s: float = DEFAULT_VIDEO_STEP_INTERVAL_S

    def due_at(self, waiting_since: float) -> float | None:
        """When work that has waited since ``waiting_since`` is owed a turn; None: never (no share)."""
        return waiting_since + self.interval_s if self.interval_s > 0 else None


# -- the worker -------------------------------------------------------------------------------------


class ActionEngine(Protocol):
    """What the worker needs of an engine (``cosmos3_runtime.engine.Cosmos3Engine`` provides it, and the
    Ray backend's ``RemoteEngine``)."""

    def predict_actions(self, request: ActionRequest) -> ActionResult: ...

    def predict_actions_batch(self, requests: list[ActionRequest]) -> Sequence[ActionResult | Exception]: ...

    def warmup(self) -> None: ...

    def describe(self) -> ModelDescription: ...


class PreparingEngine(ActionEngine, Protocol):
    """An engine whose requests can be prepared ahead (``Cosmos3Engine``; not a remote one).

    ``prepare_actions`` is host work and may run on any thread; ``predict_prepared`` runs on the engine's
    thread and answers each prepared request with its chunk or its error, in order.
    """

    def prepare_actions(self, request: ActionRequest) -> PreparedActions: ...

    def predict_prepared(self, prepared: list[PreparedActions]) -> Sequence[ActionResult | Exception]: ...


def splits_host_work(engine: ActionEngine) -> TypeGuard[PreparingEngine]:
    """Whether ``engine``'s class defines both halves of :class:`PreparingEngine`.

    The class, not the instance: a wrapper that forwards unknown attributes to an engine it wraps (one
    that delays, fails or loses calls in tests) but overrides only ``predict_actions_batch`` must be
    called through that override, not have its inner engine's halves used behind its back.
    """
    return all(callable(getattr(type(engine), name, None)) for name in ("prepare_actions", "predict_prepared"))


# Called on the worker thread with the observations and background tasks of a call whose engine was lost.
LostWorkHandler = Callable[[list[PendingObservation], list[EngineTask[Any]]], None]


@dataclass
class EngineCounters:
    """What a worker has done since it started (the backend interface reads them one by one)."""

    completed: int = 0
    failed: int = 0
    dropped_deadline: int = 0
    # Observations taken from the queue whose owner stopped waiting before their engine call started.
    orphans_skipped: int = 0
    batches: int = 0
    batched_items: int = 0
    # Seconds spent running the engine (observations and background tasks), for the busy fraction.
    busy_s: float = 0.0
    # Host inputs of observations (engine.prepare_actions): made while an earlier call ran (overlapped),
    # or on the engine thread just before their own call (inline, the device idle meanwhile).
    overlapped_preps: int = 0
    inline_preps: int = 0
    # Times the engine sat idle between two calls while an observation waited, and those seconds.
    idle_gaps: int = 0
    idle_gap_s: float = 0.0

    def __add__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(*(mine + theirs for mine, theirs in zip(astuple(self), astuple(other))))


class CounterReadouts:
    """The counters of :class:`~policy_server.engine.backend.EngineBackend`, read from ``self.counters``."""

    counters: EngineCounters

    completed = property(lambda self: self.counters.completed)
    failed = property(lambda self: self.counters.failed)
    dropped_deadline = property(lambda self: self.counters.dropped_deadline)
    batches = property(lambda self: self.counters.batches)
    batched_items = property(lambda self: self.counters.batched_items)
    busy_s = property(lambda self: self.counters.busy_s)


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


class HostPrep:
    """Prepares the next ``lookahead`` waiting observations while the engine thread runs a call.

    Start it, register nothing: it listens to ``queue`` itself. The engine thread wraps each engine call
    in :meth:`overlapping` and takes prepared inputs with :meth:`claim`. :meth:`stop` ends the thread.
    Prepared inputs belong to one :class:`PendingObservation` object: one superseded by a newer observation
    of its session, or cancelled, is never served from them (they are dropped at the next look).
    """

    def __init__(self, engine: PreparingEngine, queue: RequestQueue, lookahead: int, name: str) -> None:
        self._engine = engine
        self._queue = queue
        self._lookahead = max(1, lookahead)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        # By identity (PendingObservation compares by id); None: preparing it failed (not tried again).
        self._ready: dict[PendingObservation, PreparedActions | None] = {}
        self._preparing: PendingObservation | None = None
        self._calls_running = 0  # engine calls in progress (a video step can hold a robot batch's call)
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._queue.add_listener(self._queue_changed)
        self._thread.start()

    def stop(self, *, wait: bool = False) -> None:
        """Stop preparing; an item being prepared now finishes first. Returns at once, or with ``wait``
        once the prep thread has exited.

        The engine thread waits: the prep thread holds the engine, and whichever thread drops the last
        reference frees its tensors. A daemon thread still freeing them while the interpreter shuts down
        aborts the process (``terminate called without an active exception``).
        """
        self._queue.remove_listener(self._queue_changed)
        with self._lock:
            self._stopped = True
            self._ready.clear()
            self._changed.notify_all()
        if wait and self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join()

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

    def claim(self, batch: list[PendingObservation]) -> list[PreparedActions | None]:
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
        # core but one (configure_worker_threads); a second full pool here would take cores from the forward
        # it overlaps.
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


class WorkerState(str, enum.Enum):
    STARTING = "starting"
    LOADING = "loading"
    WARMING_UP = "warming_up"
    READY = "ready"
    RESTARTING = "restarting"  # the watchdog abandoned a hung engine call; a fresh engine is loading
    FAILED = "failed"
    STOPPED = "stopped"


class EngineWorker(CounterReadouts):
    """Owns the engine on a dedicated thread. Start it, await :meth:`wait_ready`, then feed its queue.

    ``load_engine`` is called on the worker thread (the engine is created, used and dropped by one
    thread only). ``warmup`` runs the engine's own warm-up before the worker reports ready. ``name``
    names the thread. ``on_engine_lost`` receives, on the worker thread, the work of a call whose
    engine raised :class:`~policy_server.engine.request_queue.EngineLost`, to queue it again elsewhere; without
    it, that work fails with ``engine_error`` like the work of an abandoned call.
    """

    def __init__(
        self,
        load_engine: Callable[[], ActionEngine],
        queue: RequestQueue,
        loop: asyncio.AbstractEventLoop,
        *,
        torch_threads: int | None = None,
        warmup: bool = True,
        batching: BatchPolicy | None = None,
        background: BackgroundShare | None = None,
        name: str = "engine-worker",
        on_engine_lost: LostWorkHandler | None = None,
    ) -> None:
        self._load_engine = load_engine
        self._queue = queue
        self._loop = loop
        self._torch_threads = torch_threads
        self._warmup = warmup
        self.batching = batching or BatchPolicy()
        self.background = background or BackgroundShare()
        self.name = name
        self.on_engine_lost = on_engine_lost
        # When background work last had the engine (the end of its last step): its share is counted from there.
        self._background_turn_at = 0.0
        self._ready: asyncio.Future[ModelDescription] = loop.create_future()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.state = WorkerState.STARTING
        self.description: ModelDescription | None = None
        self.thread_settings: dict[str, object] = {}
        self.current: list[PendingObservation] = []
        self.current_task: EngineTask[Any] | None = None
        self.counters = EngineCounters()
        # When the running call started, for the busy fraction (None when idle).
        self.busy_since: float | None = None
        # Called on this thread after every batch, for metrics; it must be quick and must not raise.
        self.on_batch_done: Callable[[list[PendingObservation], list[EngineOutcome]], None] | None = None
        # When the engine call now running started (a video job: its current step); None when idle.
        # The watchdog compares it with --engine-timeout-s.
        self.call_started_at: float | None = None
        self.restarts = 0
        # Prepares waiting observations while an engine call runs (None: off, or the engine cannot split).
        self.host_prep: HostPrep | None = None
        self.idle_gaps = IdleGaps(self.counters)

    # -- control, from the event loop ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    async def wait_ready(self) -> ModelDescription:
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
        """Whether the engine runs work someone waits for: an observation its owner still wants, or a
        background task (a video job, polled by its client)."""
        return self.current_task is not None or any(not item.cancelled for item in list(self.current))

    @property
    def orphaned(self) -> bool:
        """Whether the engine is finishing a call nobody waits for any more (every observation in it was
        cancelled or its session closed after the call started): a forward cannot be interrupted, its result
        will be discarded, and the engine is free once it returns."""
        current = list(self.current)
        return bool(current) and self.current_task is None and all(item.cancelled for item in current)

    def topology(self) -> dict[str, Any]:
        """One engine, in this process (the Ray backend reports its replicas the same way)."""
        # failovers: engines the watchdog abandoned and reloaded (cosmos3_replica_failovers{replica="0"}).
        return {
            "backend": "local",
            "replicas": [
                {
                    "replica": 0,
                    "state": self.state.value,
                    "completed": self.completed,
                    "failed": self.failed,
                    "busy_s": self.busy_s,
                    "failovers": self.restarts,
                }
            ],
        }

    def abandon_hung_call(self, timeout_s: float) -> None:
        """On the event loop: fail the hung call's requests with ``engine_timeout`` and reload the engine.

        The stuck thread cannot be stopped; it is left behind and whatever it produces is discarded.
        """
        items, task = list(self.current), self.current_task
        stuck_for = time.monotonic() - self.call_started_at if self.call_started_at is not None else 0.0
        self.current, self.current_task, self.call_started_at = [], None, None
        self._stop_busy_clock()
        if self.host_prep is not None:
            self.host_prep.stop()
            self.host_prep = None
        self.restarts += 1
        self.state = WorkerState.RESTARTING
        reference = uuid.uuid4().hex[:12]
        logger.error(
            "engine call stuck for %.1f s (limit %g s, ref %s): failing %d request(s)%s, abandoning thread %s "
            "and loading a fresh engine",
            stuck_for,
            timeout_s,
            reference,
            len(items),
            " and a background task" if task is not None else "",
            self._thread.name,
        )
        error = CodedError(
            ErrorCode.ENGINE_TIMEOUT,
            f"the engine did not finish within {timeout_s:g} s; the server is "
            f"restarting it (ref {reference}). Retry once it is ready",
        )
        self._fail(items, [task] if task is not None else [], error, stuck_for * 1e3, _call_now)
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-{self.restarts}", daemon=True)
        self._thread.start()

    def _fail(
        self,
        items: list[PendingObservation],
        tasks: list[EngineTask[Any]],
        error: CodedError,
        engine_ms: float,
        deliver: Callable[..., Any],
    ) -> None:
        """Answer work that will not be done with ``error`` (``deliver(callback, *args)`` calls its owners)."""
        self.counters.failed += len(items) + len(tasks)
        for item in items:
            deliver(
                item.owner.on_result, item, EngineOutcome(error=error, engine_ms=engine_ms, done_at=time.monotonic())
            )
        for task in tasks:
            deliver(task.owner.on_timeout, task, error)

    # -- the worker thread -------------------------------------------------------------------------

    def _is_current(self) -> bool:
        """False on a thread the watchdog abandoned: it must not post, take work or touch the state."""
        return threading.current_thread() is self._thread

    def _post(self, callback: Callable[..., Any], *args: Any) -> None:
        if not self._is_current():
            return  # an abandoned thread's late outcome: its requests were already answered
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
            description = self.description = engine.describe()
            logger.info("model loaded in %.1f s: %s", time.monotonic() - t0, description.model)
            if self._warmup:
                self.state = WorkerState.WARMING_UP
                t0 = time.monotonic()
                engine.warmup()
                logger.info("model warmed up in %.1f s", time.monotonic() - t0)
        except BaseException as exc:  # noqa: BLE001 - any failure here means "not ready", reported once
            logger.exception("the engine failed to load")
            if not self._is_current():
                return
            self.state = WorkerState.FAILED
            self._post(_settle, self._ready, exc)
            return
        if not self._is_current():
            return
        # The prep thread starts before the worker says it is ready, so a ready worker overlaps from its first call.
        if self.batching.overlap_host_prep and splits_host_work(engine):
            prep = HostPrep(engine, self._queue, self.batching.max_batch, f"{self._thread.name}-host-prep")
            try:
                prep.start()
            except RuntimeError:  # no thread to be had: serve, preparing inline, rather than never say ready
                logger.exception("the host-prep thread did not start; observations are prepared inline")
                prep.stop()
            else:
                self.host_prep = prep
        self.state = WorkerState.READY
        self._post(_settle, self._ready, description)
        try:
            self._serve_queue(engine)
        finally:
            if self._is_current():
                if self.host_prep is not None:
                    self.host_prep.stop(wait=True)
                    self.host_prep = None
                self.state = WorkerState.STOPPED

    def _serve_queue(self, engine: ActionEngine) -> None:
        policy = self.batching
        while self._is_current():
            # When no observation waits, or when background work is owed its share of the engine.
            task = self._queue.take_background(even_if_observations_wait=self._background_overdue())
            if task is not None:
                self._run_background(engine, task)
                continue
            taken = self._queue.take_batch(policy.max_batch, policy.max_wait_ms / 1e3, policy.compatible)
            if not taken:
                if self._queue.closed:  # the server is stopping
                    return
                continue  # woken for background work while no observation waits
            self._run_batch(engine, self._prepare_batch(taken))

    def _background_overdue(self) -> bool:
        """Whether the background task waiting now is owed a turn although observations wait."""
        waiting_since = self._queue.background_waiting_since
        if waiting_since is None:
            return False
        due_at = self.background.due_at(max(waiting_since, self._background_turn_at))
        return due_at is not None and time.monotonic() >= due_at

    def _serve_waiting(self, engine: ActionEngine, until: float | None) -> None:
        """Serve the observations waiting right now, without blocking, until the monotonic time ``until``
        (None: until none waits). A background task calls this between its steps, so a robot waits for
        at most one step of a video, not the whole video, and the video gets its next step by ``until``
        (plus the batch running then) however many robots wait."""
        policy = self.batching
        while not self._queue.closed and self._is_current():
            if until is not None and time.monotonic() >= until:
                return  # the background task's turn: its next step runs now
            taken = self._queue.take_batch(policy.max_batch, 0.0, policy.compatible, timeout=0)
            if not taken:
                return
            self._run_batch(engine, self._prepare_batch(taken))

    # -- one batch: prepared, then run --------------------------------------------------------------

    def _prepare_batch(
        self, taken: list[PendingObservation]
    ) -> list[tuple[PendingObservation, PreparedActions | None]]:
        """The observations of ``taken`` still worth running, each with its inputs prepared ahead (None
        if not): those past their deadline are dropped here, and those nobody waits for any more (taken, then
        cancelled while held for batch company or prepared) are skipped without a word: their owner has
        already let them go (``ObservationOwner``)."""
        ahead = self.host_prep.claim(taken) if self.host_prep is not None else [None] * len(taken)
        now = time.monotonic()
        batch = []
        for item, prepared in zip(taken, ahead):
            if item.cancelled:
                self.counters.orphans_skipped += 1
            elif item.expired(now):
                self.counters.dropped_deadline += 1
                self._post(item.owner.on_dropped, item, DropReason.DEADLINE)
            else:
                batch.append((item, prepared))
        return batch

    def _run_batch(self, engine: ActionEngine, taken: list[tuple[PendingObservation, PreparedActions | None]]) -> None:
        """Run one prepared batch through the engine and post every outcome to its owner."""
        if not taken:
            return
        batch = [item for item, _ in taken]
        self.current = batch
        # Inside a background task the clock is already running (busy_since is set): no double count.
        started = self.busy_since is None
        if started:
            self.busy_since = time.monotonic()
        try:
            batch, outcomes = self._predict(engine, taken)
        except EngineLost as exc:
            if self._is_current():
                self._engine_lost(batch, [], exc)
            return
        finally:
            if self._is_current():
                self.current = []
                if started:
                    self._stop_busy_clock()
        if not self._is_current() or not batch:
            return  # abandoned while it ran (the watchdog has answered these requests), or nobody waited
        for item, outcome in zip(batch, outcomes):
            # The turn pays for its share of the engine call too, so turns are fair in engine time as well
            # as in host time: a session served more often than the others (one always waiting while
            # robots in closed loop are between two observations) leads, and yields to them.
            self._queue.charge(item, outcome.engine_ms / 1e3 / len(batch))
            self._post(item.owner.on_result, item, outcome)
        if self.on_batch_done is not None:
            try:
                self.on_batch_done(batch, outcomes)
            except Exception:  # noqa: BLE001 - metrics must never stop the worker
                logger.exception("on_batch_done failed")

    def _run_background(self, engine: ActionEngine, task: EngineTask[Any]) -> None:
        self.current_task = task
        self.busy_since = self.call_started_at = time.monotonic()

        def between_steps() -> None:
            self.idle_gaps.call_ended()
            self._serve_waiting(engine, self.background.due_at(time.monotonic()))
            if self._is_current():
                self.call_started_at = time.monotonic()  # the next step starts now

        try:
            with self._overlapping():
                result = task.run(engine, between_steps)
        except EngineLost as exc:
            if self._is_current():
                self._engine_lost([], [task], exc)
            return
        finally:
            if self._is_current():
                self._background_turn_at = time.monotonic()
                self.current_task = None
                self.call_started_at = None
                self._stop_busy_clock()
        self._post(task.owner.on_result, task, result)

    def _stop_busy_clock(self) -> None:
        if self.busy_since is not None:
            self.counters.busy_s += time.monotonic() - self.busy_since
            self.busy_since = None

    def _engine_lost(self, items: list[PendingObservation], tasks: list[EngineTask[Any]], exc: EngineLost) -> None:
        """Hand the work of a call whose engine was lost to ``on_engine_lost``; without one, fail it."""
        if self.on_engine_lost is not None:
            self.on_engine_lost(items, tasks)
            return
        reference = uuid.uuid4().hex[:12]
        logger.error("the engine was lost (ref %s): %s", reference, exc)
        error = CodedError(ErrorCode.ENGINE_ERROR, f"the engine was lost while running this request (ref {reference})")
        self._fail(items, tasks, error, 0.0, self._post)

    def _predict(
        self, engine: ActionEngine, taken: list[tuple[PendingObservation, PreparedActions | None]]
    ) -> tuple[list[PendingObservation], list[EngineOutcome]]:
        """One engine call for ``taken``, on the watchdog's clock: the observations it ran, each with its
        outcome. Raises EngineLost, and nothing else."""
        outer_call = self.call_started_at  # set inside a video step: the step's clock resumes afterwards
        self.call_started_at = time.monotonic()
        batch = [item for item, _ in taken]
        try:
            prepared = host_inputs(engine, taken, self.counters, self._queue.charge)
            # Preparing inline takes a while (a video clip's decoding): an owner may have left meanwhile.
            wanted = [index for index, item in enumerate(batch) if not item.cancelled]
            if len(wanted) < len(batch):
                self.counters.orphans_skipped += len(batch) - len(wanted)
                batch = [batch[index] for index in wanted]
                if self._is_current():
                    self.current = batch
                prepared = None if prepared is None else [prepared[index] for index in wanted]
                if not batch:
                    return [], []
            self.idle_gaps.call_starting(batch)
            with self._overlapping():
                return batch, predict_batch(engine, batch, self.counters, prepared)
        finally:
            if self._is_current():
                self.idle_gaps.call_ended()
                self.call_started_at = time.monotonic() if outer_call is not None else None

    def _overlapping(self) -> AbstractContextManager[None]:
        """Around an engine call: the host-prep thread prepares the next observations meanwhile."""
        return self.host_prep.overlapping() if self.host_prep is not None else nullcontext()


def _call_now(callback: Callable[..., Any], *args: Any) -> None:
    callback(*args)


def _settle(future: asyncio.Future[ModelDescription], value: ModelDescription | BaseException) -> None:
    """Resolve the readiness future once: with the description, or with the load's exception."""
    if not future.done():
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)


def host_inputs(
    engine: ActionEngine,
    taken: list[tuple[PendingObservation, PreparedActions | None]],
    counters: EngineCounters,
    charge: Callable[[PendingObservation, float], None] | None = None,
) -> list[PreparedActions] | None:
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


def predict_batch(
    engine: ActionEngine,
    batch: list[PendingObservation],
    counters: EngineCounters,
    prepared: list[PreparedActions] | None = None,
) -> list[EngineOutcome]:
    """Run ``batch`` (one observation or more) through ``engine``; an outcome per observation, in order.

    ``prepared``: each observation's ``engine.prepare_actions`` (an engine that splits its work,
    :class:`PreparingEngine`), run with ``predict_prepared``; None: the requests go to
    ``predict_actions`` / ``predict_actions_batch``.
    Raises :class:`~policy_server.engine.request_queue.EngineLost`, and nothing else.
    """
    t0 = time.monotonic()
    if prepared is not None and splits_host_work(engine):
        preparing = engine

        def one_prepared(one: PreparedActions) -> ActionResult | Exception:
            return preparing.predict_prepared([one])[0]

        results = _results(one_prepared, preparing.predict_prepared, prepared, counters)
    else:
        results = _results(engine.predict_actions, engine.predict_actions_batch, [i.request for i in batch], counters)
    done = time.monotonic()
    return [_outcome(item, result, (done - t0) * 1e3, done, counters) for item, result in zip(batch, results)]


def _results(
    run_one: Callable[[T], ActionResult | Exception],
    run_all: Callable[[list[T]], Sequence[ActionResult | Exception]],
    inputs: list[T],
    counters: EngineCounters,
) -> Sequence[ActionResult | Exception]:
    """One result per input: a batched call for several, each alone if that call fails (only the request
    at fault then gets the error)."""
    if len(inputs) == 1:
        return [_call(run_one, inputs[0])]
    try:
        results = run_all(inputs)
    except EngineLost:
        raise
    except Exception:  # noqa: BLE001 - one bad request must not fail its batch mates
        logger.warning("a batch of %d failed in the engine; running its requests one by one", len(inputs))
        return [_call(run_one, one) for one in inputs]
    counters.batches += 1
    counters.batched_items += len(inputs)
    return results


def _outcome(
    item: PendingObservation, result: ActionResult | Exception, engine_ms: float, done: float, counters: EngineCounters
) -> EngineOutcome:
    if isinstance(result, BaseException):
        counters.failed += 1
        error = engine_failure(result, "observation", f"seq {item.seq} of session {item.session_id}")
        return EngineOutcome(error=error, engine_ms=engine_ms, done_at=done)
    counters.completed += 1
    return EngineOutcome(chunk=result, engine_ms=engine_ms, done_at=done)


def _call(fn: Callable[[T], ActionResult | Exception], arg: T) -> ActionResult | Exception:
    """``fn(arg)``, or the exception it raised, so single and batched calls report the same way.

    :class:`EngineLost` is not the request's failure: it propagates."""
    try:
        return fn(arg)
    except EngineLost:
        raise
    except Exception as exc:  # noqa: BLE001 - turned into an outcome by the caller
        return exc
