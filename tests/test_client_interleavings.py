"""The robot client under the interleavings that lose things: each test drives one order of events between
the client's tasks (reader, sender) and its callers, over real WebSocket servers on 127.0.0.1 that speak
the protocol's frames, and checks that no observation, chunk or waiting call is lost, counted twice or left
hanging until its timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from robot_clients import AsyncPolicyClient, ConnectionLost
from robot_clients.client import LatestObservationSender
from robot_clients.protocol import PROTOCOL_VERSION, action_chunk_frame, reset_done_frame
from robot_clients.wire_codec import packb, unpackb

IMAGE = np.zeros((16, 16, 3), np.uint8)
METADATA = packb({"type": "metadata", "protocol_version": PROTOCOL_VERSION, "defaults": {}})


def chunk_frame(seq: int, session_id: str | None = None) -> bytes:
    frame = action_chunk_frame(seq, np.zeros((2, 3), np.float32), {}, {})
    if session_id is not None:
        frame["session_id"] = session_id
    return packb(frame)


@contextlib.asynccontextmanager
async def scripted_server(
    handler: Callable[[ServerConnection], Awaitable[None]], process_request: Any = None
) -> AsyncIterator[str]:
    async with serve(handler, "127.0.0.1", 0, process_request=process_request, close_timeout=1.0) as listener:
        yield f"ws://127.0.0.1:{listener.sockets[0].getsockname()[1]}"


async def until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Yield to the loop until ``condition()`` holds (the interleaving's next step is in place)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"never reached: {what}"
        await asyncio.sleep(0.005)


async def test_calls_waiting_for_a_reconnect_that_gives_up_fail_at_once():
    """The connection drops; while the client reconnects, the robot calls ``infer`` (its observation waits for
    the new connection) and ``configure`` (it waits for the connection); then reconnecting fails for good
    (the server answers 403). Both must fail with ConnectionLost then, not wait out their timeout (here
    none: they hung forever)."""
    connections: list[ServerConnection] = []
    reconnecting = asyncio.Event()
    refuse = asyncio.Event()

    async def process_request(connection: ServerConnection, request: Any) -> Any:
        if not connections:
            return None  # the first handshake is served
        reconnecting.set()
        await refuse.wait()
        return connection.respond(HTTPStatus.FORBIDDEN, "not any more\n")

    async def handler(ws: ServerConnection) -> None:
        connections.append(ws)
        await ws.send(METADATA)
        with contextlib.suppress(Exception):
            async for _ in ws:
                pass

    async with scripted_server(handler, process_request) as url:
        client = AsyncPolicyClient(url, backoff_initial=0.01, backoff_max=0.01)
        await client.connect()
        try:
            await connections[0].close()  # the server goes away
            await asyncio.wait_for(reconnecting.wait(), 5)  # the client's reader is reconnecting
            assert not client.connected
            inferring = asyncio.create_task(client.infer(IMAGE, timeout=None))
            configuring = asyncio.create_task(client.configure(timeout=None, domain_name="any"))
            await until(lambda: client._sender is not None and client._sender.waiting == 0, "observation 0 waits")  # noqa: SLF001
            refuse.set()  # reconnecting now fails for good
            for call in (inferring, configuring):
                with pytest.raises(ConnectionLost):
                    await asyncio.wait_for(call, 5)
        finally:
            refuse.set()
            await client.close()


async def test_an_observation_whose_write_failed_while_a_newer_one_waited_is_reported_replaced():
    """The link drops while an observation is being written (on a slow link, a large frame's write waits for
    the socket to drain), and a newer one of the same session waits behind it. The write fails: the newer
    one is sent on the next connection, and the one whose write failed must be reported replaced, not
    vanish (it was neither sent nor counted)."""
    received: list[bytes] = []

    async def reading(ws: ServerConnection) -> None:
        async for message in ws:
            received.append(bytes(message))  # type: ignore[arg-type]

    async with scripted_server(reading) as url:
        async with connect(url) as lost, connect(url) as next_link:
            await lost.close()  # the link is gone; the client has not noticed yet
            link = lost

            async def connection() -> Any:
                return link

            sent: list[int] = []
            replaced: list[int] = []
            sender = LatestObservationSender(
                lambda: link, connection, replaced.append, lambda seq, nbytes: sent.append(seq), poll_s=0.001
            )
            sender.put(0, b"0")  # the link looks free: 0 is taken to be written
            sender.put(1, b"1")  # 1 waits behind it
            await until(lambda: sender.waiting == 1 and sender._sending is None, "the write of 0 failed")  # noqa: SLF001
            link = next_link  # the client reconnected
            await until(lambda: bool(sent), "1 sent on the new connection")
            await sender.close()
            assert sent == [1]
            assert replaced == [0]  # every observation put is sent or reported replaced
        await until(lambda: bool(received), "the server read 1")
        assert received == [b"1"]
