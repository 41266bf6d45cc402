"""Frame preprocessing: the runtime's reordered uint8 path against diffusers' own conditioning preprocessing.

The reference is ``Cosmos3OmniPipeline._prepare_action_video_conditioning`` on the float [0, 1] frames
it expects, exactly as the runtime called it before; the runtime's path must give the same canvas, the
same content size, and pixels within one uint8 level (1/127.5 in [-1, 1]).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosmos3_runtime.frame_preprocessing import canvas_for, prepare_frames

ONE_LEVEL = 2.0 / 255.0


def _natural_frames(t: int, h: int, w: int, seed: int) -> np.ndarray:
    """Camera-like frames: smooth gradients, hard edges (a checkerboard) and sensor noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    frames = []
    for i in range(t):
        board = (((xx + 7 * i) // 23 + yy // 17) % 2) * 180.0
        base = np.stack([xx / w * 255.0, yy / h * 255.0, board], axis=-1)
        frames.append(np.clip(base + rng.normal(0, 12, base.shape), 0, 255))
    return np.asarray(frames, dtype=np.uint8)


def _reference(pipe, frames: np.ndarray, tier: int, num_frames: int):
    return pipe._prepare_action_video_conditioning(
        frames.astype(np.float32) / 255.0, tier, num_frames, device=torch.device("cpu"), dtype=torch.float32
    )


@pytest.mark.parametrize(
    "t, h, w, tier, num_frames",
    [
        (1, 480, 640, 256, 1),  # a common camera, shrunk to the 256 tier's 4:5 bin
        (1, 480, 640, 480, 1),  # fits the 480 tier's bin: no resize, padding only
        (1, 224, 224, 256, 1),  # square, no resize
        (1, 180, 320, 480, 1),  # DROID's camera: not a multiple of 16, snapped by nearest first
        (1, 720, 1280, 256, 1),  # 16:9, shrunk 5x
        (3, 256, 256, 256, 17),  # a short clip padded with its last frame to 17
        (17, 200, 300, 256, 17),  # an inverse-dynamics clip, odd size
        (5, 96, 1000, 256, 5),  # a panorama: the pad is wider than the content (replicate)
    ],
)
def test_matches_diffusers_within_one_level(tiny_engine, t, h, w, tier, num_frames):
    pipe = tiny_engine("distilled").pipe
    frames = _natural_frames(t, h, w, seed=h * w + t)
    ref, ref_size, ref_h, ref_w = _reference(pipe, frames, tier, num_frames)
    ours, size, canvas_h, canvas_w = prepare_frames(frames, tier, num_frames, torch.device("cpu"))
    assert (canvas_h, canvas_w) == (ref_h, ref_w)
    assert ours.shape == ref.shape and ours.dtype == torch.float32
    assert torch.equal(size, ref_size)
    worst = (ours - ref).abs().max().item()
    assert worst <= ONE_LEVEL, f"differs from diffusers by {worst / ONE_LEVEL:.2f} uint8 levels"


def test_random_noise_frames_match_too(tiny_engine):
    """Noise is the worst case for a resize (every pixel an edge); bicubic overshoot is kept, not clamped."""
    pipe = tiny_engine("distilled").pipe
    frames = np.random.default_rng(7).integers(0, 256, (2, 480, 640, 3), dtype=np.uint8)
    ref, *_ = _reference(pipe, frames, 256, 2)
    ours, *_ = prepare_frames(frames, 256, 2, torch.device("cpu"))
    assert (ours - ref).abs().max().item() <= ONE_LEVEL


def test_canvas_follows_the_tier_bins():
    assert canvas_for(480, 640, 256) == canvas_for(480, 640, 256)
    c = canvas_for(480, 640, 256)
    assert (c.height, c.width, c.content_height, c.content_width) == (256, 320, 240, 320)
    c = canvas_for(180, 320, 480)  # snapped to 176 x 320 first, as the video processor does
    assert (c.height, c.width) == (480, 832) and (c.content_height, c.content_width) == (176, 320)
    with pytest.raises(ValueError, match="tier"):
        canvas_for(480, 640, 300)


def test_refuses_what_is_not_uint8_rgb():
    with pytest.raises(ValueError, match="uint8"):
        prepare_frames(np.zeros((1, 64, 64, 3), np.float32), 256, 1, torch.device("cpu"))
    with pytest.raises(ValueError, match="uint8"):
        prepare_frames(np.zeros((64, 64, 3), np.uint8), 256, 1, torch.device("cpu"))


def test_sides_below_sixteen_pixels_snap_up_where_diffusers_would_fail(tiny_engine):
    """diffusers snaps an 8-pixel side to 0 and raises; it is served as the 16-pixel frame it becomes."""
    pipe = tiny_engine("distilled").pipe
    small = _natural_frames(1, 8, 12, seed=3)
    with pytest.raises(Exception):  # noqa: B017 - whatever diffusers raises; it is not ours to name
        _reference(pipe, small, 256, 1)
    upscaled = small[:, np.arange(16) * 8 // 16][:, :, np.arange(16) * 12 // 16]  # torch's "nearest"
    ours, size, *_ = prepare_frames(small, 256, 1, torch.device("cpu"))
    ref, ref_size, *_ = _reference(pipe, upscaled, 256, 1)
    assert torch.equal(size, ref_size)
    assert (ours - ref).abs().max().item() <= ONE_LEVEL
    c = canvas_for(8, 12, 256)
    assert (c.content_height, c.content_width) == (16, 16)


def test_an_eight_pixel_image_gets_a_chunk(tiny_engine):
    from cosmos3_runtime.requests import ActionRequest

    engine = tiny_engine("distilled")
    domain = next(iter(engine.describe().domains))
    chunk = engine.predict_actions(ActionRequest(image=_natural_frames(1, 8, 8, seed=5)[0], domain_name=domain))
    assert np.isfinite(chunk.actions).all()
    assert engine.describe().limits.min_image_side == 8
