"""Limits of the WebSocket side that issue 6 added: sessions open at once, observations per second.

Limits that existed before are tested where they were built: frame bytes (1009) in
``test_server_protocol.py``, image size and clip length there too (``invalid_image``), body and upload
bytes and queued video jobs in ``test_sidecar_videos.py``.

One real server (tiny model) with small limits: 2 sessions, 5 observations per second with a burst of 3.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from server_fixtures import DOMAIN, ServerThread, rgb_image, tiny_engine_loader
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from policy_server.foundation.rate_limit import RateLimit, TokenBucket
from robot_clients.wire_codec import packb, unpackb

MAX_SESSIONS = 2
RATE_HZ, BURST = 5.0, 3


@pytest.fixture(scope="module")
def limited():
    with ServerThread(
        tiny_engine_loader("distilled"),
        warmup=False,
        max_sessions=MAX_SESSIONS,
        observation_rate=RateLimit(RATE_HZ, BURST),
    ) as server:
        yield server


async def open_ws(server: ServerThread, path: str = "/v1/actions/realtime"):
    ws = await connect(f"ws://127.0.0.1:{server.port}{path}", compression=None, proxy=None, max_size=None)
    return ws, unpackb(await ws.recv())


async def wait_sessions(server: ServerThread, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.run(lambda: len(server.server.context.sessions)) != count:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_metadata_states_the_limits(limited):
    ws, metadata = await open_ws(limited)
    await ws.close()
    limits = metadata["limits"]
    assert limits["max_sessions"] == MAX_SESSIONS
    assert limits["max_observations_per_s"] == RATE_HZ and limits["observation_burst"] == BURST


async def test_sessions_beyond_the_limit_are_refused_with_503_then_admitted_when_one_closes(limited):
    await wait_sessions(limited, 0)
    first, _ = await open_ws(limited)
    second, _ = await open_ws(limited, "/openpi")  # openpi sessions count too
    try:
        with pytest.raises(InvalidStatus) as caught:
            await connect(limited.url, proxy=None)
        response = caught.value.response
        assert response.status_code == 503 and response.headers["Retry-After"]
        assert b"session limit reached" in response.body
        await first.close()
        await wait_sessions(limited, 1)
        third, metadata = await open_ws(limited)
        assert metadata["type"] == "metadata"
        await third.close()
    finally:
        await first.close()
        await second.close()
    await wait_sessions(limited, 0)


async def test_observations_over_the_rate_are_answered_rate_limited_and_each_seq_once(limited):
    await wait_sessions(limited, 0)
    ws, _ = await open_ws(limited)
    try:
        await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8}))
        assert unpackb(await ws.recv())["type"] == "session"
        sent = 12
        for seq in range(sent):  # at once: far above 5/s, so after the burst of 3 most are refused
            await ws.send(packb({"type": "observation", "seq": seq, "image": rgb_image(32, seed=seq)}))
        replies: dict[int, dict] = {}
        while len(replies) < sent:
            frame = unpackb(await asyncio.wait_for(ws.recv(), 60))
            assert frame["seq"] not in replies, "a seq was answered twice"
            replies[frame["seq"]] = frame
        limited_seqs = [s for s, f in replies.items() if f["type"] == "error" and f["code"] == "rate_limited"]
        assert len(limited_seqs) >= sent - BURST - 2  # a few tokens may refill while frames arrive
        assert "observations per second" in replies[limited_seqs[0]]["message"]
        assert all(f["type"] in ("action_chunk", "dropped", "error") for f in replies.values())
        # The session goes on: after the bucket refills, an observation is served.
        await asyncio.sleep(1.0)
        await ws.send(packb({"type": "observation", "seq": 100, "image": rgb_image(32)}))
        frame = unpackb(await asyncio.wait_for(ws.recv(), 60))
        assert frame["type"] == "action_chunk" and frame["seq"] == 100
    finally:
        await ws.close()


async def test_openpi_observations_over_the_rate_get_a_rate_limited_text_frame(limited):
    await wait_sessions(limited, 0)
    ws, _ = await open_ws(limited, "/openpi")
    try:
        obs = {"observation/image": rgb_image(32), "prompt": "x"}
        for _ in range(BURST + 4):
            await ws.send(packb(obs))
        texts = []
        for _ in range(BURST + 4):
            reply = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(reply, str):
                texts.append(reply)
        assert any(t.startswith("rate_limited: ") for t in texts), texts
    except ConnectionClosed as exc:  # pragma: no cover - the connection must stay open
        pytest.fail(f"openpi connection closed: {exc}")
    finally:
        await ws.close()


def test_token_bucket_refills_at_its_rate():
    bucket = TokenBucket(rate_hz=10, burst=2)
    now = bucket._last
    assert bucket.take(now) and bucket.take(now) and not bucket.take(now)
    assert not bucket.take(now + 0.05) and bucket.take(now + 0.16)
    assert bucket.refused == 2
    assert TokenBucket(rate_hz=0, burst=1).take()  # 0: no limit


async def test_frames_that_fail_to_parse_spend_the_rate_as_observations_do(limited):
    """Before, only a frame that parsed as an observation spent a token: bad frames were free to send."""
    await wait_sessions(limited, 0)
    ws, _ = await open_ws(limited)
    try:
        await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8}))
        assert unpackb(await ws.recv())["type"] == "session"
        await asyncio.sleep(1.0)  # a full bucket
        for seq in range(BURST + 1):  # observations that do not parse: no image
            await ws.send(packb({"type": "observation", "seq": seq}))
        await ws.send(packb({"type": "observation", "seq": 99, "image": rgb_image(32)}))
        replies = [unpackb(await asyncio.wait_for(ws.recv(), 60)) for _ in range(BURST + 2)]
        assert [r["type"] for r in replies[:-1]] == ["error"] * (BURST + 1)
        assert replies[-1]["seq"] == 99 and replies[-1].get("code") == "rate_limited", replies[-1]
    finally:
        await ws.close()


def element_heavy_frame() -> bytes:
    """An observation of 49,990 empty maps: just under the 100,000-element budget, refused once decoded."""
    return packb({"type": "observation", "seq": 1, "image": {str(i): {} for i in range(49_990)}})


async def test_a_connection_whose_refused_frames_cost_more_than_its_decode_share_is_not_read_until_within():
    from policy_server.server_settings import FrameBudget
    from policy_server.sessions.wire_intake import WireIntake

    charged: list[float] = []
    intake = WireIntake(FrameBudget(decode_share=0.01, decode_burst_s=0.001), charged.append)
    frame = element_heavy_frame()
    for _ in range(3):
        await intake.prepare(frame)
        assert isinstance(intake.unpack(frame), dict)
    assert intake.paused_s == 0.0  # frames that parse are paid for in their session's turn
    for _ in range(3):
        await intake.prepare(frame)
        intake.unpack(frame)
        intake.spend_refused()  # the protocol refused it: nothing else pays for its decoding
    # Each refused frame's cost past the burst is waited for at 1 % of a core before the next one is read.
    assert intake.paused_s > 0.5 * (sum(charged[3:5]) - 0.001) / 0.01, (charged, intake.paused_s)


async def test_a_server_paces_a_connection_sending_refused_element_heavy_frames(limited):
    await wait_sessions(limited, 0)
    ws, hello = await open_ws(limited)
    try:
        for _ in range(8):  # each about 30 ms to count and decode, then refused: 0.24 s past a 0.1 s burst
            await ws.send(element_heavy_frame())
        replies = [unpackb(await asyncio.wait_for(ws.recv(), 60)) for _ in range(8)]
        assert {r["type"] for r in replies} == {"error"}, replies
        paused = limited.run(lambda: limited.server.context.sessions[hello["session_id"]].intake.paused_s)
        assert paused > 0.0
    finally:
        await ws.close()
