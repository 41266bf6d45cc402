"""The one thread that owns the engine: it loads the model, warms it up, and runs requests one by one.

The asyncio event loop never runs model code. It puts observations in the :class:`RequestQueue`; this
thread takes them in the queue's fair order (several sessions at once when their requests can share
transformer calls: see :class:`~policy_server.engine.batching.BatchPolicy`), drops those whose deadline
has passed, runs the rest through ``engine.predict_actions`` (``predict_actions_batch`` for a batch) and
hands every outcome back to the event loop with ``loop.call_soon_threadsafe``: the session that owns the
observation (``PendingObservation.owner``) gets ``on_result(item, outcome)`` or ``on_dropped(item,
reason)`` on the loop's thread, where it is safe to touch sockets (a session gone away ignores it).

Background tasks (video rollouts, :class:`~.request_queue.BackgroundTask`) run when no observation waits,
and otherwise a bounded share (:class:`~.batching.BackgroundShare`): one step at least every interval, so
a video finishes under any robot load while a robot waits at most one extra step per interval.

A hung engine call (:mod:`policy_server.engine.watchdog` notices it from ``call_started_at``) is handled by
:meth:`EngineWorker.abandon_hung_call`: the requests of that call are failed with ``engine_timeout``,
the worker reports ``restarting`` and a new thread loads a fresh engine. Python cannot kill a thread:
the stuck one is abandoned (it keeps its engine's memory until its call returns, if ever) and
everything it does afterwards is discarded, because only the current thread may post outcomes, touch
the worker's state or take from the queue.

While an engine call runs, a host-prep thread (:mod:`.host_prep`) prepares the observations waiting next,
so the engine goes from one batch to the next without waiting for the host; the idle gaps between calls
are counted. An engine that can be lost (a Ray replica) raises :class:`~.outcome.EngineLost`: the call's
work goes to ``on_engine_lost`` unanswered (the Ray backend queues it again elsewhere).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, Protocol

from robot_clients.protocol import CodedError, DropReason, ErrorCode

from .batch_call import CounterReadouts, EngineCounters, Predictor, predict_batch
from .batching import BackgroundShare, BatchPolicy
from .cpu_threads import configure_worker_threads
from .host_prep import HostPrep, IdleGaps, host_inputs, splits_host_work
from .outcome import EngineLost, EngineOutcome
from .request_queue import BackgroundTask, PendingObservation, RequestQueue

logger = logging.getLogger(__name__)


class ActionEngine(Predictor, Protocol):
    """What the worker needs of an engine (``cosmos3_runtime.engine.Cosmos3Engine`` provides it)."""

    def warmup(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...


# Called on the worker thread with the observations and background tasks of a call whose engine was lost.
LostWorkHandler = Callable[[list[PendingObservation], list[BackgroundTask]], None]


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
    engine raised :class:`~policy_server.engine.outcome.EngineLost`, to queue it again elsewhere; without
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
        self._ready = loop.create_future()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.state = WorkerState.STARTING
        self.description: dict[str, Any] | None = None
        self.thread_settings: dict[str, object] = {}
        self.current: list[PendingObservation] = []
        self.current_task: BackgroundTask | None = None
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
        return bool(self.current) or self.current_task is not None

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
        tasks: list[BackgroundTask],
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
            self.description = engine.describe()
            logger.info("model loaded in %.1f s: %s", time.monotonic() - t0, self.description.get("model"))
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
        self.state = WorkerState.READY
        self._post(_settle, self._ready, self.description)
        try:
            self._serve(engine)
        finally:
            if self._is_current():
                self.state = WorkerState.STOPPED

    def _serve(self, engine: ActionEngine) -> None:
        policy = self.batching
        if policy.overlap_host_prep and splits_host_work(engine):
            self.host_prep = HostPrep(engine, self._queue, policy.max_batch, f"{self._thread.name}-host-prep")
            self.host_prep.start()
        try:
            self._serve_queue(engine)
        finally:
            if self._is_current() and self.host_prep is not None:
                self.host_prep.stop()
                self.host_prep = None

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

    def _prepare_batch(self, taken: list[PendingObservation]) -> list[tuple[PendingObservation, Any]]:
        """The observations of ``taken`` still worth running, each with its inputs prepared ahead (None
        if not): those past their deadline are dropped here."""
        ahead = self.host_prep.claim(taken) if self.host_prep is not None else [None] * len(taken)
        now = time.monotonic()
        batch = []
        for item, prepared in zip(taken, ahead):
            if item.expired(now):
                self.counters.dropped_deadline += 1
                self._post(item.owner.on_dropped, item, DropReason.DEADLINE)
            else:
                batch.append((item, prepared))
        return batch

    def _run_batch(self, engine: ActionEngine, taken: list[tuple[PendingObservation, Any]]) -> None:
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
            outcomes = self._predict(engine, taken)
        except EngineLost as exc:
            if self._is_current():
                self._engine_lost(batch, [], exc)
            return
        finally:
            if self._is_current():
                self.current = []
                if started:
                    self._stop_busy_clock()
        if not self._is_current():
            return  # abandoned while it ran: the watchdog has answered these requests
        for item, outcome in zip(batch, outcomes):
            self._post(item.owner.on_result, item, outcome)
        if self.on_batch_done is not None:
            try:
                self.on_batch_done(batch, outcomes)
            except Exception:  # noqa: BLE001 - metrics must never stop the worker
                logger.exception("on_batch_done failed")

    def _run_background(self, engine: ActionEngine, task: BackgroundTask) -> None:
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

    def _engine_lost(self, items: list[PendingObservation], tasks: list[BackgroundTask], exc: EngineLost) -> None:
        """Hand the work of a call whose engine was lost to ``on_engine_lost``; without one, fail it."""
        if self.on_engine_lost is not None:
            self.on_engine_lost(items, tasks)
            return
        reference = uuid.uuid4().hex[:12]
        logger.error("the engine was lost (ref %s): %s", reference, exc)
        error = CodedError(ErrorCode.ENGINE_ERROR, f"the engine was lost while running this request (ref {reference})")
        self._fail(items, tasks, error, 0.0, self._post)

    def _predict(self, engine: ActionEngine, taken: list[tuple[PendingObservation, Any]]) -> list[EngineOutcome]:
        """One engine call for ``taken``, on the watchdog's clock. Raises EngineLost, and nothing else."""
        outer_call = self.call_started_at  # set inside a video step: the step's clock resumes afterwards
        self.call_started_at = time.monotonic()
        batch = [item for item, _ in taken]
        try:
            prepared = host_inputs(engine, taken, self.counters, self._queue.charge)
            self.idle_gaps.call_starting(batch)
            with self._overlapping():
                return predict_batch(engine, batch, self.counters, prepared)
        finally:
            if self._is_current():
                self.idle_gaps.call_ended()
                self.call_started_at = time.monotonic() if outer_call is not None else None

    def _overlapping(self):
        """Around an engine call: the host-prep thread prepares the next observations meanwhile."""
        return self.host_prep.overlapping() if self.host_prep is not None else nullcontext()


def _call_now(callback: Callable[..., Any], *args: Any) -> None:
    callback(*args)


def _settle(future: asyncio.Future, value: Any) -> None:
    """Resolve the readiness future once: with the description, or with the load's exception."""
    if not future.done():
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)
