"""A server that breaks the protocol cannot take the robot down with it: the client decodes each server frame
within the element budget the server holds robots to, closes a connection whose frames it cannot decode,
and tells the robot with a typed error instead of building millions of objects or hanging; a malformed answer
ends only its call, floods of frames about nothing the robot sent are counted and dropped, and a server that
never says hello fails connect() within its timeout. (The same rules, without sockets, are table tests in
test_client_state.py.)

The servers here are real WebSocket servers on 127.0.0.1 that answer with frames no honest server sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import tracemalloc

import numpy as np
import pytest
from websockets.asyncio.server import serve
from websockets.frames import CloseCode

from robot_clients import AsyncPolicyClient, MalformedServerFrame
from robot_clients.client_state import ConnectionLost, decode_server_frame
from robot_clients.protocol import PROTOCOL_VERSION, ActionChunkFrame
from robot_clients.wire_codec import FRAME_MAX_VALUES, WireLimitError, packb, unpackb

METADATA = packb({"type": "metadata", "protocol_version": PROTOCOL_VERSION, "defaults": {}})
# A msgpack array of 2 million nils: 2 MB on the wire, 2 million Python objects decoded.
NIL_BOMB = b"\xdd" + struct.pack(">I", 2_000_000) + b"\xc0" * 2_000_000
# Truncated msgpack: a map that announces one entry and ends.
TRUNCATED = b"\x81"


@contextlib.asynccontextmanager
async def hostile_server(first: bytes, reply: bytes):
    """Sends ``first`` as its hello, then answers the client's first frame with ``reply``; records how the
    client closed the connection."""
    closed: list[int | None] = []

    async def handler(ws):
        await ws.send(first)
        with contextlib.suppress(Exception):
            await ws.recv()
            await ws.send(reply)
            await ws.wait_closed()
        closed.append(ws.close_code)

    async with serve(handler, "127.0.0.1", 0, max_size=None, close_timeout=1.0) as listener:
        yield f"ws://127.0.0.1:{listener.sockets[0].getsockname()[1]}", closed


def test_a_frame_past_the_budget_is_refused_before_it_is_built():
    tracemalloc.start()
    try:
        with pytest.raises(WireLimitError):
            decode_server_frame(NIL_BOMB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20  # counted from its type bytes: far less than the ~16 MB of a built list
    assert FRAME_MAX_VALUES < 2_000_000


@pytest.mark.parametrize(
    "reply,code", [(NIL_BOMB, CloseCode.MESSAGE_TOO_BIG), (TRUNCATED, CloseCode.INVALID_DATA)], ids=["bomb", "cut"]
)
async def test_a_reply_the_client_cannot_decode_ends_the_connection_with_a_typed_error(reply, code):
    image = np.zeros((64, 64, 3), np.uint8)
    async with hostile_server(METADATA, reply) as (url, closed):
        client = AsyncPolicyClient(url, reconnect=False)
        await client.connect()
        try:
            with pytest.raises(ConnectionLost, match=f"code {int(code)}"):
                await asyncio.wait_for(client.infer({"image": image}), 30)
            assert not client.connected
        finally:
            await client.close()
        for _ in range(100):  # the server's handler ends once it has seen the close
            if closed:
                break
            await asyncio.sleep(0.05)
        assert closed == [code]


async def test_a_hello_the_client_cannot_decode_fails_the_connect():
    async with hostile_server(NIL_BOMB, b"") as (url, _closed):
        client = AsyncPolicyClient(url, reconnect=False, connect_timeout=3.0)
        with pytest.raises(ConnectionError, match="first frame could not be decoded"):
            await client.connect()
        await client.close()


@contextlib.asynccontextmanager
async def misbehaving_server(first_answer: dict | None, flood: list[bytes] = ()):
    """Sends a real hello and ``flood``, then answers the first observation with ``first_answer`` (a frame
    that breaks the protocol) and every later one with a real chunk; counts its connections."""
    connections: list[object] = []

    async def handler(ws):
        connections.append(ws)
        await ws.send(METADATA)
        for frame in flood:
            await ws.send(frame)
        with contextlib.suppress(Exception):
            async for message in ws:
                frame = unpackb(message)
                if frame["type"] != "observation":
                    continue
                if first_answer is not None and len(connections) == 1 and not getattr(handler, "answered", False):
                    handler.answered = True
                    await ws.send(packb(first_answer))  # it answers observation 0
                    continue
                await ws.send(
                    packb(ActionChunkFrame(frame["seq"], np.ones((2, 3), np.float32), {}, 2, 0, 3, {}).wire())
                )

    async with serve(handler, "127.0.0.1", 0, max_size=None, close_timeout=1.0) as listener:
        yield f"ws://127.0.0.1:{listener.sockets[0].getsockname()[1]}", connections


@pytest.mark.parametrize(
    "answer,error,reconnects",
    [
        ({"type": "action_chunk", "seq": 0, "actions": "a string", "timing": {}}, MalformedServerFrame, 0),
        ({"type": "action_chunk", "seq": [0], "actions": np.zeros((2, 3), np.float32)}, ConnectionLost, 1),
        ({"type": "action_chunk", "actions": np.zeros((2, 3), np.float32)}, ConnectionLost, 1),
    ],
    ids=["actions-a-string", "seq-a-list", "no-seq"],
)
async def test_a_malformed_chunk_ends_only_its_call_and_the_next_call_gets_its_chunk(answer, error, reconnects):
    """A fake server answers the robot's first observation with a chunk that breaks the protocol. That call
    ends at once with a typed client error, not at its timeout (the reader task died and every later infer
    timed out); the next infer gets its chunk, on the same connection when the chunk named its seq, else
    after a reconnect (a chunk without a readable seq cannot be placed: the client closes the connection)."""
    image = np.zeros((16, 16, 3), np.uint8)
    async with misbehaving_server(answer) as (url, connections):
        client = AsyncPolicyClient(url, backoff_initial=0.01, backoff_max=0.05)
        await client.connect()
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(error):
                await client.infer(image, timeout=20)
            assert loop.time() - started < 10  # ended by the frame, not by its timeout
            chunk = await client.infer(image, timeout=20)
            assert chunk.actions.tolist() == [[1.0] * 3] * 2
            assert client.stats.malformed == 1
            assert client.stats.reconnects == reconnects and len(connections) == 1 + reconnects
        finally:
            await client.close()


async def test_unsolicited_floods_are_counted_and_dropped():
    """Chunks about observations the robot never sent (40 of 4 MiB here; benchmarks/attack_client_flood.py
    sends 40 of 40 MiB) and drops with reasons of their own are counted and dropped: the robot keeps none of
    them, its counters stay a handful, and its own infer after the flood gets its chunk."""
    actions = np.zeros((2**20, 1), np.float32)  # 4 MiB
    chunks = [packb({"type": "action_chunk", "seq": 1000 + i, "actions": actions, "timing": {}}) for i in range(40)]
    drops = [packb({"type": "dropped", "seq": 10**6 + i, "reason": f"reason {i}", "message": ""}) for i in range(5000)]
    async with misbehaving_server(None, chunks + drops) as (url, _connections):
        client = AsyncPolicyClient(url, reconnect=False)
        await client.connect()
        try:
            tracemalloc.start()
            chunk = await client.infer(np.zeros((16, 16, 3), np.uint8), timeout=60)
            current, _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert chunk.seq == 0
            assert client.stats.unsolicited == 40 + 5000
            assert not client.stats.dropped and client.stats.answered == 1
            assert current < 8 * 2**20, current  # none of the 160 MiB of chunks is kept
        finally:
            await client.close()


async def test_connect_gives_up_on_a_server_that_never_says_hello():
    """The server accepts the WebSocket and never sends its metadata: connect() gives up within
    ``connect_timeout`` (it waited forever)."""

    done = asyncio.Event()

    async def silent(ws):
        await done.wait()

    async with serve(silent, "127.0.0.1", 0, close_timeout=0.5) as listener:
        client = AsyncPolicyClient(f"ws://127.0.0.1:{listener.sockets[0].getsockname()[1]}", connect_timeout=1.0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(client.connect(), 30)
            assert loop.time() - started < 1.0 + 5.0
        finally:
            done.set()
            await client.close()
