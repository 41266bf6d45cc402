"""Camera frames as the robot sends them: at the size the server conditions on, and encoded as JPEG, WebP
or PNG bytes.

**Sizing.** The server brings every frame to its resolution tier's canvas
(``cosmos3_runtime.frame_preprocessing``, which follows diffusers' Cosmos3 pipeline):

1. each side is snapped down to a multiple of 16 (nearest-neighbour);
2. the tier's canvas whose aspect ratio (height / width) is closest to the frame's is picked;
3. the frame is shrunk to fit inside that canvas, keeping its aspect ratio (bicubic, antialiased; it is
   never enlarged): that is the *content*;
4. the rest of the canvas is padded.

A 480×640 camera at tier 256 lands on the 256×320 canvas as 240×320 of content: three quarters of the
pixels the robot sent are thrown away by the shrink. Sending the frame at :func:`send_size` instead
(here 240×320) makes step 3 a no-op on the server, and :func:`resize_frame` does that shrink on the
robot with the server's own filter, so the model sees the same conditioning pixels (within rounding to
uint8) from a quarter of the bytes. The canvases come from the server's metadata frame (``canvases``: for
each tier, a list of ``{"aspect_ratio", "height", "width"}``); :func:`canvas_bins` reads them. Only numpy
is needed for this.

**Encoding.** A 480×640 RGB frame is 921,600 bytes raw; as JPEG at quality 90 it is a few tens of KB, and
shrunk to the canvas first, less again. Both protocols take these bytes where they take a raw array:
``"image": <bytes>``, a clip as a list of them, a named camera as ``"images": {"wrist": <bytes>}``.
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

import functools
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "CanvasBin",
    "Placement",
    "SendSize",
    "canvas_bins",
    "placement",
    "send_size",
    "resize_frame",
    "fit_to_canvas",
    "ImageEncoding",
    "ImageEncodingUnavailable",
    "encode_frame",
    "encode_clip",
    "IMAGE_FORMATS",
]

# Every Cosmos3 VAE downsamples by 16: the server snaps frame sides to multiples of it.
SIZE_MULTIPLE = 16


@dataclass(frozen=True)
class CanvasBin:
    """One canvas of a resolution tier; the server picks the one whose ``aspect_ratio`` is closest."""

    aspect_ratio: float  # height / width
    height: int
    width: int


@dataclass(frozen=True)
class Placement:
    """Where the server puts an H×W frame: the canvas, and the size of the (shrunk) frame inside it."""

    canvas_height: int
    canvas_width: int
    content_height: int
    content_width: int


@dataclass(frozen=True)
class SendSize:
    """What to send: ``height`` × ``width`` (the whole composed frame when cameras sit side by side).

    ``exact``: the server does not resize a frame of this size at all, so a frame shrunk to it on the
    robot (:func:`resize_frame`) conditions the model as the full-size frame would, within uint8
    rounding. Otherwise the content size is not a multiple of 16 (the server would snap it and discard
    rows), and this is the smallest multiple-of-16 size that the server shrinks to the same content:
    fewer bytes than the full frame, but the server still resizes it, so the pixels differ slightly.
    """

    height: int
    width: int
    exact: bool
    placement: Placement


def canvas_bins(canvases: Mapping[str, Any], tier: int) -> list[CanvasBin]:
    """The canvases of ``tier`` from the metadata frame's ``canvases`` (keys are tiers, as strings)."""
    entries = canvases.get(str(tier))
    if entries is None:
        entries = canvases.get(tier)  # type: ignore[call-overload]
    if not entries:
        raise ValueError(f"the server lists no canvases for tier {tier}; it has {sorted(canvases)}")
    return [CanvasBin(float(e["aspect_ratio"]), int(e["height"]), int(e["width"])) for e in entries]


def placement(height: int, width: int, bins: Sequence[CanvasBin], multiple: int = SIZE_MULTIPLE) -> Placement:
    """Where the server puts a ``height`` × ``width`` frame (steps 1-3 of the module docstring)."""
    # Snapped down to the multiple, and a side shorter than one multiple up to it (the server's rule).
    h, w = max(multiple, height - height % multiple), max(multiple, width - width % multiple)
    aspect = h / w
    canvas = min(bins, key=lambda b: abs(b.aspect_ratio - aspect))
    scale = min(canvas.width / w, canvas.height / h, 1.0)
    return Placement(canvas.height, canvas.width, max(1, int(scale * h + 0.5)), max(1, int(scale * w + 0.5)))


def send_size(
    height: int, width: int, bins: Sequence[CanvasBin], side_by_side: int = 1, multiple: int = SIZE_MULTIPLE
) -> SendSize:
    """The smallest size to send a ``height`` × ``width`` frame at, that the server places as the full frame.

    ``side_by_side``: the number of equal cameras the server composes left to right (view point
    ``concat_view``); ``height`` × ``width`` is then the composed frame, and the returned width divides
    by ``side_by_side`` (each camera gets ``width // side_by_side``). Per-camera resizing differs from
    resizing the composed frame in the few columns at each seam, so ``exact`` is False then.
    """
    target = placement(height, width, bins, multiple)
    content = (target.content_height, target.content_width)
    if content == (height - height % multiple, width - width % multiple):
        return SendSize(height, width, side_by_side == 1, target)  # the server does not shrink it: keep it
    if (
        all(side % multiple == 0 for side in content)
        and content[1] % side_by_side == 0
        and placement(*content, bins, multiple) == target
    ):
        return SendSize(*content, side_by_side == 1, target)
    # The content is not a multiple of 16: the smallest multiple-of-16 frame the server shrinks to it.
    best: tuple[int, int] | None = None
    for h in range(multiple, height - height % multiple + 1, multiple):
        for w in range(multiple, width - width % multiple + 1, multiple):
            if w % side_by_side or (best is not None and h * w >= best[0] * best[1]):
                continue
            if placement(h, w, bins, multiple) == target:
                best = (h, w)
    if best is None:  # nothing smaller lands the same way: send the frame as it is
        return SendSize(height, width, False, target)
    return SendSize(*best, False, target)


def fit_to_canvas(frame: np.ndarray, bins: Sequence[CanvasBin]) -> np.ndarray:
    """``frame`` (H×W×3 uint8) at :func:`send_size`: what the server would condition on, pixels it keeps only."""
    size = send_size(frame.shape[0], frame.shape[1], bins)
    return resize_frame(frame, size.height, size.width)


# -- the server's resize, in numpy -----------------------------------------------------------------------


def resize_frame(frame: np.ndarray, height: int, width: int, multiple: int = SIZE_MULTIPLE) -> np.ndarray:
    """H×W×3 uint8 -> ``height`` × ``width`` × 3 uint8, as the server shrinks frames (never enlarges).

    The same two steps as the server: the nearest-neighbour snap of each side down to a multiple of
    ``multiple`` (when the frame is not already one), then torch's antialiased bicubic resize
    (``F.interpolate(..., mode="bicubic", antialias=True)``, which is Pillow's filter), computed in
    float and rounded once at the end.
    """
    if frame.dtype != np.uint8 or frame.ndim != 3:
        raise ValueError(f"expected an H×W×C uint8 frame, got {frame.dtype} {frame.shape}")
    if height > frame.shape[0] or width > frame.shape[1]:
        raise ValueError(f"resize_frame only shrinks: {frame.shape[0]}×{frame.shape[1]} -> {height}×{width}")
    if (height, width) == frame.shape[:2]:
        return frame
    snapped = (frame.shape[0] - frame.shape[0] % multiple, frame.shape[1] - frame.shape[1] % multiple)
    if snapped != frame.shape[:2]:
        frame = frame[_nearest_indices(frame.shape[0], snapped[0])][:, _nearest_indices(frame.shape[1], snapped[1])]
    if (height, width) == frame.shape[:2]:
        return frame
    x = _shrink_rows(frame.astype(np.float32), height)
    # Columns: the same on the transposed frame, where gathering whole rows is the fast access.
    x = _shrink_rows(np.ascontiguousarray(x.swapaxes(0, 1)), width).swapaxes(0, 1)
    shrunk: np.ndarray = np.clip(np.rint(x), 0, 255).astype(np.uint8)
    return shrunk


def _nearest_indices(size_in: int, size_out: int) -> np.ndarray:
    # torch's "nearest" (not "nearest-exact"): floor(i * in / out), the scale in float32 as torch has it.
    scale = np.float32(size_in / size_out)
    indices: np.ndarray = np.minimum(
        np.floor(np.arange(size_out, dtype=np.float32) * scale).astype(np.int64), size_in - 1
    )
    return indices


def _shrink_rows(x: np.ndarray, size_out: int) -> np.ndarray:
    """Resize float32 ``x`` along its first axis: a weighted sum of a few gathered row sets (each output
    row reads only the rows under its kernel, 7-9 at a 2x shrink), never a dense matrix."""
    if x.shape[0] == size_out:
        return x
    indices, weights = _bicubic_taps(x.shape[0], size_out)
    weights = weights.reshape(weights.shape + (1,) * (x.ndim - 1))
    out: np.ndarray = np.multiply(x[indices[:, 0]], weights[:, 0])
    scratch = np.empty_like(out)
    for tap in range(1, indices.shape[1]):
        out += np.multiply(x[indices[:, tap]], weights[:, tap], out=scratch)
    return out


@functools.lru_cache(maxsize=64)
def _bicubic_taps(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Input indices and weights (``size_out`` × taps) of the antialiased bicubic resize (a = -0.5).

    The kernel is stretched by the scale when shrinking, so each output averages every input it covers
    (that is the antialiasing); taps past the edge get zero weight and each row is normalised, as torch
    and Pillow do.
    """
    scale = size_in / size_out
    support = 2.0 * scale if scale >= 1.0 else 2.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    centers = scale * (np.arange(size_out) + 0.5)
    starts = np.maximum((centers - support + 0.5).astype(np.int64), 0)
    stops = np.minimum((centers + support + 0.5).astype(np.int64), size_in)
    count = int((stops - starts).max())
    indices = starts[:, None] + np.arange(count)[None, :]
    distance = (indices - centers[:, None] + 0.5) * inv
    weights = _cubic(distance) * (indices < stops[:, None])
    weights /= weights.sum(axis=1, keepdims=True)
    return np.minimum(indices, size_in - 1), weights.astype(np.float32)


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


# -- encoding --------------------------------------------------------------------------------------


IMAGE_FORMATS = ("jpeg", "webp", "png")
_PIL_FORMATS = {"jpeg": "JPEG", "webp": "WEBP", "png": "PNG"}


class ImageEncodingUnavailable(ImportError):
    """Pillow is not installed on this machine, so frames cannot be encoded here (raw frames still work)."""


@dataclass(frozen=True)
class ImageEncoding:
    """How to put a frame on the wire: ``format`` is ``"jpeg"``, ``"webp"`` or ``"png"``.

    ``quality`` (1-100) applies to JPEG and WebP; PNG is lossless and ignores it. ``size`` (height,
    width), when set, shrinks every frame to it first (usually :func:`send_size`
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
