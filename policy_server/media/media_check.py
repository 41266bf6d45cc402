"""The one size check every camera passes before anything is decoded, whatever protocol it came by.

An observation (native, openpi, SGLang lock-step) or an HTTP request hands its cameras here as sent:
encoded bytes (PNG, JPEG, WebP), a list of encoded frames (a clip) or a pixel array. From headers and
array shapes alone, and before a pixel is decoded:

1. a clip has 1 to ``max_clip_frames`` frames (counted before any header is read);
2. every encoded frame's header is read (:func:`~.image_decoding.read_header`: its sides lie within the
   limits, it is not animated, not a many-scan JPEG) and every frame of a clip has the same size;
3. cameras composed side by side (openpi's mapping, the native ``concat_view``) give a frame whose sides
   lie within the limits too;
4. everything the observation decodes to (each camera at the size it will be decoded at, plus the
   composed frame) fits ``max_decoded_bytes``.

A few kilobytes of JPEG can claim 48 MiB of pixels, and a clip 65 times that: without step 4 a clip of
17 such frames made the server allocate gigabytes before any check saw the result. Step 4 answers
``payload_too_large``, the others ``invalid_image``, each naming the field.

JPEGs decode at reduced size where that still covers the canvas the model resizes to (``fit_side``:
libjpeg's DCT scaling, 1/2 to 1/8, costs a fraction of a full decode and the resize after it); the
budget counts the size they will be decoded at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cosmos3_runtime.description import ModelDescription
from robot_clients.protocol import CodedError, ErrorCode, FrameLimits

from .image_decoding import InvalidImage, model_frame_limits, read_header

__all__ = [
    "DEFAULT_MAX_DECODED_BYTES",
    "CameraSize",
    "DecodedTooLarge",
    "canvas_side",
    "check_clip_length",
    "check_decoded_bytes",
    "check_media",
    "check_sides",
    "served_frame_limits",
]

# Pixels one observation or HTTP request may decode to (RGB bytes; --max-decoded-mib): a 2560x2560 frame
# is 19 MiB, a 17-frame clip at the largest 256-tier canvas 4 MiB, while 17 frames of 4096x4096 are 816 MiB.
DEFAULT_MAX_DECODED_BYTES = 64 * 2**20
# A frame whose side is more than this many times the largest canvas side the model serves costs
# decoding and resizing the model never sees; the default of --max-image-side follows from it.
MAX_SIDE_PER_CANVAS_SIDE = 2


class DecodedTooLarge(CodedError):
    """The media would decode to more pixels than the server decodes for one observation or request."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(ErrorCode.PAYLOAD_TOO_LARGE, message, field)


@dataclass(frozen=True)
class CameraSize:
    """One camera as it will be decoded: ``frames`` (1 for an image) of ``height`` × ``width``."""

    field: str
    frames: int
    height: int
    width: int
    encoded: bool

    @property
    def decoded_bytes(self) -> int:
        return self.frames * self.height * self.width * 3


def canvas_side(description: ModelDescription | None, tier: int | None = None) -> int | None:
    """The longest canvas side of ``tier`` (None: of every tier the model serves); None when unknown."""
    canvases = description.canvases if description is not None else None
    if not canvases:
        return None
    tiers = [tier] if tier is not None and tier in canvases else list(canvases)
    return max(max(canvas.height, canvas.width) for t in tiers for canvas in canvases[t])


def served_frame_limits(
    description: ModelDescription, max_decoded_bytes: int | None, max_image_side: int | None = None
) -> FrameLimits:
    """The bounds sessions and requests are checked against: the model's, with sides capped at
    ``max_image_side`` (None: :data:`MAX_SIDE_PER_CANVAS_SIDE` times the largest canvas side the model
    serves) and the decoding budget ``max_decoded_bytes``."""
    limits = model_frame_limits(description.limits, max_decoded_bytes)
    if max_image_side is None:
        largest = canvas_side(description)
        max_image_side = MAX_SIDE_PER_CANVAS_SIDE * largest if largest is not None else limits.max_image_side
    side = max(limits.min_image_side, min(limits.max_image_side, max_image_side))
    return replace(limits, max_image_side=side)


def check_clip_length(frames: int, field: str, limits: FrameLimits) -> None:
    if not 1 <= frames <= limits.max_clip_frames:
        raise InvalidImage(f"`{field}` has {frames} frames; between 1 and {limits.max_clip_frames} are allowed", field)


def check_sides(height: int, width: int, field: str, limits: FrameLimits) -> None:
    if min(height, width) < limits.min_image_side or max(height, width) > limits.max_image_side:
        raise InvalidImage(
            f"`{field}` is {height}×{width} pixels; each side must be between {limits.min_image_side} and "
            f"{limits.max_image_side}",
            field,
        )


def check_decoded_bytes(sizes: Sequence[CameraSize], field: str, limits: FrameLimits) -> None:
    """Refuse media that would decode to more than ``limits.max_decoded_bytes`` (413: too large, not wrong)."""
    total = sum(size.decoded_bytes for size in sizes)
    if limits.max_decoded_bytes is None or total <= limits.max_decoded_bytes:
        return
    what = ", ".join(
        f"{s.frames} frames of {s.height}×{s.width}" if s.frames > 1 else f"{s.height}×{s.width}" for s in sizes
    )
    raise DecodedTooLarge(
        f"`{field}` ({what} RGB) would decode to {total / 2**20:.1f} MiB; this server decodes at most "
        f"{limits.max_decoded_bytes / 2**20:.0f} MiB of pixels per observation or request",
        field,
    )


def _encoded_size(frames: Sequence[Any], field: str, limits: FrameLimits, fit_side: int | None) -> CameraSize:
    """An encoded image (one frame) or clip from its headers alone, every frame the same size."""
    headers = [
        read_header(frame, field if len(frames) == 1 else f"{field}/{i}", limits, fit_side)
        for i, frame in enumerate(frames)
    ]
    sizes = {(h.height, h.width) for h in headers}
    if len(sizes) != 1:
        raise InvalidImage(f"every frame of `{field}` must have the same size, got {sorted(sizes)}", field)
    decoded = {(h.decoded_height, h.decoded_width) for h in headers}
    (height, width) = min(decoded)  # same-size frames draft to the same scale
    return CameraSize(field, len(frames), height, width, True)


def _camera_size(value: Any, field: str, limits: FrameLimits, fit_side: int | None) -> CameraSize | None:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _encoded_size([value], field, limits, fit_side)
    if isinstance(value, (list, tuple)) and all(isinstance(f, (bytes, bytearray, memoryview)) for f in value):
        check_clip_length(len(value), field, limits)  # before a single header is read
        return _encoded_size(value, field, limits, fit_side)
    if isinstance(value, np.ndarray) and value.ndim in (3, 4):
        return CameraSize(field, value.shape[0] if value.ndim == 4 else 1, value.shape[-3], value.shape[-2], False)
    return None  # not media: the protocol's own parser names what is wrong with it


def check_media(
    cameras: Sequence[tuple[str, Any]],
    limits: FrameLimits,
    *,
    side_by_side: bool = False,
    fit_side: int | None = None,
) -> list[CameraSize]:
    """Check ``cameras`` (``(field, value)`` pairs, in the order they compose) before any is decoded
    (see the module docstring); their sizes as they will be decoded. Raises :class:`InvalidImage` or
    :class:`DecodedTooLarge` naming the field. ``side_by_side``: the cameras become one frame, left to
    right, each at the first one's height. ``fit_side``: the canvas side JPEGs may be decoded down to."""
    sizes = [size for field, value in cameras if (size := _camera_size(value, field, limits, fit_side)) is not None]
    if not any(size.encoded for size in sizes):
        return sizes  # nothing to decode: pixel arrays are checked by the protocols' parsers
    counted = list(sizes)
    if side_by_side and len(sizes) > 1:
        name = "+".join(size.field for size in sizes)
        if len({size.frames for size in sizes}) != 1:
            raise InvalidImage(f"`{name}`: composed camera clips must have the same number of frames", name)
        height = sizes[0].height
        width = sum(max(1, round(s.width * height / s.height)) for s in sizes)
        check_sides(height, width, name, limits)
        counted.append(CameraSize(name, sizes[0].frames, height, width, False))
    check_decoded_bytes(counted, "+".join(size.field for size in sizes), limits)
    return sizes
