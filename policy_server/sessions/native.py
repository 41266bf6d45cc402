"""One robot's connection to ``/v1/actions/realtime``: where a request enters and where actions leave.

A :class:`NativeSession` lives as long as its WebSocket. It sends ``metadata``, then reads frames in a
loop: each is decoded with the shared wire codec, parsed by :mod:`robot_clients.client_frames`, and either
answered at once (``configure``, ``cancel``, ``reset``, errors) or put in the server's request queue as
an observation. What every robot connection shares (the outbox and its sender task, the in-flight
table, the rate limit, ``on_result`` / ``on_dropped``) is the session base's (:mod:`.base`); this module
is the native protocol's frames.

Every observation ``seq`` gets exactly one terminal reply: ``action_chunk``, ``dropped`` or ``error``.
That holds for a client that falls behind on its replies too: its outbox keeps only the newest unread
``action_chunk`` (latest wins); an older unread one becomes ``dropped`` (``superseded``) in its place. A
client whose outbox fills up, or whose oldest reply waits past ``--reply-timeout-s``, is closed with
1008 (:mod:`policy_server.foundation.connection_supervisor`); so is one that sends no observation for
``--idle-timeout-s``.

An observation naming a ``session_id`` belongs to that policy session of the connection
(:mod:`.policy_sessions`): its ``seq`` increases within that policy session, and every reply about it
(``action_chunk``, ``dropped``, ``error``) carries the same ``session_id``. ``cancel`` and ``reset`` name
one the same way; ``configure`` sets the connection's settings, which its policy sessions follow.

Operators act on a session through the observer channel (:meth:`NativeSession.apply_control`): a
paused session answers observations ``dropped`` (``paused``), a stopped one is closed. What the session
did is recorded in its :class:`~policy_server.sessions.telemetry.SessionTelemetry` for observers.

**Dialects** (:class:`Dialect`), chosen by a connection's first frame. Other clients than ours speak on
the robots' path: SGLang's lock-step clients (a first frame without ``type``,
``policy_server.sglang.lockstep_session``). Whoever assembles the server (``policy_server.assembly.cli``) hands
it the dialects it serves; the core names none of them. A client that must not be greeted with the
native ``metadata`` frame (one that speaks first and reads only its own frames) gets a path of its own
instead (:class:`policy_server.sessions.endpoints.SessionEndpoint`).

The contract of a :class:`Dialect`:

* On connect the native session sends its ``metadata`` frame, as native clients expect before they send
  anything; each dialect may add its own keys to it first (:meth:`Dialect.hello`), since its clients read
  the same frame.
* The connection's first frame is offered to each dialect in turn, before the native protocol parses it
  (:meth:`Dialect.claims` with a :class:`FirstFrame`: the raw message and what the wire codec made of it,
  or None when it is not a msgpack value the codec reads). The first dialect that claims it wins; no
  claim: the native protocol serves the connection. ``claims`` must be cheap, pure and never raise: it
  only inspects the frame.
* A claimed connection is handed over: the native session stops reading, lets what it queued (the
  metadata) leave, and leaves the registry; :meth:`Dialect.session` then makes the session that serves
  the connection from that first frame on (it must handle the first frame itself, for instance in its
  ``opened``), under the same session id (the metadata already told the client). The server registers
  and runs it like any other session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from websockets.asyncio.server import ServerConnection

from robot_clients import client_frames, protocol
from robot_clients.protocol import DropReason, ErrorCode, ProtocolError, ServerFrame, SessionState
from robot_clients.wire_codec import WireFormatError, packb

from ..context import ServerContext
from ..engine.request_queue import EngineOutcome, PendingObservation
from ..foundation.camera_intake import canvas_side, native_decode
from ..foundation.connection_supervisor import close_connection
from ..metadata import native_metadata
from ..session_config import merge_session_config, observation_request, settings_used
from .base import Session
from .controls import ControlAction, ControlError, ControlErrorCode, OperatorControl
from .observation_rules import ChunkReply
from .telemetry import SessionTelemetry

# Close code and reason when an operator stops a session (the client does not reconnect after it).
STOPPED_CLOSE_CODE = 1000
STOPPED_CLOSE_REASON = "session stopped by an operator"


@dataclass(frozen=True)
class FirstFrame:
    """A connection's first frame: as received, and decoded by the wire codec (None: it could not be)."""

    message: bytes | str
    decoded: Any
    received_at: float  # time.monotonic()


class Dialect(Protocol):
    """A protocol served on the robots' path beside the native one (see the module docstring)."""

    name: str  # for the logs: "sglang", "vla-eval"

    def hello(self, context: ServerContext[Session], metadata: protocol.MetadataFrame) -> protocol.MetadataFrame:
        """The native ``metadata`` frame with this dialect's keys added (or unchanged)."""
        ...

    def claims(self, first: FirstFrame) -> bool:
        """Whether ``first`` is this dialect's; pure, cheap, never raises."""
        ...

    def session(
        self,
        connection: ServerConnection,
        context: ServerContext[Session],
        session_id: str,
        first: FirstFrame,
        hello_sent_at: float,
    ) -> Session:
        """The session serving the handed-over connection, starting with ``first``."""
        ...


class NativeSession(Session):
    """The native protocol: configure, observations with seqs, cancel, reset, operator controls."""

    protocol = "native"
    controllable = True

    def __init__(
        self,
        connection: ServerConnection,
        context: ServerContext[Session],
        dialects: tuple[Dialect, ...] = (),
        *,
        parent: Session | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(connection, context, parent=parent, name=name)
        self.telemetry = SessionTelemetry()
        self.listeners.append(self.telemetry)
        # True while the prompt is the operator's: per-observation prompt overrides are then ignored,
        # until the robot's own `configure` sets a prompt again.
        self.operator_prompt = False
        # The other protocols served on this path: the first frame may choose one (:class:`Dialect`).
        self.dialects = dialects
        self.frames_read = 0
        # The dialect that claimed the first frame, and that frame: the server hands the connection to it.
        self.handover: tuple[Dialect, FirstFrame] | None = None

    def opened(self) -> None:
        hello = native_metadata(self.context, self.id)
        for dialect in self.dialects:
            hello = dialect.hello(self.context, hello)
        self._send(hello)

    # -- replies ---------------------------------------------------------------------------------------

    def spawn(self, name: str) -> NativeSession:
        return NativeSession(self.connection, self.context, parent=self, name=name)

    def encode_error(self, code: str, message: str, field: str | None, seq: int | None) -> bytes:
        return packb(protocol.ErrorFrame(code, message, field, seq, self.name).wire())

    def encode_drop(self, seq: int, reason: str, message: str) -> bytes:
        return packb(protocol.DroppedFrame(seq, reason, message, self.name).wire())

    def _send(self, frame: ServerFrame) -> None:
        self.put(packb(frame.wire()))

    def pack_chunk(self, reply: ChunkReply) -> bytes:
        return packb(reply.body)  # its timing is reply.timing, observation_age_ms now filled in

    def notify(self, event: str, details: Mapping[str, Any]) -> None:
        """Tell the robot something happened to its session on the server's side (e.g. ``replica_moved``)."""
        super().notify(event, details)
        self._send(protocol.SessionEventFrame(self.id, event, details))

    # -- frames from the client ----------------------------------------------------------------------

    def handle(self, message: bytes | str, received_at: float) -> None:
        first, self.frames_read = self.frames_read == 0, self.frames_read + 1
        decoded: Any = None
        refusal: ProtocolError | None = None
        if isinstance(message, str):
            refusal = ProtocolError(
                ErrorCode.BAD_FRAME, "text frames are not part of the protocol; send binary msgpack frames"
            )
        else:
            try:
                decoded = self.intake.unpack(message)
            except WireFormatError as exc:
                refusal = ProtocolError(ErrorCode.BAD_FRAME, exc.message, exc.field)
            except ProtocolError:  # past the element budget
                self.rate.take(received_at)
                raise
        if first and self.dialects and self._handed_over(FirstFrame(message, decoded, received_at)):
            return
        if refusal is not None:
            self.rate.take(received_at)  # a frame that fails to parse spends the rate an observation would
            raise refusal
        if isinstance(decoded, dict) and isinstance(decoded.get("seq"), int):
            self.frame_seq = decoded["seq"]  # so that even an early error names the observation it is about
        try:
            frame = client_frames.parse_client_frame(decoded, self.context.frame_limits)
        except ProtocolError:
            self.rate.take(received_at)
            raise
        if isinstance(frame, client_frames.ObservationFrame):
            # Its rate token is spent on arrival, before any decoding (as openpi's): a flood of encoded
            # frames that keep replacing the one waiting to be decoded is refused like any other flood.
            self.take_rate(received_at, frame.seq)
            target = self.policy_session(frame.session_id, frame.seq)
            if target is self:
                self.observe_native(frame, received_at)
            else:
                assert isinstance(target, NativeSession)
                target._guard(frame.seq, target.observe_native, frame, received_at)
        elif isinstance(frame, client_frames.ConfigureFrame):
            self._on_configure(frame)
        elif isinstance(frame, client_frames.CancelFrame):
            named = self._named_session(frame.session_id)
            if named is not None:
                named.cancel_in_flight(frame.seq)
        elif isinstance(frame, client_frames.ResetFrame):
            named = self._named_session(frame.session_id)
            if named is not None:
                named.reset()
                named.rules.restart()
            reset_id = self.id if frame.session_id is None else frame.session_id
            self._send(protocol.ResetDoneFrame(reset_id))

    def _named_session(self, name: str | None) -> Session | None:
        """The session a ``cancel`` or ``reset`` names: this one, a policy session, or None (no such name:
        nothing of it is in flight)."""
        return self if name is None else self.policy_sessions.get(name)

    def observe_native(self, frame: client_frames.ObservationFrame, received_at: float) -> None:
        """One parsed observation of this (policy) session: its media checked, then decoded and admitted."""
        # Checked now, by the one media check (headers, clip, composed frame, decoded bytes); pixels on the pool.
        decode = native_decode(frame, self.context.frame_limits, **self._media_plan(frame))
        self.observe(frame.seq, received_at, self._on_observation, frame, decode)

    def _handed_over(self, first: FirstFrame) -> bool:
        """Offer the first frame to the dialects; the first that claims it takes the connection over."""
        dialect = next((dialect for dialect in self.dialects if dialect.claims(first)), None)
        if dialect is None:
            return False
        self.handover, self.handed_over = (dialect, first), True
        return True

    def _media_plan(self, frame: client_frames.ObservationFrame) -> dict[str, Any]:
        """How this observation's cameras will be used: composed side by side (``concat_view``), and the
        canvas side its JPEGs may decode down to (its tier's; every tier's before a ``configure``)."""
        resolved = self.resolved_settings  # None before a configure
        tier = frame.overrides.get("resolution_tier", resolved.resolution_tier if resolved is not None else None)
        view_point = frame.overrides.get("view_point", resolved.view_point if resolved is not None else None)
        return {
            "side_by_side": view_point == "concat_view",
            "fit_side": canvas_side(self.context.description, tier if isinstance(tier, int) else None),
        }

    def _on_configure(self, frame: client_frames.ConfigureFrame) -> None:
        config = merge_session_config(self.config, frame.settings, self.description)  # refused: nothing changes
        if frame.record is not None:
            self.set_recording(frame.record, "configure")
        self.set_config(config)
        if "prompt" in frame.settings:
            self.operator_prompt = False
        assert self.resolved_settings is not None, "set by set_config"
        shown = config.shown(self.resolved_settings, self.description)
        self._send(protocol.SessionFrame(self.id, shown, self.state, self.recorded))

    def _on_observation(self, obs: client_frames.ObservationFrame, received_at: float) -> None:
        if self.operator_prompt:
            obs.overrides.pop("prompt", None)  # the operator steers; the chunk echoes the prompt used
        # Its own settings over the session's, checked like a `configure`; refused before it takes a seq.
        request = observation_request(self.config, obs, self.description)
        self.last_observation_at = received_at
        if self.parent is not None:  # the connection is not idle either
            self.parent.last_observation_at = received_at
        self.rules.check_order(obs.seq)
        state = self.operator_state
        if state is not SessionState.RUNNING:
            self.accepted(obs, request, received_at)
            self.drop(obs.seq, DropReason.PAUSED if state is SessionState.PAUSED else DropReason.STOPPED)
            return
        deadline_at = received_at + obs.deadline_ms / 1e3 if obs.deadline_ms is not None else None
        self.enqueue(obs, request, received_at, deadline_at=deadline_at)

    # -- operator controls (from the observer channel, on the event loop) ---------------------------

    @property
    def operator_state(self) -> SessionState:
        """Whether operators let this session's observations through: its own state, or its connection's
        when an operator paused or stopped the whole connection (every environment it drives holds)."""
        parent = self.parent
        if isinstance(parent, NativeSession) and parent.state is not SessionState.RUNNING:
            return parent.state
        return self.state

    def apply_control(self, control: OperatorControl) -> SessionState:
        """Pause, resume, stop or re-prompt this session and tell the robot; return the new state.

        Raises :class:`~policy_server.sessions.controls.ControlError` when the control makes no sense in
        the current state. Pausing or stopping drops what is waiting or running (``paused`` /
        ``stopped``): a chunk computed before the pause must not move a robot that was told to hold.
        """
        if self.state is SessionState.STOPPED:
            raise ControlError(ControlErrorCode.INVALID_STATE, "the session is stopped", "session_id")
        action = control.action
        self.note("operator", {"action": action.value, "reason": control.reason})
        if action is ControlAction.SET_PROMPT:
            self._set_operator_prompt(control)
        elif action is ControlAction.RESUME:
            self._change_state(SessionState.RUNNING, control.reason)
        else:
            state = SessionState.PAUSED if action is ControlAction.PAUSE else SessionState.STOPPED
            self._change_state(state, control.reason)
            reason = DropReason.PAUSED if state is SessionState.PAUSED else DropReason.STOPPED
            for session in (self, *self.policy_sessions):  # the connection's policy sessions hold with it
                session.cancel_in_flight(None, reason)
            if state is SessionState.STOPPED:
                self.close_reason = "stopped"
                asyncio.get_running_loop().create_task(self._close_when_sent(), name=f"session-{self.id}-stop")
        return self.state

    def _change_state(self, state: SessionState, reason: str) -> None:
        if state is self.state:
            return  # idempotent: a second "pause" changes nothing and tells the robot nothing
        self.state, self.state_reason = state, reason
        self._send(protocol.SessionStateFrame(self.id, state, reason))

    def _set_operator_prompt(self, control: OperatorControl) -> None:
        if self.config is None:
            raise ControlError(
                ControlErrorCode.INVALID_STATE,
                "the robot has not configured its session yet; there is no prompt to change",
                "prompt",
            )
        config = dataclasses.replace(self.config, prompt=control.prompt or "")
        self.set_config(config)
        self.operator_prompt = True
        self._send(
            protocol.SessionUpdatedFrame(self.id, config.resolved(self.description), ("prompt",), control.reason)
        )

    async def _close_when_sent(self) -> None:
        """Close with 1000 once the ``session_state: stopped`` frame (and the drops before it) left."""
        await self.drain(timeout=2.0)
        await close_connection(
            self.connection,
            STOPPED_CLOSE_CODE,
            STOPPED_CLOSE_REASON,
            self.context.settings.session_limits.close_grace_s,
        )

    # -- the chunk ------------------------------------------------------------------------------------

    def encode_chunk(self, item: PendingObservation, outcome: EngineOutcome) -> ChunkReply:
        chunk = outcome.chunk
        assert chunk is not None
        engine_timing = chunk.timing
        actions = np.ascontiguousarray(chunk.actions, dtype=np.float32)
        timing: dict[str, float | None] = {
            "decode_ms": item.decode_ms,
            "queue_ms": item.queue_ms,
            "preprocess_ms": engine_timing.preprocess_ms,
            "model_ms": engine_timing.model_ms,
            "postprocess_ms": engine_timing.postprocess_ms,
            "engine_ms": outcome.engine_ms,
            "total_ms": (time.monotonic() - item.received_at) * 1e3,
            "observation_age_ms": None,  # filled in by the sender, just before the frame leaves
        }
        frame = protocol.ActionChunkFrame(
            item.seq,
            actions,
            settings_used(chunk),
            chunk.action_horizon,
            chunk.domain_id,
            chunk.raw_action_dim,
            timing,
            item.client_timestamp,
            self.name,
        ).wire()
        return ChunkReply(item.seq, actions, chunk.seed, timing, item.received_at, frame, len(packb(frame)))
