"""A request's inputs made ready for the device: its uint8 camera frames in the VAE's input canvas
(diffusers' Cosmos3 conditioning preprocessing, made cheap), and the prepared request the model runs.

``Cosmos3OmniPipeline._prepare_action_video_conditioning`` takes float frames in [0, 1]: its video
processor converts them to a tensor, snaps the size down to a multiple of 16 (nearest), maps them to
[-1, 1], then the pipeline picks the tier's aspect-ratio bin, shrinks the frames to fit it (bicubic,
antialiased) and pads the rest of the canvas (reflect, or replicate when the pad is wider than the
content). Fed a 480×640 camera frame, that path spent 10-16 ms on a CPU core, most of it converting
and normalising every full-size pixel in float64/float32 numpy before anything was shrunk.

This module does the same operations in the order that touches the fewest bytes:

- the uint8 frames go to the device as they are (a pinned host buffer and a non-blocking copy on CUDA:
  a quarter of the bytes of float32, and the copy overlaps the host's next work);
- the nearest snap and the frame-count padding index uint8 pixels;
- the frames become float32 on the device, and are resized there (bicubic, antialiased, as diffusers);
- the [0, 255] -> [-1, 1] mapping is applied to the *resized* frames (resizing is linear with weights
  summing to one, so the order does not change the result beyond float rounding);
- the canvas padding, as diffusers.

The resize stays in float on purpose: torch's uint8 antialiased kernel rounds and clamps between its two
passes and differs from the float result by up to 5-25 levels on edges.

What preprocessing produces is the prepared request (:class:`PreparedActions`: validated, defaults
applied, its :class:`ConditioningFrames` in the canvas). It is the host's half of
:meth:`~cosmos3_runtime.engine.Cosmos3Engine.predict_actions_batch` (``prepare_actions``, no model
weight touched), made ahead of the request's turn while the current batch's forwards run;
``predict_prepared`` is the model's half. On CUDA the frames are copied and resized on a side stream, and
:attr:`ConditioningFrames.ready` is the event the model's stream waits for before it reads them.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .description import canvas_bins
from .errors import RuntimeErrorBase
from .profiles import PolicyProfile
from .requests import ActionRequest
from .validation import DenoiseJob

# The video processor snaps sizes down to a multiple of the VAE's spatial factor (16 for every Cosmos3 VAE);
# the sampler passes its pipeline's own value.
DEFAULT_SIZE_MULTIPLE = 16


def snapped_side(side: int, size_multiple: int = DEFAULT_SIZE_MULTIPLE) -> int:
    """A frame side after the video processor's snap: down to a multiple of ``size_multiple``.

    diffusers snaps a side shorter than the multiple to zero and then fails; such a side is snapped up to
    one multiple instead (nearest-neighbour, like the snap itself), so a small frame (SGLang's clients
    send 8x8 test images) is served as the 16-pixel frame it becomes, not refused by an exception.
    """
    return max(size_multiple, side - side % size_multiple)


@dataclass(frozen=True)
class Canvas:
    """Where a frame lands: the canvas of the tier's bin, and the resized content in its top-left corner."""

    height: int
    width: int
    content_height: int
    content_width: int


def canvas_for(frame_height: int, frame_width: int, tier: int, size_multiple: int = DEFAULT_SIZE_MULTIPLE) -> Canvas:
    """The canvas and content size diffusers' pipeline gives a ``frame_height`` x ``frame_width`` frame."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _ACTION_RESOLUTION_BINS
    from diffusers.video_processor import VideoProcessor

    bins = _ACTION_RESOLUTION_BINS.get(str(tier))
    if bins is None:
        raise ValueError(
            f"unsupported resolution tier {tier!r}; expected one of {sorted(map(int, _ACTION_RESOLUTION_BINS))}"
        )
    h, w = snapped_side(frame_height, size_multiple), snapped_side(frame_width, size_multiple)
    target_h, target_w = VideoProcessor.classify_height_width_bin(h, w, ratios=bins)
    scale = min(target_w / w, target_h / h, 1.0)
    return Canvas(target_h, target_w, max(1, int(scale * h + 0.5)), max(1, int(scale * w + 0.5)))


def canvas_table() -> dict[str, list[dict[str, float | int]]]:
    """Every tier's canvases, JSON-able, as a robot needs them to size its frames before sending.

    ``{"256": [{"aspect_ratio": 0.8, "height": 256, "width": 320}, ...], ...}``: the bins
    :func:`canvas_for` chooses among (closest ``aspect_ratio``, height / width). ``robot_clients.camera_frames``
    reads this from the metadata frame and places a frame exactly as :func:`canvas_for` does.
    """
    return {str(tier): [asdict(b) for b in bins] for tier, bins in canvas_bins().items()}


# What :func:`prepare_frames` returns: vision, image_size, canvas height and width.
PreparedFrames = tuple[torch.Tensor, torch.Tensor, int, int]


def prepare_frames(
    frames: np.ndarray, tier: int, num_frames: int, device: torch.device, size_multiple: int = DEFAULT_SIZE_MULTIPLE
) -> PreparedFrames:
    """uint8 ``(T, H, W, 3)`` frames -> ``(vision, image_size, canvas_h, canvas_w)`` as diffusers returns them.

    ``vision`` is ``(1, 3, num_frames, canvas_h, canvas_w)`` float32 in [-1, 1] on ``device`` (the clip
    padded with its last frame, or cut, to ``num_frames``); ``image_size`` is ``[canvas_h, canvas_w,
    content_h, content_w]`` as float32 on ``device``.
    """
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"expected uint8 frames of shape (T, H, W, 3), got {frames.dtype} {frames.shape}")
    with warnings.catch_warnings():
        # Frames decoded from the wire are read-only numpy arrays; nothing below writes into this view
        # (every step makes a new tensor), so torch's warning about non-writable arrays does not apply.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        pixels = torch.from_numpy(np.ascontiguousarray(frames))  # (T, H, W, 3), no copy
    if pixels.shape[0] < num_frames:  # the clip is padded with its last frame, as diffusers does
        pixels = torch.cat([pixels, pixels[-1:].expand(num_frames - pixels.shape[0], -1, -1, -1)])
    else:
        pixels = pixels[:num_frames]
    if device.type == "cuda":
        pixels = pixels.pin_memory().to(device, non_blocking=True)
    else:
        pixels = pixels.to(device)
    height, width = pixels.shape[1:3]
    snapped = (snapped_side(height, size_multiple), snapped_side(width, size_multiple))
    if snapped != (height, width):
        # The video processor's default resize: nearest, to a multiple of 16 (exact on uint8 too).
        pixels = F.interpolate(pixels.permute(0, 3, 1, 2), size=snapped, mode="nearest").permute(0, 2, 3, 1)
    canvas = canvas_for(height, width, tier, size_multiple)

    content = (canvas.content_height, canvas.content_width)
    if content == snapped:
        resized = pixels.permute(0, 3, 1, 2)  # converted to float by the copy into the canvas below
    elif device.type == "cpu":
        resized = _banded_resize(pixels, content)
    else:
        resized = F.interpolate(
            pixels.permute(0, 3, 1, 2).float(), size=content, mode="bicubic", align_corners=False, antialias=True
        )
    # One pass writes the content into the canvas (layout change and float conversion included), one
    # maps it to [-1, 1], and the padding is filled from it: diffusers' reflect (replicate when the pad
    # is wider than the content), done as slice copies, which cost a third of F.pad's generic kernel.
    x = torch.empty((num_frames, 3, canvas.height, canvas.width), dtype=torch.float32, device=device)
    h, w = content
    body = x[..., :h, :w]
    body.copy_(resized)
    body.mul_(2.0 / 255.0).sub_(1.0)
    pad_right, pad_bottom = canvas.width - w, canvas.height - h
    if pad_right >= w or pad_bottom >= h:
        x[..., :h, w:] = x[..., :h, w - 1 : w]
        x[..., h:, :] = x[..., h - 1 : h, :]
    else:
        if pad_right:
            x[..., :h, w:] = x[..., :h, w - 1 - pad_right : w - 1].flip(-1)
        if pad_bottom:
            x[..., h:, :] = x[..., h - 1 - pad_bottom : h - 1, :].flip(-2)
    vision = x.permute(1, 0, 2, 3).unsqueeze(0)  # (1, 3, T, H, W)
    image_size = torch.tensor([canvas.height, canvas.width, *content], dtype=torch.float32, device=device)
    return vision, image_size, canvas.height, canvas.width


def _banded_resize(pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 ``(T, H, W, 3)`` -> float ``(T, 3, h, w)`` (a view): torch's bicubic antialiased resize, as two
    sparse products.

    The antialiased resize is separable and linear: ``Wh @ frame @ Ww.T``, each matrix banded (about 8
    taps per output at a 2x shrink). torch's CPU kernel for it is scalar code (3-4 ms for one 480x640
    frame on this machine); the same weights as sparse matrices, applied first down the rows of the
    frame as it is laid out (H-major), then across its columns, cost about a third of that. The weights
    are torch's own (the resize of an identity), so the result equals ``F.interpolate`` up to float
    rounding.
    """
    t, height, width, _ = pixels.shape
    rows, cols = _resize_matrix(height, size[0]), _resize_matrix(width, size[1])
    x = pixels.float().permute(1, 0, 2, 3).reshape(height, t * width * 3)  # free for one frame
    x = torch.sparse.mm(rows, x).view(size[0], t, width, 3)  # (h, T, W, 3)
    x = x.permute(2, 1, 0, 3).reshape(width, t * size[0] * 3)  # W-major
    x = torch.sparse.mm(cols, x).view(size[1], t, size[0], 3)  # (w, T, h, 3)
    view: torch.Tensor = x.permute(1, 3, 2, 0)  # (T, 3, h, w), a view
    return view


@functools.lru_cache(maxsize=64)
def _resize_matrix(size_in: int, size_out: int) -> torch.Tensor:
    """torch's bicubic antialiased 1-D resize from ``size_in`` to ``size_out`` samples, as a sparse matrix."""
    identity = torch.eye(size_in, dtype=torch.float32).view(1, 1, size_in, size_in)
    dense = F.interpolate(identity, size=(size_out, size_in), mode="bicubic", align_corners=False, antialias=True)
    return dense[0, 0].to_sparse().coalesce()


# -- the prepared request ----------------------------------------------------------------------------


@dataclass
class ConditioningFrames:
    """A job's conditioning frames in the VAE's canvas, in [-1, 1], on the engine's device."""

    vision: torch.Tensor  # (1, 3, T, canvas_h, canvas_w) float32
    image_size: torch.Tensor  # [canvas_h, canvas_w, content_h, content_w]
    canvas_h: int
    canvas_w: int
    preprocess_s: float  # host seconds the preprocessing took
    ready: torch.cuda.Event | None = None  # recorded after the side stream's work; None on CPU

    def await_on(self, device: torch.device) -> None:
        """Make ``device``'s current stream wait for frames made on the side stream (nothing on CPU)."""
        if self.ready is None:
            return
        stream = torch.cuda.current_stream(device)
        stream.wait_event(self.ready)
        # The caching allocator must not give this memory back to the side stream while this one reads it.
        self.vision.record_stream(stream)
        self.image_size.record_stream(stream)


def condition_frames(
    preprocess: Callable[[np.ndarray, int, int], PreparedFrames],
    job: DenoiseJob,
    clock: Callable[[], float],
    stream: torch.cuda.Stream | None = None,
) -> ConditioningFrames:
    """``job``'s conditioning frames through ``preprocess(frames, tier, num_frames)``: the whole clip for
    ``inverse_dynamics``, else frame 0 alone (the VAE is causal: its first latent is frame 0's encoding).

    With a CUDA ``stream`` the copy and resize run on it and ``ready`` is recorded after them, so this
    work does not queue behind the forwards on the default stream.
    """
    frames, num_frames = (job.frames, job.horizon + 1) if job.mode == "inverse_dynamics" else (job.frames[:1], 1)
    t0 = clock()
    if stream is None:
        vision, image_size, canvas_h, canvas_w = preprocess(frames, job.settings.resolution_tier, num_frames)
        return ConditioningFrames(vision, image_size, canvas_h, canvas_w, clock() - t0)
    with torch.cuda.stream(stream):
        vision, image_size, canvas_h, canvas_w = preprocess(frames, job.settings.resolution_tier, num_frames)
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves its constructor unannotated
        ready.record(stream)
    return ConditioningFrames(vision, image_size, canvas_h, canvas_w, clock() - t0, ready)


@dataclass
class PreparedActions:
    """One action request after :meth:`~cosmos3_runtime.engine.Cosmos3Engine.prepare_actions`.

    Either ``job``, ``profile`` and ``frames`` are set, or ``error`` is: the typed error the request
    failed validation or preprocessing with, answered by ``predict_prepared`` in its place.
    """

    request: ActionRequest
    validate_s: float
    job: DenoiseJob | None = None
    profile: PolicyProfile | None = None
    frames: ConditioningFrames | None = None
    error: RuntimeErrorBase | None = None
