"""Native realtime protocol, version 1: its names, codes, errors and frames, shared by both ends.

This is the protocol's sans-I/O core, as in the ``websockets`` library: the robot's clients and the
server import the same frame names, paths, error codes, client frame builders and server frames (one frozen
dataclass per ``type``, which the server sends and the client parses) from here, so neither end re-types the
other's strings. It imports nothing but the standard library: a robot gets it with the wire codec and nothing
else. What a client frame may contain, and the typed frames the server parses it into, are in
:mod:`robot_clients.client_frames` (numpy only); the client's parser of server frames is in
:mod:`robot_clients.client_state`. ``docs/protocol.md`` is the user-facing description of everything here;
keep the two in step.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

PROTOCOL_VERSION = 1

# Where the native protocol is served, and the liveness answer on the same port.
REALTIME_PATH = "/v1/actions/realtime"
HEALTH_PATH = "/healthz"

# Client -> server frame types.
CONFIGURE = "configure"
OBSERVATION = "observation"
CANCEL = "cancel"
RESET = "reset"
CLIENT_FRAME_TYPES = (CONFIGURE, OBSERVATION, CANCEL, RESET)

# The client's name for one policy session among several on one connection (an observation's, a
# `cancel`'s or a `reset`'s field; echoed by the replies about that policy session). Absent: the
# connection's own session. At most this many characters.
SESSION_ID = "session_id"
MAX_SESSION_ID_CHARS = 128

# Server -> client frame types.
METADATA = "metadata"
SESSION = "session"
ACTION_CHUNK = "action_chunk"
DROPPED = "dropped"
ERROR = "error"
RESET_DONE = "reset_done"
# Sent when an operator acts on the session (docs/protocol.md, "Operator controls").
SESSION_STATE = "session_state"
SESSION_UPDATED = "session_updated"
# Something happened to the session on the server side (e.g. "replica_moved": its engine replica was lost).
SESSION_EVENT = "session_event"


class SessionState(str, enum.Enum):
    """Whether a session's observations reach the model (the ``state`` of a ``session_state`` frame).

    ``running``: as usual. ``paused``: observations are answered ``dropped`` (``paused``) and the robot
    holds; an operator can resume. ``stopped``: the session is over; the server closes the connection
    (1000) and the client does not reconnect.
    """

    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"


class ErrorCode:
    """Stable error codes. Clients branch on these; never rename one, only add."""

    BAD_FRAME = "bad_frame"  # not binary msgpack, not a map, or a malformed array
    UNKNOWN_TYPE = "unknown_type"  # `type` is missing or not a frame this protocol knows
    MISSING_FIELD = "missing_field"  # a required field is absent
    INVALID_FIELD = "invalid_field"  # a field has the wrong type or an out-of-range value
    INVALID_IMAGE = "invalid_image"  # image/video with the wrong dtype, rank, channel count or size
    NOT_CONFIGURED = "not_configured"  # an observation arrived before any `configure`
    UNKNOWN_DOMAIN = "unknown_domain"  # the embodiment is not one the loaded model knows
    UNSUPPORTED_MODE = "unsupported_mode"  # the model (or this endpoint) cannot serve that action_mode
    UNSUPPORTED_TIER = "unsupported_tier"  # the resolution tier is not one the variant supports
    INVALID_REQUEST = "invalid_request"  # the engine refused the request as a whole, with no one field to blame
    ENGINE_ERROR = "engine_error"  # the model failed on a valid request; details are in the server log
    RATE_LIMITED = "rate_limited"  # more observations per second than the server allows a session; not queued
    ENGINE_TIMEOUT = "engine_timeout"  # the engine call ran past --engine-timeout-s; the engine is being restarted
    RECORDING_UNAVAILABLE = "recording_unavailable"  # `record: true` on a server started without --record-dir
    # The cameras would decode to more pixels than the server decodes for one observation (its headers
    # say so: nothing was decoded); send smaller or fewer frames.
    PAYLOAD_TOO_LARGE = "payload_too_large"
    # A new `session_id` on a connection that already holds its bound of policy sessions (or on a server
    # at --max-sessions); nothing of it was queued, the connection and its other ids go on.
    TOO_MANY_SESSIONS = "too_many_sessions"


class DropReason:
    """Why an observation was not answered with actions. Each seq gets exactly one terminal reply."""

    SUPERSEDED = "superseded"  # a newer observation of the same session replaced it while it waited
    DEADLINE = "deadline"  # its deadline_ms passed before it reached the engine
    CANCELLED = "cancelled"  # the client sent `cancel` (or `reset`) for it
    SHUTDOWN = "shutdown"  # the server is stopping and will not start it
    PAUSED = "paused"  # an operator paused the session: it was (or would have been) waiting when that happened
    STOPPED = "stopped"  # an operator stopped the session


class CodedError(Exception):
    """An error with a stable ``code``, a ``message`` that says what to fix, and the ``field`` it is about.

    Every error this project answers has this shape, whatever carries it: an ``error`` frame of this
    protocol, an observer's refused control, or another protocol's error reply.
    """

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field

    def text(self) -> str:
        """``"<code>: <message> (field: <field>)"``: the error as one line of text."""
        return f"{self.code}: {self.message}" + (f" (field: {self.field})" if self.field else "")


class ProtocolError(CodedError):
    """A client frame is wrong. Answered with an ``error`` frame (tagged with ``seq`` when known); the
    session continues."""

    def __init__(self, code: str, message: str, field: str | None = None, seq: int | None = None) -> None:
        super().__init__(code, message, field)
        self.seq = seq


@dataclass(frozen=True)
class FrameLimits:
    """What the server accepts in one observation or request: the pixel and frame bounds of the model
    (the metadata's ``limits``), and the pixels one request of several frames may decode to (None: no
    such bound)."""

    min_image_side: int = 1
    max_image_side: int = 4096
    max_clip_frames: int = 65
    max_decoded_bytes: int | None = None


# ---------------------------------------------------------------------------------------------------
# Client frames
# ---------------------------------------------------------------------------------------------------


def configure_frame(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": CONFIGURE, **settings}


def observation_frame(seq: int, fields: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """An ``observation``: its ``fields`` (media, deadline, prefix, timestamp) and ``settings`` for it alone."""
    frame = {key: value for key, value in fields.items() if key not in ("type", "seq")}
    frame.update(settings)
    frame["type"] = OBSERVATION
    frame["seq"] = seq
    return frame


def cancel_frame(seq: int | None, session_id: str | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": CANCEL, "seq": seq}
    if session_id is not None:
        frame[SESSION_ID] = session_id
    return frame


def reset_frame(session_id: str | None = None) -> dict[str, Any]:
    return {"type": RESET} if session_id is None else {"type": RESET, SESSION_ID: session_id}


# ---------------------------------------------------------------------------------------------------
# Server frames: one frozen dataclass per `type`. The server sends only these (``wire()`` is the map it
# packs); the client parses each frame it reads into one of them once (robot_clients.client_state).
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetadataFrame:
    """The first frame of a connection: the protocol version, then what the model and server offer
    (``info``: model, modes, defaults, domains, limits, ...; ``docs/protocol.md``)."""

    session_id: str
    info: Mapping[str, Any]
    protocol_version: int = PROTOCOL_VERSION

    def wire(self) -> dict[str, Any]:
        return {"type": METADATA, "protocol_version": self.protocol_version, "session_id": self.session_id, **self.info}


@dataclass(frozen=True)
class SessionFrame:
    """The reply to ``configure``: the session's settings with the model's defaults resolved, its state and,
    on a server that records, whether it is recorded (None: the server does not record)."""

    session_id: str
    config: Mapping[str, Any]
    state: SessionState
    recording: bool | None = None

    def wire(self) -> dict[str, Any]:
        frame: dict[str, Any] = {
            "type": SESSION,
            "session_id": self.session_id,
            "config": dict(self.config),
            "state": self.state.value,
        }
        if self.recording is not None:
            frame["recording"] = self.recording
        return frame


@dataclass(frozen=True)
class ActionChunkFrame:
    """The answer to observation ``seq``: ``actions`` (H×D float32), how they were made (``settings``: the
    request settings a chunk reports, as used; ``action_horizon``, the ``domain_id`` that selected the action
    head and the width ``raw_action_dim``) and where the time went (``timing``, in milliseconds).
    ``timestamp`` echoes the observation's, ``session_id`` names its policy session (None: the connection's)."""

    seq: int
    actions: Any  # an H×D float32 numpy array (this module imports no numpy)
    settings: Mapping[str, Any]
    action_horizon: int
    domain_id: int
    raw_action_dim: int
    timing: dict[str, float | None]
    timestamp: Any = None
    session_id: str | None = None

    def wire(self) -> dict[str, Any]:
        """The map packed. ``timing`` is held, not copied: the server's sender fills in its last entry (the
        observation's age) as the frame leaves."""
        frame = {
            "type": ACTION_CHUNK,
            "seq": self.seq,
            "actions": self.actions,
            **self.settings,
            "action_horizon": self.action_horizon,
            "domain_id": self.domain_id,
            "raw_action_dim": self.raw_action_dim,
            "timing": self.timing,
        }
        if self.timestamp is not None:
            frame["timestamp"] = self.timestamp
        if self.session_id is not None:
            frame[SESSION_ID] = self.session_id
        return frame


@dataclass(frozen=True)
class DroppedFrame:
    """Observation ``seq`` will not be answered with actions (``reason``: a :class:`DropReason`)."""

    seq: int
    reason: str
    message: str
    session_id: str | None = None

    def wire(self) -> dict[str, Any]:
        frame = {"type": DROPPED, "seq": self.seq, "reason": self.reason, "message": self.message}
        if self.session_id is not None:
            frame[SESSION_ID] = self.session_id
        return frame


@dataclass(frozen=True)
class ErrorFrame:
    """A refused frame: ``code`` is an :class:`ErrorCode`, ``field`` the culprit, ``seq`` the observation's
    (None: a control frame's, or unknown)."""

    code: str
    message: str
    field: str | None = None
    seq: int | None = None
    session_id: str | None = None

    def wire(self) -> dict[str, Any]:
        frame = {"type": ERROR, "seq": self.seq, "code": self.code, "message": self.message, "field": self.field}
        if self.session_id is not None:
            frame[SESSION_ID] = self.session_id
        return frame


@dataclass(frozen=True)
class ResetDoneFrame:
    """The reply to ``reset``: everything the reset dropped was answered ``dropped`` before it."""

    session_id: str

    def wire(self) -> dict[str, Any]:
        return {"type": RESET_DONE, "session_id": self.session_id}


@dataclass(frozen=True)
class SessionStateFrame:
    """The session is now ``state`` (``reason`` is for people, may be empty)."""

    session_id: str
    state: SessionState
    reason: str
    source: str = "operator"

    def wire(self) -> dict[str, Any]:
        return {
            "type": SESSION_STATE,
            "session_id": self.session_id,
            "state": self.state.value,
            "reason": self.reason,
            "source": self.source,
        }


@dataclass(frozen=True)
class SessionUpdatedFrame:
    """Someone other than the robot changed settings ``changed``; ``config`` is the result."""

    session_id: str
    config: Mapping[str, Any]
    changed: tuple[str, ...]
    reason: str
    source: str = "operator"

    def wire(self) -> dict[str, Any]:
        return {
            "type": SESSION_UPDATED,
            "session_id": self.session_id,
            "config": dict(self.config),
            "changed": list(self.changed),
            "reason": self.reason,
            "source": self.source,
        }


@dataclass(frozen=True)
class SessionEventFrame:
    """Something happened to the session on the server's side (``event``, e.g. ``replica_moved``)."""

    session_id: str
    event: str
    details: Mapping[str, Any]

    def wire(self) -> dict[str, Any]:
        return {"type": SESSION_EVENT, "session_id": self.session_id, "event": self.event, **self.details}


ServerFrame: TypeAlias = (
    MetadataFrame
    | SessionFrame
    | ActionChunkFrame
    | DroppedFrame
    | ErrorFrame
    | ResetDoneFrame
    | SessionStateFrame
    | SessionUpdatedFrame
    | SessionEventFrame
)


# ---------------------------------------------------------------------------------------------------
# Observer frames: the dashboard's read-only channel (/v1/observe, JSON text; docs/dashboard.md)
# ---------------------------------------------------------------------------------------------------

OBSERVER_PROTOCOL_VERSION = 1
OBSERVER_HELLO = "hello"
OBSERVER_SESSIONS = "sessions"
OBSERVER_SESSION_DETAIL = "session_detail"
OBSERVER_SUBSCRIBED = "subscribed"
OBSERVER_CONTROL_RESULT = "control_result"


@dataclass(frozen=True)
class ObserverHelloFrame:
    """The first frame an observer gets: its id, the observer protocol's version and what it may watch and
    do (``info``: the model, the intervals, the controls, whether the server records)."""

    observer_id: str
    info: Mapping[str, Any]
    observer_protocol_version: int = OBSERVER_PROTOCOL_VERSION

    def wire(self) -> dict[str, Any]:
        return {
            "type": OBSERVER_HELLO,
            "observer_protocol_version": self.observer_protocol_version,
            "observer_id": self.observer_id,
            **self.info,
        }


@dataclass(frozen=True)
class ObserverSessionsFrame:
    """Every live session's summary at time ``t`` (Unix seconds)."""

    t: float
    sessions: Sequence[Mapping[str, Any]]

    def wire(self) -> dict[str, Any]:
        return {"type": OBSERVER_SESSIONS, "t": self.t, "sessions": list(self.sessions)}


@dataclass(frozen=True)
class ObserverSessionDetailFrame:
    """One subscribed session's detail at ``t``: its summary, latest chunk, latencies, drops and (None: not
    sent to this observer, or none yet) its latest camera frame."""

    session_id: str
    t: float
    summary: Mapping[str, Any]
    chunk: Mapping[str, Any] | None = None
    latency: Sequence[Mapping[str, Any]] = ()
    dropped: Sequence[Mapping[str, Any]] = ()
    frame: Mapping[str, Any] | None = None

    def wire(self) -> dict[str, Any]:
        return {
            "type": OBSERVER_SESSION_DETAIL,
            "session_id": self.session_id,
            "t": self.t,
            "summary": self.summary,
            "chunk": self.chunk,
            "latency": list(self.latency),
            "dropped": list(self.dropped),
            "frame": self.frame,
        }


@dataclass(frozen=True)
class ObserverErrorFrame:
    """A refused observer frame or control (the channel goes on)."""

    code: str
    message: str
    field: str | None = None

    def wire(self) -> dict[str, Any]:
        return {"type": ERROR, "code": self.code, "message": self.message, "field": self.field}


@dataclass(frozen=True)
class ObserverSubscribedFrame:
    """The session whose detail now follows (None: none)."""

    session_id: str | None

    def wire(self) -> dict[str, Any]:
        return {"type": OBSERVER_SUBSCRIBED, "session_id": self.session_id}


@dataclass(frozen=True)
class ObserverControlResultFrame:
    """An operator control was applied: the session's state after it."""

    session_id: str
    action: str
    state: SessionState

    def wire(self) -> dict[str, Any]:
        return {
            "type": OBSERVER_CONTROL_RESULT,
            "session_id": self.session_id,
            "action": self.action,
            "state": self.state.value,
        }


# Every frame the observer channel sends.
ObserverFrame: TypeAlias = (
    ObserverHelloFrame
    | ObserverSessionsFrame
    | ObserverSessionDetailFrame
    | ObserverErrorFrame
    | ObserverSubscribedFrame
    | ObserverControlResultFrame
)
