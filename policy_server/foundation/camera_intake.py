"""The camera frames a client sends, from bytes to the one frame the model conditions on: checked before
anything is decoded, decoded safely off the event loop, composed per view point. Every protocol (native,
openpi, SGLang lock-step, vla-eval) and the HTTP sidecar use these, so the checks are the same everywhere.

**The one media check** (:func:`check_media`), from headers and array shapes alone, before a pixel is
decoded:

1. a clip has 1 to ``max_clip_frames`` frames (counted before any header is read);
2. every encoded frame's header is read (:func:`read_header`: its sides lie within the limits, it is not
   animated, not a many-scan JPEG) and every frame of a clip has the same size;
3. cameras composed side by side (openpi's mapping, the native ``concat_view``), or as RoboArena's three
   DROID cameras (:func:`wrist_over_exteriors`), give a frame whose sides lie within the limits too;
4. everything the observation decodes to (each camera at the size it will be decoded at, plus the
   composed frame) fits ``max_decoded_bytes``.

A few kilobytes of JPEG can claim 48 MiB of pixels, and a clip 65 times that: without step 4 a clip of
17 such frames made the server allocate gigabytes before any check saw the result. Step 4 answers
``payload_too_large``, the others ``invalid_image``, each naming the field.

**Decoding** (:func:`decode_image`, :func:`decode_clip`): only PNG, JPEG and WebP are parsed at all
(Pillow is asked for those three plugins and no other), by content: what the client claims is never
consulted. The header is read, and nothing more, before anything is checked (so a small file that claims
a gigapixel image is refused before any pixel is allocated; Pillow's own ``MAX_IMAGE_PIXELS`` allows 89
million pixels per image); an animated image is refused (a clip is a list of frames); a JPEG with more
than :data:`MAX_JPEG_SCANS` scans is refused (a progressive JPEG is decoded once per scan; counted just
before its decoding, on the decode pool, since counting reads every byte). A JPEG larger
than the canvas the model resizes it to (``fit_side``) is decoded at reduced size (libjpeg's DCT scaling,
1/2 to 1/8, through Pillow's ``Image.draft``), never below that canvas; the budget of step 4 counts that
size. Every refusal is an :class:`InvalidImage` (``invalid_image``, naming the field); the caller answers
it and goes on.

**Off the event loop, one observation at a time** (:class:`DecodeSlot`): decoding a 480x640 JPEG costs a
few milliseconds of CPU, which the event loop serving every session must not spend. A session checks an
observation's headers as it arrives, decodes its pixels on the small decode pool (:func:`decode_pool`, 2
threads; Pillow releases the GIL) and admits it back on the event loop exactly as a raw one. One
observation per session decodes at a time and at most one waits behind it: a newer one replaces the
waiting one, answered ``dropped`` (``superseded``) as in the request queue (latest wins); while the slot
is busy a raw observation waits in it too, so a session's observations reach the queue in order. While
the session's last observation still waits in the request queue the next one waits here undecoded, and
is decoded once that one is taken: a frame that a newer one replaces is never decoded (a session
streaming 69 noise JPEGs a second decoded each, though nearly all were replaced unserved), and the
engine serves the frame that was newest when the session's previous one left the queue. A session that
leads the others' host time by more than a turn decodes nothing until they catch up (fair share).

**Composition** (:func:`compose_named`): Cosmos3 conditions on one image (or one clip). A robot with
several cameras names them, and the view point the model was trained with says which feed it:
``concat_view`` every named camera side by side in the order sent, ``wrist_view`` the first camera whose
name contains ``wrist``, ``ego_view`` and ``third_person_view`` the first whose name does not; a single
camera is used as it is. The openpi endpoint and vla-eval's map their clients' camera names with an
operator-set table instead, each entry a list of :data:`Alternative` s read by
:func:`camera_alternatives`; all compose with :func:`side_by_side`, except RoboArena's three DROID cameras,
which openpi's endpoint composes as NVIDIA's cosmos-framework server does (:func:`wrist_over_exteriors`).
"""

from __future__ import annotations

import asyncio
import io
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from cosmos3_runtime.description import EngineLimits, ModelDescription
from robot_clients.protocol import CodedError, DropReason, ErrorCode, FrameLimits, ProtocolError

if TYPE_CHECKING:  # Pillow is imported when a frame is first decoded
    from PIL.Image import Image as PILImage

logger = logging.getLogger(__name__)

T = TypeVar("T")


# -- decoding, header first ------------------------------------------------------------------------

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


def _open(data: bytes | bytearray | memoryview, field: str, bounds: FrameLimits, count_scans: bool) -> PILImage:
    """Open ``data`` with Pillow (header only), run every check of step 2, return the open image. A JPEG's
    scans are counted only when ``count_scans`` (just before decoding): counting is a pass over all its
    bytes (3 ms for a 3.8 MB noise JPEG), which the event loop would otherwise spend on every frame as it
    arrives, superseded ones included."""
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
        _check_header(image, data, field, bounds, count_scans)
    except BaseException:
        image.close()
        raise
    return image


def _check_header(
    image: PILImage, data: bytes | bytearray | memoryview, field: str, bounds: FrameLimits, count_scans: bool
) -> None:
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
    if count_scans and image.format == "JPEG":
        scans = bytes(data).count(_JPEG_START_OF_SCAN)
        if scans > MAX_JPEG_SCANS:
            raise InvalidImage(f"`{field}` is a JPEG with {scans} scans; at most {MAX_JPEG_SCANS} are accepted", field)


def read_header(
    data: bytes | bytearray | memoryview, field: str, bounds: FrameLimits, fit_side: int | None = None
) -> ImageHeader:
    """Check an encoded frame's header against ``bounds`` without decoding its pixels (microseconds:
    cheap enough for the event loop, so a bad frame can be refused as it arrives)."""
    with _open(data, field, bounds, count_scans=False) as image:
        width, height = image.size
        _draft(image, fit_side)
        return ImageHeader(ENCODED_FORMATS[image.format], height, width, image.size[1], image.size[0])


def decode_image(
    data: bytes | bytearray | memoryview, field: str, bounds: FrameLimits, fit_side: int | None = None
) -> np.ndarray:
    """An encoded PNG/JPEG/WebP frame to H×W×3 uint8 RGB, its header checked before it is decoded (a
    JPEG decoded down towards ``fit_side``, see the module docstring)."""
    from PIL import Image

    with _open(data, field, bounds, count_scans=True) as image:
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


# -- the one media check ---------------------------------------------------------------------------

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
    over_exteriors: bool = False,
    fit_side: int | None = None,
) -> list[CameraSize]:
    """Check ``cameras`` (``(field, value)`` pairs, in the order they compose) before any is decoded
    (see the module docstring); their sizes as they will be decoded. Raises :class:`InvalidImage` or
    :class:`DecodedTooLarge` naming the field. ``side_by_side``: the cameras become one frame, left to
    right, each at the first one's height; ``over_exteriors``: three cameras become one frame as
    :func:`wrist_over_exteriors` lays them out. ``fit_side``: the canvas side JPEGs may be decoded down to."""
    sizes = [size for field, value in cameras if (size := _camera_size(value, field, limits, fit_side)) is not None]
    if not any(size.encoded for size in sizes):
        return sizes  # nothing to decode: pixel arrays are checked by the protocols' parsers
    counted = list(sizes)
    if (side_by_side or over_exteriors) and len(sizes) > 1:
        name = "+".join(size.field for size in sizes)
        if len({size.frames for size in sizes}) != 1:
            raise InvalidImage(f"`{name}`: composed camera clips must have the same number of frames", name)
        height = sizes[0].height
        width = sum(max(1, round(s.width * height / s.height)) for s in sizes)
        if over_exteriors:
            height, width = height + height // 2, sizes[0].width
        check_sides(height, width, name, limits)
        counted.append(CameraSize(name, sizes[0].frames, height, width, False))
    check_decoded_bytes(counted, "+".join(size.field for size in sizes), limits)
    return sizes


# -- several cameras into one frame ----------------------------------------------------------------

Alternative = tuple[str, ...]  # camera names, composed side by side when more than one


def compose_named(images: Mapping[str, np.ndarray], view_point: str | None) -> np.ndarray:
    """The frame for ``view_point`` from named H×W×3 (or T×H×W×3) frames; raises naming the problem."""
    names = list(images)
    if len(names) == 1:
        return images[names[0]]
    if view_point == "concat_view":
        return side_by_side([images[name] for name in names])
    wants_wrist = view_point == "wrist_view"
    for name in names:
        if ("wrist" in name.lower()) == wants_wrist:
            return images[name]
    kind = "a wrist camera (a name containing 'wrist')" if wants_wrist else "a camera whose name has no 'wrist'"
    raise ProtocolError(
        ErrorCode.INVALID_FIELD,
        f"the {view_point or 'default'} view needs {kind}; got {', '.join(names)} "
        "(or configure view_point 'concat_view' to use them all side by side)",
        "images",
    )


def side_by_side(frames: list[np.ndarray]) -> np.ndarray:
    """Concatenate along width, each resized (nearest neighbour) to the first one's height."""
    height = frames[0].shape[-3]
    resized = []
    for frame in frames:
        h, w = frame.shape[-3], frame.shape[-2]
        if h != height:
            width = max(1, round(w * height / h))
            rows = (np.arange(height) * h // height).clip(0, h - 1)
            cols = (np.arange(width) * w // width).clip(0, w - 1)
            frame = frame[..., rows, :, :][..., :, cols, :]
        resized.append(frame)
    if resized[0].ndim == 4:
        frames_per_clip = {f.shape[0] for f in resized}
        if len(frames_per_clip) != 1:
            raise ProtocolError(ErrorCode.INVALID_IMAGE, "composed camera clips must have the same number of frames")
    return np.ascontiguousarray(np.concatenate(resized, axis=-2))


def wrist_over_exteriors(frames: list[np.ndarray]) -> np.ndarray:
    """RoboArena's three DROID cameras (wrist, exterior 1, exterior 2) as one frame, laid out as NVIDIA's
    cosmos-framework server lays them out for its DROID policies: the wrist camera on top at its own size;
    below it the two exterior cameras side by side, each resized (:func:`bilinear_resize`) to half the
    wrist camera's height and width. For an odd width the right one gets the extra column (the reference
    cannot compose that case at all). Frames are H×W×3, or T×H×W×3 clips of the same length."""
    wrist, left, right = frames
    height, width = wrist.shape[-3], wrist.shape[-2]
    if (
        {left.ndim, right.ndim} != {wrist.ndim}
        or wrist.ndim == 4
        and not wrist.shape[0] == left.shape[0] == right.shape[0]
    ):
        raise ProtocolError(ErrorCode.INVALID_IMAGE, "composed camera clips must have the same number of frames")
    half = height // 2
    bottom = [bilinear_resize(left, half, width // 2), bilinear_resize(right, half, width - width // 2)]
    return np.ascontiguousarray(np.concatenate([wrist, np.concatenate(bottom, axis=-2)], axis=-3))


def bilinear_resize(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 H×W×3 (or T×H×W×3) resized to ``height`` × ``width`` as ``torch.nn.functional.interpolate``
    does with ``mode="bilinear", align_corners=False`` (half-pixel centres, no antialiasing), then truncated
    to uint8 as cosmos-framework's server does: its DROID policies saw their exterior cameras made so."""

    def taps(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        source = np.maximum((np.arange(size_out, dtype=np.float32) + 0.5) * (size_in / size_out) - 0.5, 0.0)
        low = np.minimum(source.astype(np.intp), size_in - 1)  # floor: the positions are >= 0
        return low, np.minimum(low + 1, size_in - 1), (source - low).astype(np.float32)

    row_low, row_high, row_weight = taps(frames.shape[-3], height)
    col_low, col_high, col_weight = taps(frames.shape[-2], width)
    pixels = frames.astype(np.float32)
    rows = (
        pixels[..., row_low, :, :] * (1.0 - row_weight)[:, None, None]
        + pixels[..., row_high, :, :] * row_weight[:, None, None]
    )
    mixed = rows[..., col_low, :] * (1.0 - col_weight)[:, None] + rows[..., col_high, :] * col_weight[:, None]
    resized: np.ndarray = np.clip(mixed, 0.0, 255.0).astype(np.uint8)
    return resized


def camera_alternatives(entry: Any, where: str, error: type[ValueError]) -> tuple[Alternative, ...]:
    """A camera mapping entry as its alternatives, tried in order: one camera name, or a list whose items
    are names or lists of names. ``error`` is the mapping's own error, raised naming ``where``."""
    if isinstance(entry, str):
        entry = [entry]
    if not isinstance(entry, list) or not entry:
        raise error(f"{where} must be a camera name or a non-empty list of alternatives")
    alternatives = []
    for alternative in entry:
        names = [alternative] if isinstance(alternative, str) else alternative
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise error(f"{where}: each alternative is a camera name or a list of them, got {alternative!r}")
        alternatives.append(tuple(names))
    return tuple(alternatives)


# -- a session's frames, decoded off the event loop ------------------------------------------------

# How often a held decode checks whether its session may decode again (see DecodeSlot's hold).
HOLD_RECHECK_S = 0.01

_POOL: ImageDecodePool | None = None
_POOL_LOCK = threading.Lock()


def decode_pool() -> ImageDecodePool:
    """The process's decode pool (2 threads), made on first use: a server whose robots send raw frames
    starts no decode thread."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ImageDecodePool(workers=2)
        return _POOL


def _protocol_error(error: CodedError, seq: int | None) -> ProtocolError:
    return ProtocolError(error.code, error.message, error.field, seq)


def check_cameras(
    cameras: list[tuple[str, Any]],
    limits: FrameLimits,
    seq: int | None,
    *,
    side_by_side: bool,
    fit_side: int | None,
    over_exteriors: bool = False,
) -> None:
    """The one media check (:func:`check_media`: headers, clip lengths,
    the composed frame, the decoded bytes) as this protocol's error. Cheap enough for the event loop."""
    try:
        check_media(cameras, limits, side_by_side=side_by_side, over_exteriors=over_exteriors, fit_side=fit_side)
    except (InvalidImage, DecodedTooLarge) as error:
        raise _protocol_error(error, seq) from None


def decoded_image(value: Any, field: str, limits: FrameLimits, seq: int | None, fit_side: int | None = None) -> Any:
    """An encoded frame (bytes) or clip (list of bytes) as uint8 pixels; anything else as it is."""
    try:
        if isinstance(value, bytes):
            return decode_image(value, field, limits, fit_side)
        if isinstance(value, list):
            return decode_clip(value, field, limits, fit_side)
    except InvalidImage as error:
        raise _protocol_error(error, seq) from None
    return value


def decoded_frame(frame: Any, limits: FrameLimits, fit_side: int | None = None) -> Any:
    """A native :class:`~robot_clients.client_frames.ObservationFrame` with every camera decoded (in place)."""
    frame.image = decoded_image(frame.image, "image", limits, frame.seq, fit_side)
    frame.video = decoded_image(frame.video, "video", limits, frame.seq, fit_side)
    if frame.images is not None:
        frame.images = {
            name: decoded_image(image, f"images/{name}", limits, frame.seq, fit_side)
            for name, image in frame.images.items()
        }
    return frame


def native_decode(
    frame: Any, limits: FrameLimits, *, side_by_side: bool = False, fit_side: int | None = None
) -> Callable[[], Any] | None:
    """Check a native observation's cameras now (before anything is decoded); the decoding to run on the
    pool (None: every camera is an array already). ``side_by_side``: its named images are composed
    (``concat_view``); ``fit_side``: the canvas side its JPEGs may decode down to."""
    cameras = [("image", frame.image), ("video", frame.video)]
    cameras.extend((f"images/{name}", image) for name, image in (frame.images or {}).items())
    check_cameras(cameras, limits, frame.seq, side_by_side=side_by_side, fit_side=fit_side)
    if not any(isinstance(value, (bytes, list)) for _, value in cameras):
        return None
    return lambda: decoded_frame(frame, limits, fit_side)


@dataclass
class _Pending:
    seq: int
    received_at: float
    prepare: Callable[[], Any] | None  # run on the pool; None: a raw observation waiting its turn
    admit: Callable[[Any, float], None]  # on the event loop, with what prepare returned
    value: Any = None
    cancelled: bool = field(default=False)


class DecodeSlot:
    """One session's observations between their arrival and the request queue (see the module docstring).

    ``guard(seq, function, *args)`` runs an admission on the event loop the way the session handles a
    frame (a :class:`ProtocolError` becomes an error reply naming the seq); ``drop(seq, reason)`` answers a
    replaced observation.
    """

    def __init__(
        self,
        guard: Callable[..., None],
        drop: Callable[[int, str], None],
        hold: Callable[[], bool] = lambda: False,
    ) -> None:
        self._guard = guard
        self._drop = drop
        # True while the session's last observation still waits in the queue (decoded now, the next one could
        # only replace it unserved: a superseded frame is never decoded), or while the session owes turns
        # to active sessions (its decoding is host time like its turns': RequestQueue.holds_back_decoding).
        self._hold = hold
        self._held = False  # a recheck of the hold is scheduled
        self._closed = False
        self._decoding: _Pending | None = None
        self._waiting: _Pending | None = None
        self._task: asyncio.Task[None] | None = None
        self.decoded = 0
        self._cpu_s = 0.0  # CPU seconds decoding took since take_cpu_s() was last called

    def take_cpu_s(self) -> float:
        """CPU seconds spent decoding since the last call (what the session's next queued observation is
        charged for in the queue, replaced decodes included), and start counting again."""
        spent, self._cpu_s = self._cpu_s, 0.0
        return spent

    def charge(self, cpu_s: float) -> None:
        """CPU seconds spent decoding for this session elsewhere (its msgpack frames), paid like its pixels."""
        self._cpu_s += cpu_s

    @property
    def busy(self) -> bool:
        return self._decoding is not None or self._waiting is not None

    def submit(
        self,
        seq: int,
        received_at: float,
        prepare: Callable[[], Any] | None,
        value: Any,
        admit: Callable[[Any, float], None],
    ) -> None:
        """Admit ``prepare()`` (or ``value`` when there is nothing to decode) once it is this observation's
        turn; a newer submission replaces one still waiting, which is dropped ``superseded``."""
        pending = _Pending(seq, received_at, prepare, admit, value)
        if self._decoding is None and self._waiting is None:
            self._start(pending)
            return
        replaced, self._waiting = self._waiting, pending
        if replaced is not None:
            self._drop(replaced.seq, DropReason.SUPERSEDED)

    def cancel(self, seq: int | None) -> list[int]:
        """Forget ``seq`` (None: everything) here; the seqs forgotten, for the caller to answer."""
        forgotten = []
        for pending in (self._decoding, self._waiting):
            if pending is not None and not pending.cancelled and (seq is None or pending.seq == seq):
                pending.cancelled = True
                forgotten.append(pending.seq)
        if self._waiting is not None and self._waiting.cancelled:
            self._waiting = None
        return forgotten

    def close(self) -> None:
        self._closed = True
        self.cancel(None)
        if self._task is not None:
            self._task.cancel()

    def _start(self, pending: _Pending) -> None:
        if pending.prepare is not None and self._hold():
            self._waiting = pending  # newer submissions replace it meanwhile (latest wins)
            if not self._held:
                self._held = True
                asyncio.get_running_loop().call_later(HOLD_RECHECK_S, self._recheck)
            return
        self._decoding = pending
        if pending.prepare is None:
            self._finish(pending)
            return
        self._task = asyncio.get_running_loop().create_task(self._decode(pending), name=f"decode-{pending.seq}")

    async def _decode(self, pending: _Pending) -> None:
        try:
            pending.value, cpu_s = await decode_pool().run(_timed, pending.prepare)
            self._cpu_s += cpu_s
        except ProtocolError as error:
            if not pending.cancelled:
                self._guard(pending.seq, _raise, error)
            self._next()
            return
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - a decoder bug answers this seq and the session goes on
            if not pending.cancelled:
                self._guard(pending.seq, _raise, error)
            self._next()
            return
        self.decoded += 1
        self._finish(pending)

    def _finish(self, pending: _Pending) -> None:
        if not pending.cancelled:
            self._guard(pending.seq, pending.admit, pending.value, pending.received_at)
        self._next()

    def _next(self) -> None:
        self._decoding, self._task = None, None
        if not self._held:
            self._start_waiting()

    def _recheck(self) -> None:
        self._held = False
        if not self._closed and self._decoding is None:
            self._start_waiting()

    def _start_waiting(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            self._start(waiting)


def _raise(error: BaseException) -> None:
    raise error


def _timed(prepare: Callable[[], Any]) -> tuple[Any, float]:
    """``prepare()`` and the CPU seconds it took on this thread (waiting for the pool is not counted)."""
    started = time.thread_time()
    return prepare(), time.thread_time() - started
