"""vla-eval's model-server frames, read and written with no I/O.

vla-eval (PyPI ``vla-eval``, allenai/vla-evaluation-harness) drives a model server over one WebSocket
per benchmark shard. Every frame, both ways, is one binary msgpack map::

    {"type": "hello" | "episode_start" | "observation" | "action" | "episode_end" | "error",
     "payload": {...}, "seq": int, "timestamp": float (seconds since the epoch)}

* ``hello`` opens the connection, from the harness (``protocol_version`` 1, ``harness_version``), and
  is answered by a ``hello`` with the same ``seq`` (``protocol_version``, ``model_server``,
  ``capabilities``, optionally ``observation_params`` the harness merges into its benchmark's settings).
* ``episode_start`` (``task``: the task's name, suite, ...; ``mode``: ``live`` in real-time runs;
  ``recording``) and ``episode_end`` (the episode's ``metrics``) expect no reply.
* ``observation`` (``images`` by camera name, ``state`` or ``states``, ``task_description``) is answered
  by an ``action`` with the observation's ``seq`` (``actions``: one action, or a chunk), or an ``error``
  (``{"error": "..."}``; here also the stable ``code``, ``message`` and ``field``).

Arrays travel in openpi's form (``{"__ndarray__": True, "data", "dtype", "shape"}``, read by the shared
wire codec); images, by default, as ``{"__image__": True, "format": "png" | "jpeg" | "raw", "data",
"shape"}``: PNG or JPEG bytes, decoded by the session off the event loop, or raw pixels.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_clients.protocol import CodedError, ErrorCode, ProtocolError
from robot_clients.wire_codec import WireFormatError, packb, unpackb

PROTOCOL_VERSION = 1
FRAME_KEYS = ("type", "payload", "seq", "timestamp")
_IMAGE = "__image__"


class FrameType(str, enum.Enum):
    HELLO = "hello"
    EPISODE_START = "episode_start"
    OBSERVATION = "observation"
    ACTION = "action"
    EPISODE_END = "episode_end"
    ERROR = "error"


# What a harness sends; ``action`` is the server's alone.
CLIENT_TYPES = (FrameType.HELLO, FrameType.EPISODE_START, FrameType.OBSERVATION, FrameType.EPISODE_END, FrameType.ERROR)


@dataclass(frozen=True)
class VlaEvalFrame:
    type: FrameType
    payload: dict[str, Any]
    seq: int
    timestamp: float


def parse_frame(message: bytes | str, max_values: int | None = None) -> VlaEvalFrame:
    """One frame from the harness; :class:`ProtocolError` (``bad_frame``, ``unknown_type``, ...) naming
    what is wrong."""
    if isinstance(message, str):
        raise ProtocolError(ErrorCode.BAD_FRAME, "vla-eval frames are binary msgpack maps, not text")
    try:
        raw = unpackb(message, max_values=max_values)
    except WireFormatError as exc:
        raise ProtocolError(ErrorCode.BAD_FRAME, exc.message, exc.field) from None
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.BAD_FRAME, f"a frame must be a msgpack map, got {type(raw).__name__}")
    raw = {key.decode("utf-8", "replace") if isinstance(key, bytes) else key: value for key, value in raw.items()}
    seq = raw.get("seq")
    seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
    for key in raw:
        if key not in FRAME_KEYS:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"unknown frame key `{key}`: a frame has {', '.join(FRAME_KEYS)}",
                str(key),
                seq,
            )
    for key in FRAME_KEYS:
        if key not in raw:
            raise ProtocolError(ErrorCode.MISSING_FIELD, f"a frame needs `{key}`", key, seq)
    if seq is None:
        raise ProtocolError(ErrorCode.INVALID_FIELD, "`seq` must be an integer", "seq")
    names = [t.value for t in CLIENT_TYPES]
    kind = raw["type"]
    if kind not in names:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"unknown frame type {kind!r}; a harness sends {', '.join(names)}", "type", seq
        )
    payload = raw["payload"]
    if not isinstance(payload, dict):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "`payload` must be a map", "payload", seq)
    timestamp = raw["timestamp"]
    if not isinstance(timestamp, (int, float)) or isinstance(timestamp, bool):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "`timestamp` must be a number (seconds)", "timestamp", seq)
    payload = {key.decode("utf-8", "replace") if isinstance(key, bytes) else key: v for key, v in payload.items()}
    return VlaEvalFrame(FrameType(kind), payload, seq, float(timestamp))


def image_of(value: Any, field: str, seq: int | None) -> np.ndarray | bytes:
    """A camera as sent: an array, or vla-eval's image map (PNG/JPEG bytes, or raw pixels)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, dict) and value.get(_IMAGE) is True:
        fmt, data = value.get("format"), value.get("data")
        if not isinstance(data, bytes):
            raise ProtocolError(ErrorCode.INVALID_IMAGE, f"`{field}`: the image's `data` must be bytes", field, seq)
        if fmt in ("png", "jpeg"):
            return data
        if fmt == "raw":
            shape, dtype = value.get("shape"), value.get("dtype")
            try:
                pixels = unpackb(packb({"__ndarray__": True, "data": data, "dtype": dtype, "shape": shape}))
            except (WireFormatError, TypeError) as exc:
                raise ProtocolError(ErrorCode.INVALID_IMAGE, f"`{field}`: {exc}", field, seq) from None
            assert isinstance(pixels, np.ndarray), "the wire codec reads an __ndarray__ map as an array"
            return pixels
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE, f"`{field}`: image format {fmt!r}; vla-eval sends png, jpeg or raw", field, seq
        )
    raise ProtocolError(
        ErrorCode.INVALID_IMAGE,
        f"`{field}` must be an H x W x 3 uint8 array or vla-eval's image map, got {type(value).__name__}",
        field,
        seq,
    )


def frame(kind: FrameType, payload: dict[str, Any], seq: int) -> bytes:
    return packb({"type": kind.value, "payload": payload, "seq": seq, "timestamp": time.time()})


def action_frame(actions: np.ndarray, seq: int, extra: dict[str, Any] | None = None) -> bytes:
    """The answer to observation ``seq``: ``actions`` ((D,) one action, or (H, D) a chunk), float32."""
    payload: dict[str, Any] = {"actions": np.ascontiguousarray(actions, dtype=np.float32), **(extra or {})}
    return frame(FrameType.ACTION, payload, seq)


def error_frame(code: str, message: str, field: str | None, seq: int) -> bytes:
    """vla-eval's ``error`` (its harness reads ``payload["error"]``), with our stable code and the field."""
    text = CodedError(code, message, field).text()
    return frame(FrameType.ERROR, {"error": text, "code": code, "message": message, "field": field}, seq)
