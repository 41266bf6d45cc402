"""Where observations wait for the engine: one slot per session, sessions served in turn.

The queue sits between the event loop (which puts) and the engine worker thread (which takes), so it is
guarded by one lock; every operation is O(1) or O(sessions) and never blocks the event loop for longer
than a dict update.

Two rules make it a realtime queue rather than a FIFO:

* **Latest observation wins.** Each session has at most one waiting observation. A newer one replaces
  it and :meth:`RequestQueue.put` hands the replaced one back so the caller can report it ``dropped``
  (``superseded``). A robot streaming at 50 Hz against a 200 ms model therefore always gets actions for
  the freshest frame, never for a backlog.
* **Sessions are served in turn.** Sessions with a waiting observation form a ring. The worker takes the
  session at the front; when that session submits again it joins at the back. Replacing a waiting
  observation keeps the session's place, so a robot that sends faster gains nothing over one that sends
  slower: with N busy sessions each gets every N-th engine slot.
* **A turn can be shared.** An observation names the turn it waits for (:attr:`PendingObservation.turn`;
  a connection's policy sessions share the connection's: its names ride in one engine call together,
  :attr:`PendingObservation.turn_shares_call`, but only while no other turn waits;
  by default its session's own). One-shot requests of the HTTP sidecar are sessions of one request each,
  and all the requests of one HTTP client share that client's turn: they wait behind each other, oldest
  first, and the client as a whole gets one engine slot per round of the ring, like one robot, however
  many requests it has waiting. A shared turn whose request was just taken rejoins the ring only at the
  worker's next take, behind everyone who arrived while that request ran, just as a robot rejoins only
  when it sends again: so a robot in closed loop waits for at most the one request already running.

* **Turns are fair in cost, not only in number.** The host's work on an observation (decoding its frames,
  :attr:`PendingObservation.decode_cpu_s`; preparing its inputs) and its share of the engine call (the worker
  :meth:`charges <RequestQueue.charge>` both) are counted per turn, so a session served more often than the
  others (one that always has an observation waiting, while robots in closed loop are between two of theirs)
  leads them as surely as one whose frames cost more to decode. A turn whose count leads the least of the
  waiting turns' by more than one turn's length (the time between two takes) gives its place to the next one
  and goes to the back, its lead one turn shorter; such a turn is left out of batches and of what the host
  prepares ahead. One session streaming 4096x4096 frames thus waits for its own turns, paid for in turns of
  everyone else's time, instead of taking the CPU every other robot's turn needs. Alone in the ring while
  other sessions are active (robots in closed loop between two observations), such a turn waits one turn's
  length for them first. A lead is capped at :data:`MAX_HOST_LEAD_S`; a turn waiting alone while nobody else
  is active is served at once (nobody to yield to).

Deadlines are the worker's business (it is the one that knows when a request reaches the engine).

**Batching.** :meth:`RequestQueue.take_batch` hands the worker the session at the front plus further
waiting sessions whose requests can share its transformer calls (same schedule), in ring order, up to a
batch size; it may wait for more only until the first observation has waited ``max_wait`` in total, so
batching never holds a request back longer than that. Sessions taken together rejoin the ring at the
back together: fairness is unchanged. A batch takes at most one observation per turn.

**Background work** (video rollouts of the HTTP sidecar) waits in a separate FIFO lane at a lower
priority: :meth:`RequestQueue.take_background` hands one over while no observation is waiting, or when
the worker says background work is overdue for its share of the engine (``even_if_observations_wait``;
the worker keeps that clock, see :class:`~policy_server.engine.worker.BackgroundShare`). A task that is
already running is not interrupted: it runs step by step and gives way between steps (see
:class:`EngineTask`).

**Owners.** Whoever puts an item in the queue owns it (:class:`ObservationOwner`, :class:`TaskOwner`) and
hears what became of it: an observation's :class:`EngineOutcome`, a chunk or a coded error. The engine
raises the runtime's typed errors (``cosmos3_runtime.errors``); :func:`engine_failure` turns whatever an
engine call raised into the :class:`~robot_clients.protocol.CodedError` a client sees, in one place for
every way a request came in. One exception is not a failure of the request at all: :class:`EngineLost`
(the engine itself went away under the call) is handed back, not answered.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from cosmos3_runtime.errors import MissingMediumError, RuntimeErrorBase
from cosmos3_runtime.requests import ActionRequest, ActionResult
from robot_clients.protocol import CodedError, ErrorCode

logger = logging.getLogger(__name__)

ResultT = TypeVar("ResultT")
ResultT_contra = TypeVar("ResultT_contra", contravariant=True)

# The most host time a turn may lead the others by: how long a costly session can be made to wait.
MAX_HOST_LEAD_S = 2.0
# The least lead that makes a turn owe one, and the least it pays per turn given up: below it, leads are
# noise among equal robots (one frame's preparation varies by tens of milliseconds on a loaded machine).
MIN_LEAD_S = 0.1
# How much each new interval between takes moves the turn length (an exponential moving average).
TURN_LENGTH_WEIGHT = 0.2
# Host time charged to a turn that has had nothing waiting this long is forgotten (the session has gone).
FORGET_HOST_TIME_AFTER_S = 60.0


# -- what the engine made of one request, as its owner receives it ----------------------------------


class EngineLost(Exception):
    """The engine went away under a call (a remote replica died): the work in hand was not done.

    It is not the request's failure, so it is never turned into a client error: whoever catches engine
    failures (the worker's calls, a video task's ``run``) lets it through, and the worker hands the
    observations and tasks of that call to its ``on_engine_lost`` (the Ray backend queues them again
    on another replica). Raised only by engines that can be lost; the local engine never raises it.
    """


def engine_error_code(exc: RuntimeErrorBase) -> str:
    """The protocol code for an error the engine's rules raised (``cosmos3_runtime.errors``).

    A value is wrong whoever finds it: the engine's ``invalid_request`` naming a field is the same
    ``invalid_field`` the server answers when it finds the value wrong first, and a request without the camera
    input its mode needs (:class:`~cosmos3_runtime.errors.MissingMediumError`) lacks a field. A checkpoint
    problem at request time is the server's failure, not the client's.
    """
    if isinstance(exc, MissingMediumError):
        return ErrorCode.MISSING_FIELD
    if exc.code == ErrorCode.INVALID_REQUEST and exc.field is not None:
        return ErrorCode.INVALID_FIELD
    if exc.code == "checkpoint_error":
        return ErrorCode.ENGINE_ERROR
    return exc.code


def engine_failure(exc: BaseException, what: str, context: str) -> CodedError:
    """The error a client sees for an engine call that raised ``exc`` on its ``what`` (``observation``,
    ``job``). The runtime's typed errors are the client's to see (a stable code, a message, a field); any
    other failure is ours: its traceback goes to the log (about ``context``), the client gets a reference."""
    if isinstance(exc, RuntimeErrorBase):
        return CodedError(engine_error_code(exc), exc.message, exc.field)
    reference = uuid.uuid4().hex[:12]
    logger.error("the engine failed on %s (ref %s)", context, reference, exc_info=exc)
    return CodedError(
        ErrorCode.ENGINE_ERROR, f"the model failed on this {what}; the server log has details (ref {reference})"
    )


@dataclass
class EngineOutcome:
    """What the engine made of one observation: a chunk, or (``chunk`` None) the error to send to the client."""

    chunk: ActionResult | None = None
    error: CodedError | None = None
    engine_ms: float = 0.0
    done_at: float = 0.0


# -- the queue's items and their owners --------------------------------------------------------------


def queued_for_s(enqueued_at: float, taken_at: float | None) -> float:
    """Seconds a request waited for the engine: from entering the queue to being taken (0 until taken).
    The one definition of every reply's ``queue_ms`` and every metric's queue time."""
    return (taken_at or enqueued_at) - enqueued_at


@dataclass(eq=False)
class PendingObservation:
    """One observation on its way to the engine, with the clocks needed for its timing breakdown.

    All times are ``time.monotonic()`` seconds. ``owner`` receives the outcome (a session, the HTTP
    sidecar's action waiter: :class:`ObservationOwner`); the queue only uses ``session_id``.
    """

    session_id: Hashable
    seq: int
    request: ActionRequest
    owner: ObservationOwner
    received_at: float
    decode_ms: float = 0.0
    # CPU seconds the host spent decoding its session's frames since the session's previous observation
    # was queued (this one's, and those of any decoded and then replaced before it was queued): charged
    # to its turn. Not ``decode_ms``, which is wall time (waiting for the decode pool, an upload) too.
    decode_cpu_s: float = 0.0
    deadline_at: float | None = None
    client_timestamp: float | None = None
    enqueued_at: float = field(default_factory=time.monotonic)
    taken_at: float | None = None
    # Set on the event loop once nobody waits for its outcome (the client cancelled it, its session closed, an
    # HTTP request timed out): the worker skips it if its call has not started, and discards a late result.
    cancelled: bool = False
    # The place in the ring this observation waits for; None: its session's own. Observations of
    # different sessions with the same turn are served one per round, oldest first (one HTTP client's
    # requests). A session keeps the same turn for its whole life.
    turn: Hashable | None = None
    # The observations waiting for this turn may ride in one engine call together, up to the batch size
    # (a connection's policy sessions: RoboLab's environments); without it a turn fills one place in a
    # batch (one HTTP client's requests wait behind each other).
    turn_shares_call: bool = False

    @property
    def turn_key(self) -> Hashable:
        return self.session_id if self.turn is None else ("turn", self.turn)

    def expired(self, now: float) -> bool:
        return self.deadline_at is not None and now > self.deadline_at

    @property
    def queue_s(self) -> float:
        """Seconds it waited in the queue (:func:`queued_for_s`)."""
        return queued_for_s(self.enqueued_at, self.taken_at)

    @property
    def queue_ms(self) -> float:
        return self.queue_s * 1e3


# -- the owner contracts ---------------------------------------------------------------------------------
# Every item in the queue names its owner. The engine worker (or a backend's dispatcher) posts the outcome
# back to that owner on the event loop; metrics label the request by the owner's ``request_kind``. Owners
# are sessions (native, openpi, SGLang lockstep), the HTTP sidecar's action waiter, and the video
# runner's tasks. These protocols are the whole of what the engine side may call on an owner, so nothing
# probes an owner with ``getattr``/``hasattr``; nothing here imports sessions or the HTTP sidecar.


class ObservationOwner(Protocol):
    """The owner of a :class:`PendingObservation`.

    ``request_kind`` is the metrics label of its requests (``realtime``, ``openpi``,
    ``action_generation``, ...). ``on_result`` and ``on_dropped`` are called on the event loop, exactly one
    of them per observation that reached the queue, unless the owner cancelled it first.
    """

    request_kind: str

    def on_result(self, item: PendingObservation, outcome: EngineOutcome) -> None: ...

    def on_dropped(self, item: PendingObservation, reason: str) -> None: ...


class TaskOwner(Protocol[ResultT_contra]):
    """The owner of a background :class:`EngineTask` (a video rollout), receiving what its ``run`` returned.

    ``on_timeout`` is called instead of ``on_result`` when the watchdog abandoned the engine call that
    ran the task (``error`` is the coded ``engine_timeout`` error).
    """

    def on_result(self, task: EngineTask[Any], result: ResultT_contra) -> None: ...

    def on_dropped(self, task: EngineTask[Any], reason: str) -> None: ...

    def on_timeout(self, task: EngineTask[Any], error: CodedError) -> None: ...


class EngineTask(Protocol[ResultT]):
    """Work that runs on the engine behind the observations (a ``forward_dynamics`` video job).

    The worker calls ``run(engine, between_steps)`` on its thread (it must not raise: failures are
    part of its result) and then ``owner.on_result(task, result)`` on the event loop. A task that
    works in steps calls ``between_steps()`` after each: the worker then serves the observations
    waiting at that moment, so a robot waits for one step of the task, not all of it. If the queue
    closes first, ``owner.on_dropped(task, reason)`` is called instead, like for an observation.
    ``engine`` is the worker's engine, whatever API of it the task uses (a video rollout: ``start_video``).
    """

    owner: TaskOwner[ResultT]

    def run(self, engine: Any, between_steps: Callable[[], None]) -> ResultT: ...


class QueueClosed(Exception):
    """The queue was closed (server shutting down); nothing more is accepted."""


class ClosableQueue:
    """The shutdown state every request queue shares: once ``close()`` sets it, nothing more is accepted."""

    _closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _refuse_if_closed(self) -> None:
        """Raise :class:`QueueClosed` if the queue is closed (the caller holds the queue's lock)."""
        if self._closed:
            raise QueueClosed("the server is shutting down")


class RequestQueue(ClosableQueue):
    """Thread-safe, per-session single-slot, round-robin queue of :class:`PendingObservation`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._slots: dict[Hashable, PendingObservation] = {}  # session -> its waiting observation
        self._turns: dict[Hashable, deque[Hashable]] = {}  # turn -> sessions waiting for it, oldest first
        self._ring: deque[Hashable] = deque()  # turns with a waiting observation, in serving order
        # Shared turns just served that still have observations waiting: back in the ring at the next take.
        self._rejoining: list[Hashable] = []
        # Background tasks with the time each was queued; lower priority than every observation.
        self._background: deque[tuple[EngineTask[Any], float]] = deque()
        # Called after every put, outside the lock (the engine's host-prep thread watches for arrivals).
        self._listeners: list[Callable[[], None]] = []
        # Host seconds charged per turn (decoding, preparing), less what all waiting turns were charged
        # alike, with when each was last charged; and the length of one turn (see the module docstring).
        self._host_s: dict[Hashable, float] = {}
        self._charged_at: dict[Hashable, float] = {}
        self._turn_s = 0.0
        self._last_take: float | None = None

    def put(self, item: PendingObservation) -> PendingObservation | None:
        """Queue ``item``; return the observation of the same session it replaced, if any. Decoding its
        frames (``decode_cpu_s``) is charged to its turn."""
        with self._lock:
            self._refuse_if_closed()
            if item.decode_cpu_s > 0:
                self._charge(item.turn_key, item.decode_cpu_s)
            replaced = self._slots.get(item.session_id)
            self._slots[item.session_id] = item
            if replaced is None:
                waiting = self._turns.get(item.turn_key)
                if waiting is None:
                    self._turns[item.turn_key] = deque([item.session_id])
                    self._ring.append(item.turn_key)
                    self._ready.notify()
                else:
                    waiting.append(item.session_id)
            listeners = list(self._listeners)
        for listener in listeners:
            listener()
        return replaced

    def charge(self, item: PendingObservation, seconds: float) -> None:
        """Charge ``seconds`` of host work done for ``item`` (preparing its inputs) to its turn."""
        with self._lock:
            self._charge(item.turn_key, seconds)

    def holds_back_decoding(self, session_id: Hashable, turn: Hashable | None = None) -> bool:
        """Whether ``session_id`` (on its own turn, or on ``turn`` shared with others: a connection's policy
        sessions) should decode no further frames for now.

        While its last observation still waits here: a frame decoded now could only replace that one,
        unserved, so it waits undecoded (a newer one replaces it, never decoded) until this one is taken.
        And while it owes turns to sessions charged within the last two turn lengths: its decoding is
        host time like its turns', so it waits until the others' spending has caught up with its lead
        (sessions gone idle stop counting after two turn lengths, so nobody waits for the absent)."""
        with self._lock:
            if session_id in self._slots:
                return True
            key = session_id if turn is None else ("turn", turn)
            if not self._owes(key):
                return False
            recent = time.monotonic() - 2 * self._quantum()
            return any(at >= recent for other, at in self._charged_at.items() if other != key)

    def host_lead_s(self, turn: Hashable) -> float:
        """Host seconds ``turn`` is charged beyond the least-charged recent turn (0: none, or unknown)."""
        with self._lock:
            return self._host_s.get(turn, 0.0)

    def _charge(self, turn: Hashable, seconds: float) -> None:
        """Add ``seconds`` to ``turn``'s count, then keep every count a lead: the least of the turns
        charged recently is 0 (host work every session needs alike is nobody's lead)."""
        now = time.monotonic()
        self._host_s[turn] = self._host_s.get(turn, 0.0) + max(0.0, seconds)
        self._charged_at[turn] = now
        for stale in [t for t, at in self._charged_at.items() if now - at > FORGET_HOST_TIME_AFTER_S]:
            if stale not in self._turns:
                del self._charged_at[stale]
                self._host_s.pop(stale, None)
        floor = min(self._host_s.values())
        for key, lead in self._host_s.items():
            self._host_s[key] = min(MAX_HOST_LEAD_S, lead - floor)

    def _owes(self, turn: Hashable) -> bool:
        """Whether ``turn`` leads by more than one turn's length (call with the lock held)."""
        return self._host_s.get(turn, 0.0) > self._quantum()

    def _holds_back(self, turn: Hashable) -> bool:
        """Whether ``turn``, alone in the ring, owes turns to sessions charged within the last two turn
        lengths (active ones, between two observations). Lock held."""
        if len(self._ring) != 1 or not self._owes(turn):
            return False
        recent = time.monotonic() - 2 * self._quantum()
        return any(at >= recent for other, at in self._charged_at.items() if other != turn)

    def _quantum(self) -> float:
        return max(self._turn_s, MIN_LEAD_S)

    def _next_turn(self) -> Hashable:
        """The ring's front turn, after those that owe a turn have paid one each (to the back, their lead
        one turn shorter). Lock held, ring not empty."""
        now = time.monotonic()
        if self._last_take is not None and len(self._ring) > 1:
            interval = min(now - self._last_take, MAX_HOST_LEAD_S)
            self._turn_s += TURN_LENGTH_WEIGHT * (interval - self._turn_s)
        self._last_take = now
        for _ in range(len(self._ring) - 1):  # a turn alone in the ring owes nobody
            if not self._owes(self._ring[0]):
                break
            self._host_s[self._ring[0]] -= self._quantum()
            self._ring.rotate(-1)
        return self._ring.popleft()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every :meth:`put` (on the putting thread; it must be quick)."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def waiting(self, max_items: int) -> list[PendingObservation]:
        """Up to ``max_items`` waiting observations, one per turn, in the order turns will be served;
        nothing is taken (the host-prep thread prepares these ahead). Turns that owe a turn are left out:
        their observation would likely be superseded before they are served, its preparation wasted."""
        with self._lock:
            turns = [turn for turn in (*self._ring, *self._rejoining) if not self._owes(turn)][:max_items]
            return [self._slots[self._turns[turn][0]] for turn in turns]

    def put_background(self, task: EngineTask[Any]) -> None:
        """Queue a background task behind every observation (and behind earlier background tasks)."""
        with self._lock:
            self._refuse_if_closed()
            self._background.append((task, time.monotonic()))
            self._ready.notify()

    def take_background(self, even_if_observations_wait: bool = False) -> EngineTask[Any] | None:
        """The oldest background task, if no observation is waiting or the caller says its turn is due
        (``even_if_observations_wait``); never blocks."""
        with self._lock:
            if not self._background or self._closed or (self._slots and not even_if_observations_wait):
                return None
            return self._background.popleft()[0]

    @property
    def background_waiting_since(self) -> float | None:
        """When the oldest waiting background task was queued (``time.monotonic()``); None if none waits."""
        with self._lock:
            return self._background[0][1] if self._background else None

    def _pop_turn(self, turn: Hashable) -> PendingObservation:
        """Take the oldest observation waiting for ``turn``, which the caller has taken out of the ring;
        if more wait for it, the turn rejoins the ring at the next take. Call with the lock held."""
        waiting = self._turns[turn]
        item = self._slots.pop(waiting.popleft())
        if waiting:
            self._rejoining.append(turn)
        else:
            del self._turns[turn]
        item.taken_at = time.monotonic()
        return item

    def take(self, timeout: float | None = None) -> PendingObservation | None:
        """Block until an observation is waiting and return it; ``None`` on timeout or once closed.

        Also returns ``None`` (at once) while background work waits and no observation does, so the
        worker can run it: check :attr:`closed` to tell that apart from closing.

        The wait loops: a wake-up can find the ring empty again (the observation that caused it was
        cancelled in between), and that must not look like "closed" to the worker.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            # The request taken last has run by now: its turn goes behind whoever arrived meanwhile.
            self._ring.extend(self._rejoining)
            self._rejoining.clear()
            held_back = False
            while True:
                while not self._ring and not self._background and not self._closed:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return None
                    self._ready.wait(remaining)
                if self._closed or not self._ring:
                    return None
                if held_back or not self._holds_back(self._ring[0]):
                    break
                # The one waiting turn owes turns while other sessions are active, only between two of
                # their observations (a robot in closed loop sends its next one once its chunk is out):
                # give them one turn's length to arrive before it, and charge it that turn.
                held_back = True
                remaining = self._quantum() if deadline is None else min(self._quantum(), deadline - time.monotonic())
                self._host_s[self._ring[0]] -= self._quantum()
                if remaining > 0:
                    self._ready.wait(remaining)
            return self._pop_turn(self._next_turn())

    def take_batch(
        self,
        max_items: int,
        max_wait: float = 0.0,
        compatible: Callable[[PendingObservation, PendingObservation], bool] = lambda a, b: True,
        timeout: float | None = None,
    ) -> list[PendingObservation]:
        """Like :meth:`take`, plus up to ``max_items - 1`` compatible observations of other sessions.

        Waits for the first observation like :meth:`take` (empty list on timeout or once closed). Then
        collects, in serving order, waiting observations ``compatible(first, other)`` accepts, at most one
        per turn (a client with many requests waiting fills one place in a batch, like a robot); while the
        batch is short it waits for more, but only until the first observation's total wait reaches
        ``max_wait`` seconds (0: take only what is already waiting, never hold anything back).
        """
        first = self.take(timeout)
        if first is None:
            return []
        batch = [first]
        turns_taken = {first.turn_key}
        hold_until = first.enqueued_at + max_wait
        with self._lock:
            # A turn's further observations ride along only when no other turn waits: then they use an engine
            # nobody else wants; while others wait, the turn is one place in the batch like anyone's.
            if not self._ring:
                self._take_more_of(first.turn_key, batch, max_items, compatible)
            while len(batch) < max_items and not self._closed:
                for turn in list(self._ring):
                    if len(batch) == max_items:
                        break
                    if turn in turns_taken or self._owes(turn):
                        continue
                    if not compatible(first, self._slots[self._turns[turn][0]]):
                        continue
                    self._ring.remove(turn)
                    batch.append(self._pop_turn(turn))
                    turns_taken.add(turn)
                remaining = hold_until - time.monotonic()
                if len(batch) == max_items or remaining <= 0:
                    break
                self._ready.wait(remaining)
        return batch

    def _take_more_of(
        self,
        turn: Hashable,
        batch: list[PendingObservation],
        max_items: int,
        compatible: Callable[[PendingObservation, PendingObservation], bool],
    ) -> None:
        """Add to ``batch`` further observations waiting for ``turn`` (just taken), oldest first, while they
        may share its call (:attr:`PendingObservation.turn_shares_call`) and ``compatible`` with the batch's
        first. A turn drained so stays out of the ring until it has more. Lock held."""
        waiting = self._turns.get(turn)
        now = time.monotonic()
        while waiting and len(batch) < max_items:
            item = self._slots[waiting[0]]
            if not item.turn_shares_call or not compatible(batch[0], item):
                break
            del self._slots[waiting.popleft()]
            item.taken_at = now
            batch.append(item)
        if waiting is not None and not waiting:
            del self._turns[turn]
            if turn in self._rejoining:
                self._rejoining.remove(turn)

    def cancel(self, session_id: Hashable, seq: int | None = None) -> PendingObservation | None:
        """Remove the session's waiting observation (only if it is ``seq``, when given) and return it."""
        with self._lock:
            item = self._slots.get(session_id)
            if item is None or (seq is not None and item.seq != seq):
                return None
            del self._slots[session_id]
            waiting = self._turns[item.turn_key]
            waiting.remove(session_id)
            if not waiting:
                del self._turns[item.turn_key]
                (self._ring if item.turn_key in self._ring else self._rejoining).remove(item.turn_key)
            return item

    def close(self) -> list[PendingObservation | EngineTask[Any]]:
        """Stop accepting and wake the worker; return what was still waiting, for the caller to report."""
        with self._lock:
            self._closed = True
            left: list[PendingObservation | EngineTask[Any]] = [
                self._slots[s] for turn in [*self._ring, *self._rejoining] for s in self._turns[turn]
            ]
            left.extend(task for task, _ in self._background)
            self._slots.clear()
            self._turns.clear()
            self._ring.clear()
            self._rejoining.clear()
            self._background.clear()
            self._ready.notify_all()
            return left

    @property
    def background_waiting(self) -> int:
        """Background tasks waiting (not counted by ``len()``, which counts observations)."""
        with self._lock:
            return len(self._background)

    def __len__(self) -> int:
        """Observations waiting (several may wait for one turn)."""
        with self._lock:
            return len(self._slots)
