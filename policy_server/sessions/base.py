"""The session base: one robot connection's life, whatever protocol the robot speaks.

A :class:`Session` owns what every robot connection needs: the bounded outbox and the one sender task
that drains it, the table of its observations in flight, the observation rate limit, the idle clock,
putting observations in the host's request queue, turning the engine's outcomes (``on_result``,
``on_dropped``) into replies, draining at shutdown and closing. Every observation ``seq`` gets exactly
one terminal reply: a chunk, a drop or an error; an unread chunk replaced by a newer one becomes a drop
in its place.

A subclass is one protocol: it parses its client's frames (:meth:`Session.handle`) and encodes its own
replies (:meth:`Session.encode_chunk`, :meth:`Session.encode_drop`, :meth:`Session.encode_error`,
:meth:`Session.pack_chunk`). The native protocol is :mod:`.native`, openpi's :mod:`.openpi`. What a reply
is before a protocol encodes it (:class:`~.replies.ChunkReply`, the drop messages) is :mod:`.replies`.

Because every observation, chunk, drop, error, configuration, reset and close passes through here, this
is where a session is recorded (``docs/recording.md``): :attr:`Session.recording` (the hooks of
:mod:`.recording_hooks`) defaults to :data:`NOT_RECORDED`, which does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from cosmos3_runtime.requests import ActionRequest
from robot_clients.protocol import DropReason, ErrorCode, ProtocolError, SessionState

from ..engine.outcome import EngineOutcome
from ..engine.request_queue import PendingObservation, QueueClosed
from .config import SessionConfig
from .controls import ControlError, ControlErrorCode, OperatorControl
from .frame_decoding import DecodeSlot
from .host import SessionHost
from .outbox import OutboxFull, paced
from .recording_hooks import NOT_RECORDED, RecordingHooks, cameras_of
from .replies import DROP_MESSAGES, UNREAD_CHUNK_MESSAGE, ChunkReply, payload_size
from .telemetry import SessionTelemetry

# The reply and recording types live in their own modules; importers of this module still find them here.
__all__ = [
    "Session",
    "ChunkReply",
    "DROP_MESSAGES",
    "UNREAD_CHUNK_MESSAGE",
    "NOT_RECORDED",
    "RecordingHooks",
    "cameras_of",
]

logger = logging.getLogger(__name__)

# The outbox key of action chunks: a newer one replaces an unread one (latest wins for replies too).
_CHUNK = "chunk"


class Session:
    """One robot connection. Subclasses: :class:`~.native.RealtimeSession`, :class:`~.openpi.OpenpiSession`."""

    protocol: ClassVar[str] = "native"  # what observers show
    request_kind: ClassVar[str] = "realtime"  # the metrics label of its observations (native and openpi alike)
    controllable: ClassVar[bool] = False  # operators may pause, resume, stop and re-prompt it
    id_prefix: ClassVar[str] = ""
    # What the client is told (with a log reference) when handling one of its frames failed on our side.
    bug_message: ClassVar[str] = "the server failed on this frame; the log has details (ref {reference})"

    def __init__(self, connection: ServerConnection, host: SessionHost) -> None:
        self.id = self.id_prefix + uuid.uuid4().hex[:12]
        self.connection = connection
        self.host = host
        self.config: SessionConfig | None = None
        # Observations of this session that are waiting in the queue or running in the engine, by seq.
        self.in_flight: dict[int, PendingObservation] = {}
        self.closed = False
        self.outbox = host.settings.connection_limits.outbox()
        self.rate = host.settings.observation_rate.bucket()
        self.last_observation_at = time.monotonic()
        self.answered = 0
        self.dropped = 0
        self.telemetry: SessionTelemetry | None = None
        self.state = SessionState.RUNNING
        self.state_reason = ""
        self.recording: RecordingHooks = NOT_RECORDED
        if host.recorder is not None and host.settings.recording is not None and host.settings.recording.every_session:
            self.recording = host.recorder.session(self.id, self.protocol)
        self.close_reason = "closed"  # how its recorded episode ends
        self.frame_seq: int | None = None  # the seq the frame being handled is about, once known
        # Set by handle() when the client's first frame speaks another protocol served on the same path
        # (SGLang's lock-step mode on /v1/actions/realtime): run() then returns, once the replies queued so
        # far (the metadata) left, and the server hands the connection and that frame to its session kind.
        self.handover: Any = None
        # Observations whose encoded camera frames are being decoded off the event loop (one at a time).
        self.decoding = DecodeSlot(self._guard, self.drop, lambda: self.host.queue.holds_back_decoding(self.id))

    @property
    def remote(self) -> str | None:
        remote = self.connection.remote_address
        return f"{remote[0]}:{remote[1]}" if remote else None

    # -- the connection's life ---------------------------------------------------------------------

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_loop(), name=f"session-{self.id}-sender")
        try:
            self.opened()
            async for message in paced(self.connection, self.outbox):
                self._receive(message)
                if self.handover is not None:
                    break
        except ConnectionClosed:
            pass  # the client went away (or sent an oversized frame: websockets closed with 1009)
        finally:
            self._close()
            # The connection is gone (nobody will read what waits), or handed over (what waits still leaves).
            self.outbox.close(discard=self.handover is None)
            try:
                await asyncio.wait_for(sender, timeout=1.0)
            except (asyncio.TimeoutError, ConnectionClosed):
                sender.cancel()

    def _close(self) -> None:
        self.closed = True
        self.decoding.close()
        # A waiting observation is simply forgotten; a running one finishes and is discarded (the
        # worker never blocks on a session), so a vanished client costs at most one inference.
        self.host.queue.cancel(self.id)
        self.in_flight.clear()
        self.recording.end_episode(self.close_reason)

    def idle_for(self, now: float) -> float:
        """Seconds without an observation while nothing of this session is queued or running."""
        return 0.0 if self.in_flight else now - self.last_observation_at

    async def drain(self, timeout: float) -> None:
        """Wait until the outbox is empty (used at shutdown, before closing with 1001)."""
        deadline = time.monotonic() + timeout
        while not self.outbox.empty() and time.monotonic() < deadline and not self.closed:
            await asyncio.sleep(0.005)

    # -- what a protocol defines ---------------------------------------------------------------------

    def opened(self) -> None:
        """Called once the sender runs, before the first frame is read: send the hello."""

    def handle(self, message: bytes | str, received_at: float) -> None:
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
        still decoding ahead of it (:class:`~.frame_decoding.DecodeSlot`: latest wins, order kept)."""
        if decode is None and not self.decoding.busy:
            admit(observation, received_at)
            return
        self.decoding.submit(seq, received_at, decode, observation, admit)

    def encode_error(self, code: str, message: str, field: str | None, seq: int | None) -> bytes | str:
        raise NotImplementedError

    def encode_drop(self, seq: int, reason: str, message: str) -> bytes | str:
        raise NotImplementedError

    def encode_chunk(self, item: PendingObservation, outcome: EngineOutcome) -> ChunkReply:
        raise NotImplementedError

    def pack_chunk(self, reply: ChunkReply) -> bytes | str:
        """The chunk as it goes on the wire (called by the sender, as it leaves)."""
        raise NotImplementedError

    def notify(self, event: str, details: Mapping[str, Any]) -> None:
        """Something happened to this session on the server's side (``replica_moved``). A protocol without
        such a frame (openpi) carries on without telling its client."""
        self.recording.note(event, **details)

    def apply_control(self, control: OperatorControl) -> SessionState:
        """An operator's control; only :attr:`controllable` sessions accept one."""
        raise ControlError(
            ControlErrorCode.NOT_CONTROLLABLE,
            f"{self.protocol} clients cannot be told to pause or change prompt; only native sessions can",
            "session_id",
        )

    # -- replies --------------------------------------------------------------------------------------

    def put(self, payload: bytes | str | ChunkReply) -> None:
        """Queue a reply; a chunk replaces an unread one, which becomes a drop in its place."""
        if self.closed:
            return
        try:
            if isinstance(payload, ChunkReply):
                self.outbox.put(payload, payload.nbytes, latest=_CHUNK, replaced=self._unread_chunk_dropped)
            else:
                self.outbox.put(payload, payload_size(payload))
        except OutboxFull as full:
            self.host.supervisor.overflowed(self, full)

    def send_error(self, code: str, message: str, field: str | None = None, seq: int | None = None) -> None:
        if self.telemetry is not None:
            self.telemetry.record_error()
        self.recording.error(seq, code, message, field)
        self.put(self.encode_error(code, message, field, seq))

    def drop(self, seq: int, reason: str, message: str | None = None) -> None:
        """Answer ``seq`` with a drop (counted; it never reached, or left, the engine)."""
        message = message or DROP_MESSAGES.get(reason, reason)
        self.dropped += 1
        if self.telemetry is not None:
            self.telemetry.record_drop(seq, reason)
        self.recording.dropped(seq, reason, message)
        self.put(self.encode_drop(seq, reason, message))

    def report_dropped(self, item: PendingObservation, reason: str) -> None:
        self.in_flight.pop(item.seq, None)
        self.drop(item.seq, reason)

    def _unread_chunk_dropped(self, reply: ChunkReply) -> tuple[bytes | str, int]:
        """An unread chunk that a newer one replaced: its seq still gets a terminal reply, a drop."""
        self.answered -= 1
        self.dropped += 1
        if self.telemetry is not None:
            self.telemetry.record_drop(reply.seq, DropReason.SUPERSEDED)
        self.recording.dropped(reply.seq, DropReason.SUPERSEDED, UNREAD_CHUNK_MESSAGE)
        payload = self.encode_drop(reply.seq, DropReason.SUPERSEDED, UNREAD_CHUNK_MESSAGE)
        return payload, payload_size(payload)

    async def _send_loop(self) -> None:
        try:
            await self.outbox.pump(self.connection.send, self._wire)
        except ConnectionClosed:
            pass

    def _wire(self, payload: bytes | str | ChunkReply) -> bytes | str:
        if not isinstance(payload, ChunkReply):
            return payload
        payload.timing["observation_age_ms"] = (time.monotonic() - payload.received_at) * 1e3
        self.recording.chunk(payload.seq, payload.actions, payload.timing, payload.seed)
        return self.pack_chunk(payload)

    # -- frames from the client ----------------------------------------------------------------------

    def _receive(self, message: bytes | str) -> None:
        self._guard(None, self.handle, message, time.monotonic())

    def _guard(self, seq: int | None, function: Callable[..., None], *args: Any) -> None:
        """``function(*args)`` for a frame about ``seq`` (None: not known yet); an error is answered."""
        self.frame_seq = seq
        try:
            function(*args)
        except ProtocolError as exc:
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
        """The session's configuration changed (``configure``, an operator's prompt, openpi's settings)."""
        first = self.config is None
        self.config = config
        assert self.host.description is not None, "sessions open once the model is ready"
        resolved = config.resolved(self.host.description)
        if first:
            self.recording.start_episode(resolved, self.host.description.raw)
        else:
            self.recording.configured(resolved)

    @property
    def recorded(self) -> bool:
        return self.recording is not NOT_RECORDED

    def set_recording(self, on: bool, reason: str = "") -> None:
        """Start (``configure``'s ``record: true``, an operator's ``record``) or stop recording this session.
        Recording starts an episode at once if the session is configured, else at its first ``configure``;
        stopping ends it (``recording_stopped``, the event log saying who stopped it: ``reason``)."""
        if on == self.recorded:
            return
        if not on:
            self.recording.note("recording", action="stop", reason=reason)
            self.recording.end_episode("recording_stopped")
            self.recording = NOT_RECORDED
            return
        if self.host.recorder is None:
            raise ProtocolError(
                ErrorCode.RECORDING_UNAVAILABLE,
                "this server records nothing: it was started without --record-dir",
                "record",
            )
        self.recording = self.host.recorder.session(self.id, self.protocol)
        if self.config is not None and self.host.description is not None:
            self.recording.start_episode(self.config.resolved(self.host.description), self.host.description.raw)

    def reset(self) -> None:
        """Forget what is in flight (dropped ``cancelled``); the recording starts a new episode."""
        self.cancel_in_flight(None)
        self.recording.end_episode("reset")
        if self.config is not None and self.host.description is not None:
            self.recording.start_episode(self.config.resolved(self.host.description), self.host.description.raw)

    def enqueue(
        self,
        seq: int,
        request: ActionRequest,
        received_at: float,
        cameras: Mapping[str, np.ndarray],
        *,
        deadline_at: float | None = None,
        client_timestamp: float | None = None,
    ) -> None:
        """Put an observation in the host's queue; the one it replaced (latest wins) is dropped ``superseded``."""
        self.recording.observation(seq, cameras, request, received_at=received_at, client_timestamp=client_timestamp)
        item = PendingObservation(
            session_id=self.id,
            seq=seq,
            request=request,
            owner=self,
            received_at=received_at,
            decode_ms=(time.monotonic() - received_at) * 1e3,
            decode_cpu_s=self.decoding.take_cpu_s(),  # its turn pays for it in the queue
            deadline_at=deadline_at,
            client_timestamp=client_timestamp,
        )
        try:
            replaced = self.host.queue.put(item)
        except QueueClosed:
            self.refuse_at_shutdown(seq)
            return
        self.in_flight[seq] = item
        if replaced is not None:
            self.report_dropped(replaced, DropReason.SUPERSEDED)

    def refuse_at_shutdown(self, seq: int) -> None:
        """The queue is closed: the server is stopping and will not run this observation."""
        self.put(self.encode_drop(seq, DropReason.SHUTDOWN, DROP_MESSAGES[DropReason.SHUTDOWN]))

    def cancel_in_flight(self, seq: int | None, reason: str = DropReason.CANCELLED) -> None:
        """Drop ``seq`` (None: every observation in flight) with ``reason``, now."""
        for decoding in self.decoding.cancel(seq):
            self.drop(decoding, reason)
        for item in [item for s, item in self.in_flight.items() if seq is None or s == seq]:
            # Waiting: take it out of the queue. Running: it cannot be stopped mid-forward, so mark it;
            # its result will be discarded. Either way the client hears `dropped` now, not later.
            self.host.queue.cancel(self.id, item.seq)
            item.cancelled = True
            self.report_dropped(item, reason)

    # -- outcomes from the engine worker (called on the event loop) ----------------------------------

    def _expects(self, item: PendingObservation) -> bool:
        return not self.closed and not item.cancelled and self.in_flight.get(item.seq) is item

    def on_dropped(self, item: PendingObservation, reason: str) -> None:
        if self._expects(item):
            self.report_dropped(item, reason)

    def on_result(self, item: PendingObservation, outcome: EngineOutcome) -> None:
        if not self._expects(item):
            return  # the client left, cancelled or reset: nobody wants these actions any more
        del self.in_flight[item.seq]
        if outcome.chunk is None:
            error = outcome.error
            assert error is not None, "an outcome has a chunk or an error"
            self.send_error(error.code, error.message, error.field, item.seq)
            return
        self.answered += 1
        reply = self.encode_chunk(item, outcome)
        if self.telemetry is not None:
            self.telemetry.record_chunk(item.seq, reply.actions, reply.timing)
        self.put(reply)
