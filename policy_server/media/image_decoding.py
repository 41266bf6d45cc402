"""Encoded camera frames (JPEG, PNG, WebP bytes) to uint8 arrays, safely: header first, pixels after.

Robots on slow links send camera frames encoded (:mod:`robot_clients.camera_frames`). Whatever path
such bytes arrive by (the native protocol, the openpi endpoint, an HTTP msgpack body), they are decoded
here, so the checks are the same everywhere:

1. Only PNG, JPEG and WebP are parsed at all (Pillow is asked for those three plugins and no other), by
   content: what the client claims is never consulted.
2. The header is read, and nothing more, before anything is checked: the width and height each lie
   within the frame limits (so a small file that claims a gigapixel image is refused before any pixel
   is allocated; Pillow's own ``MAX_IMAGE_PIXELS`` guard allows 89 million pixels per image, far more
   than a camera frame); an animated image is refused (a clip is a list of frames); a JPEG with more
   than :data:`MAX_JPEG_SCANS` scans is refused (a progressive JPEG is decoded once per scan, so a
   small file with thousands of scans costs seconds of CPU).
3. Then the pixels are decoded and converted to RGB. A JPEG larger than the canvas the model resizes
   it to (``fit_side``) is decoded at reduced size (libjpeg's DCT scaling, 1/2 to 1/8, through
   Pillow's ``Image.draft``), never below that canvas: a 4096×4096 frame for a 320-pixel canvas costs
   an eighth of its pixels in decoding, and the resize after it an eighth more.

Every refusal is an :class:`InvalidImage` with the ``invalid_image`` code and the field's name; the
caller answers it and goes on (a session is never closed for a bad frame).

Decoding a 480×640 JPEG takes a few milliseconds of CPU, which must not be spent on the event loop
that serves every session. :class:`ImageDecodePool` runs :func:`decode_image` / :func:`decode_clip` on
a small thread pool (Pillow releases the GIL while it decodes); the functions themselves are plain and
synchronous, so the engine worker can call them on its side of the queue as well.
"""

from __future__ import annotations

import asyncio
import io
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from cosmos3_runtime.description import EngineLimits
from robot_clients.protocol import CodedError, ErrorCode, FrameLimits

if TYPE_CHECKING:  # Pillow is imported when a frame is first decoded
    from PIL.Image import Image as PILImage

T = TypeVar("T")

__all__ = [
    "ENCODED_FORMATS",
    "MAX_JPEG_SCANS",
    "ImageDecodePool",
    "ImageHeader",
    "InvalidImage",
    "decode_clip",
    "decode_image",
    "fit_size",
    "model_frame_limits",
    "read_header",
]

# Pillow's format names -> the names clients use.
ENCODED_FORMATS = {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp"}
# A baseline JPEG has 1 scan, a progressive one about 10 (3 components, DC then AC bands). libjpeg decodes
# a progressive image once per scan, so the scan count multiplies the cost of every pixel.
MAX_JPEG_SCANS = 64
_JPEG_START_OF_SCAN = b"\xff\xda"


def model_frame_limits(limits: EngineLimits, max_decoded_bytes: int | None = None) -> FrameLimits:
    """The model's pixel and frame bounds as the wire checks them, and for HTTP bodies the pixels one
    request may decode to (None: no such bound)."""
    return FrameLimits(limits.min_image_side, limits.max_image_side, limits.max_clip_frames, max_decoded_bytes)


class InvalidImage(CodedError, ValueError):
    """An encoded frame was refused: ``code`` is ``invalid_image``, ``field`` names where it was sent."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(ErrorCode.INVALID_IMAGE, message, field)


@dataclass(frozen=True)
class ImageHeader:
    """What an encoded frame's header says: its format (``jpeg``, ``png``, ``webp``) and size, and the
    size it decodes to (smaller for a JPEG decoded down to a canvas)."""

    format: str
    height: int
    width: int
    decoded_height: int
    decoded_width: int


def fit_size(height: int, width: int, fit_side: int | None) -> tuple[int, int] | None:
    """The (width, height) a frame may be decoded down to and still cover every canvas whose sides are
    at most ``fit_side`` (its longest side scaled to ``fit_side``); None: no smaller size to ask for."""
    if fit_side is None or max(height, width) <= fit_side:
        return None
    scale = fit_side / max(height, width)
    return math.ceil(width * scale), math.ceil(height * scale)


def _draft(image: PILImage, fit_side: int | None) -> None:
    """Ask a JPEG to decode at the smallest DCT scale that still covers ``fit_side`` (header only)."""
    target = fit_size(image.size[1], image.size[0], fit_side)
    if target is not None and image.format == "JPEG":
        image.draft("RGB", target)


def _open(data: bytes | bytearray | memoryview, field: str, bounds: FrameLimits) -> PILImage:
    """Open ``data`` with Pillow (header only), run every check of step 2, return the open image."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=tuple(ENCODED_FORMATS))
    except Image.DecompressionBombError:  # a header claiming hundreds of millions of pixels
        raise InvalidImage(
            f"`{field}` claims a size far beyond the limits; each side must be between "
            f"{bounds.min_image_side} and {bounds.max_image_side}",
            field,
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise InvalidImage(f"`{field}` is not a PNG, JPEG or WebP image (or its header is corrupt)", field) from None
    try:
        _check_header(image, data, field, bounds)
    except BaseException:
        image.close()
        raise
    return image


def _check_header(image: PILImage, data: bytes | bytearray | memoryview, field: str, bounds: FrameLimits) -> None:
    if image.format not in ENCODED_FORMATS:  # e.g. MPO, which Pillow's JPEG plugin may return
        raise InvalidImage(f"`{field}` is a {image.format} image; accepted: PNG, JPEG, WebP", field)
    width, height = image.size
    if min(height, width) < bounds.min_image_side or max(height, width) > bounds.max_image_side:
        raise InvalidImage(
            f"`{field}` is {height}×{width} pixels; each side must be between {bounds.min_image_side} and "
            f"{bounds.max_image_side}",
            field,
        )
    if getattr(image, "is_animated", False) or getattr(image, "n_frames", 1) != 1:
        raise InvalidImage(f"`{field}` is an animated image; send a clip as a list of single frames", field)
    if image.format == "JPEG":
        scans = bytes(data).count(_JPEG_START_OF_SCAN)
        if scans > MAX_JPEG_SCANS:
            raise InvalidImage(f"`{field}` is a JPEG with {scans} scans; at most {MAX_JPEG_SCANS} are accepted", field)


def read_header(
    data: bytes | bytearray | memoryview, field: str, bounds: FrameLimits, fit_side: int | None = None
) -> ImageHeader:
    """Check an encoded frame's header against ``bounds`` without decoding its pixels (microseconds:
    cheap enough for the event loop, so a bad frame can be refused as it arrives)."""
    with _open(data, field, bounds) as image:
        width, height = image.size
        _draft(image, fit_side)
        return ImageHeader(ENCODED_FORMATS[image.format], height, width, image.size[1], image.size[0])


def decode_image(
    data: bytes | bytearray | memoryview, field: str, bounds: FrameLimits, fit_side: int | None = None
) -> np.ndarray:
    """An encoded PNG/JPEG/WebP frame to H×W×3 uint8 RGB, its header checked before it is decoded (a
    JPEG decoded down towards ``fit_side``, see the module docstring)."""
    from PIL import Image

    with _open(data, field, bounds) as image:
        try:
            _draft(image, fit_side)
            rgb = image.convert("RGB") if image.mode != "RGB" else image
            rgb.load()
            pixels = np.asarray(rgb, dtype=np.uint8)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            # Truncated or corrupt pixel data, or a mode that has no RGB conversion.
            raise InvalidImage(
                f"`{field}` could not be decoded: its pixel data is corrupt or truncated", field
            ) from None
    return np.ascontiguousarray(pixels)


def decode_clip(
    frames: Sequence[bytes | bytearray | memoryview], field: str, bounds: FrameLimits, fit_side: int | None = None
) -> np.ndarray:
    """A list of encoded frames to T×H×W×3 uint8. The count and every frame's header are checked (all
    frames the same size) before the first frame is decoded."""
    if not 1 <= len(frames) <= bounds.max_clip_frames:
        raise InvalidImage(
            f"`{field}` has {len(frames)} frames; between 1 and {bounds.max_clip_frames} are allowed", field
        )
    headers = [read_header(frame, f"{field}/{i}", bounds, fit_side) for i, frame in enumerate(frames)]
    sizes = {(h.height, h.width) for h in headers}
    if len(sizes) != 1:
        raise InvalidImage(f"every frame of `{field}` must have the same size, got {sorted(sizes)}", field)
    decoded = {(h.decoded_height, h.decoded_width) for h in headers}
    if len(decoded) != 1:  # same-size frames of different kinds (a PNG among JPEGs) decode at one size
        fit_side = None
        decoded = sizes
    ((height, width),) = decoded
    clip = np.empty((len(frames), height, width, 3), dtype=np.uint8)
    for i, frame in enumerate(frames):
        clip[i] = decode_image(frame, f"{field}/{i}", bounds, fit_side)
    return clip


class ImageDecodePool:
    """A few threads that decode encoded frames off the event loop.

    ``await pool.decode_image(data, field, bounds)`` (or ``decode_clip``) returns the array, or raises
    :class:`InvalidImage`, without blocking the loop. ``workers`` bounds the CPU spent decoding at once
    (default 2: a frame decodes in a few ms, and the engine worker needs the other cores). Callers bound
    what they submit: one frame per session waiting at a time (latest wins, as the engine queue).
    """

    def __init__(self, workers: int = 2) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="image-decode")

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on a pool thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def decode_image(
        self, data: bytes | bytearray | memoryview, field: str, bounds: FrameLimits, fit_side: int | None = None
    ) -> np.ndarray:
        return await self.run(decode_image, data, field, bounds, fit_side)

    async def decode_clip(
        self,
        frames: Sequence[bytes | bytearray | memoryview],
        field: str,
        bounds: FrameLimits,
        fit_side: int | None = None,
    ) -> np.ndarray:
        return await self.run(decode_clip, frames, field, bounds, fit_side)

    def close(self) -> None:
        """Stop the threads once the frames being decoded are done (queued ones are dropped)."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ImageDecodePool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
