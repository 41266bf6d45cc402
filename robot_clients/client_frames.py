"""What a client frame of the native protocol may contain, and the typed frames it is parsed into.

Pure data, like :mod:`robot_clients.protocol` (whose names and codes it uses): :func:`parse_client_frame`
turns one decoded client frame into a typed dataclass, or raises :class:`ProtocolError` with a stable
code and the offending field. The server parses every frame with it; a client may check its own frames
with it before sending. The session settings a frame may carry are in
:mod:`robot_clients.session_settings`, an observation's cameras, state and prefix actions in
:mod:`robot_clients.observation_fields`; their public names are importable from here too. It imports
numpy and nothing else. ``docs/protocol.md`` is the user-facing description; keep the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .frame_fields import check_field_type, str_keys
from .observation_fields import (
    MAX_NAMED_CAMERAS,
    MAX_STATE_VALUES,
    check_image_size,
    is_encoded_clip,
    is_encoded_frame,
    parse_cameras,
    parse_prefix_actions,
    parse_state,
)
from .protocol import CANCEL, CLIENT_FRAME_TYPES, CONFIGURE, OBSERVATION, RESET, ErrorCode, FrameLimits, ProtocolError
from .session_settings import (
    CONFIGURE_FIELDS,
    OBSERVATION_SETTINGS,
    SESSION_ONLY_SETTINGS,
    SESSION_SETTINGS,
    SETTING_ALIASES,
    parse_settings,
)

__all__ = [
    # the typed frames and their parser
    "CancelFrame",
    "ClientFrame",
    "ConfigureFrame",
    "ObservationFrame",
    "ResetFrame",
    "has_encoded_frames",
    "parse_client_frame",
    "CANCEL_FIELDS",
    "OBSERVATION_FIELDS",
    "RECORD_FIELD",
    # re-exported from the modules that define them (the server and the tests import them from here)
    "CONFIGURE_FIELDS",
    "OBSERVATION_SETTINGS",
    "SESSION_ONLY_SETTINGS",
    "SESSION_SETTINGS",
    "SETTING_ALIASES",
    "MAX_NAMED_CAMERAS",
    "MAX_STATE_VALUES",
    "check_image_size",
    "is_encoded_clip",
    "is_encoded_frame",
    "parse_state",
    "str_keys",
]

# An observation's own fields (besides `type` and the session settings it may carry).
OBSERVATION_FIELDS = ("seq", "image", "images", "video", "deadline_ms", "prefix_actions", "state", "timestamp")
CANCEL_FIELDS = ("seq",)
# `configure` only, not a setting an observation may carry: whether the server records this session.
RECORD_FIELD = "record"


@dataclass
class ConfigureFrame:
    """Session settings to merge over the current ones; only the keys the client sent are present.

    A ``None`` value unsets that setting: it goes back to the model's default (``seed``: random again).
    """

    settings: dict[str, Any]
    # `record`: True records this session from now on, False stops recording it; None (absent): unchanged.
    record: bool | None = None


@dataclass
class ObservationFrame:
    """One observation. A camera may hold encoded bytes (an image, each named image) or a list of them (a
    video) as parsed; the server decodes them to arrays before the observation is queued."""

    seq: int
    image: np.ndarray | bytes | None = None
    video: np.ndarray | list[bytes] | None = None
    # Named cameras (H×W×3 each), composed into ``image`` per the session's view point.
    images: dict[str, np.ndarray | bytes] | None = None
    prefix_actions: np.ndarray | None = None
    # The robot's proprioceptive state, float32: one row ``[state_dim]`` or history rows
    # ``[history_length, state_dim]`` (oldest first), for a domain whose profile conditions on it.
    state: np.ndarray | None = None
    deadline_ms: float | None = None
    # Session settings for this observation only, merged over the session's (see SESSION_SETTINGS).
    overrides: dict[str, Any] = field(default_factory=dict)
    # Opaque to the server: any msgpack scalar, echoed unchanged in the chunk.
    client_timestamp: Any = None


@dataclass
class CancelFrame:
    seq: int | None  # None: every observation of this session that is waiting or running


@dataclass
class ResetFrame:
    pass


ClientFrame = ConfigureFrame | ObservationFrame | CancelFrame | ResetFrame


def has_encoded_frames(obs: ObservationFrame) -> bool:
    """Whether any camera of ``obs`` still carries encoded bytes (the server decodes them before queueing)."""
    images = obs.images.values() if obs.images is not None else ()
    return (
        is_encoded_frame(obs.image) or isinstance(obs.video, list) or any(is_encoded_frame(image) for image in images)
    )


def _refuse_unknown(frame: Mapping[str, Any], frame_type: str, known: tuple[str, ...], seq: int | None = None) -> None:
    """Every field a client sends is honoured or refused: an unknown one is ``invalid_field`` naming it."""
    unknown = sorted(set(frame) - set(known) - {"type"})
    if unknown:
        name = unknown[0]
        if frame_type == OBSERVATION and name in SESSION_ONLY_SETTINGS:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"{SESSION_ONLY_SETTINGS[name]}, not in an observation", name, seq
            )
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{frame_type}` has unknown field `{name}`; known fields: {', '.join(known) or 'none'}",
            name,
            seq,
        )


def _parse_configure(frame: Mapping[str, Any]) -> ConfigureFrame:
    _refuse_unknown(frame, CONFIGURE, tuple(CONFIGURE_FIELDS) + tuple(SETTING_ALIASES) + (RECORD_FIELD,))
    record = frame.get(RECORD_FIELD)
    if record is not None and not isinstance(record, bool):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{RECORD_FIELD}` must be true or false, got {type(record).__name__}",
            RECORD_FIELD,
        )
    return ConfigureFrame(parse_settings(frame, tuple(CONFIGURE_FIELDS), None, keep_null=True), record)


def _parse_observation(frame: Mapping[str, Any], limits: FrameLimits) -> ObservationFrame:
    if "seq" not in frame:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "`observation` needs an integer `seq`", "seq")
    seq = check_field_type(frame, "seq", (int,))
    if seq < 0:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"`seq` must be >= 0, got {seq}", "seq")
    _refuse_unknown(frame, OBSERVATION, OBSERVATION_FIELDS + OBSERVATION_SETTINGS + tuple(SETTING_ALIASES), seq)
    obs = ObservationFrame(seq=seq)
    obs.image, obs.video, obs.images = parse_cameras(frame, limits, seq)

    if frame.get("prefix_actions") is not None:
        obs.prefix_actions = parse_prefix_actions(frame["prefix_actions"], seq)

    if frame.get("state") is not None:
        obs.state = parse_state(frame["state"], "state", seq)

    if frame.get("deadline_ms") is not None:
        deadline = check_field_type(frame, "deadline_ms", (float, int), seq)
        if deadline <= 0:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"`deadline_ms` must be > 0, got {deadline}", "deadline_ms", seq
            )
        obs.deadline_ms = float(deadline)

    timestamp = frame.get("timestamp")
    if timestamp is not None:
        if not isinstance(timestamp, (bool, int, float, str, bytes, np.generic)):
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`timestamp` is echoed as sent and must be a scalar (number, string, bytes or boolean), got "
                f"{type(timestamp).__name__}",
                "timestamp",
                seq,
            )
        obs.client_timestamp = timestamp

    obs.overrides = parse_settings(frame, OBSERVATION_SETTINGS, seq, keep_null=False)
    return obs


def _parse_cancel(frame: Mapping[str, Any]) -> CancelFrame:
    _refuse_unknown(frame, CANCEL, CANCEL_FIELDS)
    if frame.get("seq") is None:
        return CancelFrame(seq=None)
    return CancelFrame(seq=check_field_type(frame, "seq", (int,)))


def parse_client_frame(message: Any, limits: FrameLimits) -> ClientFrame:
    """Turn one decoded client frame into a typed frame, or raise :class:`ProtocolError`."""
    if not isinstance(message, dict):
        raise ProtocolError(ErrorCode.BAD_FRAME, f"a frame must be a msgpack map, got {type(message).__name__}", None)
    message = str_keys(message, None)
    frame_type = message.get("type")
    if frame_type is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"frame has no `type`; expected one of {', '.join(CLIENT_FRAME_TYPES)}", "type"
        )
    if frame_type == OBSERVATION:
        return _parse_observation(message, limits)
    if frame_type == CONFIGURE:
        return _parse_configure(message)
    if frame_type == CANCEL:
        return _parse_cancel(message)
    if frame_type == RESET:
        _refuse_unknown(message, RESET, ())
        return ResetFrame()
    raise ProtocolError(
        ErrorCode.UNKNOWN_TYPE,
        f"unknown frame type {frame_type!r}; expected one of {', '.join(CLIENT_FRAME_TYPES)}",
        "type",
    )
