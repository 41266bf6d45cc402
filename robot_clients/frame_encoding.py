"""Camera frames as JPEG, WebP or PNG bytes, made on the robot before they go on the wire.

A 480×640 RGB frame is 921,600 bytes raw; as JPEG at quality 90 it is a few tens of KB, and shrunk to
the canvas the server conditions on first (:mod:`robot_clients.frame_sizing`), less again. Both
protocols take these bytes where they take a raw array: ``"image": <bytes>``, a clip as a list of
them, a named camera as ``"images": {"wrist": <bytes>}``.

Encoding needs Pillow, which is not a dependency of the robot install (numpy, msgpack and websockets
only). Install it with the ``images`` extra::

    pip install 'cosmos3-policy-server[images]'

It is imported the first time a frame is encoded; without it, :func:`encode_frame` raises
:class:`ImageEncodingUnavailable` saying what to install. Raw frames never need it.

Which format: JPEG (quality 75-90) is the robot's choice: it encodes a 480×640 frame in a few
milliseconds. WebP is smaller at equal quality but costs several times the CPU to encode (we use
libwebp's fastest method); PNG is lossless and large, for when pixels must arrive exactly.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from .frame_sizing import resize_frame

__all__ = ["ImageEncoding", "ImageEncodingUnavailable", "encode_frame", "encode_clip", "IMAGE_FORMATS"]

IMAGE_FORMATS = ("jpeg", "webp", "png")
_PIL_FORMATS = {"jpeg": "JPEG", "webp": "WEBP", "png": "PNG"}


class ImageEncodingUnavailable(ImportError):
    """Pillow is not installed on this machine, so frames cannot be encoded here (raw frames still work)."""


@dataclass(frozen=True)
class ImageEncoding:
    """How to put a frame on the wire: ``format`` is ``"jpeg"``, ``"webp"`` or ``"png"``.

    ``quality`` (1-100) applies to JPEG and WebP; PNG is lossless and ignores it. ``size`` (height,
    width), when set, shrinks every frame to it first (usually :func:`robot_clients.frame_sizing.send_size`
    of the served tier, so the server receives only the pixels it conditions on).
    """

    format: str = "jpeg"
    quality: int = 90
    size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.format not in IMAGE_FORMATS:
            raise ValueError(f"image format must be one of {', '.join(IMAGE_FORMATS)}, got {self.format!r}")
        if isinstance(self.quality, bool) or not isinstance(self.quality, int) or not 1 <= self.quality <= 100:
            raise ValueError(f"image quality must be an integer from 1 to 100, got {self.quality!r}")
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise ValueError(f"image size must be (height, width) in pixels, got {self.size!r}")


def _pillow() -> ModuleType:
    try:
        from PIL import Image
    except ImportError:
        raise ImageEncodingUnavailable(
            "encoding camera frames as JPEG/WebP/PNG needs Pillow, which the robot install leaves out: "
            "pip install 'cosmos3-policy-server[images]' (or pip install pillow), or send raw frames"
        ) from None
    return Image


def encode_frame(frame: np.ndarray, encoding: ImageEncoding) -> bytes:
    """An H×W×3 uint8 RGB frame as ``encoding.format`` bytes (shrunk to ``encoding.size`` first if set)."""
    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
        raise ValueError(
            f"expected an H×W×3 uint8 RGB frame, got {getattr(frame, 'dtype', type(frame).__name__)} "
            f"{getattr(frame, 'shape', '')}"
        )
    Image = _pillow()
    if encoding.size is not None and tuple(encoding.size) != frame.shape[:2]:
        frame = resize_frame(frame, *encoding.size)
    options: dict[str, object] = {}
    if encoding.format == "jpeg":
        options = {"quality": encoding.quality}
    elif encoding.format == "webp":
        options = {"quality": encoding.quality, "method": 0}  # libwebp's fastest: a robot encodes every tick
    else:
        options = {"compress_level": 1}  # lossless either way; level 1 is several times faster than 6
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame)).save(buffer, _PIL_FORMATS[encoding.format], **options)
    return buffer.getvalue()


def encode_clip(frames: np.ndarray | Sequence[np.ndarray], encoding: ImageEncoding) -> list[bytes]:
    """A T×H×W×3 uint8 clip as a list of encoded frames (the form a clip takes on the wire)."""
    return [encode_frame(frame, encoding) for frame in frames]
