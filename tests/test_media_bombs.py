"""Encoded camera frames that are small on the wire and huge once decoded, on every protocol of a real
server process: refused from their headers, before a pixel is decoded, by the one media check.

The attack run: a native ``video`` of 17 JPEGs at 4096×4096 (about 1 MB each) raised the server's memory
by 7.4 GiB, because the sessions' frame limits carried no decoding budget; the frame count and the
composed cameras' size were checked only after decoding. Here each protocol gets the same bombs (on a
server that accepts sides up to the model's 4096, so that the budget is what refuses them, and on a
default server, whose side cap refuses them first): each is answered with a typed error, the peak
resident set stays within 200 MiB of idle, and the same connection is served right after.
"""

from __future__ import annotations

import asyncio
import base64
import io
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import psutil
import pytest
from PIL import Image
from server_fixtures import DOMAIN, ServerProcess, tiny_checkpoint
from test_sidecar_memory_attacks import MIB, PEAK_LIMIT, PeakRss
from websockets.asyncio.client import connect

from policy_server.foundation.camera_intake import DecodedTooLarge, InvalidImage, check_media, decode_image
from policy_server.sessions.openpi import openpi_arrays
from robot_clients.protocol import FrameLimits
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(300)

OPENPI_DOMAIN = "droid_lerobot"
BOMB_FRAMES = 17


def _jpeg(side: int, seed: int = 0) -> bytes:
    """A ``side``² JPEG of smooth content: about 100 KB on the wire, side² × 3 bytes once decoded."""
    small = np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(small).resize((side, side), Image.BILINEAR).save(buffer, "JPEG", quality=70)
    return buffer.getvalue()


def _flat_png(side: int) -> bytes:
    """A ``side``² PNG of one colour: 58 KB for 4096², which no decoder can decode at a smaller size."""
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (10, 20, 30)).save(buffer, "PNG")
    return buffer.getvalue()


JPEG_BOMB = _jpeg(4096)
PNG_BOMB = _flat_png(4096)
HORIZON = BOMB_FRAMES - 1  # so that the bomb clip's length is the right one: only its size is wrong


def _start(*flags: str) -> ServerProcess:
    process = ServerProcess(
        "--model",
        str(tiny_checkpoint("distilled")),
        "--no-warmup",
        "--openpi-domain",
        OPENPI_DOMAIN,
        "--openpi-horizon",
        "8",
        "--openpi-view-point",
        "concat_view",
        *flags,
    ).start()
    process.wait_for_log("ready: serving", 120)
    return process


def _stop(process: ServerProcess) -> None:
    process.stop()


@pytest.fixture(scope="module")
def wide():
    """Sides up to the model's own limit (4096): the decoding budget is what must refuse the bombs."""
    process = _start("--max-image-side", "4096")
    yield process
    _stop(process)


@pytest.fixture(scope="module")
def default():
    process = _start()
    yield process
    _stop(process)


async def _recv(ws, timeout: float = 60.0):
    return await asyncio.wait_for(ws.recv(), timeout)


async def _native(process: ServerProcess, **settings):
    ws = await connect(f"ws://127.0.0.1:{process.port}/v1/actions/realtime", max_size=None, proxy=None)
    unpackb(await _recv(ws))
    await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": HORIZON, "seed": 1, **settings}))
    assert unpackb(await _recv(ws))["type"] == "session"
    return ws


async def _attack(process: ServerProcess, attack) -> tuple[object, int]:
    """Run ``attack()`` (it returns the server's answer); the answer and the peak RSS growth over idle."""
    rss = psutil.Process(process.proc.pid)
    idle = rss.memory_info().rss
    with PeakRss(process.proc.pid) as peak:
        answer = await attack()
    return answer, peak.peak - idle


def _small_clip() -> list[bytes]:
    return [_jpeg(64, seed=i) for i in range(BOMB_FRAMES)]


async def _native_clip_bomb(process: ServerProcess, bomb: bytes) -> tuple[dict, dict]:
    ws = await _native(process, action_mode="inverse_dynamics")
    async with ws:
        await ws.send(packb({"type": "observation", "seq": 0, "video": [bomb] * BOMB_FRAMES}))
        error = unpackb(await _recv(ws))
        await ws.send(packb({"type": "observation", "seq": 1, "video": _small_clip()}))
        return error, unpackb(await _recv(ws))


async def _native_cameras_bomb(process: ServerProcess, bomb: bytes) -> tuple[dict, dict]:
    """Four 4096² cameras side by side (concat_view): one 4096×16384 frame, 192 MiB, once composed."""
    ws = await _native(process, view_point="concat_view")
    async with ws:
        images = {f"cam{i}": bomb for i in range(4)}
        await ws.send(packb({"type": "observation", "seq": 0, "images": images}))
        error = unpackb(await _recv(ws))
        await ws.send(packb({"type": "observation", "seq": 1, "images": {"cam0": _jpeg(64)}}))
        return error, unpackb(await _recv(ws))


async def _openpi_bomb(process: ServerProcess, bomb: bytes) -> tuple[str, dict]:
    ws = await connect(f"ws://127.0.0.1:{process.port}/", max_size=None, proxy=None)
    async with ws:
        await _recv(ws)
        cameras = ("observation/exterior_image_1_left", "observation/wrist_image_left")
        await ws.send(packb(openpi_arrays({**dict.fromkeys(cameras, bomb), "prompt": "pick"})))
        error = await _recv(ws)
        good = {**dict.fromkeys(cameras, _jpeg(64)), "prompt": "pick"}
        await ws.send(packb(openpi_arrays(good)))
        return error, unpackb(await _recv(ws))


def _sglang_envelope(frames: list[bytes]) -> dict:
    return {
        "input": {"task": "pick", "observation": {"video": [base64.b64encode(f).decode() for f in frames]}},
        "parameters": {"action_mode": "inverse_dynamics", "domain_name": OPENPI_DOMAIN, "action_horizon": HORIZON},
    }


async def _sglang_bomb(process: ServerProcess, bomb: bytes) -> tuple[dict, dict]:
    ws = await connect(f"ws://127.0.0.1:{process.port}/v1/actions/realtime", max_size=None, proxy=None)
    async with ws:
        await _recv(ws)
        await ws.send(packb(_sglang_envelope([bomb] * BOMB_FRAMES)))
        error = unpackb(await _recv(ws))
        await ws.send(packb(_sglang_envelope(_small_clip())))
        return error, unpackb(await _recv(ws))


def _http_bomb(process: ServerProcess, bomb: bytes) -> tuple[dict, dict]:
    import httpx

    with httpx.Client(base_url=f"http://127.0.0.1:{process.http_port}", trust_env=False, timeout=60) as client:
        deadline = time.monotonic() + 60
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        body = {"domain_name": DOMAIN, "action_horizon": HORIZON, "action_mode": "inverse_dynamics"}
        encoded = [base64.b64encode(bomb).decode()] * BOMB_FRAMES
        refused = client.post("/v1/actions/generations", json={**body, "video": encoded})
        clip = [base64.b64encode(frame).decode() for frame in _small_clip()]
        served = client.post("/v1/actions/generations", json={**body, "video": clip})
        return {"status": refused.status_code, **refused.json()}, {"status": served.status_code}


def _attacks(process: ServerProcess, bomb: bytes) -> dict[str, Callable[[], Awaitable[tuple[Any, Any]]]]:
    return {
        "native video": lambda: _native_clip_bomb(process, bomb),
        "native images": lambda: _native_cameras_bomb(process, bomb),
        "openpi": lambda: _openpi_bomb(process, bomb),
        "sglang lock-step": lambda: _sglang_bomb(process, bomb),
        "http": lambda: asyncio.to_thread(_http_bomb, process, bomb),
    }


async def _run_every_attack(process: ServerProcess, bomb: bytes) -> dict[str, tuple[object, object, int]]:
    # Each protocol served once with harmless frames first, so that idle includes what serving needs.
    for warm_up in _attacks(process, _jpeg(64)).values():
        await warm_up()
    results = {}
    for name, attack in _attacks(process, bomb).items():
        (refusal, after), peak = await _attack(process, attack)
        results[name] = (refusal, after, peak)
    return results


def _error_code(refusal) -> str:
    if isinstance(refusal, str):  # openpi answers errors as text: "<code>: <message>"
        return refusal.split(":", 1)[0]
    return (refusal.get("error") or refusal)["code"]


def _served(after) -> bool:
    return after.get("type") == "action_chunk" or "actions" in after or "data" in after or after.get("status") == 200


async def test_every_protocol_refuses_the_bombs_by_the_decoding_budget_before_decoding(wide):
    results = await _run_every_attack(wide, PNG_BOMB)
    for name, (refusal, after, peak) in results.items():
        assert _error_code(refusal) in ("payload_too_large", "invalid_image"), (name, refusal)
        assert peak < PEAK_LIMIT, f"{name}: peak RSS grew {peak / MIB:.0f} MiB"
        assert _served(after), (name, after)
    # The clips are refused for what they decode to; the cameras for the frame they compose to.
    assert _error_code(results["native video"][0]) == "payload_too_large"
    assert _error_code(results["sglang lock-step"][0]) == "payload_too_large"
    assert results["http"][0]["status"] == 413
    assert results["native images"][0]["field"] == "images/cam0+images/cam1+images/cam2+images/cam3"
    assert "exterior_image_1_left" in results["openpi"][0]


async def test_a_default_server_refuses_sides_beyond_twice_its_largest_canvas(default):
    results = await _run_every_attack(default, JPEG_BOMB)
    for name, (refusal, after, peak) in results.items():
        assert _error_code(refusal) == "invalid_image", (name, refusal)
        message = refusal if isinstance(refusal, str) else (refusal.get("error") or refusal)["message"]
        assert "4096×4096" in message and "2560" in message, (name, message)
        assert peak < PEAK_LIMIT, f"{name}: peak RSS grew {peak / MIB:.0f} MiB"
        assert _served(after), (name, after)


async def test_a_jpeg_clip_decoded_down_to_the_canvas_is_served_within_the_memory_bound(wide):
    """The same 17 frames as JPEGs fit the budget once decoded at an eighth of their side (the 256 tier's
    canvas is 320 wide): served, not refused, and still within 200 MiB of idle."""
    await _native_clip_bomb(wide, _jpeg(64))  # served once first: idle includes what serving needs
    # Serving a 17-frame clip takes memory of its own that is freed between requests, more while other tests
    # load the machine (seen: 133 to 181 MiB alone, 216 in make test). The bomb is held to the bound, or to
    # what the same clip of small JPEGs took just before plus 64 MiB: decoded at full size, the 17 frames
    # would take 319 MiB more.
    _, served = await _attack(wide, lambda: _native_clip_bomb(wide, _jpeg(64)))
    (refusal, after), peak = await _attack(wide, lambda: _native_clip_bomb(wide, JPEG_BOMB))
    assert refusal["type"] == "action_chunk", refusal
    bound = max(PEAK_LIMIT, served + 64 * MIB)
    assert peak < bound, f"peak RSS grew {peak / MIB:.0f} MiB (the small clip's: {served / MIB:.0f} MiB)"
    assert after["type"] == "action_chunk", after


def test_a_large_jpeg_is_decoded_down_to_the_canvas_and_counted_at_that_size():
    """DCT scaling: a 2560² JPEG for a 320-pixel canvas decodes at an eighth of its side; the budget
    counts those pixels, and a PNG (no such scaling) at its full size."""
    limits = FrameLimits(max_image_side=4096, max_decoded_bytes=4 * MIB)
    frame = _jpeg(2560)
    assert decode_image(frame, "image", limits, fit_side=320).shape == (320, 320, 3)
    assert decode_image(frame, "image", limits, fit_side=1280).shape == (1280, 1280, 3)
    assert decode_image(frame, "image", limits).shape == (2560, 2560, 3)
    (size,) = check_media([("image", frame)], limits, fit_side=320)
    assert (size.height, size.width) == (320, 320)
    with pytest.raises(DecodedTooLarge):
        check_media([("image", frame)], limits)  # 18.8 MiB at full size
    png = io.BytesIO()
    Image.new("RGB", (2560, 2560)).save(png, "PNG")
    with pytest.raises(DecodedTooLarge):
        check_media([("image", png.getvalue())], limits, fit_side=320)


def test_the_composed_frame_is_checked_and_counted_before_decoding():
    limits = FrameLimits(max_image_side=1000, max_decoded_bytes=3 * MIB)
    cameras = [("a", _jpeg(600)), ("b", _jpeg(600))]
    assert len(check_media(cameras, limits)) == 2  # 2 × 1.03 MiB: within the budget and the sides
    with pytest.raises(InvalidImage, match="a\\+b.*600×1200"):
        check_media(cameras, limits, side_by_side=True)  # 600×1200: wider than 1000
    with pytest.raises(InvalidImage, match="66 frames"):
        check_media([("video", [b"not even read"] * 66)], FrameLimits(max_clip_frames=65))
