"""A server that breaks the protocol cannot take the robot down with it: the client decodes each server frame
within the element budget the server holds robots to, closes a connection whose frames it cannot decode,
and tells the robot with a typed error instead of building millions of objects or hanging.

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

from robot_clients import AsyncPolicyClient
from robot_clients.client_state import ConnectionLost, decode_server_frame
from robot_clients.protocol import PROTOCOL_VERSION
from robot_clients.wire_codec import FRAME_MAX_VALUES, WireLimitError, packb

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
