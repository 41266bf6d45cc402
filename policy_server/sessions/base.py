"""The session base: one robot connection's life, whatever protocol the robot speaks.

A :class:`Session` does the I/O every robot connection needs: the bounded outbox and the one sender task
that drains it, the observation rate limit, the idle clock, putting observations in the request queue,
turning the engine's outcomes (``on_result``, ``on_dropped``) into replies, draining at shutdown and
closing. What it decides about its observations (sequence order, one terminal reply each, latest wins) is
its :class:`~.observation_rules.ObservationRules`, which has no sockets. What happens to it is told to its
listeners (:mod:`policy_server.session_events`: its telemetry, its recording), never to a feature by name.

A subclass is one protocol: it parses its client's frames (:meth:`Session.handle`) and encodes its own
replies (:meth:`Session.encode_chunk`, :meth:`Session.encode_drop`, :meth:`Session.encode_error`,
:meth:`Session.pack_chunk`). The native protocol is :mod:`.native`, openpi's :mod:`.openpi`.

**Policy sessions.** An observation that names a ``session_id`` belongs to a policy session of the
connection (:mod:`.policy_sessions`): a session of the same protocol made for that name
(:meth:`Session.spawn`, :attr:`Session.parent` set), with its own id, rules, decode slot, queue slot and
turn, listeners and recording, that shares the connection's socket, outbox and rate limit. It is registered
with the server like a connection (it counts against ``--max-sessions``), is never run itself (the
connection's reader hands it its frames) and ends when it expires or when the connection closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.requests import ActionRequest, ResolvedSettings
from robot_clients.client_frames import ObservationFrame
from robot_clients.protocol import DropReason, ErrorCode, ProtocolError, SessionState

from ..context import ServerContext
from ..engine.request_queue import EngineOutcome, PendingObservation, QueueClosed
from ..foundation.camera_intake import DecodeSlot
from ..foundation.outbox import Outbox, OutboxFull, paced, payload_size
from ..foundation.rate_limit import TokenBucket
from ..session_config import SessionConfig
from ..session_events import AcceptedObservation, SessionListener
from .controls import ControlError, ControlErrorCode, OperatorControl
from .observation_rules import DROP_MESSAGES, ChunkReply, Drop, ObservationRules
from .policy_sessions import PolicySessionTable
from .telemetry import SessionTelemetry
from .wire_intake import WireIntake

logger = logging.getLogger(__name__)

# The outbox key of action chunks: a newer one replaces an unread one (latest wins for replies too).
_CHUNK = "chunk"

# What a session's frames become on the wire.
Payload = bytes | str


class Session:
    """One robot connection. Subclasses: :class:`~.native.NativeSession`, :class:`~.openpi.OpenpiSession`."""

    protocol: ClassVar[str] = "native"  # what observers show
    request_kind: str = "realtime"  # the metrics label of its observations (native and openpi alike)
    controllable: ClassVar[bool] = False  # operators may pause, resume, stop and re-prompt it
    id_prefix: ClassVar[str] = ""
    # What the client is told (with a log reference) when handling one of its frames failed on our side.
    bug_message: ClassVar[str] = "the server failed on this frame; the log has details (ref {reference})"

    def __init__(
        self,
        connection: ServerConnection,
        context: ServerContext[Session],
        *,
        parent: Session | None = None,
        name: str | None = None,
    ) -> None:
        # A policy session (``parent`` set) is named by its client (``name``) and shares the socket.
        self.parent = parent
        self.name = name
        self.id: str = self.id_prefix + uuid.uuid4().hex[:12] if parent is None else f"{parent.id}/{name}"
        self.connection = connection
        self.context = context
        self.config: SessionConfig | None = None
        # What ``config`` resolves to (``config.settings(description)``), kept from set_config: every observation's
        # media step reads it. None before a configure.
        self.resolved_settings: ResolvedSettings | None = None
        self.rules = ObservationRules()
        self.outbox: Outbox = context.settings.session_limits.outbox() if parent is None else parent.outbox
        self.rate: TokenBucket = context.settings.observation_rate.bucket() if parent is None else parent.rate
        # The connection's named policy sessions (:mod:`.policy_sessions`); a policy session has none.
        self.policy_sessions: PolicySessionTable[Session] = PolicySessionTable(context.settings.policy_sessions)
        # The turn its observations wait for in the request queue: None, its own; a policy session's is one
        # of its connection's (PolicySessionLimits: the connection is the unit of fairness).
        self.turn: tuple[str, int] | None = None
        self._names_opened = 0
        self._expiry: asyncio.TimerHandle | None = None
        self.last_observation_at = time.monotonic()
        self.telemetry: SessionTelemetry | None = None  # what observers see; a kind with none says so
        self.state = SessionState.RUNNING
        self.state_reason = ""
        self.listeners: list[SessionListener] = []
        self.recording: SessionListener | None = None  # one of the listeners, while this session is recorded
        recordings = context.recordings
        if recordings is not None and recordings.every_session:
            self.recording = recordings.listener(self.id, self.protocol)
            self.listeners.append(self.recording)
        self.close_reason = "closed"  # what its listeners hear when it ends
        self.frame_seq: int | None = None  # the seq the frame being handled is about, once known
        # Set by handle() when the client's first frame speaks another dialect served on the same path
        # (:class:`.native.Dialect`): run() then returns, once the replies queued so far (the metadata) left, and
        # the server hands the connection to that dialect's session.
        self.handed_over = False
        # Observations whose encoded camera frames are being decoded off the event loop (one at a time).
        self.decoding = DecodeSlot(
            self._guard, self.drop, lambda: self.context.queue.holds_back_decoding(self.id, self.turn)
        )
        # Its msgpack frames, decoded within the server's element budget (large ones on a thread, paid for here).
        self.intake = WireIntake(context.settings.frame_budget, self.decoding.charge)

    @property
    def description(self) -> ModelDescription:
        """The loaded model's description: sessions open only once the model is ready, so it is there."""
        description = self.context.description
        assert description is not None, "sessions open once the model is ready"
        return description

    @property
    def remote(self) -> str | None:
        remote = self.connection.remote_address
        return f"{remote[0]}:{remote[1]}" if remote else None

    @property
    def answered(self) -> int:
        return self.rules.answered

    @property
    def dropped(self) -> int:
        return self.rules.dropped

    # -- the connection's life ---------------------------------------------------------------------

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_loop(), name=f"session-{self.id}-sender")
        try:
            self.opened()
            async for message in paced(self.connection, self.outbox):
                received_at = time.monotonic()
                await self.intake.prepare(message)  # a costly frame is decoded on a thread meanwhile
                self._receive(message, received_at)
                if self.handed_over:
                    break
        except ConnectionClosed:
            pass  # the client went away (or sent an oversized frame: websockets closed with 1009)
        finally:
            self._close()
            # The connection is gone (nobody will read what waits), or handed over (what waits still leaves).
            self.outbox.close(discard=not self.handed_over)
            try:
                await asyncio.wait_for(sender, timeout=1.0)
            except (asyncio.TimeoutError, ConnectionClosed):
                sender.cancel()

    def _close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        for policy_session in self.policy_sessions.clear():
            policy_session.close_reason = self.close_reason
            policy_session.end()
        self.rules.close()
        self.decoding.close()
        # A waiting observation is simply forgotten; a running one finishes and is discarded (the
        # worker never blocks on a session), so a vanished client costs at most one inference.
        self.context.queue.cancel(self.id)
        for listener in self.listeners:
            listener.closed(self.close_reason)

    def idle_for(self, now: float) -> float:
        """Seconds without an observation while nothing of this connection is queued or running. A policy
        session is never idle here: it expires (:meth:`expire_idle`) instead of closing the socket."""
        if self.parent is not None:
            return 0.0
        busy = self.rules.in_flight or any(session.rules.in_flight for session in self.policy_sessions)
        return 0.0 if busy else now - self.last_observation_at

    # -- policy sessions (``session_id``) ---------------------------------------------------------------

    def spawn(self, name: str) -> Session:
        """A new policy session of this connection named ``name``: this protocol's kind of session, with
        :attr:`parent` set (see the module docstring). Its configuration is set by the caller."""
        raise NotImplementedError

    def policy_session(self, name: str | None, seq: int | None = None) -> Session:
        """The session an observation naming ``session_id`` ``name`` belongs to: this one for None, else the
        policy session of that name, opened now if new, and used now by the idle clock
        (:attr:`~policy_server.server_settings.PolicySessionLimits.clock`). Raises :class:`ProtocolError`
        ``too_many_sessions`` (about ``seq``) past the connection's or the server's bound."""
        if name is None:
            return self
        settings = self.context.settings
        room = settings.max_sessions - len(self.context.sessions)
        per_peer = settings.policy_sessions.max_per_peer
        per_peer = settings.max_sessions - settings.max_sessions // 4 if per_peer is None else per_peer
        peer = self.peer
        held = sum(1 for session in list(self.context.sessions.values()) if session.peer == peer)
        now = self.policy_sessions.limits.clock()
        return self.policy_sessions.open(
            name, now, lambda: self._open_policy_session(name), room, seq, peer_room=per_peer - held
        )

    @property
    def peer(self) -> str | None:
        """The client's address, without its port (what per-peer bounds count)."""
        remote = self.connection.remote_address
        return str(remote[0]) if remote else None

    def _open_policy_session(self, name: str) -> Session:
        session = self.spawn(name)
        turns = self.policy_sessions.limits.turns_per_connection
        session.turn = (self.id, self._names_opened % max(1, turns))
        self._names_opened += 1
        self.context.register(session)
        if self.recorded and not session.recorded:  # the connection opted in (`record: true`): its names too
            session.set_recording(True, "connection")
        if self.config is not None:
            session.set_config(self.config)
        logger.info("session %s: policy session %s opened", self.id, session.id)
        if self._expiry is None and self.policy_sessions.limits.idle_timeout_s > 0:
            self._expiry = asyncio.get_running_loop().call_later(
                self.policy_sessions.limits.check_interval_s, self.expire_idle
            )
        return session

    def expire_idle(self) -> None:
        """End the policy sessions idle past their timeout (their slot freed, their episode ended), and look
        again later while any is left."""
        self._expiry = None
        if self.rules.closed:
            return
        for session in self.policy_sessions.expire(
            self.policy_sessions.limits.clock(), lambda s: bool(s.rules.in_flight or s.decoding.busy)
        ):
            session.close_reason = "expired"
            session.end()
            logger.info("session %s: policy session %s expired", self.id, session.id)
        if len(self.policy_sessions):
            self._expiry = asyncio.get_running_loop().call_later(
                self.policy_sessions.limits.check_interval_s, self.expire_idle
            )

    def end(self) -> None:
        """End this policy session (it expired, or its connection closed): what it has in flight is
        forgotten, its listeners hear :attr:`close_reason`, its server slot is freed."""
        self._close()
        self.context.unregister(self)

    async def drain(self, timeout: float) -> None:
        """Wait until the outbox is empty (used at shutdown, before closing with 1001)."""
        deadline = time.monotonic() + timeout
        while not self.outbox.empty() and time.monotonic() < deadline and not self.rules.closed:
            await asyncio.sleep(0.005)

    # -- what a protocol defines ---------------------------------------------------------------------

    def opened(self) -> None:
        """Called once the sender runs, before the first frame is read: send the hello."""

    def handle(self, message: Payload, received_at: float) -> None:
        """One frame from the client. Raise :class:`ProtocolError` to answer it with an error (set
        :attr:`frame_seq` as soon as the seq it is about is known)."""
        raise NotImplementedError

    def observe(
        self,
        seq: int,
        received_at: float,
        admit: Callable[[Any, float], None],
        observation: Any,
        decode: Callable[[], Any] | None = None,
    ) -> None:
        """The one step every observation takes from its parsed frame to its admission (``admit``: rate,
        seq, queue). ``decode`` (its encoded camera frames to pixels, headers already checked) runs on the
        decode pool, never here; an observation with nothing to decode is admitted at once unless one is
        still decoding ahead of it (:class:`~policy_server.foundation.camera_intake.DecodeSlot`: latest wins,
        order kept)."""
        if decode is None and not self.decoding.busy:
            admit(observation, received_at)
            return
        self.decoding.submit(seq, received_at, decode, observation, admit)

    def encode_error(self, code: str, message: str, field: str | None, seq: int | None) -> Payload:
        raise NotImplementedError

    def encode_drop(self, seq: int, reason: str, message: str) -> Payload:
        raise NotImplementedError

    def encode_chunk(self, item: PendingObservation, outcome: EngineOutcome) -> ChunkReply:
        raise NotImplementedError

    def pack_chunk(self, reply: ChunkReply) -> Payload:
        """The chunk as it goes on the wire (called by the sender, as it leaves)."""
        raise NotImplementedError

    def notify(self, event: str, details: Mapping[str, Any]) -> None:
        """Something happened to this session on the server's side (``replica_moved``). A protocol without
        such a frame (openpi) carries on without telling its client."""
        self.note(event, details)

    def apply_control(self, control: OperatorControl) -> SessionState:
        """An operator's control; only :attr:`controllable` sessions accept one."""
        raise ControlError(
            ControlErrorCode.NOT_CONTROLLABLE,
            f"{self.protocol} clients cannot be told to pause or change prompt; only native sessions can",
            "session_id",
        )

    # -- listeners ------------------------------------------------------------------------------------

    def note(self, kind: str, details: Mapping[str, Any]) -> None:
        """A line for the session's log, told to its listeners."""
        for listener in self.listeners:
            listener.noted(kind, details)

    def accepted(self, frame: ObservationFrame, request: ActionRequest, received_at: float) -> None:
        """An observation accepted (its one terminal reply follows), told to the listeners."""
        event = AcceptedObservation(frame, request, received_at)
        for listener in self.listeners:
            listener.observation(event)

    def _attach(self, listener: SessionListener) -> None:
        """A listener joins; if the session is configured it hears that first."""
        self.listeners.append(listener)
        description = self.context.description
        if self.config is not None and description is not None:
            listener.configured(self.config.resolved(description), description.identity())

    # -- replies --------------------------------------------------------------------------------------

    def put(self, payload: Payload | ChunkReply) -> None:
        """Queue a reply; a chunk replaces an unread one, which becomes a drop in its place."""
        if self.rules.closed:
            return
        try:
            if isinstance(payload, ChunkReply):
                payload.policy_session = self.name  # whose listeners hear it leave (:meth:`_wire`)
                latest = _CHUNK if self.name is None else f"{_CHUNK}/{self.name}"
                self.outbox.put(payload, payload.nbytes, latest=latest, replaced=self._unread_chunk_dropped)
            else:
                self.outbox.put(payload, payload_size(payload))
        except OutboxFull as full:
            self.context.supervisor.overflowed(self, full)

    def send_error(self, code: str, message: str, field: str | None = None, seq: int | None = None) -> None:
        for listener in self.listeners:
            listener.error(seq, code, message, field)
        self.put(self.encode_error(code, message, field, seq))

    def send_drop(self, drop: Drop) -> None:
        """Answer ``drop.seq`` with its drop, and tell the listeners."""
        for listener in self.listeners:
            listener.dropped(drop.seq, drop.reason, drop.message)
        self.put(self.encode_drop(drop.seq, drop.reason, drop.message))

    def drop(self, seq: int, reason: str, message: str | None = None) -> None:
        """Answer ``seq`` with a drop (counted; it never reached, or left, the engine)."""
        self.send_drop(self.rules.drop(seq, reason, message))

    def _unread_chunk_dropped(self, reply: ChunkReply) -> tuple[Payload, int]:
        """An unread chunk that a newer one replaced: its seq still gets a terminal reply, a drop."""
        drop = self.rules.unread_chunk_replaced(reply)
        for listener in self.listeners:
            listener.dropped(drop.seq, drop.reason, drop.message)
        payload = self.encode_drop(drop.seq, drop.reason, drop.message)
        return payload, payload_size(payload)

    async def _send_loop(self) -> None:
        try:
            await self.outbox.pump(self.connection.send, self._wire)
        except ConnectionClosed:
            pass

    def _wire(self, payload: Payload | ChunkReply) -> Payload:
        if not isinstance(payload, ChunkReply):
            return payload
        payload.timing["observation_age_ms"] = (time.monotonic() - payload.received_at) * 1e3
        name = payload.policy_session
        owner = self if name is None else self.policy_sessions.get(name)
        for listener in owner.listeners if owner is not None else ():  # an expired one's listeners are gone
            listener.chunk_sent(payload.seq, payload.actions, payload.timing, payload.seed)
        return self.pack_chunk(payload)

    # -- frames from the client ----------------------------------------------------------------------

    def _receive(self, message: Payload, received_at: float | None = None) -> None:
        self._guard(None, self.handle, message, time.monotonic() if received_at is None else received_at)

    def _guard(self, seq: int | None, function: Callable[..., None], *args: Any) -> None:
        """``function(*args)`` for a frame about ``seq`` (None: not known yet); an error is answered."""
        self.frame_seq = seq
        try:
            function(*args)
        except ProtocolError as exc:
            if function == self.handle:  # a frame from the wire, refused: its decoding is the connection's
                self.intake.spend_refused()
            self.send_error(exc.code, exc.message, exc.field, exc.seq if exc.seq is not None else self.frame_seq)
        except Exception:  # noqa: BLE001 - a bug of ours must not end the session, nor reach the client
            reference = uuid.uuid4().hex[:12]
            logger.exception("session %s: failed to handle a frame (ref %s)", self.id, reference)
            self.send_error(ErrorCode.ENGINE_ERROR, self.bug_message.format(reference=reference), None, self.frame_seq)

    def take_rate(self, received_at: float, seq: int | None = None) -> None:
        """Spend one of the session's observations per second; refuse the observation beyond the limit."""
        if not self.rate.take(received_at):
            raise ProtocolError(ErrorCode.RATE_LIMITED, self.rate.message(), None, seq)

    def set_config(self, config: SessionConfig) -> None:
        """The session's configuration changed (``configure``, an operator's prompt, openpi's settings);
        its policy sessions follow it."""
        self.config = config
        description = self.description
        resolved = self.resolved_settings = config.settings(description)
        shown = config.shown(resolved, description)
        for listener in self.listeners:
            listener.configured(shown, description.identity())
        for policy_session in self.policy_sessions:
            policy_session.set_config(config)

    @property
    def recorded(self) -> bool:
        return self.recording is not None

    def set_recording(self, on: bool, reason: str = "") -> None:
        """Start (``configure``'s ``record: true``, an operator's ``record``) or stop recording this session.
        Recording starts an episode at once if the session is configured, else at its first ``configure``;
        stopping ends it (``recording_stopped``, the event log saying who stopped it: ``reason``). The
        connection's policy sessions follow it."""
        for policy_session in self.policy_sessions:
            policy_session.set_recording(on, reason)
        if on == self.recorded:
            return
        if self.recording is not None:
            self.recording.noted("recording", {"action": "stop", "reason": reason})
            self.recording.closed("recording_stopped")
            self.listeners.remove(self.recording)
            self.recording = None
            return
        recordings = self.context.recordings
        if recordings is None:
            raise ProtocolError(
                ErrorCode.RECORDING_UNAVAILABLE,
                "this server records nothing: it was started without --record-dir",
                "record",
            )
        self.recording = recordings.listener(self.id, self.protocol)
        self._attach(self.recording)

    def reset(self) -> None:
        """Forget what is in flight (dropped ``cancelled``); the listeners hear of the reset."""
        self.cancel_in_flight(None)
        for listener in self.listeners:
            listener.reset()

    def enqueue(
        self,
        frame: ObservationFrame,
        request: ActionRequest,
        received_at: float,
        *,
        deadline_at: float | None = None,
    ) -> None:
        """Put an accepted observation in the queue; the one it replaced (latest wins) is dropped ``superseded``."""
        self.accepted(frame, request, received_at)
        item = PendingObservation(
            session_id=self.id,
            seq=frame.seq,
            request=request,
            owner=self,
            received_at=received_at,
            decode_ms=(time.monotonic() - received_at) * 1e3,
            decode_cpu_s=self.decoding.take_cpu_s(),  # its turn pays for it in the queue
            deadline_at=deadline_at,
            client_timestamp=frame.client_timestamp,
            turn=self.turn,
            turn_shares_call=self.turn is not None,
        )
        try:
            replaced = self.context.queue.put(item)
        except QueueClosed:
            self.refuse_at_shutdown(frame.seq)
            return
        drop = self.rules.admitted(item, replaced)
        if drop is not None:
            self.send_drop(drop)

    def refuse_at_shutdown(self, seq: int) -> None:
        """The queue is closed: the server is stopping and will not run this observation."""
        self.put(self.encode_drop(seq, DropReason.SHUTDOWN, DROP_MESSAGES[DropReason.SHUTDOWN]))

    def cancel_in_flight(self, seq: int | None, reason: str = DropReason.CANCELLED) -> None:
        """Drop ``seq`` (None: every observation in flight) with ``reason``, now."""
        for decoding in self.decoding.cancel(seq):
            self.drop(decoding, reason)
        for item in self.rules.cancel(seq):
            # Waiting: take it out of the queue. Running: it cannot be stopped mid-forward; it is marked,
            # and its result will be discarded. Either way the client hears `dropped` now, not later.
            self.context.queue.cancel(self.id, item.seq)
            self.send_drop(self.rules.end_in_flight(item, reason))

    # -- outcomes from the engine worker (called on the event loop) ----------------------------------

    def on_dropped(self, item: PendingObservation, reason: str) -> None:
        drop = self.rules.engine_dropped(item, reason)
        if drop is not None:
            self.send_drop(drop)

    def on_result(self, item: PendingObservation, outcome: EngineOutcome) -> None:
        if not self.rules.engine_answered(item):
            return  # the client left, cancelled or reset: nobody wants these actions any more
        if outcome.chunk is None:
            error = outcome.error
            assert error is not None, "an outcome has a chunk or an error"
            self.send_error(error.code, error.message, error.field, item.seq)
            return
        self.rules.chunk_made()
        reply = self.encode_chunk(item, outcome)
        for listener in self.listeners:
            listener.chunk_made(item.seq, reply.actions, reply.timing)
        self.put(reply)
