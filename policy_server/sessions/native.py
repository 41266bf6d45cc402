"""One robot's connection to ``/v1/actions/realtime``: where a request enters and where actions leave.

A :class:`RealtimeSession` lives as long as its WebSocket. It sends ``metadata``, then reads frames in a
loop: each is decoded with the shared wire codec, parsed by :mod:`robot_clients.client_frames`, and either
answered at once (``configure``, ``cancel``, ``reset``, errors) or turned into a
:class:`~policy_server.engine.request_queue.PendingObservation` and put in the server's request queue. The
engine worker calls back (on the event loop) with ``on_result`` / ``on_dropped``; replies go through a
bounded :class:`~policy_server.sessions.outbox.Outbox` that one sender task drains, so the reader never waits for a
slow client's socket and replies leave in the order they were made.

Every observation ``seq`` gets exactly one terminal reply: ``action_chunk``, ``dropped`` or ``error``.
That holds for a client that falls behind on its replies too: its outbox keeps only the newest unread
``action_chunk`` (latest wins); an older unread one becomes ``dropped`` (``superseded``) in its place. A
client whose outbox fills up, or whose oldest reply waits past ``--reply-timeout-s``, is closed with
1008 (:mod:`policy_server.sessions.supervisor`); so is one that sends no observation for
``--idle-timeout-s``.

Operators act on a session through the observer channel (:meth:`RealtimeSession.apply_control`): a
paused session answers observations ``dropped`` (``paused``), a stopped one is closed. What the session
did is recorded in its :class:`~policy_server.sessions.telemetry.SessionTelemetry` for observers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from robot_clients import client_frames, protocol
from robot_clients.protocol import (
    DropReason, ErrorCode, ProtocolError, SessionState, session_state_frame, session_updated_frame,
)
from robot_clients.wire_codec import WireFormatError, packb, unpackb

from ..engine.outcome import EngineOutcome
from ..engine.request_queue import PendingObservation, QueueClosed
from .config import SessionConfig, merge_session_config, observation_request, settings_used
from .controls import ControlAction, ControlError, ControlErrorCode, OperatorControl
from .outbox import OutboxFull, paced
from .supervisor import close_connection
from .telemetry import SessionTelemetry

if TYPE_CHECKING:
    from ..server import PolicyServer

logger = logging.getLogger(__name__)

_DROP_MESSAGES = {
    DropReason.SUPERSEDED: "a newer observation of this session replaced it before the engine reached it",
    DropReason.DEADLINE: "its deadline_ms passed before the engine reached it",
    DropReason.CANCELLED: "cancelled by the client",
    DropReason.SHUTDOWN: "the server is shutting down",
    DropReason.PAUSED: "an operator paused this session; hold until it is resumed",
    DropReason.STOPPED: "an operator stopped this session",
}
# An unread chunk replaced by a newer one in the outbox (the client is behind on its replies).
UNREAD_CHUNK_MESSAGE = "a newer chunk of this session replaced it before the client read it"

# Close code and reason when an operator stops a session (the client does not reconnect after it).
STOPPED_CLOSE_CODE = 1000
STOPPED_CLOSE_REASON = "session stopped by an operator"


class RealtimeSession:
    """Protocol state of one connection: its configuration, its seqs in flight, its outbox."""

    def __init__(self, connection: ServerConnection, server: "PolicyServer") -> None:
        self.id = uuid.uuid4().hex[:12]
        self.connection = connection
        self.server = server
        self.config: SessionConfig | None = None
        self.last_seq: int | None = None
        # Observations of this session that are waiting in the queue or running in the engine, by seq.
        self.in_flight: dict[int, PendingObservation] = {}
        self.closed = False
        self.outbox = server.settings.connection_limits.outbox()
        self.last_observation_at = time.monotonic()
        self.answered = 0
        self.dropped = 0
        self.telemetry = SessionTelemetry()
        self.state = SessionState.RUNNING
        self.state_reason = ""
        # True while the prompt is the operator's: per-observation prompt overrides are then ignored,
        # until the robot's own `configure` sets a prompt again.
        self.operator_prompt = False
        self.rate = server.settings.observation_rate.bucket()

    # -- the connection's life ---------------------------------------------------------------------

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_loop(), name=f"session-{self.id}-sender")
        try:
            self._send(self.server.metadata_frame(self.id))
            async for message in paced(self.connection, self.outbox):
                self._handle(message)
        except ConnectionClosed:
            pass  # the client went away (or sent an oversized frame: websockets closed with 1009)
        finally:
            self._close()
            self.outbox.close()  # the connection is gone: nobody will read what waits
            try:
                await asyncio.wait_for(sender, timeout=1.0)
            except (asyncio.TimeoutError, ConnectionClosed):
                sender.cancel()

    def _close(self) -> None:
        self.closed = True
        # A waiting observation is simply forgotten; a running one finishes and is discarded (the
        # worker never blocks on a session), so a vanished client costs at most one inference.
        self.server.queue.cancel(self.id)
        self.in_flight.clear()

    def idle_for(self, now: float) -> float:
        """Seconds without an observation while nothing of this session is queued or running."""
        return 0.0 if self.in_flight else now - self.last_observation_at

    async def drain(self, timeout: float) -> None:
        """Wait until the outbox is empty (used at shutdown, before closing with 1001)."""
        deadline = time.monotonic() + timeout
        while not self.outbox.empty() and time.monotonic() < deadline and not self.closed:
            await asyncio.sleep(0.005)

    def _send(self, frame: dict[str, Any], received_at: float | None = None) -> None:
        if self.closed:
            return
        try:
            if received_at is None:
                message = packb(frame)
                self.outbox.put(message, len(message))
            else:  # an action chunk: packed when it leaves, with its observation_age_ms; latest wins
                self.outbox.put((frame, received_at), len(packb(frame)), latest=protocol.ACTION_CHUNK,
                                replaced=self._unread_chunk_dropped)
        except OutboxFull as full:
            self.server.supervisor.overflowed(self, full)

    def _unread_chunk_dropped(self, entry: tuple[dict[str, Any], float]) -> tuple[bytes, int]:
        """An unread chunk that a newer one replaced: its seq still gets a terminal reply, ``dropped``."""
        seq = entry[0]["seq"]
        self.answered -= 1
        self.dropped += 1
        self.telemetry.record_drop(seq, DropReason.SUPERSEDED)
        message = packb(protocol.dropped_frame(seq, DropReason.SUPERSEDED, UNREAD_CHUNK_MESSAGE))
        return message, len(message)

    async def _send_loop(self) -> None:
        try:
            await self.outbox.pump(self.connection.send, self._encode)
        except ConnectionClosed:
            pass

    @staticmethod
    def _encode(payload: bytes | tuple[dict[str, Any], float]) -> bytes:
        if isinstance(payload, bytes):
            return payload
        frame, received_at = payload  # an action chunk: its age is measured as it leaves
        frame["timing"]["observation_age_ms"] = (time.monotonic() - received_at) * 1e3
        return packb(frame)

    # -- frames from the client ----------------------------------------------------------------------

    def _handle(self, message: bytes | str) -> None:
        received_at = time.monotonic()
        seq = None
        try:
            if isinstance(message, str):
                raise ProtocolError(
                    ErrorCode.BAD_FRAME, "text frames are not part of the protocol; send binary msgpack frames"
                )
            try:
                decoded = unpackb(message)
            except WireFormatError as exc:
                raise ProtocolError(ErrorCode.BAD_FRAME, exc.message, exc.field) from None
            if isinstance(decoded, dict) and isinstance(decoded.get("seq"), int):
                seq = decoded["seq"]  # so that even an early error names the observation it is about
            frame = client_frames.parse_client_frame(decoded, self.server.frame_limits)
            if isinstance(frame, client_frames.ObservationFrame):
                self._on_observation(frame, received_at)
            elif isinstance(frame, client_frames.ConfigureFrame):
                self._on_configure(frame)
            elif isinstance(frame, client_frames.CancelFrame):
                self._on_cancel(frame.seq)
            elif isinstance(frame, client_frames.ResetFrame):
                self._on_reset()
        except ProtocolError as exc:
            self.telemetry.record_error()
            self._send(protocol.error_frame(exc.code, exc.message, exc.field, exc.seq if exc.seq is not None else seq))
        except Exception:  # noqa: BLE001 - a bug of ours must not end the session, nor reach the client
            reference = uuid.uuid4().hex[:12]
            logger.exception("session %s: failed to handle a frame (ref %s)", self.id, reference)
            self._send(
                protocol.error_frame(
                    ErrorCode.ENGINE_ERROR, f"the server failed on this frame; the log has details (ref {reference})",
                    None, seq,
                )
            )

    def _on_configure(self, frame: client_frames.ConfigureFrame) -> None:
        self.config = merge_session_config(self.config, frame.settings, self.server.description)
        if "prompt" in frame.settings:
            self.operator_prompt = False
        self._send(
            {"type": protocol.SESSION, "session_id": self.id, "config": self.config.resolved(self.server.description),
             "state": self.state.value}
        )

    def _on_observation(self, obs: client_frames.ObservationFrame, received_at: float) -> None:
        if not self.rate.take(received_at):
            raise ProtocolError(ErrorCode.RATE_LIMITED, self.rate.message(), None, obs.seq)
        if self.operator_prompt:
            obs.overrides.pop("prompt", None)  # the operator steers; the chunk echoes the prompt used
        # Its own settings over the session's, checked like a `configure`; refused before it takes a seq.
        request = observation_request(self.config, obs, self.server.description)
        self.last_observation_at = received_at
        if self.last_seq is not None and obs.seq <= self.last_seq:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`seq` must increase within a session: got {obs.seq} after {self.last_seq} (send `reset` to restart)",
                "seq",
                obs.seq,
            )
        self.last_seq = obs.seq
        shown = obs.image if obs.images is None else next(iter(obs.images.values()))
        self.telemetry.record_observation(obs.seq, shown, obs.video)
        if self.state is not SessionState.RUNNING:
            reason = DropReason.PAUSED if self.state is SessionState.PAUSED else DropReason.STOPPED
            self.dropped += 1
            self.telemetry.record_drop(obs.seq, reason)
            self._send(protocol.dropped_frame(obs.seq, reason, _DROP_MESSAGES[reason]))
            return
        item = PendingObservation(
            session_id=self.id,
            seq=obs.seq,
            request=request,
            owner=self,
            received_at=received_at,
            decode_ms=(time.monotonic() - received_at) * 1e3,
            deadline_at=received_at + obs.deadline_ms / 1e3 if obs.deadline_ms is not None else None,
            client_timestamp=obs.client_timestamp,
        )
        try:
            replaced = self.server.queue.put(item)
        except QueueClosed:
            self._send(protocol.dropped_frame(obs.seq, DropReason.SHUTDOWN, _DROP_MESSAGES[DropReason.SHUTDOWN]))
            return
        self.in_flight[obs.seq] = item
        if replaced is not None:
            self._report_dropped(replaced, DropReason.SUPERSEDED)

    def _on_cancel(self, seq: int | None, reason: str = DropReason.CANCELLED) -> None:
        targets = [item for s, item in self.in_flight.items() if seq is None or s == seq]
        for item in targets:
            # Waiting: take it out of the queue. Running: it cannot be stopped mid-forward, so mark it;
            # its result will be discarded. Either way the client hears `dropped` now, not later.
            self.server.queue.cancel(self.id, item.seq)
            item.cancelled = True
            self._report_dropped(item, reason)

    def _on_reset(self) -> None:
        self._on_cancel(None)
        self.last_seq = None
        self._send({"type": protocol.RESET_DONE, "session_id": self.id})

    def _report_dropped(self, item: PendingObservation, reason: str) -> None:
        self.in_flight.pop(item.seq, None)
        self.dropped += 1
        self.telemetry.record_drop(item.seq, reason)
        self._send(protocol.dropped_frame(item.seq, reason, _DROP_MESSAGES[reason]))

    def send_session_event(self, event: str, details: dict[str, Any]) -> None:
        """Tell the robot something happened to its session on the server's side (e.g. ``replica_moved``)."""
        self._send({"type": protocol.SESSION_EVENT, "session_id": self.id, "event": event, **details})

    # -- operator controls (from the observer channel, on the event loop) ---------------------------

    def apply_control(self, control: OperatorControl) -> SessionState:
        """Pause, resume, stop or re-prompt this session and tell the robot; return the new state.

        Raises :class:`~policy_server.sessions.controls.ControlError` when the control makes no sense in
        the current state. Pausing or stopping drops what is waiting or running (``paused`` /
        ``stopped``): a chunk computed before the pause must not move a robot that was told to hold.
        """
        if self.state is SessionState.STOPPED:
            raise ControlError(ControlErrorCode.INVALID_STATE, "the session is stopped", "session_id")
        action = control.action
        if action is ControlAction.SET_PROMPT:
            self._set_operator_prompt(control)
        elif action is ControlAction.RESUME:
            self._change_state(SessionState.RUNNING, control.reason)
        else:
            state = SessionState.PAUSED if action is ControlAction.PAUSE else SessionState.STOPPED
            self._change_state(state, control.reason)
            self._on_cancel(None, DropReason.PAUSED if state is SessionState.PAUSED else DropReason.STOPPED)
            if state is SessionState.STOPPED:
                asyncio.get_running_loop().create_task(self._close_when_sent(), name=f"session-{self.id}-stop")
        return self.state

    def _change_state(self, state: SessionState, reason: str) -> None:
        if state is self.state:
            return  # idempotent: a second "pause" changes nothing and tells the robot nothing
        self.state, self.state_reason = state, reason
        self._send(session_state_frame(self.id, state, reason))

    def _set_operator_prompt(self, control: OperatorControl) -> None:
        if self.config is None:
            raise ControlError(ControlErrorCode.INVALID_STATE,
                               "the robot has not configured its session yet; there is no prompt to change", "prompt")
        self.config = dataclasses.replace(self.config, prompt=control.prompt or "")
        self.operator_prompt = True
        self._send(session_updated_frame(self.id, self.config.resolved(self.server.description), ["prompt"],
                                         control.reason))

    async def _close_when_sent(self) -> None:
        """Close with 1000 once the ``session_state: stopped`` frame (and the drops before it) left."""
        await self.drain(timeout=2.0)
        await close_connection(self.connection, STOPPED_CLOSE_CODE, STOPPED_CLOSE_REASON,
                               self.server.settings.connection_limits.close_grace_s)

    # -- outcomes from the engine worker (called on the event loop) ----------------------------------

    def on_dropped(self, item: PendingObservation, reason: str) -> None:
        if self.closed or item.cancelled or self.in_flight.get(item.seq) is not item:
            return
        self._report_dropped(item, reason)

    def on_result(self, item: PendingObservation, outcome: EngineOutcome) -> None:
        if self.closed or item.cancelled or self.in_flight.get(item.seq) is not item:
            return  # the client left, cancelled or reset: nobody wants these actions any more
        del self.in_flight[item.seq]
        if outcome.chunk is None:
            self.telemetry.record_error()
            error = outcome.error
            self._send(protocol.error_frame(error.code, error.message, error.field, item.seq))
            return
        self.answered += 1
        frame = self._chunk_frame(item, outcome)
        self.telemetry.record_chunk(item.seq, frame["actions"], frame["timing"])
        self._send(frame, received_at=item.received_at)

    def _chunk_frame(self, item: PendingObservation, outcome: EngineOutcome) -> dict[str, Any]:
        chunk = outcome.chunk
        engine_timing = chunk.timing
        queue_ms = ((item.taken_at or item.enqueued_at) - item.enqueued_at) * 1e3
        frame: dict[str, Any] = {
            "type": protocol.ACTION_CHUNK,
            "seq": item.seq,
            "actions": np.ascontiguousarray(chunk.actions, dtype=np.float32),
            "action_mode": chunk.action_mode,
            "domain_name": chunk.domain_name,
            "domain_id": chunk.domain_id,
            "raw_action_dim": chunk.raw_action_dim,
            "action_horizon": chunk.action_horizon,
            "num_steps": chunk.num_steps,
            "seed": chunk.seed,
            **settings_used(item.request, self.server.description),
            "timing": {
                "decode_ms": item.decode_ms,
                "queue_ms": queue_ms,
                "preprocess_ms": engine_timing.preprocess_ms,
                "model_ms": engine_timing.model_ms,
                "postprocess_ms": engine_timing.postprocess_ms,
                "engine_ms": outcome.engine_ms,
                "total_ms": (time.monotonic() - item.received_at) * 1e3,
                "observation_age_ms": None,  # filled in by the sender, just before the frame leaves
            },
        }
        if item.client_timestamp is not None:
            frame["timestamp"] = item.client_timestamp
        return frame
