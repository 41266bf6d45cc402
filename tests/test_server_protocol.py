"""Native protocol v1 against a real server and the real tiny distilled model: frames, replies, errors.

The client side here is a bare ``websockets`` connection and the shared codec, so every test controls
the exact bytes it sends.
"""

from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import pytest
from server_fixtures import DOMAIN, ServerThread, http_get, rgb_image, tiny_engine_loader
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from robot_clients.wire_codec import packb, unpackb

MAX_MESSAGE_BYTES = 2 * 2**20  # small, so the oversized-frame test sends only a few MB


@pytest.fixture(scope="module")
def server():
    with ServerThread(tiny_engine_loader("distilled"), max_message_bytes=MAX_MESSAGE_BYTES) as running:
        yield running


class Conn:
    """A raw protocol connection: send maps, receive decoded maps."""

    def __init__(self, ws):
        self.ws = ws

    async def send(self, frame) -> None:
        await self.ws.send(frame if isinstance(frame, (bytes, str)) else packb(frame))

    async def recv(self, timeout: float = 30.0) -> dict:
        return unpackb(await asyncio.wait_for(self.ws.recv(), timeout))

    async def configure(self, **settings) -> dict:
        await self.send({"type": "configure", "domain_name": DOMAIN, **settings})
        return await self.recv()


async def wait_until_busy(server: ServerThread, timeout: float = 10.0) -> None:
    """Until the engine worker is running a request (so the next observation has to wait)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not server.run(lambda: server.server.context.worker.busy):
        assert asyncio.get_running_loop().time() < deadline, "the worker never started the request"
        await asyncio.sleep(0.002)


async def open_conn(server: ServerThread) -> tuple[Conn, dict]:
    ws = await connect(server.url, compression=None, proxy=None, max_size=None)
    conn = Conn(ws)
    return conn, await conn.recv()


async def test_metadata_describes_the_model_and_the_protocol(server):
    conn, meta = await open_conn(server)
    async with conn.ws:
        assert meta["type"] == "metadata"
        assert meta["protocol_version"] == 1
        assert meta["variant"] == "distilled"
        assert set(meta["modes"]) == {"policy", "inverse_dynamics"}
        assert meta["domains"][DOMAIN]["raw_action_dim"] > 0
        assert meta["limits"]["max_message_bytes"] == MAX_MESSAGE_BYTES
        assert meta["capabilities"]["latest_observation_wins"] is True
        assert meta["defaults"]["num_steps"] == 4


async def test_round_trip_returns_a_chunk_with_timing(server):
    conn, meta = await open_conn(server)
    async with conn.ws:
        session = await conn.configure(action_horizon=8, seed=3)
        assert session["type"] == "session"
        assert session["config"]["action_horizon"] == 8
        assert session["config"]["domain_name"] == DOMAIN
        await conn.send({"type": "observation", "seq": 0, "image": rgb_image(), "timestamp": 12.5})
        chunk = await conn.recv()
        assert chunk["type"] == "action_chunk" and chunk["seq"] == 0
        width = meta["domains"][DOMAIN]["raw_action_dim"]
        assert chunk["actions"].shape == (8, width) and chunk["actions"].dtype == np.float32
        assert np.isfinite(chunk["actions"]).all()
        assert chunk["timestamp"] == 12.5  # the client's timestamp is echoed, untouched
        timing = chunk["timing"]
        for key in ("queue_ms", "preprocess_ms", "model_ms", "postprocess_ms", "total_ms", "observation_age_ms"):
            assert timing[key] >= 0, key
        assert timing["model_ms"] > 0
        assert timing["observation_age_ms"] >= timing["model_ms"]


async def test_same_seed_gives_the_same_actions(server):
    conn, _ = await open_conn(server)
    async with conn.ws:
        await conn.configure(seed=7)
        image = rgb_image(seed=1)
        results = []
        for seq in (0, 1):
            await conn.send({"type": "observation", "seq": seq, "image": image})
            results.append((await conn.recv())["actions"])
        np.testing.assert_array_equal(results[0], results[1])


async def test_streaming_many_observations_each_answered_once(server):
    """Observations sent back to back, without waiting: every seq gets exactly one terminal reply, the
    chunks come back in seq order, and the last observation is always answered (latest wins)."""
    conn, _ = await open_conn(server)
    async with conn.ws:
        await conn.configure()
        count = 12
        for seq in range(count):
            await conn.send({"type": "observation", "seq": seq, "image": rgb_image(seed=seq)})
        replies = {}
        while len(replies) < count:
            frame = await conn.recv()
            assert frame["seq"] not in replies, "a seq was answered twice"
            replies[frame["seq"]] = frame
        answered = [s for s, f in replies.items() if f["type"] == "action_chunk"]
        dropped = [s for s, f in replies.items() if f["type"] == "dropped"]
        assert len(answered) + len(dropped) == count
        assert answered == sorted(answered)
        assert count - 1 in answered
        assert all(replies[s]["reason"] == "superseded" for s in dropped)


async def test_reconfigure_changes_the_horizon(server):
    conn, _ = await open_conn(server)
    async with conn.ws:
        await conn.configure(action_horizon=8)
        second = await conn.configure(action_horizon=12)
        assert second["config"]["action_horizon"] == 12
        await conn.send({"type": "observation", "seq": 0, "image": rgb_image()})
        assert (await conn.recv())["actions"].shape[0] == 12


async def test_per_observation_overrides_apply_to_that_observation(server):
    conn, _ = await open_conn(server)
    async with conn.ws:
        await conn.configure(seed=1)
        await conn.send({"type": "observation", "seq": 0, "image": rgb_image(), "seed": 99})
        assert (await conn.recv())["seed"] == 99
        await conn.send({"type": "observation", "seq": 1, "image": rgb_image()})
        assert (await conn.recv())["seed"] == 1


async def test_inverse_dynamics_from_a_video(server):
    conn, meta = await open_conn(server)
    async with conn.ws:
        await conn.configure(action_mode="inverse_dynamics", action_horizon=8)
        video = np.stack([rgb_image(64, seed=i) for i in range(9)])
        await conn.send({"type": "observation", "seq": 0, "video": video})
        chunk = await conn.recv()
        assert chunk["type"] == "action_chunk", chunk
        assert chunk["action_mode"] == "inverse_dynamics"
        assert chunk["actions"].shape == (8, meta["domains"][DOMAIN]["raw_action_dim"])


async def test_cancel_and_reset(server):
    conn, _ = await open_conn(server)
    async with conn.ws:
        await conn.configure()
        # Cancel by seq: answered `dropped` at once, whether it was still waiting or already running.
        await conn.send({"type": "observation", "seq": 0, "image": rgb_image()})
        await conn.send({"type": "cancel", "seq": 0})
        assert await conn.recv() == {
            "type": "dropped",
            "seq": 0,
            "reason": "cancelled",
            "message": "cancelled by the client",
        }
        # Cancel without a seq: everything outstanding.
        await conn.send({"type": "observation", "seq": 1, "image": rgb_image()})
        await conn.send({"type": "cancel"})
        frame = await conn.recv()
        assert (frame["type"], frame["seq"], frame["reason"]) == ("dropped", 1, "cancelled")
        await conn.send({"type": "observation", "seq": 2, "image": rgb_image()})
        await conn.send({"type": "reset"})
        replies = [await conn.recv(), await conn.recv()]
        assert [r["type"] for r in replies] == ["dropped", "reset_done"]
        assert replies[0]["seq"] == 2 and replies[0]["reason"] == "cancelled"
        # After a reset seqs may start again from 0, and the configuration is kept.
        await conn.send({"type": "observation", "seq": 0, "image": rgb_image()})
        frame = await conn.recv()
        assert frame["type"] == "action_chunk" and frame["seq"] == 0
        with pytest.raises(asyncio.TimeoutError):
            await conn.recv(timeout=0.5)  # the cancelled seqs never come back as chunks


async def test_deadline_that_passes_in_the_queue_is_dropped_not_run(server):
    conn, _ = await open_conn(server)
    async with conn.ws:
        await conn.configure()
        await conn.send({"type": "observation", "seq": 0, "image": rgb_image()})
        await wait_until_busy(server)
        # Waits behind seq 0 (tens of ms at least): a 1 ms budget has passed when it reaches the engine.
        await conn.send({"type": "observation", "seq": 1, "image": rgb_image(), "deadline_ms": 1})
        first, second = await conn.recv(), await conn.recv()
        assert first["type"] == "action_chunk" and first["seq"] == 0
        assert second == {**second, "type": "dropped", "seq": 1, "reason": "deadline"}


# ---------------------------------------------------------------------------------------------------
# Errors: every bad frame gets an `error` with a stable code and the field; the session goes on.
# ---------------------------------------------------------------------------------------------------

IMAGE = rgb_image(64)

BAD_FRAMES = {
    "not msgpack": (b"\xc1\xc1\xc1", "bad_frame", None),
    "text frame": ("hello", "bad_frame", None),
    "not a map": (packb([1, 2, 3]), "bad_frame", None),
    "malformed array": (
        msgpack.packb(
            {
                "type": "observation",
                "seq": 5,
                "image": {"__ndarray__": True, "data": b"\0" * 10, "dtype": "|u1", "shape": [2, 2, 3]},
            }
        ),
        "bad_frame",
        "shape",
    ),
    "object dtype": (
        msgpack.packb(
            {
                "type": "observation",
                "seq": 5,
                "image": {"__ndarray__": True, "data": b"\0" * 8, "dtype": "|O", "shape": [1]},
            }
        ),
        "bad_frame",
        "dtype",
    ),
    "no type": ({"seq": 1}, "unknown_type", "type"),
    "unknown type": ({"type": "teleport"}, "unknown_type", "type"),
    "observation without seq": ({"type": "observation", "image": IMAGE}, "missing_field", "seq"),
    "seq is a string": ({"type": "observation", "seq": "7", "image": IMAGE}, "invalid_field", "seq"),
    "seq is negative": ({"type": "observation", "seq": -1, "image": IMAGE}, "invalid_field", "seq"),
    "no image": ({"type": "observation", "seq": 5}, "missing_field", "image"),
    "image is a list": ({"type": "observation", "seq": 5, "image": [[1, 2, 3]]}, "invalid_image", "image"),
    "image float32": ({"type": "observation", "seq": 5, "image": IMAGE.astype(np.float32)}, "invalid_image", "image"),
    "image rank 2": ({"type": "observation", "seq": 5, "image": IMAGE[..., 0]}, "invalid_image", "image"),
    "image rgba": (
        {"type": "observation", "seq": 5, "image": np.zeros((64, 64, 4), np.uint8)},
        "invalid_image",
        "image",
    ),
    "image too small": (
        {"type": "observation", "seq": 5, "image": np.zeros((4, 4, 3), np.uint8)},
        "invalid_image",
        "image",
    ),
    "image too large": (
        {"type": "observation", "seq": 5, "image": np.zeros((1, 5000, 3), np.uint8)},
        "invalid_image",
        "image",
    ),
    "video rank 3": ({"type": "observation", "seq": 5, "video": IMAGE}, "invalid_image", "video"),
    "deadline is a string": (
        {"type": "observation", "seq": 5, "image": IMAGE, "deadline_ms": "soon"},
        "invalid_field",
        "deadline_ms",
    ),
    "prefix actions int": (
        {"type": "observation", "seq": 5, "image": IMAGE, "prefix_actions": np.zeros((2, 3), np.int32)},
        "invalid_field",
        "prefix_actions",
    ),
    "unknown domain": ({"type": "configure", "domain_name": "spaceship"}, "unknown_domain", "domain_name"),
    "configure without domain": ({"type": "configure", "seed": 1}, "missing_field", "domain_name"),
    "unsupported mode": (
        {"type": "configure", "domain_name": DOMAIN, "action_mode": "forward_dynamics"},
        "unsupported_mode",
        "action_mode",
    ),
    "made-up mode": (
        {"type": "configure", "domain_name": DOMAIN, "action_mode": "dance"},
        "unsupported_mode",
        "action_mode",
    ),
    "unsupported tier": (
        {"type": "configure", "domain_name": DOMAIN, "resolution_tier": 333},
        "unsupported_tier",
        "resolution_tier",
    ),
    "horizon not a multiple": (
        {"type": "configure", "domain_name": DOMAIN, "action_horizon": 7},
        "invalid_field",
        "action_horizon",
    ),
    "horizon is a bool": (
        {"type": "configure", "domain_name": DOMAIN, "action_horizon": True},
        "invalid_field",
        "action_horizon",
    ),
    "unknown configure field": ({"type": "configure", "domain_name": DOMAIN, "speed": 3}, "invalid_field", "speed"),
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
async def test_bad_frame_is_answered_with_a_precise_error_and_the_session_continues(server, name):
    frame, code, field = BAD_FRAMES[name]
    conn, _ = await open_conn(server)
    async with conn.ws:
        await conn.send(frame)
        error = await conn.recv()
        assert error["type"] == "error", error
        assert error["code"] == code, error
        assert error["field"] == field, error
        assert len(error["message"]) > 10 and "Traceback" not in error["message"]
        if isinstance(frame, dict) and frame.get("type") == "observation" and isinstance(frame.get("seq"), int):
            assert error["seq"] == frame["seq"]
        # The session is still alive and useful.
        session = await conn.configure()
        assert session["type"] == "session"
        await conn.send({"type": "observation", "seq": 100, "image": IMAGE})
        assert (await conn.recv())["type"] == "action_chunk"


async def test_observation_before_configure_is_refused(server):
    conn, _ = await open_conn(server)
    async with conn.ws:
        await conn.send({"type": "observation", "seq": 0, "image": IMAGE})
        error = await conn.recv()
        assert (error["code"], error["seq"]) == ("not_configured", 0)


async def test_seq_must_increase(server):
    conn, _ = await open_conn(server)
    async with conn.ws:
        await conn.configure()
        await conn.send({"type": "observation", "seq": 5, "image": IMAGE})
        await conn.send({"type": "observation", "seq": 5, "image": IMAGE})
        replies = [await conn.recv(), await conn.recv()]
        error = next(r for r in replies if r["type"] == "error")
        assert (error["code"], error["field"], error["seq"]) == ("invalid_field", "seq", 5)
        assert any(r["type"] == "action_chunk" for r in replies)


async def test_engine_side_validation_error_reaches_the_client_with_its_code(server):
    """A value only the engine can judge (a prefix that overflows once normalized by the domain's
    statistics) comes back as the same `invalid_field` the server gives the values it judges itself,
    tagged with the seq, and the session goes on."""
    conn, meta = await open_conn(server)
    async with conn.ws:
        await conn.configure(action_horizon=8)
        width = meta["domains"][DOMAIN]["raw_action_dim"]
        await conn.send(
            {"type": "observation", "seq": 0, "image": IMAGE, "prefix_actions": np.full((2, width), 1e38, np.float32)}
        )
        error = await conn.recv()
        assert error["type"] == "error" and error["seq"] == 0
        assert (error["code"], error["field"]) == ("invalid_field", "prefix_actions")
        assert "action range" in error["message"]
        await conn.send({"type": "observation", "seq": 1, "image": IMAGE})
        assert (await conn.recv())["type"] == "action_chunk"


async def test_oversized_frame_closes_with_1009(server):
    conn, _ = await open_conn(server)
    await conn.send({"type": "observation", "seq": 0, "image": np.zeros((1100, 1100, 3), np.uint8)})  # 3.6 MB
    with pytest.raises(ConnectionClosed) as info:
        await conn.recv()
    assert info.value.rcvd.code == 1009
    # The server itself is unharmed.
    other, meta = await open_conn(server)
    await other.ws.close()
    assert meta["type"] == "metadata"


async def test_healthz_and_unknown_paths(server):
    status, health, _ = await asyncio.to_thread(http_get, server.health_url)
    assert status == 200
    assert health["status"] == "ready"
    assert health["variant"] == "distilled"
    assert health["worker"]["omp_wait_policy"]
    with pytest.raises(InvalidStatus) as info:
        await connect(f"ws://127.0.0.1:{server.port}/nowhere", proxy=None)
    assert info.value.response.status_code == 404


async def test_named_cameras_are_composed_per_the_view_point(server):
    """`images` (named cameras): concat_view composes them side by side, wrist_view picks the wrist camera;
    each gives the chunk the engine gives for that composed frame."""
    front, wrist = rgb_image(seed=1), rgb_image(seed=2)
    conn, _ = await open_conn(server)
    async with conn.ws:
        await conn.configure(seed=5, view_point="concat_view")
        await conn.send({"type": "observation", "seq": 0, "images": {"front": front, "wrist": wrist}})
        concat = await conn.recv()
        await conn.send({"type": "observation", "seq": 1, "image": np.concatenate([front, wrist], axis=1)})
        reference = await conn.recv()
        assert concat["type"] == reference["type"] == "action_chunk"
        np.testing.assert_array_equal(concat["actions"], reference["actions"])

        await conn.configure(view_point="wrist_view")
        await conn.send({"type": "observation", "seq": 2, "images": {"front": front, "wrist_cam": wrist}})
        picked = await conn.recv()
        await conn.send({"type": "observation", "seq": 3, "image": wrist})
        assert np.array_equal(picked["actions"], (await conn.recv())["actions"])

        await conn.send({"type": "observation", "seq": 4, "images": {"left": front, "right": front}})
        error = await conn.recv()
        assert (error["type"], error["code"], error["field"]) == ("error", "invalid_field", "images")
        await conn.send({"type": "observation", "seq": 5, "images": {"front": front}, "image": front})
        error = await conn.recv()
        assert (error["type"], error["field"]) == ("error", "images")
