"""What an observation's data fields may hold: its cameras (arrays or encoded frames), its proprio state and
its prefix actions, each checked against the frame limits and the protocol's shapes.

The field-level half of parsing an observation; :mod:`robot_clients.client_frames` puts the fields
together into an ``ObservationFrame``. The openpi protocol and the HTTP sidecar check their own
observations with the same functions (``check_image_size``, ``parse_state``, the encoded-frame tests), so
every protocol refuses the same things in the same words. Each raises
:class:`~robot_clients.protocol.ProtocolError` naming the offending field. It imports numpy and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .frame_fields import str_keys
from .protocol import ErrorCode, FrameLimits, ProtocolError

__all__ = [
    "MAX_NAMED_CAMERAS",
    "MAX_STATE_VALUES",
    "check_image_size",
    "is_encoded_clip",
    "is_encoded_frame",
    "parse_cameras",
    "parse_prefix_actions",
    "parse_state",
]

# More cameras than a robot has, fewer than a frame-size attack would want.
MAX_NAMED_CAMERAS = 8
# A proprioceptive state has at most this many numbers: the widest embodiments have tens per row and
# a profile conditions on a few rows; a JSON body of millions of numbers is an attack, not a robot.
MAX_STATE_VALUES = 4096

# One camera as parsed: an H×W×3 array, or the encoded bytes the server decodes before queueing.
Frame = np.ndarray | bytes
# A clip as parsed: a T×H×W×3 array, or a list of encoded frames.
Clip = np.ndarray | list[bytes]


def is_encoded_frame(value: Any) -> bool:
    """True for a frame sent as encoded bytes (PNG, JPEG or WebP) in place of an H×W×3 array."""
    return isinstance(value, (bytes, bytearray, memoryview))


def is_encoded_clip(value: Any) -> bool:
    """True for a clip sent as a list of encoded frames in place of a T×H×W×3 array."""
    return isinstance(value, (list, tuple)) and bool(value) and all(is_encoded_frame(frame) for frame in value)


def _check_encoded(value: Any, name: str, rank: int, limits: FrameLimits, seq: int) -> bytes | list[bytes]:
    """An encoded frame (rank 3) or clip (rank 4: a list of encoded frames), as bytes. Only what needs no
    image library is checked here (non-empty, the clip's frame count); the server reads each header and
    checks its size against the limits before decoding a pixel (``policy_server.media.image_decoding``)."""
    frames = [value] if rank == 3 else list(value)
    if rank == 4 and not 1 <= len(frames) <= limits.max_clip_frames:
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{name}` has {len(frames)} frames; between 1 and {limits.max_clip_frames} are allowed",
            name,
            seq,
        )
    if not all(frames):
        raise ProtocolError(ErrorCode.INVALID_IMAGE, f"`{name}` holds an empty encoded frame", name, seq)
    return bytes(value) if rank == 3 else [bytes(frame) for frame in frames]


def _check_frames(array: Any, name: str, rank: int, limits: FrameLimits, seq: int) -> np.ndarray | bytes | list[bytes]:
    """Validate an image (rank 3: H×W×3) or a video (rank 4: T×H×W×3) of uint8, or its encoded form: PNG,
    JPEG or WebP bytes for an image, a list of them for a video."""
    shape_text = "H×W×3" if rank == 3 else "T×H×W×3"
    if is_encoded_frame(array) if rank == 3 else is_encoded_clip(array):
        return _check_encoded(array, name, rank, limits, seq)
    if not isinstance(array, np.ndarray):
        encoded = "PNG/JPEG/WebP bytes" if rank == 3 else "a list of PNG/JPEG/WebP bytes"
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{name}` must be a numpy array ({shape_text} uint8) or {encoded}, got {type(array).__name__}",
            name,
            seq,
        )
    if array.dtype != np.uint8:
        raise ProtocolError(ErrorCode.INVALID_IMAGE, f"`{name}` must have dtype uint8, got {array.dtype}", name, seq)
    if array.ndim != rank or array.shape[-1] != 3:
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{name}` must have shape {shape_text} (RGB), got {list(array.shape)}",
            name,
            seq,
        )
    check_image_size(array, name, limits, seq)
    if rank == 4 and not 1 <= array.shape[0] <= limits.max_clip_frames:
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{name}` has {array.shape[0]} frames; between 1 and {limits.max_clip_frames} are allowed",
            name,
            seq,
        )
    return array


def check_image_size(frames: np.ndarray, name: str, limits: FrameLimits, seq: int | None = None) -> None:
    """Each side of an H×W×3 frame (or T×H×W×3 clip) within the limits; both protocols use this."""
    check_image_sides(frames.shape[-3], frames.shape[-2], name, limits, seq)


def check_image_sides(height: int, width: int, name: str, limits: FrameLimits, seq: int | None = None) -> None:
    """A frame's height and width within the limits (read from an encoded frame's header, before decoding)."""
    if min(height, width) < limits.min_image_side or max(height, width) > limits.max_image_side:
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{name}` is {height}×{width} pixels; each side must be between {limits.min_image_side} "
            f"and {limits.max_image_side}",
            name,
            seq,
        )


def parse_cameras(
    frame: Mapping[str, Any], limits: FrameLimits, seq: int
) -> tuple[Frame | None, Clip | None, dict[str, Frame] | None]:
    """An observation's cameras as ``(image, video, images)``: exactly one of an ``image``, a ``video`` or
    named ``images`` (1 to :data:`MAX_NAMED_CAMERAS`), each checked; the others are ``None``."""
    image = video = images = None
    if frame.get("images") is not None:
        named = str_keys(frame["images"], "images", seq) if isinstance(frame["images"], dict) else None
        if named is None or not 1 <= len(named) <= MAX_NAMED_CAMERAS:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`images` must map 1 to {MAX_NAMED_CAMERAS} camera names to H×W×3 uint8 frames",
                "images",
                seq,
            )
        images = {name: _check_frames(value, f"images/{name}", 3, limits, seq) for name, value in named.items()}
        if frame.get("image") is not None or frame.get("video") is not None:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, "send one of `image`, `video` or `images` in an observation", "images", seq
            )
    if frame.get("image") is not None:
        image = _check_frames(frame["image"], "image", 3, limits, seq)
    if frame.get("video") is not None:
        video = _check_frames(frame["video"], "video", 4, limits, seq)
    if image is None and video is None and images is None:
        raise ProtocolError(
            ErrorCode.MISSING_FIELD,
            "`observation` needs an `image` (H×W×3 uint8), named `images` or a `video` (T×H×W×3 uint8)",
            "image",
            seq,
        )
    if image is not None and video is not None:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, "send either `image` or `video` in one observation, not both", "video", seq
        )
    return image, video, images


def parse_prefix_actions(prefix: Any, seq: int) -> np.ndarray:
    """The actions still to execute, as a finite float32 K×D array (K >= 1)."""
    if not isinstance(prefix, np.ndarray) or prefix.ndim != 2 or prefix.dtype.kind != "f" or not len(prefix):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            "`prefix_actions` must be a K×D float array, K >= 1 (the actions still to execute)",
            "prefix_actions",
            seq,
        )
    with np.errstate(over="ignore"):
        prefix = prefix.astype(np.float32)
    if not np.isfinite(prefix).all():
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            "`prefix_actions` must be finite float32 values (no NaN, no infinity, |x| < 3.4e38)",
            "prefix_actions",
            seq,
        )
    return prefix


def parse_state(value: Any, name: str = "state", seq: int | None = None) -> np.ndarray:
    """A proprio state as float32: ``[D]`` or ``[rows, D]``, finite, at most :data:`MAX_STATE_VALUES`.

    Takes a numeric array, or (from JSON senders) a list or nested lists of numbers. Whether the width
    and the row count fit the domain is for the server to judge against the domain's profile; this is
    the shape every protocol shares. Raises :class:`ProtocolError` (``invalid_field``) naming ``name``.
    """
    wanted = f"`{name}` must be a float array [state_dim] or [history_length, state_dim]"
    if isinstance(value, list):
        try:
            value = np.asarray(value, dtype=np.float64)
        except (ValueError, TypeError):
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"{wanted}, of numbers in rows of equal length", name, seq
            ) from None
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiu":
        got = f"dtype {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{wanted}, got {got}", name, seq)
    if value.ndim not in (1, 2) or value.size == 0 or value.size > MAX_STATE_VALUES:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"{wanted} of 1 to {MAX_STATE_VALUES} values, got shape {list(value.shape)}",
            name,
            seq,
        )
    with np.errstate(over="ignore"):
        state = value.astype(np.float32)
    if not np.isfinite(state).all():
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{name}` must be finite float32 values (no NaN, no infinity, |x| < 3.4e38)",
            name,
            seq,
        )
    return np.ascontiguousarray(state)
