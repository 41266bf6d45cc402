"""Encoded camera frames: the robot's encoder (robot_clients.camera_frames) and the server's decoder
(policy_server.foundation.camera_intake), including what the decoder refuses before it decodes anything."""

from __future__ import annotations

import asyncio
import io
import struct
import sys
import threading
import tracemalloc
import zlib

import numpy as np
import pytest
from PIL import Image

from policy_server.foundation.camera_intake import (
    MAX_JPEG_SCANS,
    ImageDecodePool,
    InvalidImage,
    decode_clip,
    decode_image,
    read_header,
)
from robot_clients.camera_frames import ImageEncoding, ImageEncodingUnavailable, encode_clip, encode_frame
from robot_clients.client_frames import is_encoded_clip
from robot_clients.client_frames import is_encoded_frame as is_encoded_image
from robot_clients.protocol import ErrorCode, FrameLimits

LIMITS = FrameLimits(min_image_side=32, max_image_side=4096, max_clip_frames=65)


def scene(height: int = 480, width: int = 640, seed: int = 0) -> np.ndarray:
    """A camera-like frame: smooth shapes plus a little sensor noise (compresses like a real one)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([128 + 100 * np.sin(x / 37), 128 + 100 * np.cos(y / 23), (x + y) % 256], axis=-1)
    rgb[(x - width / 2) ** 2 + (y - height / 2) ** 2 < (height / 5) ** 2] = (20, 90, 220)
    noise = np.random.default_rng(seed).normal(0, 3, rgb.shape)
    return np.clip(rgb + noise, 0, 255).astype(np.uint8)


def pillow_bytes(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header_only(width: int, height: int) -> bytes:
    """A 30-byte PNG whose header claims ``width`` × ``height`` RGB pixels, with almost no pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + png_chunk(b"IEND", b"")
    )


def with_jpeg_size(data: bytes, height: int, width: int) -> bytes:
    """A real JPEG whose start-of-frame header is rewritten to claim ``height`` × ``width``."""
    sof = data.index(b"\xff\xc0")
    return data[: sof + 5] + struct.pack(">HH", height, width) + data[sof + 9 :]


# -- the robot's encoder -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jpeg", "webp", "png"])
def test_encoded_frames_decode_to_the_frame_sent(fmt):
    frame = scene()
    data = encode_frame(frame, ImageEncoding(fmt, quality=90))
    assert len(data) < frame.nbytes / 2 if fmt != "png" else len(data) < frame.nbytes
    decoded = decode_image(data, "image", LIMITS)
    assert decoded.shape == frame.shape and decoded.dtype == np.uint8 and decoded.flags.c_contiguous
    error = np.abs(decoded.astype(np.int16) - frame).mean()
    assert error == 0 if fmt == "png" else error < 4, f"{fmt}: mean abs error {error:.2f} levels"
    assert read_header(data, "image", LIMITS).format == fmt


def test_quality_trades_bytes_for_fidelity():
    frame = scene()
    low, high = (encode_frame(frame, ImageEncoding("jpeg", quality=q)) for q in (50, 95))
    assert len(low) < len(high)
    errors = [np.abs(decode_image(d, "image", LIMITS).astype(np.int16) - frame).mean() for d in (low, high)]
    assert errors[1] < errors[0]


def test_encoding_with_a_size_shrinks_the_frame_first():
    frame = scene()
    data = encode_frame(frame, ImageEncoding("png", size=(240, 320)))
    from robot_clients.camera_frames import resize_frame

    np.testing.assert_array_equal(decode_image(data, "image", LIMITS), resize_frame(frame, 240, 320))


def test_a_clip_is_a_list_of_encoded_frames():
    clip = np.stack([scene(seed=s) for s in range(3)])
    frames = encode_clip(clip, ImageEncoding("png"))
    assert is_encoded_clip(frames) and not is_encoded_clip([]) and is_encoded_image(frames[0])
    np.testing.assert_array_equal(decode_clip(frames, "video", LIMITS), clip)


def test_bad_encoding_settings_are_refused():
    for bad in (dict(format="gif"), dict(quality=0), dict(quality=101), dict(quality=True), dict(size=(0, 5))):
        with pytest.raises(ValueError):
            ImageEncoding(**bad)
    with pytest.raises(ValueError, match="H×W×3 uint8"):
        encode_frame(np.zeros((8, 8, 3), np.float32), ImageEncoding())


def test_without_pillow_the_robot_is_told_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)  # as on a robot installed without the `images` extra
    with pytest.raises(ImageEncodingUnavailable, match=r"cosmos3-policy-server\[images\]"):
        encode_frame(scene(64, 64), ImageEncoding("jpeg"))


# -- what the server refuses -------------------------------------------------------------------------------


def refused(data, field: str = "image", **limits) -> InvalidImage:
    with pytest.raises(InvalidImage) as caught:
        decode_image(data, field, FrameLimits(**{**LIMITS.__dict__, **limits}))
    assert caught.value.code == ErrorCode.INVALID_IMAGE and caught.value.field == field
    return caught.value


def test_a_header_claiming_a_huge_image_is_refused_before_any_pixel_is_allocated():
    tracemalloc.start()
    try:
        error = refused(png_header_only(8000, 6000))  # 144 MB of pixels if anyone believed it
        jpeg = with_jpeg_size(pillow_bytes(Image.fromarray(scene(64, 64)), "JPEG"), 6000, 5000)
        jpeg_error = refused(jpeg, "images/wrist")
        bomb = refused(png_header_only(100_000, 100_000))  # 30 GB: beyond even Pillow's own bomb guard
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "6000×8000" in error.message and "4096" in error.message
    assert "6000×5000" in jpeg_error.message and jpeg_error.field == "images/wrist"
    assert "beyond the limits" in bomb.message
    assert peak < 4 * 2**20, f"refusing a header allocated {peak / 2**20:.1f} MiB"


def test_sizes_outside_the_frame_limits_are_refused():
    assert "each side must be between 32" in refused(encode_frame(scene(16, 64), ImageEncoding("png"))).message
    assert (
        "between 32 and 200"
        in refused(encode_frame(scene(240, 320), ImageEncoding("jpeg")), max_image_side=200).message
    )


@pytest.mark.parametrize(
    "payload",
    [b"", b"not an image", b"\xff\xd8\xff\xe0" + b"\0" * 64, png_header_only(64, 64)[:20], png_header_only(64, 64)],
)
def test_corrupt_payloads_are_refused(payload):
    refused(payload)


def test_truncated_pixel_data_is_refused():
    data = encode_frame(scene(), ImageEncoding("jpeg"))
    assert "corrupt or truncated" in refused(data[: len(data) // 2]).message
    png = encode_frame(scene(), ImageEncoding("png"))
    refused(png[: len(png) // 2])


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF", "PPM"])
def test_formats_other_than_png_jpeg_webp_are_refused(fmt):
    error = refused(pillow_bytes(Image.fromarray(scene(64, 64)), fmt))
    assert "PNG, JPEG or WebP" in error.message


def test_animated_images_are_refused():
    frames = [Image.fromarray(scene(64, 64, seed=s)) for s in range(3)]
    for fmt in ("WEBP", "PNG"):
        data = pillow_bytes(frames[0], fmt, save_all=True, append_images=frames[1:])
        assert "animated" in refused(data).message


def test_a_jpeg_with_too_many_scans_is_refused():
    progressive = pillow_bytes(Image.fromarray(scene(64, 64)), "JPEG", progressive=True)
    assert 1 < progressive.count(b"\xff\xda") <= MAX_JPEG_SCANS
    decode_image(progressive, "image", LIMITS)  # an ordinary progressive JPEG is fine
    eoi = progressive.rindex(b"\xff\xd9")
    scan = b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00"  # a start of scan (one component, DC band)
    bomb = progressive[:eoi] + scan * (MAX_JPEG_SCANS + 1) + progressive[eoi:]
    assert "scans" in refused(bomb).message


def test_clips_are_checked_frame_by_frame_before_decoding():
    good = encode_frame(scene(64, 64), ImageEncoding("png"))
    other_size = encode_frame(scene(64, 96), ImageEncoding("png"))
    with pytest.raises(InvalidImage, match="same size"):
        decode_clip([good, other_size], "video", LIMITS)
    with pytest.raises(InvalidImage, match="66 frames") as caught:
        decode_clip([good] * 66, "video", LIMITS)
    assert caught.value.field == "video"
    with pytest.raises(InvalidImage) as caught:
        decode_clip([good, png_header_only(100_000, 64)], "video", LIMITS)
    assert caught.value.field == "video/1"


# -- off the event loop ---------------------------------------------------------------------------------------


async def test_the_pool_decodes_on_its_own_threads_and_the_loop_stays_free():
    frames = [encode_frame(scene(seed=s), ImageEncoding("jpeg")) for s in range(4)]
    loop_thread = threading.get_ident()
    with ImageDecodePool(workers=2) as pool:
        threads = await asyncio.gather(*(pool.run(threading.get_ident) for _ in range(4)))
        assert loop_thread not in threads
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        decoded = await asyncio.gather(*(pool.decode_image(f, "image", LIMITS) for f in frames))
        clip = await pool.decode_clip(frames, "video", LIMITS)
        ticker.cancel()
        assert ticks > len(frames)  # the loop ran other work while the frames decoded
        assert [d.shape for d in decoded] == [(480, 640, 3)] * 4 and clip.shape == (4, 480, 640, 3)
        with pytest.raises(InvalidImage):
            await pool.decode_image(b"garbage", "image", LIMITS)
