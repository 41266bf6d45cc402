"""Resizing on the robot (robot_clients.camera_frames) against what the server does to a frame
(cosmos3_runtime.frame_preprocessing, the tiny engine's own preprocessing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosmos3_runtime.frame_preprocessing import canvas_for, canvas_table
from robot_clients.camera_frames import (
    CanvasBin,
    canvas_bins,
    fit_to_canvas,
    placement,
    resize_frame,
    send_size,
)

TIERS = (256, 480, 704, 720)
ONE_LEVEL = 2 / 255  # one uint8 level, in the model's [-1, 1] pixel range


def scene(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Edges, gradients and noise: where resize filters differ, if they differ."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    frame = np.stack(
        [(x * 255 // max(1, width - 1)), (y * 255 // max(1, height - 1)), ((x // 16 + y // 16) % 2) * 255], axis=-1
    ).astype(np.int16)
    return np.clip(frame + rng.integers(-40, 41, frame.shape), 0, 255).astype(np.uint8)


def test_the_metadata_canvases_place_frames_exactly_as_the_server_does():
    table = canvas_table()
    assert sorted(map(int, table)) == sorted(TIERS)
    for tier in TIERS:
        bins = canvas_bins(table, tier)
        # Small sides too: below 16 pixels both snap up to one multiple.
        for height in [*range(8, 32, 5), *range(32, 1300, 53)]:
            for width in [*range(8, 32, 7), *range(32, 2000, 61)]:
                server = canvas_for(height, width, tier)
                robot = placement(height, width, bins)
                assert (robot.canvas_height, robot.canvas_width, robot.content_height, robot.content_width) == (
                    server.height,
                    server.width,
                    server.content_height,
                    server.content_width,
                ), (tier, height, width)


def test_canvas_bins_names_the_tiers_it_has():
    with pytest.raises(ValueError, match="no canvases for tier 333"):
        canvas_bins(canvas_table(), 333)


@pytest.mark.parametrize(
    "size_in,size_out",
    [
        ((480, 640), (240, 320)),
        ((480, 640), (144, 192)),
        ((720, 1280), (288, 512)),
        ((500, 650), (240, 320)),
        ((473, 611), (230, 301)),
    ],
)
def test_resize_frame_is_torchs_antialiased_bicubic(size_in, size_out):
    frame = scene(*size_in)
    ours = resize_frame(frame, *size_out)
    pixels = torch.from_numpy(frame).permute(2, 0, 1)[None]
    snapped = (size_in[0] - size_in[0] % 16, size_in[1] - size_in[1] % 16)
    if snapped != size_in:
        pixels = F.interpolate(pixels, size=snapped, mode="nearest")
    reference = F.interpolate(pixels.float(), size=size_out, mode="bicubic", align_corners=False, antialias=True)
    reference = reference[0].permute(1, 2, 0).clamp(0, 255).numpy()
    assert ours.shape == (*size_out, 3) and ours.dtype == np.uint8
    assert np.abs(ours - reference).max() <= 0.5 + 1e-2  # rounded once, at the end (float32 weights)


def test_resize_frame_only_shrinks():
    with pytest.raises(ValueError, match="only shrinks"):
        resize_frame(scene(64, 64), 128, 64)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(
    "size", [(480, 640), (720, 1280), (1080, 1920), (224, 224), (400, 400), (600, 800), (480, 1280), (333, 517)]
)
def test_send_size_lands_on_the_same_canvas_with_no_more_pixels(tier, size):
    bins = canvas_bins(canvas_table(), tier)
    target = placement(*size, bins)
    sent = send_size(*size, bins)
    assert sent.placement == target
    assert placement(sent.height, sent.width, bins) == target  # the server places it as the full frame
    assert sent.height <= size[0] and sent.width <= size[1]
    if sent.exact:
        # The server will not resize it: it is the content itself (or the frame, untouched).
        assert (sent.height, sent.width) in ((target.content_height, target.content_width), size)
    else:
        assert sent.height % 16 == 0 and sent.width % 16 == 0


def test_send_size_examples():
    bins = canvas_bins(canvas_table(), 256)
    assert (s := send_size(480, 640, bins)).exact and (s.height, s.width) == (240, 320)  # a quarter of the pixels
    assert (s := send_size(224, 224, bins)).exact and (s.height, s.width) == (224, 224)  # never enlarged
    two_cameras = send_size(480, 1280, bins, side_by_side=2)  # content 120×320: not a multiple of 16
    assert not two_cameras.exact and (two_cameras.height, two_cameras.width) == (144, 384)
    assert two_cameras.width % 2 == 0
    assert send_size(480, 640, canvas_bins(canvas_table(), 480)).exact  # tier 480 keeps 480×640 as it is


def test_placement_snaps_sides_below_sixteen_up_as_the_server_does():
    assert placement(8, 64, [CanvasBin(1.0, 256, 256)]) == placement(16, 64, [CanvasBin(1.0, 256, 256)])


@pytest.mark.parametrize(
    "tier,size", [(256, (480, 640)), (256, (400, 400)), (256, (720, 1280)), (480, (720, 1280)), (256, (500, 650))]
)
def test_a_frame_resized_on_the_robot_conditions_the_model_as_the_full_frame(tiny_engine, tier, size):
    """The tiny engine's own preprocessing (the pixels the VAE encodes) of the full frame and of the frame
    at send_size: the same canvas, and where the size is exact, the same pixels within one uint8 level.

    One exception, which no uint8 frame can avoid: at hard edges the server's float bicubic resize of the
    full frame overshoots [0, 255] (ringing), and the frame resized on the robot is clamped to uint8. The
    scene here is made of such edges (a noisy checkerboard); those pixels are compared clamped."""
    engine = tiny_engine("distilled")
    frame = scene(*size, seed=1)
    sent = send_size(*size, canvas_bins(canvas_table(), tier))
    small = resize_frame(frame, sent.height, sent.width)
    full, full_size, *full_canvas = engine.sampler.preprocess(frame[None], tier, 1)
    robot, robot_size, *robot_canvas = engine.sampler.preprocess(small[None], tier, 1)
    assert full_canvas == robot_canvas and torch.equal(full_size, robot_size)
    assert small.nbytes < frame.nbytes or (sent.height, sent.width) == size
    difference = (full.clamp(-1, 1) - robot).abs()
    overshoot = (full < -1) | (full > 1)
    if sent.exact:
        assert difference.max().item() <= ONE_LEVEL, f"{difference.max().item() / ONE_LEVEL:.2f} levels"
        assert ((full - robot).abs() > ONE_LEVEL).le(overshoot).all()  # larger only where the server overshoots
    else:  # the server still resizes (from far fewer pixels): close, not equal
        assert difference.mean().item() <= 4 * ONE_LEVEL, f"mean {difference.mean().item() / ONE_LEVEL:.2f} levels"


def test_fit_to_canvas_is_resize_to_send_size():
    bins = canvas_bins(canvas_table(), 256)
    frame = scene(480, 640)
    np.testing.assert_array_equal(fit_to_canvas(frame, bins), resize_frame(frame, 240, 320))
