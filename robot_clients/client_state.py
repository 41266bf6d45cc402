"""The robot client's protocol state, without I/O: what :class:`~robot_clients.client.AsyncPolicyClient` knows.

As in ``websockets``, the protocol lives in one object that never touches a socket, a task or the clock
(:class:`ClientState`; the clock is passed in). Its inputs are the caller's calls (an ``infer`` begun, ended
or timed out, a control call, an observation ready to be sent), what the link did (a frame written or its
write failed, a connection opened or lost, reconnecting given up, the client closing) and each frame
received. Its outputs are the observations to write next (:meth:`ClientState.next_write`) and events for
the caller (:meth:`ClientState.events`): a call answered or failed, a chunk streamed, the session's state
changed, a connection to close. The asyncio client only moves bytes and resolves futures; every rule about
what is lost, counted, answered or sent lives here, so each race is a table test of inputs and outputs.

A broken or hostile server cannot take the robot's memory or its calls: each frame is parsed once into a
typed server frame (:mod:`robot_clients.protocol`) and a malformed one ends only the call it answers
(:class:`MalformedServerFrame`); frames about observations the robot never sent, or of an unknown type, are
counted and dropped; what the client keeps (the stream, the counters, the observations it awaits) is bounded.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from . import protocol
from .client_frames import REQUEST_SETTINGS, SETTINGS_BY_NAME
from .protocol import (
    ActionChunkFrame,
    CodedError,
    DroppedFrame,
    DropReason,
    ErrorFrame,
    MetadataFrame,
    ResetDoneFrame,
    ServerFrame,
    SessionEventFrame,
    SessionFrame,
    SessionState,
    SessionStateFrame,
    SessionUpdatedFrame,
)
from .wire_codec import FRAME_MAX_DEPTH, FRAME_MAX_VALUES, WireFormatError, WireLimitError, packb, unpackb

logger = logging.getLogger("robot_clients.client")

# Session states an operator can set (server frame `session_state`).
RUNNING, PAUSED, STOPPED = SessionState.RUNNING.value, SessionState.PAUSED.value, SessionState.STOPPED.value
# The drop reason of an observation replaced on the robot, before it was sent (the in-flight bound).
UNSENT = "unsent"
# Drop reasons counted by name in ``ClientStats.dropped``; a server inventing more than this many is counted
# under OTHER_REASON from then on (200,000 unique reasons must not become 200,000 counters).
MAX_COUNTED_REASONS = 32
OTHER_REASON = "other"
# Observations sent and not yet answered that the client remembers, to tell an answer from an unsolicited
# frame. A server that never answers would otherwise grow the set by one per observation; past the bound the
# oldest one not awaited by a call is forgotten (a late answer to it is then counted unsolicited).
MAX_AWAITED_ANSWERS = 4096
# The bytes of streamed chunks (and errors) waiting for ``receive``: past this, the oldest are discarded as
# stale (a newer one of the robot's own observations is waiting behind them).
MAX_STREAM_BYTES = 32 * 2**20
# How the client closes a connection whose server broke the protocol (a chunk or drop it cannot attribute).
PROTOCOL_ERROR_CLOSE = 1002
INVALID_DATA_CLOSE = 1007
MESSAGE_TOO_BIG_CLOSE = 1009

Clock = Callable[[], float]


# ---------------------------------------------------------------------------------------------------
# What a call returns or raises
# ---------------------------------------------------------------------------------------------------


@dataclass
class ActionChunk:
    """A chunk of actions answering observation ``seq``: ``actions`` is float32, horizon × action width.

    ``timing`` is the server's breakdown in milliseconds (``queue_ms``, ``preprocess_ms``, ``model_ms``,
    ``postprocess_ms``, ``total_ms``, ``observation_age_ms``, ...); ``round_trip_ms`` is what this client
    measured from sending the observation to decoding the chunk.
    """

    seq: int
    actions: np.ndarray
    action_mode: str
    domain_name: str
    domain_id: int
    raw_action_dim: int
    num_steps: int | None = None
    seed: int | None = None
    timing: dict[str, float | None] = field(default_factory=dict)  # None: a step that did not run
    round_trip_ms: float | None = None
    # The other settings the server used for this chunk (an observation's own, else the session's).
    prompt: str | None = None
    resolution_tier: int | None = None
    view_point: str | None = None
    guidance_scale: float | None = None
    shift: float | None = None
    fps: float | None = None
    # The policy session it answers, as the observation named it (None: the connection's own session).
    session_id: str | None = None

    @property
    def action_horizon(self) -> int:
        return int(self.actions.shape[0])

    @classmethod
    def from_frame(cls, frame: ActionChunkFrame, round_trip_ms: float | None) -> ActionChunk:
        settings = frame.settings
        # The settings a chunk may report (its optional fields the table names): None when the frame has none.
        reported = {name: settings.get(name) for name in _REPORTED_FIELDS}
        return cls(
            seq=frame.seq,
            # The wire codec gives a read-only view on the received bytes; a robot may want to edit it.
            actions=np.array(frame.actions, dtype=np.float32, copy=True),
            action_mode=settings.get("action_mode", ""),
            domain_name=settings.get("domain_name", ""),
            domain_id=frame.domain_id,
            raw_action_dim=frame.raw_action_dim,
            timing=dict(frame.timing),
            round_trip_ms=round_trip_ms,
            session_id=frame.session_id,
            **reported,
        )


_REPORTED_FIELDS = tuple(f.name for f in fields(ActionChunk) if f.name in SETTINGS_BY_NAME and f.default is None)


class PolicyClientError(Exception):
    """Base of the errors a policy client raises."""


class ServerError(PolicyClientError, CodedError):
    """The server answered with an ``error`` frame: ``code`` is stable, ``field`` names the culprit."""

    def __init__(self, code: str, message: str, field: str | None = None, seq: int | None = None) -> None:
        CodedError.__init__(self, code, message, field)
        self.args = (self.text(),)
        self.seq = seq


class MalformedServerFrame(PolicyClientError):
    """The server answered this call with a frame that breaks the protocol (a field missing or of the wrong
    type). Only this call ends; the connection and the next call go on."""

    def __init__(self, frame_type: str, message: str, seq: int | None = None) -> None:
        super().__init__(f"the server sent a malformed `{frame_type}` frame: {message}")
        self.frame_type = frame_type
        self.seq = seq


class ObservationDropped(PolicyClientError):
    """The server will not answer this observation (``reason``: superseded, deadline, cancelled,
    shutdown), or the client discarded its answer because a newer one was already delivered (stale)."""

    def __init__(self, seq: int, reason: str, message: str = "") -> None:
        super().__init__(f"observation {seq} dropped: {reason}" + (f" ({message})" if message else ""))
        self.seq: int | None = seq  # None only for a SessionPaused refused before it was sent
        self.reason = reason


class ConnectionLost(PolicyClientError):
    """The connection closed before the answer came. The client reconnects in the background."""


class SessionPaused(ObservationDropped):
    """An operator paused the session: observations are not answered until it is resumed. Hold the robot.

    Raised for observations the server dropped because of the pause, and at once, without sending, for
    observations submitted while the client knows the session is paused.
    """

    def __init__(self, seq: int | None, message: str = "") -> None:
        PolicyClientError.__init__(
            self, "the session is paused by an operator" + (f" ({message})" if message else "") + "; hold"
        )
        self.seq = seq  # None: refused before it was sent
        self.reason = "paused"


class SessionStopped(PolicyClientError):
    """An operator stopped the session. The server closed the connection; the client does not reconnect."""

    reason = "stopped"


@dataclass
class ClientStats:
    """Counters of what happened to this client's observations (across reconnects)."""

    sent: int = 0
    answered: int = 0
    errors: int = 0
    stale: int = 0  # chunks discarded because a newer seq had already been delivered (or was waiting)
    reconnects: int = 0
    # By reason ("unsent": replaced on the robot, never sent); at most MAX_COUNTED_REASONS names, then "other".
    dropped: Counter[str] = field(default_factory=Counter)
    bytes_sent: int = 0  # observation frames written to the socket
    buffered_bytes: int = 0  # written and not yet acknowledged by the server, at the last submit
    buffered_bytes_max: int = 0
    unsolicited: int = 0  # frames about no observation the client awaits, or of an unknown type: dropped
    malformed: int = 0  # frames that broke the protocol (undecodable, or a field missing or mistyped)


# ---------------------------------------------------------------------------------------------------
# Server frames, parsed once
# ---------------------------------------------------------------------------------------------------


class FrameParseError(ValueError):
    """A server frame that breaks the protocol: ``seq`` is the observation it is about, when readable."""

    def __init__(self, frame_type: str, message: str, seq: int | None = None) -> None:
        super().__init__(message)
        self.frame_type = frame_type
        self.message = message
        self.seq = seq


class UnknownFrame(ValueError):
    """A server frame that is not a map, or of a type this client does not know (a newer server's)."""


def decode_server_frame(message: bytes) -> Any:
    """One server frame, decoded within the element budget the server holds a robot's frames to (a chunk, a
    session config or the metadata hold a few hundred elements): a broken or hostile server cannot make the
    robot build millions of objects. Raises :class:`~robot_clients.wire_codec.WireFormatError`
    (:class:`~robot_clients.wire_codec.WireLimitError` past the budget)."""
    return unpackb(message, max_values=FRAME_MAX_VALUES, max_depth=FRAME_MAX_DEPTH)


def close_code(error: WireFormatError) -> int:
    """How the client closes a connection whose server sent a frame it does not decode."""
    return MESSAGE_TOO_BIG_CLOSE if isinstance(error, WireLimitError) else INVALID_DATA_CLOSE


class _Fields:
    """One decoded frame's fields, each read once with its type checked (a :class:`FrameParseError` names
    the first that is missing or mistyped)."""

    def __init__(self, frame_type: str, frame: Mapping[Any, Any]) -> None:
        self.type = frame_type
        self.frame = frame
        self.seq: int | None = None

    def fail(self, message: str) -> FrameParseError:
        return FrameParseError(self.type, message, self.seq)

    def get(self, name: str, types: type | tuple[type, ...], default: Any = ..., nullable: bool = False) -> Any:
        if name not in self.frame:
            if default is ...:
                raise self.fail(f"`{name}` is missing")
            return default
        value = self.frame[name]
        if value is None and nullable:
            return None
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
            raise self.fail(f"`{name}` is {type(value).__name__}, not {_type_names(types)}")
        return value

    def seq_field(self, nullable: bool = False) -> int | None:
        seq: int | None = self.get("seq", int, None if nullable else ..., nullable=nullable)
        if seq is not None and seq < 0:
            raise self.fail(f"`seq` is {seq}")
        self.seq = seq
        return seq

    def mapping(self, name: str, default: Any = ...) -> dict[str, Any]:
        value = self.get(name, dict, default)
        if not all(isinstance(key, str) for key in value):
            raise self.fail(f"`{name}` has keys that are not strings")
        return dict(value)


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _type_names(types: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(types))


# The settings a chunk reports, with the types each may take (the table's; None when the server left it out).
_CHUNK_SETTINGS = {setting.name: setting.types for setting in REQUEST_SETTINGS if setting.in_chunk}
_NUMBER = (int, float)


def _state(fields_: _Fields) -> SessionState:
    value = fields_.get("state", str)
    try:
        return SessionState(value)
    except ValueError:
        raise fields_.fail(f"`state` is {value!r}, not one of {', '.join(s.value for s in SessionState)}") from None


def _parse_chunk(f: _Fields) -> ActionChunkFrame:
    frame = f.frame
    # Every chunk of a round trip comes through here: the usual case (each field of an exact type the protocol
    # allows) is one lookup and one type test a field; anything else goes through the checked read, which
    # names what is wrong.
    seq = frame.get("seq")
    if type(seq) is not int or seq < 0:
        seq = f.seq_field()
    f.seq = seq
    assert seq is not None
    actions = frame.get("actions")
    if type(actions) is not np.ndarray:
        actions = f.get("actions", np.ndarray)
    if actions.ndim != 2 or actions.dtype.kind not in "fiu":
        raise f.fail(f"`actions` is a {actions.ndim}-D {actions.dtype} array, not a horizon × width of numbers")
    settings = {}
    for name, types in _CHUNK_SETTINGS.items():
        value = frame.get(name)
        if value is not None:
            value = value if type(value) in types else f.get(name, types, None, nullable=True)
            if value is not None:
                settings[name] = value
    timing = frame.get("timing", {})
    if type(timing) is not dict:
        timing = f.mapping("timing")
    for name, value in timing.items():
        if type(name) is not str:
            raise f.fail("`timing` has keys that are not strings")
        if value is not None and type(value) not in _NUMBER:
            raise f.fail(f"`timing.{name}` is {type(value).__name__}, not a number")
    timestamp = frame.get("timestamp")
    return ActionChunkFrame(
        seq=seq,
        actions=actions,
        settings=settings,
        action_horizon=_int_field(f, "action_horizon", int(actions.shape[0])),
        domain_id=_int_field(f, "domain_id", -1),
        raw_action_dim=_int_field(f, "raw_action_dim", -1),
        timing=dict(timing),
        timestamp=timestamp if isinstance(timestamp, (int, float, str, bytes)) else None,
        session_id=f.get(protocol.SESSION_ID, str, None, nullable=True) if protocol.SESSION_ID in frame else None,
    )


def _int_field(f: _Fields, name: str, default: int) -> int:
    value = f.frame.get(name, default)
    return value if type(value) is int else f.get(name, int, default)


def _parse(f: _Fields) -> ServerFrame:
    if f.type == protocol.ACTION_CHUNK:
        return _parse_chunk(f)
    if f.type == protocol.DROPPED:
        seq = f.seq_field()
        assert seq is not None
        return DroppedFrame(
            seq, f.get("reason", str), f.get("message", str, ""), f.get(protocol.SESSION_ID, str, None, nullable=True)
        )
    if f.type == protocol.ERROR:
        seq = f.seq_field(nullable=True)
        return ErrorFrame(
            f.get("code", str),
            f.get("message", str, ""),
            f.get("field", str, None, nullable=True),
            seq,
            f.get(protocol.SESSION_ID, str, None, nullable=True),
        )
    session_id = f.get("session_id", str, "")
    if f.type == protocol.SESSION:
        return SessionFrame(session_id, f.mapping("config"), _state(f) if "state" in f.frame else SessionState.RUNNING)
    if f.type == protocol.RESET_DONE:
        return ResetDoneFrame(session_id)
    if f.type == protocol.SESSION_STATE:
        return SessionStateFrame(session_id, _state(f), f.get("reason", str, "", nullable=True) or "")
    if f.type == protocol.SESSION_UPDATED:
        changed = f.get("changed", list, [])
        if not all(isinstance(name, str) for name in changed):
            raise f.fail("`changed` is not a list of setting names")
        return SessionUpdatedFrame(session_id, f.mapping("config"), tuple(changed), f.get("reason", str, ""))
    if f.type == protocol.SESSION_EVENT:
        details = {key: value for key, value in f.frame.items() if key not in ("type", "session_id", "event")}
        return SessionEventFrame(session_id, f.get("event", str), details)
    if f.type == protocol.METADATA:
        version = f.get("protocol_version", int)
        info = {key: value for key, value in f.frame.items() if key not in ("type", "protocol_version", "session_id")}
        if not all(isinstance(key, str) for key in info):
            raise f.fail("has keys that are not strings")
        return MetadataFrame(session_id, info, version)
    raise UnknownFrame(f"a server frame of unknown type {f.type!r}")


def parse_server_frame(decoded: Any) -> ServerFrame:
    """One decoded server frame as its typed frame. Raises :class:`UnknownFrame` (not a map, or an unknown
    ``type``) or :class:`FrameParseError` (a field missing or of the wrong type; its ``seq`` when readable)."""
    if not isinstance(decoded, dict):
        raise UnknownFrame(f"a server frame that is not a map but {type(decoded).__name__}")
    frame_type = decoded.get("type")
    if not isinstance(frame_type, str):
        raise UnknownFrame(f"a server frame whose type is {type(frame_type).__name__}")
    f = _Fields(frame_type, decoded)
    try:
        return _parse(f)
    except FrameParseError:
        if f.seq is None and frame_type in (protocol.ACTION_CHUNK, protocol.DROPPED, protocol.ERROR):
            try:  # a frame broken elsewhere may still say which observation it answers
                f.seq_field(nullable=True)
            except FrameParseError:
                pass
        raise


# ---------------------------------------------------------------------------------------------------
# Events for the caller
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InferAnswered:
    """The ``infer`` call waiting for ``seq`` gets ``chunk``."""

    seq: int
    chunk: ActionChunk


@dataclass(frozen=True)
class InferFailed:
    """The ``infer`` call waiting for ``seq`` ends with ``error``."""

    seq: int
    error: PolicyClientError


@dataclass(frozen=True)
class ControlAnswered:
    """The control call (``configure``/``reset``) waiting gets ``reply``."""

    reply: SessionFrame | ResetDoneFrame


@dataclass(frozen=True)
class ControlFailed:
    """The control call waiting ends with ``error``."""

    error: PolicyClientError


@dataclass(frozen=True)
class Streamed:
    """A chunk or an error for ``receive`` is waiting (:meth:`ClientState.next_streamed`)."""


@dataclass(frozen=True)
class StateChanged:
    """An operator (or a new connection) set the session's state to ``state``."""

    state: str


@dataclass(frozen=True)
class CloseConnection:
    """The server broke the protocol on this connection: close it with ``code`` (the client reconnects)."""

    code: int
    reason: str


ClientEvent = InferAnswered | InferFailed | ControlAnswered | ControlFailed | Streamed | StateChanged | CloseConnection


# ---------------------------------------------------------------------------------------------------
# The state
# ---------------------------------------------------------------------------------------------------


@dataclass
class Outgoing:
    """An observation to send: its ``seq``, its packed ``payload`` and its policy session. ``writing``: it was
    handed to the socket (its bytes leave ahead of anything written later)."""

    seq: int
    payload: bytes
    session_id: str | None
    writing: bool = False


@dataclass
class _InferCall:
    session_id: str | None
    gave_up: bool = False  # timed out: still ending (sending its cancel), its chunk reaches nobody


@dataclass
class _ControlCall:
    epoch: int | None = None  # the connection its frame was sent on (None: not sent yet)
    answered: bool = False


@dataclass(frozen=True)
class ReceiveStep:
    """What ``receive`` does next: return ``item`` (a chunk, or raise it when it is an error), or ``wait``
    (None: no time is left; it reports a timeout)."""

    item: ActionChunk | PolicyClientError | None = None
    wait: float | None = None


class ClientState:
    """Every piece of one robot client's protocol state, across connections; no I/O.

    Feed it the caller's calls, what the link did and each frame received; act on what
    :meth:`next_write` returns and on :meth:`events`. ``clock()`` is a monotonic time in seconds.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        reconnect: bool = True,
        max_stream_bytes: int = MAX_STREAM_BYTES,
        max_awaited: int = MAX_AWAITED_ANSWERS,
    ) -> None:
        self.clock = clock
        self.reconnect = reconnect
        self.max_stream_bytes = max_stream_bytes
        self.max_awaited = max_awaited
        self.stats = ClientStats()
        self.metadata: dict[str, Any] = {}
        self.session: dict[str, Any] = {}  # the server's resolved configuration (`session` frame)
        self.settings: dict[str, Any] = {}  # everything sent in `configure`, re-sent after a reconnect
        self.session_state = RUNNING
        self.state_reason = ""
        self.connected = False
        self.closing = False
        self.epoch = 0  # counts connections opened: a control reply is owed on the connection it was sent on
        self.next_seq = 0
        # The newest seq handed to the robot, per policy session (None: the connection's own).
        self.latest_delivered: dict[str | None, int] = {}
        self._infers: dict[int, _InferCall] = {}  # infer() calls waiting for their seq
        self._control: _ControlCall | None = None  # the one configure/reset under way
        # Replies still to come on this connection for control calls that stopped waiting (timed out): the
        # server answers control frames in order, so the next ones to come are theirs, not a later call's.
        self.control_replies_owed = 0
        # Observations put and not yet answered, by seq (oldest first), with their policy session.
        self._awaited: dict[int, str | None] = {}
        self._stream: list[tuple[ActionChunk | PolicyClientError, int]] = []  # for receive(), with each one's bytes
        self._stream_bytes = 0
        # The observations not yet sent: one being written (or taken to be) and one waiting per policy session.
        self.sending: Outgoing | None = None
        self.waiting: dict[str | None, Outgoing] = {}
        self._events: list[ClientEvent] = []

    # -- events --------------------------------------------------------------------------------------

    def events(self) -> list[ClientEvent]:
        """The events since the last call, oldest first (each is returned once)."""
        events, self._events = self._events, []
        return events

    def _fail_infer(self, seq: int | None, error: PolicyClientError) -> bool:
        """End the ``infer`` call waiting for ``seq`` (if any) with ``error``; say whether there was one."""
        call = self._infers.pop(seq, None) if seq is not None else None
        if call is None:
            return False
        if not call.gave_up:
            assert seq is not None
            self._events.append(InferFailed(seq, error))
        return True

    def _fail_calls(self, error: PolicyClientError) -> None:
        for seq, call in list(self._infers.items()):
            if not call.gave_up:
                self._events.append(InferFailed(seq, error))
        self._infers.clear()
        if self._control is not None and not self._control.answered:
            self._control.answered = True
            self._events.append(ControlFailed(error))

    # -- the connection ------------------------------------------------------------------------------

    def connection_opened(self, metadata: MetadataFrame, session: SessionFrame | None) -> bool:
        """A connection read its ``metadata`` (and the reply to the re-sent configuration, if any). False: the
        client is closing and nobody will use it (close it at once); it is not taken."""
        if self.closing:
            return False
        self.metadata = metadata.wire()
        if session is not None:
            self.session = dict(session.config)
        self.connected = True
        self.epoch += 1
        self.control_replies_owed = 0  # a new connection owes nothing of the last one's
        self._set_state(RUNNING, "")  # a new connection is a new session: it starts running
        return True

    def connection_lost(self, code: int | None, reason: str | None) -> bool:
        """The connection closed. Calls waiting on it end; return whether to reconnect."""
        self.connected = False
        if self.session_state == STOPPED:  # an operator ended the session: reconnecting would undo that
            self._fail_calls(SessionStopped(f"the session was stopped by an operator ({self.state_reason})"))
            self._abandon("an operator stopped the session before it was sent")
            return False
        self._fail_calls(ConnectionLost(f"connection closed (code {code}: {reason or 'no reason'})"))
        # Answers to what was sent on it will not come; what still waits to be sent goes on the next one.
        unsent = {item.seq for item in self.waiting.values()} | ({self.sending.seq} if self.sending else set())
        self._awaited = {seq: session for seq, session in self._awaited.items() if seq in unsent}
        if not self.reconnect or self.closing:
            self._abandon("the connection closed and the client does not reconnect")
            return False
        return True

    def reconnected(self) -> None:
        self.stats.reconnects += 1

    def reconnect_failed(self, error: str) -> None:
        """Reconnecting gave up for good (or the client closed meanwhile): calls made while it reconnected end
        now, not at their timeout, and nothing held will be sent."""
        self._fail_calls(
            ConnectionLost("the client was closed" if self.closing else f"reconnecting failed for good: {error}")
        )
        self._abandon("no connection will come to send it on")

    def close(self) -> None:
        """The robot closes the client: every call hears so, and what is held is never sent (one being written
        leaves ahead of the close frame: it is counted sent)."""
        self.closing = True
        self.connected = False
        # Calls waiting now hear that the client closed (not that their observation was replaced unsent).
        self._fail_calls(ConnectionLost("the client was closed"))
        if self.sending is not None and self.sending.writing:
            self.written(self.sending.seq, len(self.sending.payload))
        self._abandon("the client was closed before it was sent")

    def opening(self) -> None:
        """``connect()`` is called (again, maybe after a close)."""
        self.closing = False

    # -- the session's state -------------------------------------------------------------------------

    def _set_state(self, state: str, reason: str) -> None:
        self.session_state, self.state_reason = state, reason
        self._events.append(StateChanged(state))

    def check_running(self) -> None:
        """Raise what a call made now hears while an operator has the session paused or stopped."""
        if self.session_state == PAUSED:
            raise SessionPaused(None, self.state_reason)
        if self.session_state == STOPPED:
            raise SessionStopped(f"the session was stopped by an operator ({self.state_reason})")

    # -- calls ---------------------------------------------------------------------------------------

    def new_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def infer_begun(self, seq: int, session_id: str | None) -> None:
        """An ``infer`` call waits for the answer to ``seq`` (its observation is put next)."""
        self._infers[seq] = _InferCall(session_id)

    def infer_timed_out(self, seq: int) -> None:
        """The ``infer`` of ``seq`` gave up (it sends a cancel next): its chunk, should it come, reaches nobody."""
        call = self._infers.get(seq)
        if call is not None:
            call.gave_up = True

    def infer_ended(self, seq: int, session_id: str | None) -> None:
        """The ``infer`` of ``seq`` returned or raised. If its observation still waits to be sent (for a new
        connection, say), it is not sent: sent now it would be answered, and its chunk handed to the next
        ``receive``, but nobody waits for it."""
        self._infers.pop(seq, None)
        if self.withdraw(session_id, seq) is not None:
            self._unsent(seq, "its infer call ended before it was sent")

    def control_begun(self) -> None:
        """A ``configure`` or ``reset`` begins (one at a time: their replies carry no seq)."""
        self._control = _ControlCall()

    def control_sent(self) -> None:
        assert self._control is not None
        self._control.epoch = self.epoch

    def control_ended(self) -> None:
        """The control call returned or raised. One that stopped waiting before its reply came is owed that
        reply on the connection it was sent on: the next control reply there is its, not a later call's."""
        call, self._control = self._control, None
        if call is not None and not call.answered and call.epoch == self.epoch and self.connected:
            self.control_replies_owed += 1

    def configured(self, settings: Mapping[str, Any], reply: SessionFrame) -> dict[str, Any]:
        """The server took ``settings``: they are re-sent after a reconnect; return the resolved session."""
        self.settings.update(settings)
        self.session = dict(reply.config)
        return self.session

    def reset_begun(self, session_id: str | None) -> None:
        """A ``reset`` of ``session_id`` begins. Its observation still waiting on the robot is not sent: sent
        after the reset it would be answered, its pre-reset actions reaching the robot after the reset. Nothing
        else is failed: the server answers each observation the reset drops before ``reset_done``, and every
        one still awaited after that was sent after the reset."""
        withdrawn = self.withdraw(session_id)
        if withdrawn is not None:
            self._unsent(withdrawn, "the session was reset before it was sent")

    def reset_done(self, session_id: str | None) -> None:
        self.latest_delivered.pop(session_id, None)

    # -- frames out --------------------------------------------------------------------------------------
    # Every frame the client sends is built here; the shell only writes the bytes.

    def observation_frame(
        self,
        seq: int,
        fields: Mapping[str, Any],
        settings: Mapping[str, Any],
        robot_state: Any | None,
        session_id: str | None,
    ) -> bytes:
        """Observation ``seq`` as sent: its ``fields`` (image, video, ...), its own ``settings`` (the server
        applies them to it alone), the robot's ``robot_state`` (joint readings, sent as the float32 array the
        protocol names), its policy session, and this client's clock as its ``timestamp`` unless it has one
        (opaque to the server, which echoes it in the chunk: how the client measures round trips)."""
        observation = protocol.observation_frame(seq, fields, settings)
        if robot_state is not None:
            observation["state"] = np.ascontiguousarray(robot_state, dtype=np.float32)
        if session_id is not None:
            observation[protocol.SESSION_ID] = session_id
        observation.setdefault("timestamp", self.clock())
        return packb(observation)

    @staticmethod
    def configure_frame(settings: Mapping[str, Any]) -> bytes:
        return packb(protocol.configure_frame(settings))

    @staticmethod
    def reset_frame(session_id: str | None) -> bytes:
        return packb(protocol.reset_frame(session_id))

    @staticmethod
    def cancel_frame(seq: int | None, session_id: str | None) -> bytes:
        return packb(protocol.cancel_frame(seq, session_id))

    # -- observations out ----------------------------------------------------------------------------

    def observation_ready(self, seq: int, payload: bytes, session_id: str | None, link_free: bool) -> None:
        """Observation ``seq`` is to be sent. One of its policy session still waiting is replaced (never sent).
        ``link_free``: the connection holds little enough that it is taken to be written at once, so that a
        next put cannot replace it."""
        replaced = self.waiting.pop(session_id, None)
        if replaced is not None:
            self._unsent(replaced.seq, "a newer observation replaced it before it was sent")
        self._await(seq, session_id)
        self.waiting[session_id] = Outgoing(seq, payload, session_id)
        if link_free and self.sending is None and self.connected:
            self.sending = self._take()

    def observation_writing(self, seq: int, session_id: str | None) -> None:
        """Without the in-flight bound, ``submit`` writes observation ``seq`` itself, now (its answer may come
        before the write returns); :meth:`written_directly` follows once it is written."""
        self._await(seq, session_id)

    def written_directly(self, nbytes: int) -> None:
        self._count_sent(nbytes)

    def _await(self, seq: int, session_id: str | None) -> None:
        self._awaited[seq] = session_id
        if len(self._awaited) > self.max_awaited:
            for old in self._awaited:  # the oldest that no call waits for (a call's is answered or fails)
                if old not in self._infers:
                    del self._awaited[old]
                    break

    def _take(self) -> Outgoing:
        """The oldest waiting observation, taken out (one must wait)."""
        return self.waiting.pop(next(iter(self.waiting)))

    def next_write(self) -> Outgoing | None:
        """The observation to write now (the link is free): the one taken already, else the oldest waiting."""
        if self.sending is None:
            if not self.waiting:
                return None
            # Only when nothing is being written: one a put() took when it found the link free is written first.
            self.sending = self._take()
        self.sending.writing = True
        return self.sending

    def written(self, seq: int, nbytes: int) -> None:
        """``seq``, the one being written, is on the wire. (Told late, after the client closed or gave up and
        counted it already, it is not counted again.)"""
        if self.sending is None or self.sending.seq != seq:
            return
        self.sending = None
        self._count_sent(nbytes)

    def _count_sent(self, nbytes: int) -> None:
        self.stats.sent += 1
        self.stats.bytes_sent += nbytes

    def write_failed(self, seq: int) -> None:
        """The connection dropped while ``seq`` was written. Nothing newer of its session waits: it goes on the
        next connection. A newer one waits: this one will never be sent."""
        item, self.sending = self.sending, None
        if item is None or item.seq != seq:
            return
        item.writing = False
        if item.session_id not in self.waiting:
            self.waiting[item.session_id] = item
        else:
            self._unsent(seq, "a newer observation replaced it before it was sent")

    def withdraw(self, session_id: str | None, seq: int | None = None) -> int | None:
        """Take back the observation of ``session_id`` waiting to be sent (only if it is ``seq``, when given);
        return its seq, or None when none was taken. One being written is on its way already."""
        waiting = self.waiting.get(session_id)
        if waiting is None or (seq is not None and waiting.seq != seq):
            return None
        del self.waiting[session_id]
        return waiting.seq

    @property
    def waiting_seq(self) -> int | None:
        """The seq of the oldest observation waiting to be sent, if any."""
        return next(iter(self.waiting.values())).seq if self.waiting else None

    def _unsent(self, seq: int, message: str) -> None:
        """``seq`` will never be written: it never reaches the server."""
        self.stats.dropped[UNSENT] += 1
        self._awaited.pop(seq, None)
        self._fail_infer(seq, ObservationDropped(seq, UNSENT, message))

    def _abandon(self, message: str) -> None:
        """Nothing held will be sent: each is told, as one replaced before it was sent, not forgotten."""
        abandoned = [] if self.sending is None else [self.sending.seq]
        abandoned += [item.seq for item in self.waiting.values()]
        self.sending = None
        self.waiting.clear()
        for seq in abandoned:
            self._unsent(seq, message)

    # -- frames in -----------------------------------------------------------------------------------

    def receive_frame(self, message: bytes | str) -> None:
        """One frame the server sent: decoded within the budget, parsed once, routed."""
        if isinstance(message, str):
            self._unsolicited("a text frame")
            return
        try:
            decoded = decode_server_frame(message)
        except WireFormatError as exc:
            # The server broke the protocol: this connection's frames can no longer be trusted.
            logger.error("the server sent a frame this client does not decode (%s); closing", exc)
            self.stats.malformed += 1
            self._events.append(CloseConnection(close_code(exc), "undecodable server frame"))
            return
        try:
            frame = parse_server_frame(decoded)
        except UnknownFrame as exc:
            self._unsolicited(str(exc))
            return
        except FrameParseError as exc:
            self._malformed(exc)
            return
        self.frame_received(frame)

    def frame_received(self, frame: ServerFrame) -> None:
        """One parsed server frame, routed to the call it answers, the stream, or the session's state."""
        if isinstance(frame, ActionChunkFrame):
            self._on_chunk(frame)
        elif isinstance(frame, DroppedFrame):
            self._on_dropped(frame)
        elif isinstance(frame, ErrorFrame):
            self._on_error(frame)
        elif isinstance(frame, (SessionFrame, ResetDoneFrame)):
            if not self._control_answered(frame):
                self._unsolicited(f"a `{type(frame).__name__}` no control call waits for")
        elif isinstance(frame, SessionStateFrame):
            logger.info("the session is now %s%s", frame.state.value, f" ({frame.reason})" if frame.reason else "")
            self._set_state(frame.state.value, frame.reason)
        elif isinstance(frame, SessionUpdatedFrame):
            self.session = dict(frame.config)
            if "prompt" in frame.changed:
                # The operator's prompt is the session's now: keep it across reconnects too.
                self.settings["prompt"] = self.session.get("prompt", "")
            logger.info("an operator changed %s", ", ".join(frame.changed))
        elif isinstance(frame, SessionEventFrame):
            logger.info("the server says: %s", frame.event)
        else:  # a metadata frame after the first
            self._unsolicited("a second metadata frame")

    def _unsolicited(self, what: str) -> None:
        self.stats.unsolicited += 1
        logger.debug("ignoring %s", what)

    def _malformed(self, error: FrameParseError) -> None:
        """A frame that breaks the protocol ends only the call it answers. Without a seq to say which, a chunk
        or drop cannot be placed: the connection is closed (the calls on it end, the client reconnects)."""
        self.stats.malformed += 1
        failure = MalformedServerFrame(error.frame_type, error.message, error.seq)
        logger.warning("%s", failure)
        seq = error.seq
        if seq is not None:
            if seq in self._awaited:
                del self._awaited[seq]
                if not self._fail_infer(seq, failure):
                    self._stream_put(failure, len(error.message))  # a streamed observation's: receive() raises it
            else:
                self._unsolicited(f"a malformed frame about observation {seq}")
        elif error.frame_type in (protocol.ACTION_CHUNK, protocol.DROPPED):
            self._events.append(CloseConnection(PROTOCOL_ERROR_CLOSE, f"malformed {error.frame_type} frame"))
        elif error.frame_type in (protocol.SESSION, protocol.RESET_DONE, protocol.ERROR):
            self._control_answered(failure)

    def _on_chunk(self, frame: ActionChunkFrame) -> None:
        seq = frame.seq
        if seq not in self._awaited:
            self._unsolicited(f"a chunk for observation {seq}, which this client does not await")
            return
        session_id = self._awaited.pop(seq)
        sent_at = frame.timestamp
        round_trip = (self.clock() - sent_at) * 1e3 if isinstance(sent_at, float) else None
        chunk = ActionChunk.from_frame(frame, round_trip)
        chunk.session_id = frame.session_id if frame.session_id is not None else session_id
        if seq <= self.latest_delivered.get(chunk.session_id, -1):
            self.stats.stale += 1  # a newer chunk already reached the robot: this one is wrong now
            self._fail_infer(seq, ObservationDropped(seq, "stale", "a newer chunk was already delivered"))
            return
        call = self._infers.pop(seq, None)
        self.stats.answered += 1
        if call is None:
            self._stream_put(chunk, chunk.actions.nbytes)
        elif not call.gave_up:
            self.latest_delivered[chunk.session_id] = seq
            self._events.append(InferAnswered(seq, chunk))
        # else its infer gave up (timed out) and is still sending its cancel: the chunk reaches nobody, so it
        # is not delivered and must not make an older chunk the robot can still receive look stale.

    def _on_dropped(self, frame: DroppedFrame) -> None:
        seq, reason = frame.seq, frame.reason
        if self._awaited.pop(seq, ...) is ...:
            self._unsolicited(f"a drop of observation {seq}, which this client does not await")
            return
        counted = (
            reason if reason in self.stats.dropped or len(self.stats.dropped) < MAX_COUNTED_REASONS else OTHER_REASON
        )
        self.stats.dropped[counted] += 1
        if reason == DropReason.PAUSED:
            self._fail_infer(seq, SessionPaused(seq, self.state_reason))
        elif reason == DropReason.STOPPED:
            self._fail_infer(seq, SessionStopped(frame.message))
        else:
            self._fail_infer(seq, ObservationDropped(seq, reason, frame.message))

    def _on_error(self, frame: ErrorFrame) -> None:
        self.stats.errors += 1
        error = ServerError(frame.code, frame.message, frame.field, frame.seq)
        seq = frame.seq
        if seq is None:
            if not self._control_answered(error):
                logger.warning("server error: %s", error)
        elif self._awaited.pop(seq, ...) is ...:
            logger.warning("server error about observation %d, which this client does not await: %s", seq, error)
        elif not self._fail_infer(seq, error):
            self._stream_put(error, len(frame.message))  # a streamed observation's: receive() raises it

    def _control_answered(self, answer: SessionFrame | ResetDoneFrame | PolicyClientError) -> bool:
        """A reply to a control frame: it ends the waiting call, or is the late one of a call that stopped
        waiting. Says whether it was taken."""
        if self.control_replies_owed:
            self.control_replies_owed -= 1
            logger.debug("a reply came after its control call stopped waiting: %r", answer)
            return True
        call = self._control
        if call is None or call.answered:
            return False
        call.answered = True
        if isinstance(answer, PolicyClientError):
            self._events.append(ControlFailed(answer))
        else:
            self._events.append(ControlAnswered(answer))
        return True

    # -- the stream (receive) ------------------------------------------------------------------------

    def _stream_put(self, item: ActionChunk | PolicyClientError, nbytes: int) -> None:
        self._stream.append((item, nbytes))
        self._stream_bytes += nbytes
        while self._stream_bytes > self.max_stream_bytes and len(self._stream) > 1:
            _, dropped_bytes = self._stream.pop(0)  # older than what waits behind it: stale already
            self._stream_bytes -= dropped_bytes
            self.stats.stale += 1
        self._events.append(Streamed())

    def receive_step(self, deadline: float | None) -> ReceiveStep:
        """What ``receive`` (given ``deadline``, None: none) does now. A chunk that came already is returned
        whatever time is left (a robot polling with no time to wait gets it); otherwise it waits what is left."""
        while self._stream:
            item, nbytes = self._stream.pop(0)
            self._stream_bytes -= nbytes
            if isinstance(item, ActionChunk):
                if item.seq <= self.latest_delivered.get(item.session_id, -1):
                    self.stats.stale += 1
                    continue
                self.latest_delivered[item.session_id] = item.seq
            return ReceiveStep(item=item)
        self.check_running()  # nothing will come while paused: say so instead of timing out
        if deadline is None:
            return ReceiveStep(wait=float("inf"))
        left = deadline - self.clock()
        return ReceiveStep(wait=left if left > 0 else None)

    @property
    def stream_bytes(self) -> int:
        """The bytes of chunks and errors waiting for ``receive``."""
        return self._stream_bytes
