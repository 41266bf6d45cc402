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

from robot_clients import AsyncPolicyClient, ConnectionLost, ObservationDropped
from robot_clients.client import ObservationSender
from robot_clients.client_state import ClientState
from robot_clients.protocol import (
    PROTOCOL_VERSION,
    ActionChunkFrame,
    MetadataFrame,
    ResetDoneFrame,
    SessionFrame,
    SessionState,
    SessionUpdatedFrame,
)
from robot_clients.wire_codec import packb, unpackb

IMAGE = np.zeros((16, 16, 3), np.uint8)
METADATA = packb({"type": "metadata", "protocol_version": PROTOCOL_VERSION, "defaults": {}})


def chunk_frame(seq: int) -> bytes:
    return packb(ActionChunkFrame(seq, np.zeros((2, 3), np.float32), {}, 2, 0, 3, {}).wire())


class ScriptedServer:
    """A WebSocket server on 127.0.0.1 that speaks just enough of the protocol for one interleaving.

    Each connection gets the metadata frame, is kept in ``connections``, and each frame it reads is kept in
    ``read`` and answered with ``answer(frame)`` (nothing when that returns None). Reading starts once
    ``drained`` is set (set from the start unless ``draining=False``: a link that does not drain).

    Every handshake after the first (the client reconnecting) sets ``reconnecting``. With
    ``hold_reconnects``, it then waits for ``release`` and is served, or refused with the status ``refuse``;
    without, it is refused with ``refuse`` (when given) until ``release`` is set, and served after.
    """

    def __init__(
        self,
        answer: Callable[[dict[str, Any]], bytes | None] = lambda frame: None,
        *,
        draining: bool = True,
        hold_reconnects: bool = False,
        refuse: HTTPStatus | None = None,
    ) -> None:
        self.answer = answer
        self.hold_reconnects = hold_reconnects
        self.refuse = refuse
        self.connections: list[ServerConnection] = []
        self.read: list[dict[str, Any]] = []
        self.drained = asyncio.Event()
        if draining:
            self.drained.set()
        self.reconnecting = asyncio.Event()
        self.release = asyncio.Event()

    async def _handshake(self, connection: ServerConnection, request: Any) -> Any:
        if not self.connections:
            return None
        self.reconnecting.set()
        if self.hold_reconnects:
            await self.release.wait()
        elif self.release.is_set():
            return None
        return None if self.refuse is None else connection.respond(self.refuse, "not now\n")

    async def _serve(self, ws: ServerConnection) -> None:
        self.connections.append(ws)
        await ws.send(METADATA)
        await self.drained.wait()
        with contextlib.suppress(Exception):
            async for message in ws:
                self.read.append(unpackb(message))
                reply = self.answer(self.read[-1])
                if reply is not None:
                    await ws.send(reply)

    @contextlib.asynccontextmanager
    async def serving(self, close_timeout: float = 1.0) -> AsyncIterator[str]:
        """Listen on an ephemeral port; yield the URL."""
        async with serve(
            self._serve, "127.0.0.1", 0, process_request=self._handshake, max_size=None, close_timeout=close_timeout
        ) as listener:
            yield f"ws://127.0.0.1:{listener.sockets[0].getsockname()[1]}"


def answer_chunks(frame: dict[str, Any]) -> bytes | None:
    """Answer each observation with a chunk, and a reset with ``reset_done``."""
    if frame["type"] == "reset":
        return packb(ResetDoneFrame("s").wire())
    return chunk_frame(frame["seq"]) if frame["type"] == "observation" else None


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
    server = ScriptedServer(hold_reconnects=True, refuse=HTTPStatus.FORBIDDEN)
    async with server.serving() as url:
        client = AsyncPolicyClient(url, backoff_initial=0.01, backoff_max=0.01)
        await client.connect()
        try:
            await server.connections[0].close()  # the server goes away
            await asyncio.wait_for(server.reconnecting.wait(), 5)  # the client's reader is reconnecting
            assert not client.connected
            inferring = asyncio.create_task(client.infer(IMAGE, timeout=None))
            configuring = asyncio.create_task(client.configure(timeout=None, domain_name="any"))
            await until(lambda: client._state.waiting_seq == 0, "observation 0 waits")  # noqa: SLF001
            streamed = await client.submit(IMAGE, session_id="env-b")  # waits too, beside 0
            server.release.set()  # reconnecting now fails for good
            for call in (inferring, configuring):
                with pytest.raises(ConnectionLost):
                    await asyncio.wait_for(call, 5)
            # Neither observation was sent, and each is counted so (none forgotten).
            await until(lambda: client.stats.dropped["unsent"] == 2, f"both counted unsent ({streamed} too)")
            assert client.stats.sent == 0
        finally:
            server.release.set()
            await client.close()


async def test_an_observation_whose_write_failed_while_a_newer_one_waited_is_reported_replaced():
    """The link drops while an observation is being written (on a slow link, a large frame's write waits for
    the socket to drain), and a newer one of the same session waits behind it. The write fails: the newer
    one is sent on the next connection, and the one whose write failed must be reported replaced, not
    vanish (it was neither sent nor counted)."""
    server = ScriptedServer()
    async with server.serving() as url:
        async with connect(url) as lost, connect(url) as next_link:
            await lost.close()  # the link is gone; the client has not noticed yet
            link = lost

            async def connection() -> Any:
                return link

            state = ClientState(lambda: 0.0)
            state.connection_opened(MetadataFrame("s", {}), None)
            sender = ObservationSender(state, lambda: link, connection, state.events, poll_s=0.001)
            sender.put(0, packb({"type": "observation", "seq": 0}))  # the link looks free: 0 is taken to be written
            sender.put(1, packb({"type": "observation", "seq": 1}))  # 1 waits behind it
            await until(lambda: state.waiting_seq == 1 and state.sending is None, "the write of 0 failed")
            link = next_link  # the client reconnected
            await until(lambda: state.stats.sent == 1, "1 sent on the new connection")
            await sender.close()
            assert state.stats.sent == 1
            assert state.stats.dropped["unsent"] == 1  # 0: every observation put is sent or reported replaced
        await until(lambda: bool(server.read), "the server read 1")
        assert [frame["seq"] for frame in server.read] == [1]


async def test_an_infer_sent_after_a_reset_gets_its_chunk():
    """A reset is on its way (the server has read it); meanwhile the robot's next ``infer`` sends its
    observation, which the server reads after the reset and answers. The reset's ``reset_done`` comes first,
    then the chunk: the infer must return that chunk, not be failed as dropped by the reset (the server
    answered every observation the reset dropped with its own ``dropped`` frame), and the chunk must not turn
    up in the stream instead."""
    server = ScriptedServer()
    read = server.read
    async with server.serving() as url:
        async with AsyncPolicyClient(url, reconnect=False) as client:
            resetting = asyncio.create_task(client.reset(timeout=5))
            await until(lambda: [f["type"] for f in read] == ["reset"], "the server read the reset")
            inferring = asyncio.create_task(client.infer(IMAGE, timeout=5))
            await until(lambda: [f["type"] for f in read] == ["reset", "observation"], "the server read observation 0")
            await server.connections[0].send(packb(ResetDoneFrame("s").wire()))
            await asyncio.wait_for(resetting, 5)
            await server.connections[0].send(chunk_frame(read[1]["seq"]))
            chunk = await asyncio.wait_for(inferring, 5)
            assert chunk.seq == 0
            assert client.stats.answered == 1 and not client.stats.dropped
            with pytest.raises(TimeoutError):
                await client.receive(timeout=0.05)


async def test_a_reset_drops_the_observation_still_waiting_on_the_robot():
    """On a link that does not drain, an ``infer``'s observation waits on the robot to be sent when the robot
    resets its session. It must be dropped there (``unsent``): sent after the reset, the server would answer
    it, and its pre-reset actions would reach the robot's stream after the reset."""
    frame = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    server = ScriptedServer(answer_chunks, draining=False)  # a link that does not drain, until the test lets it
    read = server.read
    async with server.serving() as url:
        async with AsyncPolicyClient(url, reconnect=False) as client:
            state = client._state  # noqa: SLF001
            while state.waiting_seq is None:  # streamed observations fill the link until one has to wait
                await client.submit({"image": frame})
                await asyncio.sleep(0.01)
            inferring = asyncio.create_task(client.infer({"image": frame}, timeout=30))
            await until(lambda: state.waiting_seq == state.next_seq - 1, "the infer's observation waits")
            seq = state.next_seq - 1
            resetting = asyncio.create_task(client.reset(timeout=30))
            await asyncio.sleep(0.05)
            server.drained.set()
            await asyncio.wait_for(resetting, 30)
            with pytest.raises(ObservationDropped) as dropped:
                await asyncio.wait_for(inferring, 30)
            assert dropped.value.reason == "unsent"
            await until(lambda: state.waiting_seq is None and state.sending is None, "the link is idle")
            await asyncio.sleep(0.1)
            assert seq not in [f.get("seq") for f in read]  # never sent
            assert "reset" in [f["type"] for f in read]


async def test_receive_without_time_to_wait_returns_a_chunk_that_already_came():
    """A robot that polls (``receive(timeout=0)``) between control steps: a chunk that arrived before the call
    is returned, not reported as not arrived in time while it waits in the stream."""
    async with ScriptedServer(answer_chunks).serving() as url:
        async with AsyncPolicyClient(url, reconnect=False) as client:
            seq = await client.submit(IMAGE)
            await until(lambda: client.stats.answered == 1, "the chunk came")
            assert (await client.receive(timeout=0)).seq == seq
            with pytest.raises(TimeoutError):
                await client.receive(timeout=0)  # and nothing else


async def test_closing_while_a_reconnect_is_being_made_closes_the_new_connection():
    """``close()`` is called while the reader's reconnect handshake is under way; the handshake then succeeds.
    The new connection must be closed at once (it was left open, the client reading it, until close() gave
    up on the reader after 5 s and cancelled it), and the client must not say it is connected."""
    server = ScriptedServer(hold_reconnects=True)
    connections = server.connections
    async with server.serving() as url:
        client = AsyncPolicyClient(url, backoff_initial=0.01, backoff_max=0.01)
        await client.connect()
        await connections[0].close()
        await asyncio.wait_for(server.reconnecting.wait(), 5)  # the reader is reconnecting
        loop = asyncio.get_running_loop()
        started = loop.time()
        closing = asyncio.create_task(client.close())
        await asyncio.sleep(0.05)
        server.release.set()  # the reconnect's handshake completes after close() was called
        await asyncio.wait_for(closing, 10)
        assert loop.time() - started < 2.0
        assert not client.connected
        await until(lambda: len(connections) == 2, "the server saw the reconnect")
        await asyncio.wait_for(connections[1].wait_closed(), 2)


async def test_an_infer_that_timed_out_while_reconnecting_leaves_nothing_to_be_sent():
    """An ``infer`` made while the client reconnects times out with its observation still waiting for the new
    connection. The call is over (TimeoutError cancels the observation): the observation must not be sent
    once the client reconnects, where it would be answered and its chunk handed to the next ``receive``."""
    server = ScriptedServer(answer_chunks, hold_reconnects=True)
    read = server.read
    async with server.serving() as url:
        async with AsyncPolicyClient(url, backoff_initial=0.01, backoff_max=0.01) as client:
            await server.connections[0].close()
            await asyncio.wait_for(server.reconnecting.wait(), 5)
            with pytest.raises(TimeoutError):
                await client.infer(IMAGE, timeout=0.1)  # its observation waits for the new connection
            server.release.set()
            await until(lambda: client.connected, "reconnected")
            later = await client.submit(IMAGE)
            assert (await client.receive(timeout=5)).seq == later  # the timed-out one's chunk never comes
            assert [frame["seq"] for frame in read] == [later]
            assert client.stats.dropped["unsent"] == 1


async def test_a_chunk_that_comes_after_its_infer_timed_out_does_not_make_older_chunks_stale():
    """Observation 0 is streamed and its chunk waits in the stream; ``infer`` sends 1 and times out, and while
    its cancel waits for a link that does not drain, chunk 1 comes. That chunk reaches nobody (the call
    raised TimeoutError), so it is not delivered: chunk 0, the newest the robot can still have, must not be
    discarded as older than a chunk the robot never got."""
    big = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    server = ScriptedServer(draining=False)  # reads nothing until drained: the link from the robot does not drain
    connections = server.connections
    async with server.serving() as url:
        client = AsyncPolicyClient(url, reconnect=False, max_buffered_bytes=None)
        await client.connect()
        try:
            streamed = await client.submit(IMAGE)
            inferring = asyncio.create_task(client.infer(IMAGE, timeout=3.0))
            await until(lambda: client.stats.sent == 2, "observation 1 sent")
            await connections[0].send(chunk_frame(streamed))
            await until(lambda: client.stats.answered == 1, "chunk 0 in the stream")
            with pytest.raises(asyncio.TimeoutError):  # streamed frames fill the link until one cannot leave
                while True:
                    await asyncio.wait_for(client.submit({"image": big}), 0.5)
            assert not inferring.done()
            waiter = client._infers[streamed + 1]  # noqa: SLF001
            await until(waiter.done, "the infer timed out", timeout=10)  # its cancel now waits for the link
            assert not inferring.done()
            await connections[0].send(chunk_frame(streamed + 1))
            await until(lambda: client.stats.answered == 2, "chunk 1 came")
            server.drained.set()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(inferring, 10)
            assert (await client.receive(timeout=1)).seq == streamed
            assert client.stats.stale == 0
        finally:
            server.drained.set()
            await client.close()


async def test_a_late_reply_to_a_configure_that_timed_out_does_not_answer_the_next_control_call():
    """``configure`` times out (the server is slow to answer it), then the robot calls ``reset``. The
    configure's ``session`` reply comes after all: control replies carry no seq, and it must not be taken
    for the reset's answer (reset returned before the server had reset anything, and its own ``reset_done``
    would then answer the control call after it)."""
    scripted = ScriptedServer()
    read = scripted.read
    async with scripted.serving() as url:
        async with AsyncPolicyClient(url, reconnect=False) as client:
            server = scripted.connections[0]
            with pytest.raises(TimeoutError):
                await client.configure(timeout=0.1, domain_name="slow")
            resetting = asyncio.create_task(client.reset(timeout=5))
            await until(lambda: [f["type"] for f in read] == ["configure", "reset"], "the server read the reset")
            await server.send(packb(SessionFrame("s", {"domain_name": "slow"}, SessionState.RUNNING).wire()))
            # A frame after it, to know the client has read the late reply.
            await server.send(packb(SessionUpdatedFrame("s", {"prompt": "marker"}, ("prompt",), "test").wire()))
            await until(lambda: client.session.get("prompt") == "marker", "the client read both frames")
            assert not resetting.done()  # the late configure reply did not answer it
            await server.send(packb(ResetDoneFrame("s").wire()))
            await asyncio.wait_for(resetting, 5)
            configuring = asyncio.create_task(client.configure(timeout=5, action_horizon=8))
            await until(lambda: len(read) == 3, "the server read the second configure")
            await server.send(packb(SessionFrame("s", {"action_horizon": 8}, SessionState.RUNNING).wire()))
            assert await asyncio.wait_for(configuring, 5) == {"action_horizon": 8}


async def test_an_observation_waiting_when_the_client_closes_is_not_sent_after_it_connects_again():
    """An observation waits for a reconnect when the robot closes the client; later it connects the same
    client again. The observation belongs to the closed connection's calls: it is counted unsent at the
    close, and never sent on the new connection (it was, ahead of the robot's newer observations)."""
    server = ScriptedServer(refuse=HTTPStatus.SERVICE_UNAVAILABLE)  # the client retries, until released
    read = server.read
    async with server.serving() as url:
        client = AsyncPolicyClient(url, backoff_initial=0.01, backoff_max=0.01)
        await client.connect()
        try:
            await server.connections[0].close()
            await until(lambda: not client.connected, "the client saw the connection close")
            before = await client.submit(IMAGE)  # waits for a connection that does not come
            await client.close()
            assert client.stats.dropped["unsent"] == 1
            server.release.set()
            await client.connect()
            after = await client.submit(IMAGE, session_id="env-b")
            await until(lambda: len(read) >= 1, "the server read an observation")
            await asyncio.sleep(0.05)
            assert [frame["seq"] for frame in read] == [after], f"{before} was sent after the close"
        finally:
            server.release.set()
            await client.close()


async def test_an_observation_being_written_when_the_client_closes_is_counted_sent():
    """``close()`` stops the sender while a large observation is being written (its bytes handed to the socket,
    the write waiting for the link to drain). Those bytes leave ahead of the close frame and the server reads
    the observation: it is counted sent, not unsent (which says the server never got it)."""
    big = np.random.default_rng(0).integers(0, 256, (2400, 2400, 3), dtype=np.uint8)  # more than the kernel holds
    connections: list[ServerConnection] = []
    read: list[dict[str, Any]] = []

    async def handler(ws: ServerConnection) -> None:
        connections.append(ws)
        await ws.send(METADATA)
        ws.transport.pause_reading()  # the link does not drain until the test resumes it
        with contextlib.suppress(Exception):
            async for message in ws:
                read.append(unpackb(message))

    async with serve(handler, "127.0.0.1", 0, max_size=None, close_timeout=5.0) as listener:
        url = f"ws://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
        client = AsyncPolicyClient(url, reconnect=False, close_timeout=5.0)
        await client.connect()
        try:
            await until(lambda: bool(connections), "the server has the connection")
            seq = await client.submit({"image": big})
            state = client._state  # noqa: SLF001
            await asyncio.sleep(0.1)
            assert state.sending is not None and state.sending.seq == seq and state.sending.writing  # being written
            closing = asyncio.create_task(client.close())
            await asyncio.sleep(0.05)
            connections[0].transport.resume_reading()
            await asyncio.wait_for(closing, 10)
            await until(lambda: bool(read), "the server read the observation")
            assert [frame["seq"] for frame in read] == [seq]
            assert client.stats.sent == 1 and client.stats.dropped["unsent"] == 0, client.stats
        finally:
            await client.close()
