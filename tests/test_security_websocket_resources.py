"""Issue 18, items 1, 6 and 13 (frame limit): what a robot connection may hold without using it.

Attacks, each against a real server (tiny model) over real sockets:

* a client that never reads its replies while it keeps sending (its outbox must stay bounded in frames
  and bytes, the server's memory must not grow, and it is closed with 1008 and a reason);
* a client that stops reading *and* goes silent once its receive window is full (websockets' keepalive
  cannot close it: its ping waits for the write buffer to drain; the reply timeout does);
* a robot that falls behind on its replies keeps only its newest chunk (latest wins for replies too), and
  every seq still gets exactly one terminal reply;
* idle connections that would fill ``--max-sessions``;
* a 4096x4096 camera frame (the models' largest image) fits the default frame limit.

A client "that never reads" is made with a small ``SO_RCVBUF`` and websockets' ``max_queue=1``: once the
library has one message queued it stops reading the socket, the kernel buffers fill, and the server's
writes stall exactly as with a peer that never calls ``recv``. The server side of that socket gets a
small ``SO_SNDBUF`` too (a thin link), so that the stall comes after kilobytes rather than megabytes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import numpy as np
import psutil
import pytest
from server_fixtures import DOMAIN, ServerThread, rgb_image, tiny_engine_loader
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.protocol import State

from policy_server.foundation.connection_supervisor import WRITE_LIMIT_BYTES, SessionLimits
from policy_server.foundation.rate_limit import RateLimit
from policy_server.sessions.observation_rules import UNREAD_CHUNK_MESSAGE
from robot_clients.wire_codec import packb, unpackb

MAX_FRAMES, MAX_BYTES = 64, 64 * 1024
# Keepalive would close a silent peer 3 + 1.5 s after it opened; the reply timeout comes later, so a close
# with 1008 (not keepalive's 1011) shows that the keepalive ping was stuck behind the stalled writes.
PING_INTERVAL_S, PING_TIMEOUT_S = 3.0, 1.5
REPLY_TIMEOUT_S = 6.0
BOGUS = packb({"type": "bogus"})  # answered with an `unknown_type` error: a reply per frame, no model work


@pytest.fixture(scope="module")
def strict():
    """Small outbox, short reply timeout, fast keepalive; idle timeout off (tested on its own server)."""
    limits = SessionLimits(
        max_outbox_frames=MAX_FRAMES,
        max_outbox_bytes=MAX_BYTES,
        reply_timeout_s=REPLY_TIMEOUT_S,
        idle_timeout_s=0,
        close_grace_s=30,
    )
    with ServerThread(
        tiny_engine_loader("distilled"),
        warmup=False,
        session_limits=limits,
        observation_rate=RateLimit(0),
        ping_interval=PING_INTERVAL_S,
        ping_timeout=PING_TIMEOUT_S,
    ) as server:
        yield server


async def open_unread(server: ServerThread, path: str = "/v1/actions/realtime"):
    """A client whose socket stops being read as soon as one message waits in its library, on a thin
    link; returns (connection, session id), the first frame (metadata) read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", server.port))
    sock.setblocking(False)
    ws = await connect(
        f"ws://127.0.0.1:{server.port}{path}",
        sock=sock,
        max_queue=1,
        compression=None,
        proxy=None,
        max_size=None,
        ping_interval=None,
    )
    session_id = unpackb(await ws.recv())["session_id"]

    def thin_link():
        connection = server.server.context.sessions[session_id].connection
        connection.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    server.run(thin_link)
    return ws, session_id


def session_of(server: ServerThread, session_id: str):
    return server.run(lambda: server.server.context.sessions.get(session_id))


def probe(server: ServerThread, session_id: str) -> dict:
    """What the server holds for this session right now (read on the server's loop)."""

    def read():
        session = server.server.context.sessions.get(session_id)
        if session is None:
            return {"open": False}
        outbox = getattr(session, "outbox", None)
        return {
            "open": session.connection.state is State.OPEN,
            "frames": len(outbox) if outbox is not None else None,
            "bytes": outbox.nbytes if outbox is not None else None,
            "transport_bytes": session.connection.transport.get_write_buffer_size(),
            "errors": session.telemetry.errors,
        }

    return server.run(read)


async def read_until_closed(ws, timeout: float = 60.0) -> list:
    """Read everything that is left; return the frames and the ConnectionClosed that ended it."""
    frames = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            frames.append(await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic())))
        except ConnectionClosed as exc:
            return frames, exc


async def stall_writes(server: ServerThread, ws, session_id: str) -> None:
    """Send until the server's write buffer is above websockets' write limit (writes paused, `send` waits).

    A few frames at a time, each batch answered before the next: the stall, not a full outbox, is wanted.
    """
    sent = 0
    while (state := probe(server, session_id))["transport_bytes"] < WRITE_LIMIT_BYTES:
        if state["errors"] == sent:
            for _ in range(10):
                await ws.send(BOGUS)
            sent += 10
        else:
            await asyncio.sleep(0.001)


async def flood(ws, frame: bytes = BOGUS) -> int:
    """Send ``frame`` as fast as the connection takes it, never reading; return how many went."""
    sent = 0
    try:
        while True:
            await ws.send(frame)
            sent += 1
            await asyncio.sleep(0)  # send() does not yield while the socket takes data
    except (ConnectionClosed, asyncio.CancelledError):
        return sent


async def test_a_client_that_never_reads_is_bounded_and_closed_with_1008(strict):
    rss = psutil.Process(os.getpid())
    ws, session_id = await open_unread(strict)
    before = rss.memory_info().rss
    most_frames = most_bytes = 0
    flooding = asyncio.create_task(flood(ws))
    deadline = time.monotonic() + REPLY_TIMEOUT_S + 20
    state = probe(strict, session_id)
    while state["open"]:  # flood, never read, until the server gives up on this client
        assert time.monotonic() < deadline, f"the server never closed a client that does not read: {state}"
        await asyncio.sleep(0.05)
        state = probe(strict, session_id)
        if state.get("frames") is not None:
            most_frames, most_bytes = max(most_frames, state["frames"]), max(most_bytes, state["bytes"])
    flooding.cancel()
    await flooding
    grown_mib = (rss.memory_info().rss - before) / 2**20
    assert most_frames <= MAX_FRAMES and most_bytes <= MAX_BYTES
    assert grown_mib < 64, f"RSS grew by {grown_mib:.0f} MiB while a client did not read"
    # When it finally reads: what was in its socket, then the close frame with the code and the reason.
    frames, closed = await read_until_closed(ws)
    assert closed.rcvd is not None and closed.rcvd.code == 1008, closed
    assert "not reading replies" in closed.rcvd.reason
    assert all(unpackb(f)["type"] == "error" for f in frames)
    await wait_gone(strict, session_id)


async def test_a_peer_that_stops_reading_and_goes_silent_is_closed(strict):
    """Keepalive alone never closes it (its ping waits for the full write buffer); the reply timeout does."""
    opened = time.monotonic()
    ws, session_id = await open_unread(strict)
    await stall_writes(strict, ws, session_id)
    if time.monotonic() - opened > PING_INTERVAL_S:
        pytest.skip("the machine was too slow to stall the writes before the first keepalive ping")
    # Now silence: nothing sent, nothing read. The keepalive ping, due 3 s after opening, waits behind the
    # stalled writes and its timeout never starts; the reply timeout closes the peer.
    while probe(strict, session_id)["open"]:
        assert time.monotonic() - opened < REPLY_TIMEOUT_S + 15, "a peer that stopped reading was never closed"
        await asyncio.sleep(0.1)
    frames, closed = await read_until_closed(ws)
    assert closed.rcvd is not None and closed.rcvd.code == 1008 and "not reading replies" in closed.rcvd.reason
    await wait_gone(strict, session_id)


async def wait_gone(server: ServerThread, session_id: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while session_of(server, session_id) is not None:
        assert time.monotonic() < deadline, "the closed session was never removed"
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def patient():
    """A roomy outbox and a long reply timeout: a robot may fall behind for a while."""
    limits = SessionLimits(max_outbox_frames=100_000, max_outbox_bytes=64 * 2**20, reply_timeout_s=60, idle_timeout_s=0)
    with ServerThread(
        tiny_engine_loader("distilled"), warmup=False, session_limits=limits, observation_rate=RateLimit(0)
    ) as server:
        yield server


def unread_chunks(session) -> int:
    outbox = getattr(session, "outbox", None)
    return outbox.waiting("action_chunk") if outbox is not None else 0


async def test_a_robot_behind_on_its_replies_keeps_only_its_newest_chunk(patient):
    ws, session_id = await open_unread(patient)
    await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8}))
    # Fill the socket buffers with error replies until the server's writes stall.
    deadline = time.monotonic() + 20
    bogus_sent = 0
    while probe(patient, session_id)["transport_bytes"] < WRITE_LIMIT_BYTES:
        assert time.monotonic() < deadline
        for _ in range(100):
            await ws.send(BOGUS)
        bogus_sent += 100
    # Stream observations while not reading: the engine answers them, the chunks cannot leave.
    sent = list(range(30))
    most_chunks = 0
    for seq in sent:
        await ws.send(packb({"type": "observation", "seq": seq, "image": rgb_image(32, seed=seq)}))
        await asyncio.sleep(0.1)
        most_chunks = max(most_chunks, patient.run(lambda: unread_chunks(patient.server.context.sessions[session_id])))
    await asyncio.sleep(1.0)  # the last observation's chunk
    assert most_chunks <= 1, "the outbox held more than the newest unread chunk"
    replies: dict[int, dict] = {}
    errors = 0
    while len(replies) < len(sent):
        frame = unpackb(await asyncio.wait_for(ws.recv(), 30))
        if frame["type"] == "session":
            continue
        if frame["type"] == "error" and frame["seq"] is None:
            errors += 1  # the bogus frames' replies, all still delivered
            continue
        assert frame["seq"] not in replies, f"seq {frame['seq']} answered twice"
        replies[frame["seq"]] = frame
    await ws.close()
    assert errors == bogus_sent
    unread = [f for f in replies.values() if f["type"] == "dropped" and f["message"] == UNREAD_CHUNK_MESSAGE]
    assert unread, "no unread chunk was replaced by a newer one"
    assert all(f["reason"] == "superseded" for f in unread)
    assert replies[sent[-1]]["type"] == "action_chunk"
    assert sum(f["type"] == "action_chunk" for f in replies.values()) <= len(sent) - len(unread)


IDLE_S = 2.0


@pytest.fixture(scope="module")
def idle_limited():
    limits = SessionLimits(idle_timeout_s=IDLE_S)
    with ServerThread(tiny_engine_loader("distilled"), warmup=False, session_limits=limits, max_sessions=2) as server:
        yield server


async def test_idle_connections_are_closed_and_cannot_fill_the_session_limit(idle_limited):
    url = f"ws://127.0.0.1:{idle_limited.port}"
    native = await connect(url + "/v1/actions/realtime", proxy=None, max_size=None)
    openpi = await connect(url + "/openpi", proxy=None, max_size=None)
    await native.recv(), await openpi.recv()
    await native.send(packb({"type": "configure", "domain_name": DOMAIN}))  # configured, but no observation
    with pytest.raises(InvalidStatus):  # the slots are full now
        await connect(url + "/v1/actions/realtime", proxy=None)
    for ws in (native, openpi):
        _, closed = await read_until_closed(ws, timeout=10 * IDLE_S)
        assert closed.rcvd is not None and closed.rcvd.code == 1008 and closed.rcvd.reason.startswith("idle"), closed
    # A real robot gets in, and one that keeps sending observations is not idle.
    deadline = time.monotonic() + 10
    while idle_limited.run(lambda: len(idle_limited.server.context.sessions)):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    async with connect(url + "/v1/actions/realtime", proxy=None, max_size=None) as robot:
        assert unpackb(await robot.recv())["limits"]["idle_timeout_s"] == IDLE_S
        await robot.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8}))
        assert unpackb(await robot.recv())["type"] == "session"
        for seq in range(int(3 * IDLE_S / 0.25)):  # 3 idle timeouts long
            await robot.send(packb({"type": "observation", "seq": seq, "image": rgb_image(32)}))
            reply = unpackb(await asyncio.wait_for(robot.recv(), 30))
            assert reply["type"] == "action_chunk", reply
            await asyncio.sleep(0.25)


async def test_a_4096_square_camera_frame_fits_the_default_frame_limit(patient):
    """The models' largest image (4096x4096x3, 48 MiB) must not be cut off by the frame limit (1009)."""
    async with connect(patient.url, proxy=None, max_size=None, compression=None) as ws:
        limits = unpackb(await ws.recv())["limits"]
        side = limits["max_image_side"]
        image = np.zeros((side, side, 3), np.uint8)
        frame = packb({"type": "observation", "seq": 1, "image": image})
        assert len(frame) <= limits["max_message_bytes"]
        await ws.send(frame)  # before `configure`: parsed and size-checked, then refused without model work
        reply = unpackb(await asyncio.wait_for(ws.recv(), 60))
        assert reply["type"] == "error" and reply["code"] == "not_configured", reply


async def test_shutdown_does_not_wait_forever_for_a_client_that_does_not_read():
    """websockets' own close() waits for the write buffer to drain, which never happens here."""
    limits = SessionLimits(reply_timeout_s=0, idle_timeout_s=0, close_grace_s=1)  # shutdown on its own
    server = ServerThread(
        tiny_engine_loader("distilled"), warmup=False, session_limits=limits, ping_interval=None
    ).start()
    try:
        ws, session_id = await open_unread(server)
        await stall_writes(server, ws, session_id)
        flooding = asyncio.create_task(flood(ws))  # still sending, never reading, while the server stops
        started = time.monotonic()
        await asyncio.to_thread(server.stop, 60)
        assert not server._thread.is_alive(), "shutdown hung on a client that does not read"
        assert time.monotonic() - started < 30
        flooding.cancel()
        await flooding
    finally:
        server.stop(5)
