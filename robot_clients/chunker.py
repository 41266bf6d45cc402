"""Executes action chunks one step per control tick, and asks for the next chunk before it is needed.

A policy answers an observation with a chunk of H actions; the robot executes one per tick at its
control rate. Waiting for a new chunk only when the current one has run out stalls the robot at every
chunk boundary for as long as inference takes. :class:`ActionChunker` avoids that: it measures how
long chunks take to arrive and sends the next observation early, when the actions left in the current
execution window (``execute_horizon`` actions of each chunk) fall to a threshold of that latency in
steps plus a margin. Inference runs on the chunker's own thread; the control loop only ever polls.
When inference is faster than the executed horizon, the new chunk is there before the old one ends and
the robot never stalls.

Chunks are aligned in time: action ``i`` of a chunk is for ``i`` steps after the observation it
answers. A chunk that arrives ``d`` steps after its observation starts executing at its action ``d``
(the first ``d`` were due while the model was thinking). How the new chunk meets the rest of the
current one is the strategy:

``open_loop``
    Execute ``execute_horizon`` (k) actions of each chunk, then switch to the next one. The next chunk
    is requested early, but kept until the current k actions are done.
``replace``
    Switch to the new chunk as soon as it arrives; the rest of the current one is dropped.
``blend``
    Cross-fade from the rest of the current chunk to the new one over their overlap (or
    ``blend_steps``), with weights ramping linearly toward the new chunk, so the commanded trajectory
    has no jump at the switch.
``rtc`` (real-time chunking)
    The actions of the current chunk that the robot will still execute while inference runs (its
    estimated latency in steps plus the margin) are sent with the observation as ``prefix_actions``.
    The server conditions those action frames as clean, the mechanism diffusers uses for forward
    dynamics, so the new chunk starts with exactly them and continues from where the robot will be:
    training-free inpainting, no blending and no jump. If a chunk arrives later than its prefix covered,
    the switch may jump; it is counted in ``stats.prefix_overruns``.

**Acting before being asked** (``roll_state_forward``, VLASH's idea): whatever the strategy, the model is
asked on the robot's state *now*, but its chunk takes over several ticks later, after the actions still
planned have moved the arm. With ``roll_state_forward`` the request's ``state`` is instead the action the
robot will last have commanded when the new chunk takes over: the plan's action at the tick the chunk is
expected to start (for ``rtc``, the prefix's last action; otherwise the tick the latency estimate says it
arrives), the plan's last action if the plan ends sooner (the robot holds it), or the last action executed
if no plan is left. It needs a state in the action's units (absolute joint targets, as the MuJoCo arm's),
and is counted in ``stats.rolled_states``.

When no planned action is left for a tick (inference slower than the executed horizon, or a failed
request), the chunker repeats the last action, which holds a position-controlled robot in place, and
counts a stall. Observations the server drops or refuses are counted and asked again at the next tick.

An operator can pause the robot's session on the server (the teleop dashboard). When the policy has a
``session_state`` that is not ``"running"`` (:class:`~robot_clients.chunker.RemoteChunkPolicy`
reads it from the client), the chunker **holds**: it repeats the last action without asking for
chunks and forgets the plan, whose actions were planned for a moment that has passed. On resume it asks
for a fresh chunk at once and holds (counted as a stall) until it comes. Held ticks are counted in
``stats.held_steps``; a stopped session holds for good (the control loop ends its episode).

Chunks come from a chunk policy, called on the chunker's own thread: :class:`RemoteChunkPolicy` asks the
policy server through a blocking ``PolicyClient``; anything with the same ``infer_chunk`` method (a local
model, a recorded trajectory, a test double with a known latency) can stand in for it.

Imports only numpy and the standard library: it runs on the robot, and a chunker running a local policy
never loads websockets.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

import numpy as np

from .client_frames import OBSERVATION_SETTINGS

if TYPE_CHECKING:  # the chunker must not load websockets: the client is only named in annotations
    from .client import PolicyClient

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# How chunks are executed
# ---------------------------------------------------------------------------------------------------


class ChunkStrategy(str, enum.Enum):
    """How a new chunk is merged with the rest of the one being executed (see the module docstring)."""

    OPEN_LOOP = "open_loop"
    REPLACE = "replace"
    BLEND = "blend"
    REAL_TIME_CHUNKING = "rtc"


class ChunkerError(RuntimeError):
    """The chunker cannot produce actions (the first chunk never came, or the chunker is closed)."""


@dataclass(frozen=True)
class ChunkerConfig:
    """How chunks are executed.

    Args:
        strategy: a :class:`ChunkStrategy` or its value (``open_loop``, ``replace``, ``blend``, ``rtc``).
        control_hz: the rate the robot executes actions at; turns measured latency into steps.
        execute_horizon: actions executed of each chunk before the next one should take over (k). ``None``:
            the whole chunk. For ``open_loop`` it is a hard limit; the other strategies keep executing the
            rest of the chunk if the next one is late, and stall only when it is exhausted.
        request_threshold: ask for the next chunk when this many actions of the execution window remain.
            ``None``: the latency estimate in steps plus ``latency_margin_steps``, re-measured every chunk.
        latency_margin_steps: steps of slack added to the measured latency (jitter, the tick that picks the
            chunk up).
        blend_steps: ``blend`` cross-fades over at most this many steps; ``None``: the whole overlap.
        latency_window: how many recent chunk latencies the estimate looks at.
        latency_quantile: which quantile of them it takes (0.9: plan for a slow chunk, not the median).
        startup_timeout_s: how long the first call waits for the first chunk.
        roll_state_forward: send, as the observation's ``state``, the action the robot will last have
            commanded when the requested chunk takes over, instead of the state measured now (see the module
            docstring). The state must be in the action's units and width; a mismatch raises ``ValueError``.
    """

    strategy: ChunkStrategy | str = ChunkStrategy.REAL_TIME_CHUNKING
    control_hz: float = 20.0
    execute_horizon: int | None = None
    request_threshold: int | None = None
    latency_margin_steps: int = 2
    blend_steps: int | None = None
    latency_window: int = 16
    latency_quantile: float = 0.9
    startup_timeout_s: float = 60.0
    roll_state_forward: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "strategy", ChunkStrategy(self.strategy))
        except ValueError:
            known = ", ".join(s.value for s in ChunkStrategy)
            raise ValueError(f"unknown chunk strategy {self.strategy!r}; expected one of {known}") from None
        if not self.control_hz > 0:
            raise ValueError(f"control_hz must be > 0, got {self.control_hz}")
        if self.execute_horizon is not None and self.execute_horizon < 1:
            raise ValueError(f"execute_horizon must be >= 1, got {self.execute_horizon}")
        if self.request_threshold is not None and self.request_threshold < 0:
            raise ValueError(f"request_threshold must be >= 0, got {self.request_threshold}")
        if self.latency_margin_steps < 0:
            raise ValueError(f"latency_margin_steps must be >= 0, got {self.latency_margin_steps}")
        if self.blend_steps is not None and self.blend_steps < 1:
            raise ValueError(f"blend_steps must be >= 1, got {self.blend_steps}")
        if not 0.0 < self.latency_quantile <= 1.0:
            raise ValueError(f"latency_quantile must be in (0, 1], got {self.latency_quantile}")


# ---------------------------------------------------------------------------------------------------
# What the chunker reports
# ---------------------------------------------------------------------------------------------------


@dataclass
class ChunkRecord:
    """One chunk as the chunker used it (handed to ``on_chunk`` when it takes effect)."""

    index: int
    requested_at_step: int  # the tick whose observation it answers: its action 0 is for this step
    arrived_at_step: int  # the tick that picked it up
    applied_at_step: int  # the tick it started executing at (later than arrival for open_loop)
    latency_s: float  # from sending the observation to the chunk coming back
    actions: np.ndarray  # as received, H x D
    prefix_length: int = 0  # rtc: actions sent as prefix_actions
    prefix_error: float | None = None  # rtc: max |chunk[:K] - prefix|, 0 when the server honoured it


class ChunkerSummary(TypedDict):
    """:meth:`ChunkerStats.summary`: the counters and latency quantiles, as an episode report shows them."""

    steps: int
    requests: int
    chunks: int
    chunk_latency_p50_ms: float | None
    chunk_latency_p99_ms: float | None
    stalls: int
    stall_steps: int
    dropped: int
    errors: int
    stale_chunks: int
    prefix_overruns: int
    held_steps: int
    holds: int
    rolled_states: int
    startup_s: float | None


@dataclass
class ChunkerStats:
    """What happened so far, across episodes."""

    steps: int = 0
    requests: int = 0
    chunks: int = 0
    stall_steps: int = 0  # ticks that had no planned action and repeated the last one
    stalls: int = 0  # boundary stalls: runs of consecutive stall steps
    dropped: int = 0  # observations the server dropped (superseded, deadline, cancelled) or timed out
    errors: int = 0  # observations the server refused, or a failed connection
    stale_chunks: int = 0  # chunks that arrived after every action in them was due
    prefix_overruns: int = 0  # rtc: chunks that arrived after their prefix had been executed
    held_steps: int = 0  # ticks that held the last action because an operator paused (or stopped) the session
    holds: int = 0  # pauses: runs of consecutive held steps
    rolled_states: int = 0  # roll_state_forward: requests whose state was a planned action, not the measured one
    startup_s: float | None = None
    latencies_s: list[float] = field(default_factory=list)

    def latency_ms(self, quantile: float) -> float | None:
        """A quantile of the chunk latencies (``0.5``: p50), in milliseconds; None before any chunk."""
        if not self.latencies_s:
            return None
        return float(np.quantile(np.asarray(self.latencies_s), quantile) * 1e3)

    def summary(self) -> ChunkerSummary:
        return {
            "steps": self.steps,
            "requests": self.requests,
            "chunks": self.chunks,
            "chunk_latency_p50_ms": self.latency_ms(0.5),
            "chunk_latency_p99_ms": self.latency_ms(0.99),
            "stalls": self.stalls,
            "stall_steps": self.stall_steps,
            "dropped": self.dropped,
            "errors": self.errors,
            "stale_chunks": self.stale_chunks,
            "prefix_overruns": self.prefix_overruns,
            "held_steps": self.held_steps,
            "holds": self.holds,
            "rolled_states": self.rolled_states,
            "startup_s": self.startup_s,
        }


# ---------------------------------------------------------------------------------------------------
# Where chunks come from
# ---------------------------------------------------------------------------------------------------


# The observation fields a chunk request forwards besides the settings an observation may carry for itself
# (the chunker adds `prefix_actions`; the client sets `seq` and `timestamp`). Anything else the environment
# reports (its step count, cameras under other keys, ...) stays on the robot.
FORWARDED_FIELDS = ("image", "images", "video", "deadline_ms")


@runtime_checkable
class ChunkPolicy(Protocol):
    """Anything that answers an observation with a chunk of actions."""

    def infer_chunk(self, observation: Mapping[str, Any], prefix_actions: np.ndarray | None) -> np.ndarray:
        """Return an H × D float32 chunk whose action ``i`` is meant for ``i`` steps after ``observation``.

        ``prefix_actions`` (K × D, K < H), when given, are the actions the robot executes in the first K
        steps regardless of the answer; a policy that supports real-time chunking returns a chunk that
        starts with exactly them. Raise to report that no chunk will come for this observation.
        """
        ...

    # Optional: a policy may also have a ``session_state`` attribute (``"running"``, ``"paused"``,
    # ``"stopped"``); the chunker holds the robot whenever it is not ``"running"``.


class RemoteChunkPolicy:
    """Chunks from the policy server over ``/v1/actions/realtime``, through a blocking :class:`PolicyClient`.

    The client must be connected and configured (domain, horizon, prompt) by the caller. Each chunk request
    sends the observation's cameras (``image``, named ``images`` or a ``video``), its ``deadline_ms``, the
    session settings it carries for itself (the protocol's observation settings:
    :data:`~robot_clients.client_frames.OBSERVATION_SETTINGS`) and the robot's ``state`` when the
    observation's domain conditions on one (its ``state_dim`` in the server's metadata); a state reported
    for a domain that takes none stays on the robot, as the server would refuse it. ``timeout`` bounds one
    round trip: a chunk that takes longer is no use to a robot that has already run out of actions, so the
    observation is cancelled and the chunker asks again with a fresh one.
    """

    def __init__(self, client: PolicyClient, *, timeout: float = 5.0) -> None:
        self.client = client
        self.timeout = timeout

    def infer_chunk(self, observation: Mapping[str, Any], prefix_actions: np.ndarray | None) -> np.ndarray:
        fields = {key: observation[key] for key in FORWARDED_FIELDS if observation.get(key) is not None}
        if prefix_actions is not None and len(prefix_actions):
            fields["prefix_actions"] = np.ascontiguousarray(prefix_actions, dtype=np.float32)
        settings = {name: observation[name] for name in OBSERVATION_SETTINGS if observation.get(name) is not None}
        state = observation.get("state")
        if state is not None and not self._conditions_on_state(settings.get("domain_name")):
            state = None
        return self.client.infer(fields, timeout=self.timeout, state=state, **settings).actions

    def _conditions_on_state(self, domain_name: str | None) -> bool:
        """Whether ``domain_name`` (None: the session's) has a ``state_dim`` in the server's metadata."""
        domain = domain_name or self.client.session.get("domain_name")
        profile = (self.client.metadata.get("domains") or {}).get(domain) or {}
        return profile.get("state_dim") is not None

    @property
    def session_state(self) -> str:
        """What an operator set on the server: the chunker holds the robot unless ``"running"``."""
        return self.client.session_state


# ---------------------------------------------------------------------------------------------------
# The chunker's inference thread
# ---------------------------------------------------------------------------------------------------


@dataclass
class ChunkRequest:
    generation: int
    step: int
    observation: Mapping[str, Any]
    prefix: np.ndarray | None
    sent_at: float = 0.0


@dataclass
class ChunkOutcome:
    request: ChunkRequest
    actions: np.ndarray | None
    error: BaseException | None
    latency_s: float


class InferenceThread:
    """Runs ``policy.infer_chunk`` off the control thread, one request at a time."""

    def __init__(self, policy: ChunkPolicy) -> None:
        self._policy = policy
        self._cv = threading.Condition()
        self._inbox: ChunkRequest | None = None
        self._outbox: deque[ChunkOutcome] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="chunk-inference", daemon=True)
        self._thread.start()

    def submit(self, request: ChunkRequest) -> None:
        with self._cv:
            if self._closed:
                raise ChunkerError("the chunker is closed")
            request.sent_at = time.monotonic()
            self._inbox = request
            self._cv.notify_all()

    def poll(self) -> ChunkOutcome | None:
        with self._cv:
            return self._outbox.popleft() if self._outbox else None

    def wait(self, timeout: float) -> ChunkOutcome | None:
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._outbox and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cv.wait(remaining)
            return self._outbox.popleft() if self._outbox else None

    def close(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._inbox is None and not self._closed:
                    self._cv.wait()
                if self._closed or self._inbox is None:  # the wait ends with a request or a close
                    return
                request, self._inbox = self._inbox, None
            actions, error = None, None
            try:
                actions = np.asarray(self._policy.infer_chunk(request.observation, request.prefix), dtype=np.float32)
                if actions.ndim != 2 or actions.shape[0] < 1:
                    raise ValueError(f"a chunk must be H x D, got shape {list(actions.shape)}")
            except Exception as exc:  # noqa: BLE001 - reported to the control thread, which counts it
                actions, error = None, exc
            outcome = ChunkOutcome(request, actions, error, time.monotonic() - request.sent_at)
            with self._cv:
                self._outbox.append(outcome)
                self._cv.notify_all()


# ---------------------------------------------------------------------------------------------------
# The chunker
# ---------------------------------------------------------------------------------------------------


class ActionChunker:
    """Turns a chunk policy into one action per control tick. Call :meth:`next_action` once per tick.

    ``on_chunk`` is called (on the control thread) with a :class:`ChunkRecord` each time a chunk takes
    effect: for logging, plotting or checking the chunks the robot really executed.
    """

    def __init__(
        self,
        policy: ChunkPolicy,
        config: ChunkerConfig | None = None,
        on_chunk: Callable[[ChunkRecord], None] | None = None,
    ) -> None:
        self.config = config or ChunkerConfig()
        self.policy = policy
        self.on_chunk = on_chunk
        self.stats = ChunkerStats()
        self._worker = InferenceThread(policy)
        self._latencies: deque[float] = deque(maxlen=self.config.latency_window)
        self._generation = 0
        self._applied = 0
        self._reset_state()

    def _reset_state(self) -> None:
        self._step = 0
        self._plan: np.ndarray | None = None  # the chunk being executed
        self._origin = 0  # the step its action 0 is for
        self._plan_end = 0  # first step it has no action for (for open_loop: its window's end)
        self._window_end = 0  # where the next chunk should take over
        self._queued: ChunkOutcome | None = None  # open_loop: the next chunk, waiting for the window to end
        self._queued_arrival = 0
        self._in_flight: ChunkRequest | None = None
        self._last_action: np.ndarray | None = None
        self._stalling = False
        self._holding = False

    # -- the control thread's interface -----------------------------------------------------------------

    @property
    def step(self) -> int:
        """Ticks executed in this episode."""
        return self._step

    @property
    def latency_steps(self) -> int:
        """The chunk latency estimate in control steps (rounded up), 0 before any chunk."""
        if not self._latencies:
            return 0
        latency = float(np.quantile(np.asarray(self._latencies), self.config.latency_quantile))
        return math.ceil(latency * self.config.control_hz)

    @property
    def request_threshold(self) -> int:
        """Ask for the next chunk when this many actions of the execution window are left."""
        if self.config.request_threshold is not None:
            return self.config.request_threshold
        return self.latency_steps + self.config.latency_margin_steps

    def next_action(self, observation: Mapping[str, Any]) -> np.ndarray:
        """The action to execute at this tick. ``observation`` is this tick's (fresh arrays, not reused).

        Blocks only on the first call of an episode, for the first chunk.
        """
        t = self._step
        if self.session_state != "running":
            return self._hold(observation, t)
        if self._holding:
            self._holding = False
            self._window_end = t  # the plan was dropped at the pause: ask for a fresh chunk now
        if self._plan is None and self._queued is None and self._last_action is None:
            self._wait_first_chunk(observation, t)
        self._collect(t)
        if self._queued is not None and t >= self._window_end:
            self._apply(self._queued, t, arrived_at=self._queued_arrival)
            self._queued = None
        if self._in_flight is None and self._queued is None and self._window_end - t <= self.request_threshold:
            self._request(observation, t)

        if self._plan is not None and self._origin <= t < self._plan_end:
            action = self._plan[t - self._origin]
            self._stalling = False
        else:
            if self._last_action is None:
                raise ChunkerError("no action to execute: no chunk has arrived yet")
            action = self._last_action
            self.stats.stall_steps += 1
            if not self._stalling:
                self.stats.stalls += 1
                self._stalling = True
        self._last_action = action
        self._step += 1
        self.stats.steps += 1
        return np.array(action, copy=True)

    @property
    def session_state(self) -> str:
        """The policy's session state (``"running"`` for a policy without one); see the module docstring."""
        return getattr(self.policy, "session_state", "running")

    def _hold(self, observation: Mapping[str, Any], t: int) -> np.ndarray:
        """This tick's action while the session is paused or stopped: the last one, unchanged."""
        if not self._holding:
            self._holding = True
            self.stats.holds += 1
            # Whatever is planned or in flight was meant for a moment that will have passed on resume.
            self._generation += 1
            self._plan, self._queued, self._in_flight = None, None, None
        if self._last_action is None:
            self._wait_until_running()  # paused before the first action: there is nothing to hold yet
            return self.next_action(observation)
        self.stats.held_steps += 1
        self._step += 1
        self.stats.steps += 1
        return np.array(self._last_action, copy=True)

    def _wait_until_running(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while self.session_state == "paused":
            if time.monotonic() > deadline:
                raise ChunkerError(
                    f"the session stayed paused for {self.config.startup_timeout_s} s before the first action"
                )
            time.sleep(0.01)
        if self.session_state == "stopped":
            raise ChunkerError("the session was stopped by an operator before the first action")

    def prime(self, observation: Mapping[str, Any]) -> None:
        """Send the episode's first observation without waiting: the next :meth:`next_action` waits for
        its chunk. Lets several robots stepped in lockstep (a vectorized simulator) start in parallel."""
        if self._plan is None and self._queued is None and self._in_flight is None:
            self._request(observation, self._step)

    def reset(self, clear_stats: bool = False) -> None:
        """Start a new episode: forget the plan; a chunk still in flight is discarded when it comes.

        The latency estimate is kept (the server did not get faster); ``clear_stats`` starts the counters
        afresh, for per-episode reports.
        """
        self._generation += 1
        self._reset_state()
        if clear_stats:
            self.stats = ChunkerStats()

    def close(self) -> None:
        self._worker.close()

    def __enter__(self) -> ActionChunker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- requests and arrivals ---------------------------------------------------------------------------

    def _wait_first_chunk(self, observation: Mapping[str, Any], t: int) -> None:
        if self._in_flight is None:
            self._request(observation, t)
        assert self._in_flight is not None
        started = self._in_flight.sent_at
        deadline = time.monotonic() + self.config.startup_timeout_s
        while True:
            outcome = self._worker.wait(max(0.0, deadline - time.monotonic()))
            if outcome is None:
                raise ChunkerError(f"no first chunk within {self.config.startup_timeout_s} s")
            if outcome.request.generation != self._generation:
                continue
            self._in_flight = None
            if outcome.error is not None:
                raise ChunkerError(f"the first chunk failed: {outcome.error}") from outcome.error
            self.stats.startup_s = time.monotonic() - started
            self._record_latency(outcome)
            self._apply(outcome, t, arrived_at=t)
            return

    def _request(self, observation: Mapping[str, Any], t: int) -> None:
        prefix = None
        if self.config.strategy is ChunkStrategy.REAL_TIME_CHUNKING and self._plan is not None:
            # The actions that will run while the model thinks: the latency in steps plus the margin,
            # never more than what is planned nor a whole chunk (the model must add at least one).
            length = min(self.latency_steps + self.config.latency_margin_steps, self._plan_end - t, len(self._plan) - 1)
            if length > 0:
                start = t - self._origin
                prefix = np.ascontiguousarray(self._plan[start : start + length], dtype=np.float32)
        if self.config.roll_state_forward:
            observation = self._rolled_forward(observation, t, prefix)
        request = ChunkRequest(self._generation, t, observation, prefix)
        self._worker.submit(request)
        self._in_flight = request
        self.stats.requests += 1

    def rolled_state(self, t: int, prefix: np.ndarray | None = None) -> np.ndarray | None:
        """The action the robot will last have commanded when a chunk requested at tick ``t`` takes over:
        ``prefix``'s last row when there is one (rtc: the chunk starts after it); else the plan's action at
        tick ``t + latency_steps - 1`` (the tick before the chunk is expected), or the plan's last action if
        it ends sooner, or the last action executed if no plan covers tick ``t``; ``None`` before any
        action (the measured state is all there is)."""
        if prefix is not None and len(prefix):
            return np.array(prefix[-1], dtype=np.float32)
        if self._plan is not None and t < self._plan_end:
            ahead = min(t + max(self.latency_steps, 1) - 1, self._plan_end - 1)
            return np.array(self._plan[ahead - self._origin], dtype=np.float32)
        if self._last_action is not None:
            return np.array(self._last_action, dtype=np.float32)
        return None

    def _rolled_forward(self, observation: Mapping[str, Any], t: int, prefix: np.ndarray | None) -> Mapping[str, Any]:
        """``observation`` with its ``state`` replaced by :meth:`rolled_state` (unchanged without one)."""
        rolled = self.rolled_state(t, prefix)
        measured = observation.get("state")
        if rolled is None or measured is None:
            return observation
        if np.shape(measured) != rolled.shape:
            raise ValueError(
                f"roll_state_forward needs the state in the action's units: the state has shape "
                f"{list(np.shape(measured))}, an action {list(rolled.shape)}"
            )
        self.stats.rolled_states += 1
        return {**observation, "state": rolled}

    def _collect(self, t: int) -> None:
        outcome = self._worker.poll()
        while outcome is not None:
            if outcome.request.generation == self._generation:
                self._in_flight = None
                if outcome.error is not None:
                    self._count_failure(outcome.error)
                else:
                    self._record_latency(outcome)
                    self._arrive(outcome, t)
            outcome = self._worker.poll()

    def _count_failure(self, error: BaseException) -> None:
        # Duck-typed so this module does not depend on a particular client: PolicyClient raises
        # ObservationDropped (with a `reason`) and TimeoutError for observations nobody will answer.
        if hasattr(error, "reason") or isinstance(error, TimeoutError):
            self.stats.dropped += 1
            logger.debug("observation dropped: %s", error)
        else:
            self.stats.errors += 1
            logger.warning("chunk request failed: %s", error)

    def _record_latency(self, outcome: ChunkOutcome) -> None:
        self._latencies.append(outcome.latency_s)
        self.stats.latencies_s.append(outcome.latency_s)
        self.stats.chunks += 1

    def _arrive(self, outcome: ChunkOutcome, t: int) -> None:
        assert outcome.actions is not None
        if t - outcome.request.step >= len(outcome.actions):
            self.stats.stale_chunks += 1  # every action in it was due while the model thought
            return
        if self.config.strategy is ChunkStrategy.OPEN_LOOP and self._plan is not None and t < self._window_end:
            self._queued, self._queued_arrival = outcome, t
            return
        self._apply(outcome, t, arrived_at=t)

    def _apply(self, outcome: ChunkOutcome, t: int, arrived_at: int) -> None:
        strategy, actions, s = self.config.strategy, outcome.actions, outcome.request.step
        assert actions is not None
        horizon = len(actions)
        offset = t - s  # actions of the chunk that were due before it took effect
        if offset >= horizon:
            self.stats.stale_chunks += 1
            return
        prefix = outcome.request.prefix
        record = ChunkRecord(
            index=self._applied,
            requested_at_step=s,
            arrived_at_step=arrived_at,
            applied_at_step=t,
            latency_s=outcome.latency_s,
            actions=actions,
            prefix_length=0 if prefix is None else len(prefix),
        )
        plan = actions
        if strategy is ChunkStrategy.BLEND and self._plan is not None:
            plan = self._blend(actions, s, t)
        elif strategy is ChunkStrategy.REAL_TIME_CHUNKING and prefix is not None:
            record.prefix_error = float(np.max(np.abs(actions[: len(prefix)] - prefix)))
            if offset > len(prefix):
                self.stats.prefix_overruns += 1
        self._applied += 1
        window = self.config.execute_horizon or horizon
        self._plan, self._origin = plan, s
        self._window_end = min(t + window, s + horizon)
        self._plan_end = self._window_end if strategy is ChunkStrategy.OPEN_LOOP else s + horizon
        if self.on_chunk is not None:
            self.on_chunk(record)

    def _blend(self, actions: np.ndarray, s: int, t: int) -> np.ndarray:
        """The new chunk with its first overlapping actions cross-faded from the current plan's."""
        assert self._plan is not None
        old_left = max(0, self._plan_end - t)
        overlap = min(old_left, len(actions) - (t - s))
        if self.config.blend_steps is not None:
            overlap = min(overlap, self.config.blend_steps)
        if overlap <= 0:
            return actions
        blended = np.array(actions, dtype=np.float32, copy=True)
        weights = (np.arange(1, overlap + 1, dtype=np.float32) / (overlap + 1))[:, None]
        old = self._plan[t - self._origin : t - self._origin + overlap]
        new = blended[t - s : t - s + overlap]
        blended[t - s : t - s + overlap] = (1.0 - weights) * old + weights * new
        return blended
