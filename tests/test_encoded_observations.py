"""Encoded camera frames (PNG, JPEG, WebP bytes) in both WebSocket protocols, against a real server and the
tiny distilled model: decoded off the event loop, headers checked first, hostile payloads answered
``invalid_image`` while the session goes on, and a session's decodes latest-wins."""

from __future__ import annotations

import asyncio
import io
import struct
import threading
import time
import zlib

import numpy as np
import pytest
from PIL import Image
from server_fixtures import DOMAIN, ServerThread, rgb_image, tiny_engine_loader
from websockets.asyncio.client import connect

from policy_server.foundation.camera_intake import DecodeSlot
from policy_server.openpi_settings import OpenpiSettings
from policy_server.sessions.openpi import openpi_arrays
from robot_clients.protocol import DropReason, ProtocolError
from robot_clients.wire_codec import packb, unpackb

OPENPI_DOMAIN = "droid_lerobot"


@pytest.fixture(scope="module")
def server():
    settings = OpenpiSettings(requested={"domain_name": OPENPI_DOMAIN, "action_horizon": 8})
    with ServerThread(tiny_engine_loader("distilled"), openpi=settings) as running:
        yield running


def encoded(frame: np.ndarray, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, fmt, **options)
    return buffer.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A few dozen bytes of PNG whose header claims ``width`` × ``height`` pixels (a decompression bomb)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


async def native(server):
    ws = await connect(server.url, compression=None, proxy=None, max_size=None)
    meta = unpackb(await ws.recv())
    await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8, "seed": 7}))
    assert unpackb(await ws.recv())["type"] == "session"
    return ws, meta


async def reply(ws, timeout: float = 60.0) -> dict:
    return unpackb(await asyncio.wait_for(ws.recv(), timeout))


async def test_the_hello_names_the_formats_and_the_canvases(server):
    ws, meta = await native(server)
    async with ws:
        assert meta["capabilities"]["encoded_images"] == ["jpeg", "png", "webp"]
        tiers = [str(tier) for tier in meta["resolution_tiers"]]
        assert set(meta["canvases"]) == set(tiers)
        assert all({"aspect_ratio", "height", "width"} <= set(entry) for entry in meta["canvases"][tiers[0]])


async def test_a_png_frame_gives_the_actions_of_the_raw_frame(server):
    frame = rgb_image(224, seed=1)
    ws, _ = await native(server)
    async with ws:
        await ws.send(packb({"type": "observation", "seq": 0, "image": frame}))
        raw = await reply(ws)
        await ws.send(packb({"type": "observation", "seq": 1, "image": encoded(frame)}))
        png = await reply(ws)
        await ws.send(packb({"type": "observation", "seq": 2, "images": {"front": encoded(frame, "JPEG", quality=90)}}))
        jpeg = await reply(ws)
    assert [raw["type"], png["type"], jpeg["type"]] == ["action_chunk"] * 3, (raw, png, jpeg)
    np.testing.assert_array_equal(png["actions"], raw["actions"])  # lossless: the very same pixels
    assert jpeg["actions"].shape == raw["actions"].shape


@pytest.mark.parametrize(
    "payload,field",
    [
        (b"not an image at all", "image"),
        (png_claiming(100_000, 100_000), "image"),  # refused from its header: no pixel is allocated
        (encoded(rgb_image(64))[:80], "image"),  # truncated pixel data: found while decoding, on the pool
        (encoded(rgb_image(64), "GIF"), "image"),
    ],
)
async def test_hostile_payloads_get_invalid_image_and_the_session_goes_on(server, payload, field):
    ws, _ = await native(server)
    async with ws:
        await ws.send(packb({"type": "observation", "seq": 0, "image": payload}))
        error = await reply(ws)
        assert (error["type"], error["code"], error["field"], error["seq"]) == ("error", "invalid_image", field, 0)
        await ws.send(packb({"type": "observation", "seq": 1, "image": encoded(rgb_image(64))}))
        chunk = await reply(ws)
        assert (chunk["type"], chunk["seq"]) == ("action_chunk", 1)
        decoded = server.run(lambda: max(s.decoding.decoded for s in server.server.context.sessions.values()))
        assert decoded >= 1


async def test_an_encoded_clip_is_a_list_of_frames_and_its_count_is_bounded(server):
    ws, _ = await native(server)
    async with ws:
        await ws.send(packb({"type": "configure", "action_mode": "inverse_dynamics"}))
        assert (await reply(ws))["type"] == "session"
        clip = [encoded(rgb_image(64, seed=i)) for i in range(9)]
        await ws.send(packb({"type": "observation", "seq": 0, "video": clip}))
        chunk = await reply(ws)
        assert chunk["type"] == "action_chunk", chunk
        await ws.send(packb({"type": "observation", "seq": 1, "video": [clip[0]] * 1000}))
        error = await reply(ws)
        assert (error["code"], error["field"]) == ("invalid_image", "video")


async def openpi(server):
    ws = await connect(f"ws://127.0.0.1:{server.port}/openpi", compression=None, proxy=None, max_size=None)
    meta = unpackb(await ws.recv())
    return ws, meta


async def test_openpi_cameras_may_be_jpeg_bytes(server):
    frame = rgb_image(224, seed=2)
    ws, meta = await openpi(server)
    async with ws:
        assert meta["encoded_images"] == ["jpeg", "png", "webp"] and meta["canvases"]
        raw_obs = {"observation/exterior_image_1_left": frame, "observation/wrist_image_left": frame, "prompt": "x"}
        await ws.send(packb(openpi_arrays(raw_obs)))
        raw = unpackb(await asyncio.wait_for(ws.recv(), 60))
        png_obs = {
            **raw_obs,
            "observation/exterior_image_1_left": encoded(frame),
            "observation/wrist_image_left": encoded(frame),
        }
        await ws.send(packb(openpi_arrays(png_obs)))
        png = unpackb(await asyncio.wait_for(ws.recv(), 60))
        assert png["actions"].shape == raw["actions"].shape
        await ws.send(packb(openpi_arrays({**raw_obs, "observation/exterior_image_1_left": b"\xff\xd8 corrupt"})))
        error = await asyncio.wait_for(ws.recv(), 60)
        assert isinstance(error, str) and error.startswith("invalid_image") and "exterior_image_1_left" in error
        await ws.send(packb(openpi_arrays(png_obs)))
        assert "actions" in unpackb(await asyncio.wait_for(ws.recv(), 60))


async def test_the_slot_decodes_one_at_a_time_off_the_loop_and_the_newest_waiting_wins():
    """Three observations while the first decodes: the second is replaced by the third (dropped
    ``superseded``), and every decode ran on a pool thread, not the event loop's."""
    admitted, dropped, errors, threads = [], [], [], []
    loop_thread = threading.current_thread()
    release = threading.Event()

    def guard(seq, function, *args):
        try:
            function(*args)
        except ProtocolError as error:
            errors.append((seq, error.code))

    def decode(value, wait=False):
        def run():
            threads.append(threading.current_thread())
            if wait:
                release.wait(10)
            return value

        return run

    slot = DecodeSlot(guard, lambda seq, reason: dropped.append((seq, reason)))
    admit = lambda value, received_at: admitted.append(value)  # noqa: E731
    slot.submit(0, time.monotonic(), decode("first", wait=True), None, admit)
    slot.submit(1, time.monotonic(), decode("second"), None, admit)
    slot.submit(2, time.monotonic(), None, "third, raw", admit)  # a raw one waits its turn too (order kept)
    assert slot.busy and dropped == [(1, DropReason.SUPERSEDED)]
    release.set()
    for _ in range(200):
        if not slot.busy:
            break
        await asyncio.sleep(0.01)
    assert admitted == ["first", "third, raw"]
    assert threads and all(thread is not loop_thread for thread in threads)
    assert errors == []


async def test_a_held_session_decodes_only_once_its_queued_observation_is_taken():
    """Issue 25.2: a session streaming costly frames decoded every one it sent, though each only replaced
    the last one waiting in the queue. While the queue holds it back (its observation still waits there),
    its newest frame waits undecoded (newer ones replace it: superseded), and is decoded once the hold
    lifts."""
    admitted, dropped, decoded = [], [], []
    hold = [True]

    def decode(value):
        def run():
            decoded.append(value)
            return value

        return run

    slot = DecodeSlot(
        lambda seq, fn, *args: fn(*args), lambda seq, reason: dropped.append((seq, reason)), lambda: hold[0]
    )
    admit = lambda value, received_at: admitted.append(value)  # noqa: E731
    for seq in range(3):
        slot.submit(seq, time.monotonic(), decode(f"frame {seq}"), None, admit)
        await asyncio.sleep(0.03)  # longer than the hold's recheck
    assert decoded == [] and admitted == [] and slot.busy
    assert dropped == [(0, DropReason.SUPERSEDED), (1, DropReason.SUPERSEDED)]
    hold[0] = False
    for _ in range(200):
        if not slot.busy:
            break
        await asyncio.sleep(0.01)
    assert decoded == ["frame 2"] and admitted == ["frame 2"]


async def test_a_frame_a_newer_one_replaced_is_never_decoded():
    """Issue 36.2: a session streaming JPEGs faster than a slow engine answers. Every frame it sent got
    one terminal reply; only those that reached the engine were decoded (the queue never held a decoded
    frame that a newer decoded one replaced), and the superseded ones cost no decoding."""
    with ServerThread(tiny_engine_loader("distilled", delay_s=0.3)) as slow:
        frame = encoded(rgb_image(256), "JPEG", quality=90)
        async with connect(slow.url, proxy=None, max_size=None, compression=None) as ws:
            session_id = unpackb(await ws.recv())["session_id"]
            await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8}))
            assert unpackb(await ws.recv())["type"] == "session"
            sent = 40
            for seq in range(sent):
                await ws.send(packb({"type": "observation", "seq": seq, "image": frame}))
                await asyncio.sleep(0.02)  # 50 Hz against an engine call of 300 ms or more
            replies: dict[str, int] = {}
            while sum(replies.values()) < sent:
                reply = unpackb(await asyncio.wait_for(ws.recv(), 60))
                kind = reply["type"] if reply["type"] != "dropped" else f"dropped {reply['reason']}"
                replies[kind] = replies.get(kind, 0) + 1
            session = slow.run(lambda: slow.server.context.sessions[session_id])
            decoded = session.decoding.decoded
    assert set(replies) <= {"action_chunk", "dropped superseded"}, replies
    assert replies.get("dropped superseded", 0) >= sent // 2, replies  # most were replaced while waiting
    assert decoded == replies["action_chunk"], (decoded, replies)  # only the frames the engine answered
