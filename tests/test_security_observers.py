"""Issue 18, item 5: what observers (``/v1/observe``, the dashboard's channel) may cost the server.

Against a real server (tiny model) with a real robot session:

* observers beyond ``max_observers`` are refused at the handshake (503);
* an observer that floods ``subscribe`` frames gets at most one ``session_detail`` per interval (each
  detail may carry a JPEG encode), and its excess frames are answered ``rate_limited``;
* a long prompt is cut in what is broadcast to every observer (the ``sessions`` list) and bounded in
  the detail, so no observer frame carries more than a bounded amount per session;
* an observer that stops reading while it keeps sending is closed with 1008, its outbox bounded.
* deep JSON (issue 36.3) is answered ``payload_too_large`` before Python's parser recurses, and the channel
  goes on; a frame past the 64 KiB limit is closed with 1009; neither logs a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import pytest
from server_fixtures import DOMAIN, ServerThread, rgb_image, tiny_engine_loader
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from policy_server.foundation.connection_supervisor import SessionLimits
from policy_server.sessions.observer import DETAIL_PROMPT_CHARS, LIST_PROMPT_CHARS
from robot_clients.wire_codec import packb, unpackb

MAX_OBSERVERS = 3
MAX_FRAMES = 64


@pytest.fixture(scope="module")
def server():
    limits = SessionLimits(max_outbox_frames=MAX_FRAMES, reply_timeout_s=3.0, idle_timeout_s=0, close_grace_s=30)
    with ServerThread(
        tiny_engine_loader("distilled"), warmup=False, max_observers=MAX_OBSERVERS, session_limits=limits
    ) as running:
        yield running


def observe_url(server: ServerThread) -> str:
    return f"ws://127.0.0.1:{server.port}/v1/observe"


async def open_robot(server: ServerThread, prompt: str = "pick up the cup"):
    """A configured native session that has sent one observation (so it has a camera frame)."""
    ws = await connect(server.url, proxy=None, max_size=None, compression=None)
    metadata = unpackb(await ws.recv())
    await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8, "prompt": prompt}))
    reply = unpackb(await ws.recv())
    assert reply["type"] == "session", reply
    await ws.send(packb({"type": "observation", "seq": 0, "image": rgb_image(64)}))
    assert unpackb(await asyncio.wait_for(ws.recv(), 60))["type"] == "action_chunk"
    return ws, metadata


async def wait_observers(server: ServerThread, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.run(lambda: len(server.server.context.observers)) != count:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_observers_beyond_the_limit_are_refused_with_503(server):
    await wait_observers(server, 0)
    observers = [await connect(observe_url(server), proxy=None) for _ in range(MAX_OBSERVERS)]
    try:
        with pytest.raises(InvalidStatus) as caught:
            await connect(observe_url(server), proxy=None)
        assert caught.value.response.status_code == 503
        assert b"observer limit reached" in caught.value.response.body
        await observers.pop().close()
        await wait_observers(server, MAX_OBSERVERS - 1)
        observers.append(await connect(observe_url(server), proxy=None))  # a freed slot is usable
    finally:
        for ws in observers:
            await ws.close()
    await wait_observers(server, 0)


async def test_an_observer_flooding_subscribes_gets_details_at_a_bounded_rate(server):
    robot, metadata = await open_robot(server)
    session_id = metadata["session_id"]
    async with connect(observe_url(server), proxy=None, max_size=None) as obs:
        hello = json.loads(await obs.recv())
        flood = 200
        started = time.monotonic()
        for _ in range(flood):
            await obs.send(json.dumps({"type": "subscribe", "session_id": session_id}))
        counts: dict[str, int] = {}
        rate_limited = 0
        # At least 2 s, and until every subscribe was answered.
        while time.monotonic() - started < 2.0 or counts.get("subscribed", 0) + rate_limited < flood:
            assert time.monotonic() - started < 30, counts
            try:
                frame = json.loads(await asyncio.wait_for(obs.recv(), 0.1))
            except asyncio.TimeoutError:
                continue
            counts[frame["type"]] = counts.get(frame["type"], 0) + 1
            rate_limited += frame["type"] == "error" and frame["code"] == "rate_limited"
        elapsed = time.monotonic() - started
    await robot.close()
    # One detail per interval at most (+1 for the first), whatever the observer asks for.
    assert counts.get("session_detail", 0) <= elapsed / hello["interval_s"] + 2, counts
    assert counts.get("sessions", 0) <= elapsed / hello["sessions_interval_s"] + 2, counts
    # Every frame was answered, the excess with `rate_limited` (not acted on).
    assert counts.get("subscribed", 0) + rate_limited == flood, counts
    assert rate_limited > 0


async def flood(ws) -> None:
    """Send as fast as the connection takes it, never reading."""
    try:
        while True:
            await ws.send("{}")
            await asyncio.sleep(0)  # send() does not yield while the socket takes data
    except (ConnectionClosed, asyncio.CancelledError):
        pass


async def observed_session(server: ServerThread, session_id: str) -> dict:
    """The session's entry in the `sessions` list an observer receives."""
    async with connect(observe_url(server), proxy=None, max_size=None) as obs:
        while True:
            frame = json.loads(await asyncio.wait_for(obs.recv(), 10))
            if frame["type"] == "sessions":
                for summary in frame["sessions"]:
                    if summary["session_id"] == session_id:
                        return summary


async def test_a_long_prompt_is_never_broadcast_whole(server):
    # The longest prompt a model takes (the session keeps it; the model checks it when it runs).
    limits_prompt = "x" * 2000
    robot, metadata = await open_robot(server, prompt=limits_prompt)
    assert len(limits_prompt) <= metadata["limits"]["max_prompt_chars"]
    try:
        summary = await observed_session(server, metadata["session_id"])
        assert len(summary["prompt"]) == LIST_PROMPT_CHARS and summary["prompt_truncated"] is True
        async with connect(observe_url(server), proxy=None, max_size=None) as obs:
            await obs.send(json.dumps({"type": "subscribe", "session_id": summary["session_id"]}))
            sizes = {}
            while "session_detail" not in sizes or "sessions" not in sizes:
                text = await asyncio.wait_for(obs.recv(), 10)
                frame = json.loads(text)
                sizes[frame["type"]] = max(sizes.get(frame["type"], 0), len(text))
                if frame["type"] == "session_detail":
                    assert len(frame["summary"]["prompt"]) <= DETAIL_PROMPT_CHARS
        # Per session: the list carries a few hundred bytes plus the cut prompt, the detail a bounded
        # amount (a preview JPEG of at most 320 px, 200 latencies, 200 drops, one chunk).
        assert sizes["sessions"] < LIST_PROMPT_CHARS + 1500, sizes
        assert sizes["session_detail"] < 200_000, sizes
    finally:
        await robot.close()


async def test_an_observer_that_never_reads_is_bounded_and_closed_with_1008(server):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.setblocking(False)
    obs = await connect(observe_url(server), sock=sock, max_queue=1, proxy=None, max_size=None, ping_interval=None)
    observer_id = json.loads(await obs.recv())["observer_id"]

    def state():
        observer = server.server.context.observers.get(observer_id)
        if observer is None:
            return None
        observer.connection.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return len(observer.outbox), observer.outbox.closed

    most = 0
    # Each frame is answered (most with `rate_limited`): replies the observer never reads.
    flooding = asyncio.create_task(flood(obs))
    deadline = time.monotonic() + 30
    while (held := server.run(state)) is not None and not held[1]:
        assert time.monotonic() < deadline, "an observer that does not read was never closed"
        most = max(most, held[0])
        await asyncio.sleep(0.05)
    flooding.cancel()
    await flooding
    assert most <= MAX_FRAMES
    while True:
        try:
            await asyncio.wait_for(obs.recv(), 60)
        except ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code == 1008, closed
            assert "not reading replies" in closed.rcvd.reason
            break
    await wait_observers(server, 0)


async def test_deep_json_is_refused_before_parsing_and_the_observer_goes_on(server, caplog):
    caplog.set_level(logging.INFO)
    async with connect(observe_url(server), proxy=None, max_size=None, compression=None) as obs:
        assert json.loads(await obs.recv())["type"] == "hello"

        async def answer() -> dict:
            while True:
                frame = json.loads(await asyncio.wait_for(obs.recv(), 10))
                if frame["type"] not in ("sessions", "session_detail"):  # periodic snapshots interleave
                    return frame

        for deep in (
            "[" * 12_000 + "]" * 12_000,
            '{"a":' * 10_000 + "1" + "}" * 10_000,
            "[" * 40 + '"]]]]]]"' + "]" * 40,
        ):
            await obs.send(
                deep
            )  # 24 kB, 60 kB, and 40 deep around a string of closing brackets: under the channel's 64 KiB limit
            reply = await answer()
            assert reply["type"] == "error" and reply["code"] == "payload_too_large", reply
            assert "deep" in reply["message"], reply
        await obs.send(json.dumps({"type": "subscribe", "session_id": None}))
        assert (await answer())["type"] == "subscribed"  # the channel goes on
    async with connect(observe_url(server), proxy=None, max_size=None, compression=None) as obs:
        await obs.recv()
        await obs.send('{"a":' * 12_000 + "1" + "}" * 12_000)  # the 72 kB: past the frame limit
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(obs.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009, closed.value
    tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not tracebacks, [r.getMessage() for r in tracebacks]
