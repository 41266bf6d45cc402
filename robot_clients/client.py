"""The robot's clients of the native realtime protocol (version 1): ``AsyncPolicyClient`` (asyncio) and
``PolicyClient`` (blocking, on top of it).

One round trip::

    with PolicyClient("ws://robot-server:8000") as client:
        client.configure(domain_name="droid_lerobot")
        while running:
            chunk = client.infer({"image": camera.read()}, timeout=0.5)
            robot.execute(chunk.actions)

Streaming (send without waiting; each chunk comes back as soon as it is ready)::

    seq = await client.submit({"image": rgb})
    chunk = await client.receive(timeout=0.5)

Guarantees:

* A chunk for an older ``seq`` than the latest one already handed to the robot is never handed over
  (it is counted in ``stats.stale``). Late actions are wrong actions.
* If the connection drops, the client reconnects in the background with exponential backoff, reads the
  new metadata and re-sends its configuration. Calls waiting on the lost connection fail with
  :class:`ConnectionLost`; the next call waits for the new connection (within its timeout).
* Operator controls are honoured: while an operator has the session paused (``session_state``
  ``"paused"``), ``infer`` and ``submit`` raise :class:`SessionPaused` without sending and the robot
  should hold (``wait_until_running`` waits for the resume); once stopped, calls raise
  :class:`SessionStopped` and the client does not reconnect. A prompt set by an operator replaces the
  client's own, also after a reconnect.
* On a slow link at most one observation waits to be sent and a newer one replaces it, so the newest
  frame overtakes instead of queueing behind stale ones (``max_buffered_bytes``).
* A broken or hostile server cannot take the robot down: a malformed answer ends only its call
  (:class:`MalformedServerFrame`), frames about nothing the robot sent are counted and dropped, and what
  the client keeps is bounded; ``connect()`` gives up within ``connect_timeout``.

This module is the I/O: sockets, tasks, futures and the clock. Every rule of the protocol (what a frame
answers, what is counted, sent or never sent) is :class:`~robot_clients.client_state.ClientState`'s, which
does no I/O; the chunks, errors and counters a call returns are declared there too. Imports only numpy,
msgpack (through the wire codec) and websockets (Pillow to encode frames): it runs on the robot.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from ssl import SSLContext
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from . import protocol
from .camera_frames import ImageEncoding, canvas_bins, encode_frame, resize_frame, send_size
from .client_state import (
    PAUSED,
    RUNNING,
    STOPPED,
    ActionChunk,
    ClientState,
    ClientStats,
    CloseConnection,
    ConnectionLost,
    ControlAnswered,
    ControlFailed,
    FrameParseError,
    InferAnswered,
    InferFailed,
    MalformedServerFrame,
    ServerError,
    StateChanged,
    Streamed,
    UnknownFrame,
    close_code,
    decode_server_frame,
    parse_server_frame,
)
from .protocol import REALTIME_PATH, ErrorFrame, MetadataFrame, ResetDoneFrame, SessionFrame
from .wire_codec import WireFormatError

try:
    import fcntl
except ImportError:  # not on Linux: the transport's own buffer is all that is counted
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

SUPPORTED_PROTOCOL_VERSION = protocol.PROTOCOL_VERSION

T = TypeVar("T")
# The robot's proprio state as a caller hands it over: [state_dim] or [history_length, state_dim] numbers,
# sent as float32.
RobotState = np.ndarray | Sequence[float] | Sequence[Sequence[float]]


# ---------------------------------------------------------------------------------------------------
# Connecting: the endpoint, the handshake options, backoff
# ---------------------------------------------------------------------------------------------------


def realtime_url(url: str) -> str:
    """Accept ``ws://host:port`` as well as the full endpoint URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"policy server URL must start with ws:// or wss://, got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path=REALTIME_PATH)
    return urlunsplit(parts)


def connect_options(
    *,
    headers: Mapping[str, str] | None,
    token: str | None,
    ssl: SSLContext | None,
    connect_timeout: float,
    ping_interval: float | None,
    ping_timeout: float | None,
    max_message_bytes: int,
    proxy: str | bool | None,
    close_timeout: float,
) -> dict[str, Any]:
    """The keyword arguments of ``websockets.connect`` for these client options."""
    handshake_headers = dict(headers or {})
    if token is not None:
        handshake_headers["Authorization"] = f"Bearer {token}"
    options: dict[str, Any] = dict(
        additional_headers=handshake_headers,
        # Compression costs 30-40 ms per camera frame and gains nothing on pixels.
        compression=None,
        proxy=proxy,
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        max_size=max_message_bytes,
        open_timeout=min(10.0, connect_timeout),
        close_timeout=close_timeout,
    )
    if ssl is not None:
        options["ssl"] = ssl
    return options


@dataclass
class OpenedSession:
    """A connection that has read its metadata and (when there was one) re-sent the configuration."""

    ws: ClientConnection
    metadata: MetadataFrame
    session: SessionFrame | None  # the server's resolved configuration; None when nothing was re-sent


@dataclass(frozen=True)
class Backoff:
    """Reconnect delays, doubling from ``initial`` to ``maximum`` (with ±20 % jitter)."""

    initial: float
    maximum: float

    def delay(self, attempt: int) -> float:
        return min(self.maximum, self.initial * 2.0**attempt) * random.uniform(0.8, 1.2)


async def open_session(
    url: str,
    options: Mapping[str, Any],
    settings: Mapping[str, Any],
    backoff: Backoff,
    deadline: float | None,
    closing: Callable[[], bool],
) -> OpenedSession:
    """Connect with backoff until ``deadline`` (None: forever), read metadata, re-send ``settings``.

    The one place a connection is made, for the first connect and every reconnect alike: it retries while
    the server is loading (HTTP 502/503/504, refused connections). Gives up at once on what retrying cannot
    fix (HTTP 401, another HTTP status, a bad URL, another protocol version), and when ``closing()`` says
    the client is being closed.
    """
    attempt = 0
    # One attempt's connection and hello: a server that accepts the socket and never says hello must not hold
    # the robot past its deadline (websockets bounds the HTTP handshake only).
    attempt_limit = float(options.get("open_timeout") or 10.0)
    while True:
        limit = attempt_limit if deadline is None else max(0.0, min(attempt_limit, deadline - time.monotonic()))
        try:
            return await asyncio.wait_for(_handshake(url, options, settings), limit)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status == 401:  # retrying cannot help: the token is missing or wrong
                raise ConnectionError(
                    f"{url}: the server requires a valid bearer token (HTTP 401); pass token=..."
                ) from None
            if status not in (502, 503, 504):
                raise ConnectionError(f"{url}: the server answered HTTP {status}") from None
            error: Exception = exc
        except (OSError, asyncio.TimeoutError, ConnectionClosed, ConnectionError) as exc:
            error = exc
        except InvalidURI:
            raise
        delay = backoff.delay(attempt)
        attempt += 1
        if closing() or (deadline is not None and time.monotonic() + delay > deadline):
            raise ConnectionError(f"could not connect to {url}: {error}") from None
        logger.debug("connect attempt %d failed (%s); retrying in %.2f s", attempt, error, delay)
        await asyncio.sleep(delay)


async def _handshake(url: str, options: Mapping[str, Any], settings: Mapping[str, Any]) -> OpenedSession:
    ws = await connect(url, **options)
    try:
        return await _hello(ws, url, settings)
    except BaseException:
        # Timed out waiting for the hello, or refused it: this connection will not be used.
        ws.transport.abort()
        raise


async def _read_typed(ws: ClientConnection, url: str, what: str) -> protocol.ServerFrame:
    """The next server frame, parsed; a ``ConnectionError`` when it does not decode or parse."""
    try:
        return parse_server_frame(decode_server_frame(await ws.recv(decode=False)))
    except WireFormatError as exc:
        await ws.close(close_code(exc), f"undecodable {what} frame")
        raise ConnectionError(f"{url}: the server's {what} could not be decoded: {exc}") from None
    except (FrameParseError, UnknownFrame) as exc:
        await ws.close(1002, f"malformed {what} frame")
        raise ConnectionError(f"{url}: the server's {what} is malformed: {exc}") from None


async def _hello(ws: ClientConnection, url: str, settings: Mapping[str, Any]) -> OpenedSession:
    frame = await _read_typed(ws, url, "first frame")
    if not isinstance(frame, MetadataFrame):
        raise ConnectionError(f"expected a metadata frame first, got {type(frame).__name__}")
    if frame.protocol_version != SUPPORTED_PROTOCOL_VERSION:
        await ws.close()
        raise ServerError(
            "protocol_version",
            f"server speaks protocol {frame.protocol_version}, this client {SUPPORTED_PROTOCOL_VERSION}",
        )
    session = None
    if settings:
        await ws.send(ClientState.configure_frame(settings))
        reply = await _read_typed(ws, url, "reply to configure")
        if isinstance(reply, SessionFrame):
            session = reply
        elif isinstance(reply, ErrorFrame):
            logger.warning("the server refused the configuration on reconnect: %s", reply.message)
        else:
            logger.warning("the server answered the configuration on reconnect with %s", type(reply).__name__)
    return OpenedSession(ws, frame, session)


# ---------------------------------------------------------------------------------------------------
# Camera frames on the way out: resized and encoded as the options say
# ---------------------------------------------------------------------------------------------------


class OutgoingFrames:
    """A client's image options, applied to each observation's cameras (``prepare``).

    ``images``: ``"raw"`` (the arrays as they are), ``"jpeg"``, ``"webp"`` or ``"png"`` (quality 90), or an
    :class:`~robot_clients.camera_frames.ImageEncoding` for another quality. ``resize``: shrink every camera
    to the size the server would shrink it to anyway (:func:`robot_clients.camera_frames.send_size` of the
    session's resolution tier, from the ``canvases`` of the server's metadata frame), so the link carries
    only pixels the model conditions on. Named cameras under the ``concat_view`` view point are sized as the
    composed frame the server makes of them (side by side). Encoding needs Pillow; resizing numpy only.
    """

    def __init__(self, images: str | ImageEncoding = "raw", resize: bool = False) -> None:
        self.encoding: ImageEncoding | None = None
        if images != "raw":
            self.encoding = images if isinstance(images, ImageEncoding) else ImageEncoding(str(images))
        self.resize = resize
        self._sizes: dict[tuple[Any, ...], tuple[int, int]] = {}

    @property
    def active(self) -> bool:
        return self.encoding is not None or self.resize

    def prepare(
        self,
        obs: Mapping[str, Any],
        metadata: Mapping[str, Any],
        session: Mapping[str, Any],
        settings: Mapping[str, Any],
    ) -> dict[str, Any]:
        """``obs`` with its cameras resized and encoded (a new map; the caller's arrays are not touched).
        ``session``: the server's resolved configuration; ``settings``: this observation's own."""
        fields = dict(obs)
        if not self.active:
            return fields
        view_point = settings.get("view_point") or session.get("view_point")
        tier = (
            settings.get("resolution_tier")
            or session.get("resolution_tier")
            or (metadata.get("defaults") or {}).get("resolution_tier")
        )
        if isinstance(fields.get("image"), np.ndarray):
            fields["image"] = self._frame(fields["image"], metadata, tier, 1)
        if isinstance(fields.get("video"), np.ndarray):
            fields["video"] = [self._frame(frame, metadata, tier, 1) for frame in fields["video"]]
            if self.encoding is None:
                fields["video"] = np.stack(fields["video"])
        if isinstance(fields.get("images"), Mapping):
            cameras = fields["images"]
            side_by_side = len(cameras) if view_point == "concat_view" else 1
            fields["images"] = {
                name: self._frame(frame, metadata, tier, side_by_side) if isinstance(frame, np.ndarray) else frame
                for name, frame in cameras.items()
            }
        return fields

    def _size(self, frame: np.ndarray, metadata: Mapping[str, Any], tier: Any, side_by_side: int) -> tuple[int, int]:
        height, width = frame.shape[:2]
        key = (height, width, tier, side_by_side)
        if key not in self._sizes:
            canvases = metadata.get("canvases")
            if not canvases or tier is None:
                raise ValueError(
                    "resize=True needs the server's canvases and resolution tier in its metadata frame "
                    "(servers with encoded-frame support send them); pass resize=False"
                )
            size = send_size(height, width * side_by_side, canvas_bins(canvases, int(tier)), side_by_side=side_by_side)
            self._sizes[key] = (size.height, size.width // side_by_side)
        return self._sizes[key]

    def _frame(
        self, frame: np.ndarray, metadata: Mapping[str, Any], tier: Any, side_by_side: int
    ) -> np.ndarray | bytes:
        size = self._size(frame, metadata, tier, side_by_side) if self.resize else None
        if self.encoding is None:
            return resize_frame(frame, *size) if size is not None and size != frame.shape[:2] else frame
        return encode_frame(frame, replace(self.encoding, size=size) if size is not None else self.encoding)


# ---------------------------------------------------------------------------------------------------
# The one observation waiting to be sent (latest wins on the robot)
# ---------------------------------------------------------------------------------------------------


_TIOCOUTQ = 0x5411  # Linux: bytes in a TCP socket's send queue


def buffered_bytes(ws: ClientConnection) -> int:
    """Bytes written to ``ws`` and not yet acknowledged by the server: the transport's write buffer plus,
    on Linux, the socket's send queue."""
    transport = ws.transport
    total = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None and fcntl is not None and sys.platform.startswith("linux"):
        try:
            total += int(struct.unpack("i", fcntl.ioctl(sock.fileno(), _TIOCOUTQ, b"\0\0\0\0"))[0])
        except (OSError, ValueError):  # the socket is closed (its descriptor is -1)
            pass
    return total


class ObservationSender:
    """Writes observations one at a time, latest wins: the I/O of the state's outbox.

    On a slow link, a robot that writes every frame to its socket builds a queue there (the kernel's send
    buffer, the transport's write buffer): the newest frame waits behind all the older ones, and the
    server's "latest wins" cannot help because it never sees the newest. The state
    (:meth:`~robot_clients.client_state.ClientState.observation_ready`) holds at most one observation per
    policy session that is not on the wire yet, a newer one replacing it; this task writes what
    :meth:`~robot_clients.client_state.ClientState.next_write` gives once what the socket still holds is below
    ``max_buffered_bytes``, and tells the state how each write went.

    ``current()`` is the connection now (None while reconnecting), ``connection()`` waits for one (and raises
    when none will come); ``settle()`` acts on the state's events after each change.
    """

    def __init__(
        self,
        state: ClientState,
        current: Callable[[], ClientConnection | None],
        connection: Callable[[], Awaitable[ClientConnection]],
        settle: Callable[[], object],
        max_buffered_bytes: int = 32 * 1024,
        poll_s: float = 0.002,
    ) -> None:
        self._state = state
        self._current = current
        self._connection = connection
        self._settle = settle
        self.max_buffered_bytes = max_buffered_bytes
        self.poll_s = poll_s
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def put(self, seq: int, payload: bytes, session: str | None = None) -> None:
        """Queue ``payload`` to be sent (taken to be written at once if the link is free); one of ``session``
        still waiting is replaced."""
        ws = self._current()
        link_free = ws is not None and buffered_bytes(ws) <= self.max_buffered_bytes
        self._state.observation_ready(seq, payload, session, link_free)
        self._settle()
        self._ready.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="policy-client-sender")

    async def _run(self) -> None:
        state = self._state
        try:
            while True:
                if state.sending is None and not state.waiting:
                    self._ready.clear()
                    await self._ready.wait()
                    continue
                ws = await self._connection()
                while buffered_bytes(ws) > self.max_buffered_bytes:  # the link still carries older bytes
                    await asyncio.sleep(self.poll_s)
                ws = await self._connection()
                item = state.next_write()
                if item is None:
                    continue
                try:
                    await ws.send(item.payload)
                except asyncio.CancelledError:
                    # close() stopped it while the write waited for the link to drain: its bytes are in the
                    # socket's buffers already and leave ahead of the close frame (the state counted it).
                    raise
                except Exception:  # noqa: BLE001 - the connection dropped: the reader reconnects
                    state.write_failed(item.seq)
                    self._settle()
                    await asyncio.sleep(self.poll_s)
                    continue
                state.written(item.seq, len(item.payload))
        except ConnectionLost:
            pass  # no connection any more (the client is closing or gave up): the state abandoned what it held

    async def close(self) -> None:
        """Stop writing (what is still held, the state abandons)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        self._task = None


# ---------------------------------------------------------------------------------------------------
# The asyncio client
# ---------------------------------------------------------------------------------------------------


class AsyncPolicyClient:
    """Client of ``/v1/actions/realtime``: one session on one connection, kept across reconnects. Not
    thread-safe: use it from one event loop.

    It connects (retrying while the server loads), reads every frame the server sends and routes it: a
    chunk to the ``infer`` call waiting for its ``seq`` or to the stream ``receive`` reads, a drop or an
    error to the call it ends, a ``session``/``reset_done`` to the control request waiting for it.

    Args:
        url: ``ws://host:port`` or ``wss://host:port`` (the endpoint path is added), or a full URL.
        headers: extra HTTP headers for the handshake.
        token: the server's bearer token (``cosmos3-serve --auth-token``), sent as
            ``Authorization: Bearer <token>``; a wrong or missing one fails :meth:`connect` at once (HTTP 401).
        ssl: an ``ssl.SSLContext`` for ``wss://`` with a private CA; ``None`` uses the system's.
        connect_timeout: how long :meth:`connect` keeps retrying (a loading server answers 503).
        reconnect: reconnect in the background when the connection drops.
        backoff_initial, backoff_max: reconnect delays, doubling from the first to the cap (with jitter).
        proxy: websockets' proxy setting; ``None`` (the default) connects directly, ignoring the
            environment's proxy variables, which is what a robot on a LAN wants.
        images: how camera frames go on the wire: ``"raw"`` (arrays, the default), ``"jpeg"``, ``"webp"`` or
            ``"png"`` (quality 90), or a :class:`~robot_clients.camera_frames.ImageEncoding` (another quality).
            Encoding needs Pillow (the ``images`` extra).
        resize: shrink every camera to the size the server would shrink it to (the served tier's canvas,
            from the metadata frame) before sending, so the link carries no pixels the server throws away.
        max_buffered_bytes: the in-flight bound. An observation is written to the socket only once what it
            still holds from earlier ones (written, not yet acknowledged) is below this; meanwhile at most
            one observation waits, and a newer one replaces it (counted in ``stats.dropped["unsent"]``), so
            on a slow link the newest frame overtakes instead of queueing behind stale ones. ``submit``
            returns at once. ``None``: no bound; ``submit`` waits while the socket's buffer is full.
        close_timeout: how long :meth:`close` waits for the close frame to go out and the server to answer
            it (seconds); then the connection is dropped. A server that answers does so in milliseconds; a
            link that stopped draining would otherwise hold a shutting-down robot until keepalive gave up.
    """

    def __init__(
        self,
        url: str = "ws://127.0.0.1:8000",
        *,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
        ssl: SSLContext | None = None,
        connect_timeout: float = 30.0,
        reconnect: bool = True,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        max_message_bytes: int = 64 * 2**20,
        proxy: str | bool | None = None,
        images: str | ImageEncoding = "raw",
        resize: bool = False,
        max_buffered_bytes: int | None = 32 * 1024,
        close_timeout: float = 2.0,
    ) -> None:
        self.url = realtime_url(url)
        self._connect_kwargs = connect_options(
            headers=headers,
            token=token,
            ssl=ssl,
            connect_timeout=connect_timeout,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            max_message_bytes=max_message_bytes,
            proxy=proxy,
            close_timeout=close_timeout,
        )
        self.connect_timeout = connect_timeout
        self.close_timeout = close_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max

        # Every piece of protocol state; what follows is I/O: the connection, the tasks, the calls' futures.
        self._state = ClientState(time.monotonic, reconnect=reconnect)
        self._running = asyncio.Event()
        self._running.set()
        self._ws: ClientConnection | None = None
        self._connected = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._infers: dict[int, asyncio.Future[ActionChunk]] = {}  # infer() calls waiting for their seq
        self._control_lock = asyncio.Lock()  # one configure/reset at a time: their replies carry no seq
        self._control_reply: asyncio.Future[SessionFrame | ResetDoneFrame] | None = None
        self._streamed = asyncio.Event()  # set when a chunk (or error) for receive() came
        self._frames = OutgoingFrames(images, resize)
        self._sender = (
            None
            if max_buffered_bytes is None
            else ObservationSender(
                self._state,
                lambda: self._ws if self._connected.is_set() else None,
                lambda: self._wait_connected(None),
                self._settle,
                max_buffered_bytes,
            )
        )

    # -- the protocol state, as callers read it ---------------------------------------------------------

    @property
    def metadata(self) -> dict[str, Any]:
        """The server's ``metadata`` frame (the latest connection's)."""
        return self._state.metadata

    @property
    def session(self) -> dict[str, Any]:
        """The server's resolved configuration (its ``session`` frame, or an operator's update)."""
        return self._state.session

    @property
    def session_state(self) -> str:
        """``running``, ``paused`` or ``stopped``: what an operator last set (``session_state`` frames)."""
        return self._state.session_state

    @property
    def state_reason(self) -> str:
        return self._state.state_reason

    @property
    def stats(self) -> ClientStats:
        return self._state.stats

    @property
    def reconnect(self) -> bool:
        """Whether the client reconnects in the background when the connection drops."""
        return self._state.reconnect

    @reconnect.setter
    def reconnect(self, value: bool) -> None:
        self._state.reconnect = value

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def paused(self) -> bool:
        """True while an operator has this session paused: hold the robot, send nothing."""
        return self._state.session_state == PAUSED

    def _settle(self) -> CloseConnection | None:
        """Act on the state's events: end the calls they end, wake ``receive``, follow the session's state.
        Returns a request to close the connection, if the state made one."""
        close = None
        for event in self._state.events():
            if isinstance(event, InferAnswered):
                future = self._infers.pop(event.seq, None)
                if future is not None and not future.done():
                    future.set_result(event.chunk)
            elif isinstance(event, InferFailed):
                future = self._infers.pop(event.seq, None)
                if future is not None and not future.done():
                    future.set_exception(event.error)
            elif isinstance(event, (ControlAnswered, ControlFailed)):
                reply = self._control_reply
                if reply is not None and not reply.done():
                    if isinstance(event, ControlAnswered):
                        reply.set_result(event.reply)
                    else:
                        reply.set_exception(event.error)
            elif isinstance(event, Streamed):
                self._streamed.set()
            elif isinstance(event, StateChanged):
                if event.state == RUNNING:
                    self._running.set()
                else:
                    self._running.clear()
            elif isinstance(event, CloseConnection):
                close = event
        return close

    # -- connection ------------------------------------------------------------------------------------

    async def connect(self) -> dict[str, Any]:
        """Open the connection (retrying while the server is loading) and return its metadata. Gives up after
        ``connect_timeout``, also against a server that accepts the connection and never says hello."""
        self._state.opening()
        await self._open(deadline=time.monotonic() + self.connect_timeout)
        self._reader = asyncio.create_task(self._read_loop(), name="policy-client-reader")
        return self.metadata

    async def _open(self, deadline: float | None) -> ClientConnection:
        """Connect with backoff until ``deadline`` (None: forever), read metadata, re-send the config."""
        opened = await open_session(
            self.url,
            self._connect_kwargs,
            self._state.settings,
            Backoff(self.backoff_initial, self.backoff_max),
            deadline,
            lambda: self._state.closing,
        )
        if not self._state.connection_opened(opened.metadata, opened.session):
            await opened.ws.close()  # close() was called while this connection was being made: nobody will use it
            raise ConnectionLost("the client was closed while it connected")
        self._ws = opened.ws
        self._connected.set()
        self._settle()
        return opened.ws

    async def close(self) -> None:
        """Close the connection and stop reconnecting."""
        self._connected.clear()
        self._state.close()  # calls end, what waits to be sent is dropped (unsent)
        self._settle()
        if self._sender is not None:  # stop writing before the socket closes
            await self._sender.close()
        if self._ws is not None:
            try:
                # websockets bounds the wait for the server's answer, not the wait for the close frame to be
                # written: on a link that stopped draining that lasts until keepalive gives up (up to 40 s).
                await asyncio.wait_for(self._ws.close(), self.close_timeout)
            except asyncio.TimeoutError:
                self._ws.transport.abort()
        if self._reader is not None:
            try:
                await asyncio.wait_for(self._reader, timeout=5.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._reader.cancel()
        self._state.close()  # calls made while it closed
        self._settle()

    async def __aenter__(self) -> AsyncPolicyClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _read_loop(self) -> None:
        ws = self._ws
        assert ws is not None  # connect() opened it before starting this loop
        state = self._state
        while True:
            try:
                async for message in ws:
                    state.receive_frame(message)
                    close = self._settle()
                    if close is not None:
                        await ws.close(close.code, close.reason)
                        break
            except ConnectionClosed:
                pass
            self._connected.clear()
            reconnect = state.connection_lost(ws.close_code, ws.close_reason)
            self._settle()
            if not reconnect:
                return
            logger.info("connection lost (code %s); reconnecting", ws.close_code)
            try:
                ws = await self._open(deadline=None)
            except Exception as exc:  # noqa: BLE001 - give up only on errors retrying cannot fix
                if not state.closing:
                    logger.error("reconnecting failed for good: %s", exc)
                # Calls made while it reconnected wait for that connection: they end now, not at their timeout.
                state.reconnect_failed(str(exc))
                self._settle()
                return
            state.reconnected()

    async def wait_until_running(self, timeout: float | None = None) -> None:
        """Return once the session is running (at once if it is). Raises :class:`SessionStopped` if an
        operator stops it, :class:`TimeoutError` if it is still paused after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._running.wait(), timeout)
        except asyncio.TimeoutError:
            if self._state.session_state == STOPPED:
                self._state.check_running()
            raise TimeoutError(f"the session is still {self._state.session_state} after {timeout} s") from None

    # -- sending ---------------------------------------------------------------------------------------

    async def _wait_connected(self, timeout: float | None) -> ClientConnection:
        if not self._connected.is_set():
            reader = self._reader
            if self._state.closing or reader is None or reader.done():
                raise ConnectionLost("not connected (call connect() first)")
            # The reader reconnects; when it gives up (or the client closes) it ends, and nothing would ever
            # set the event: wait for either, so that a caller hears at once instead of at its timeout.
            connected = asyncio.ensure_future(self._connected.wait())
            try:
                await asyncio.wait((connected, reader), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                connected.cancel()
            if not self._connected.is_set():
                if reader.done() or self._state.closing:
                    raise ConnectionLost("the connection was lost and the client stopped reconnecting")
                raise TimeoutError("not connected to the policy server (reconnecting)")
        assert self._ws is not None
        return self._ws

    @staticmethod
    async def _write(ws: ClientConnection, payload: bytes) -> None:
        try:
            await ws.send(payload)
        except ConnectionClosed:
            raise ConnectionLost("the connection closed while sending") from None

    async def _send(self, payload: bytes, timeout: float | None = None) -> None:
        await self._write(await self._wait_connected(timeout), payload)

    async def _control(self, payload: bytes, timeout: float | None) -> SessionFrame | ResetDoneFrame:
        async with self._control_lock:
            reply: asyncio.Future[SessionFrame | ResetDoneFrame] = asyncio.get_running_loop().create_future()
            self._control_reply = reply
            self._state.control_begun()
            try:
                ws = await self._wait_connected(timeout)
                self._state.control_sent()
                await self._write(ws, payload)
                return await asyncio.wait_for(reply, timeout)
            finally:
                self._control_reply = None
                self._state.control_ended()
                if reply.done() and not reply.cancelled():
                    # Answered, or failed (connection lost) while the frame was still being sent: then the call
                    # raised that already; read it here so the loop does not log it again as never retrieved.
                    reply.exception()

    # -- requests --------------------------------------------------------------------------------------

    async def configure(self, timeout: float | None = 10.0, **settings: Any) -> dict[str, Any]:
        """Set session settings (the protocol's ``configure`` settings: ``SESSION_SETTINGS`` in
        :mod:`robot_clients.client_frames`, listed in ``docs/protocol.md``).

        Settings accumulate across calls and are re-sent after a reconnect. Returns the server's resolved
        configuration; raises :class:`ServerError` if the server refuses it (nothing is kept then).
        """
        reply = await self._control(ClientState.configure_frame(settings), timeout)
        if not isinstance(reply, SessionFrame):
            raise MalformedServerFrame(protocol.RESET_DONE, "it answered a configure")
        return self._state.configured(settings, reply)

    async def reset(self, timeout: float | None = 10.0, *, session_id: str | None = None) -> None:
        """Drop everything this session (or its policy session ``session_id``) has waiting or running, and
        start its sequence over; the configuration is kept.

        The server answers each observation the reset drops with ``dropped`` (``cancelled``) before
        ``reset_done``; one of this session still waiting on the robot to be sent is dropped here
        (``unsent``). One submitted while the reset is on its way reaches the server after it and is
        answered as usual.
        """
        self._state.reset_begun(session_id)  # held back by a slow link, it would reach the server after the reset
        self._settle()
        await self._control(ClientState.reset_frame(session_id), timeout)
        self._state.reset_done(session_id)

    async def cancel(self, seq: int | None = None, *, session_id: str | None = None) -> None:
        """Ask the server not to answer ``seq`` (or any outstanding observation when ``None``) of this
        session, or of its policy session ``session_id``."""
        await self._send(ClientState.cancel_frame(seq, session_id))

    async def submit(
        self,
        obs: Mapping[str, Any] | np.ndarray,
        timeout: float | None = None,
        *,
        state: RobotState | None = None,
        session_id: str | None = None,
        **settings: Any,
    ) -> int:
        """Send an observation without waiting for its chunk; return its ``seq``. See :meth:`receive`.

        ``session_id`` names the policy session it belongs to, one of several this connection drives (one
        per simulated environment, say): each has its own queue slot, turn and recording on the server, and
        its chunks carry the same ``session_id`` (:attr:`ActionChunk.session_id`). Seqs are counted for the
        whole client, so they increase within every policy session.

        ``state`` is the robot's proprio state (``[state_dim]`` or ``[history_length, state_dim]``, sent as
        float32) for a domain that conditions on it (``state_dim`` in the metadata's ``domains``).
        ``settings`` (any of the protocol's observation settings: ``OBSERVATION_SETTINGS`` in
        :mod:`robot_clients.client_frames`) apply to this observation only, over the session's
        configuration; the chunk reports what was used.
        Raises :class:`SessionPaused` (nothing is sent) while an operator has the session paused.
        """
        self._state.check_running()
        seq = self._state.new_seq()
        await self._submit(seq, obs, timeout, state, session_id, settings)
        return seq

    async def _submit(
        self,
        seq: int,
        obs: Mapping[str, Any] | np.ndarray,
        timeout: float | None,
        robot_state: RobotState | None,
        session_id: str | None,
        settings: Mapping[str, Any],
    ) -> None:
        fields = self._frames.prepare(
            {"image": obs} if isinstance(obs, np.ndarray) else obs, self.metadata, self.session, settings
        )
        payload = self._state.observation_frame(seq, fields, settings, robot_state, session_id)
        if self._sender is None:
            ws = await self._wait_connected(timeout)
            self._state.observation_writing(seq, session_id)
            await self._write(ws, payload)
            self._state.written_directly(len(payload))
        else:
            if not self._connected.is_set() and (self._state.closing or self._reader is None or self._reader.done()):
                raise ConnectionLost("not connected (call connect() first)")
            self._sender.put(seq, payload, session_id)  # while reconnecting, the newest waits for the new connection
            # Let the sender write it now: a robot loop that is behind its schedule may never await otherwise,
            # and then nothing would leave (and the keepalive would go unanswered) until it caught up.
            await asyncio.sleep(0)
        stats = self._state.stats
        stats.buffered_bytes = self.buffered_bytes
        stats.buffered_bytes_max = max(stats.buffered_bytes_max, stats.buffered_bytes)

    @property
    def buffered_bytes(self) -> int:
        """Bytes written to the connection and not yet acknowledged by the server (the socket's send queue
        and the transport's buffer): what a slow link holds of this client's frames right now."""
        return buffered_bytes(self._ws) if self._ws is not None else 0

    async def receive(self, timeout: float | None = None) -> ActionChunk:
        """The next streamed chunk newer than any already delivered. Raises :class:`ServerError` when the
        server refused a streamed observation (:class:`MalformedServerFrame` when it answered one with a frame
        that breaks the protocol), :class:`TimeoutError` when nothing came in time."""
        deadline = None if timeout is None else self._state.clock() + timeout
        while True:
            step = self._state.receive_step(deadline)
            if isinstance(step.item, ActionChunk):
                return step.item
            if step.item is not None:
                raise step.item
            if step.wait is None:
                raise TimeoutError("no action chunk arrived in time")
            self._streamed.clear()
            try:
                await asyncio.wait_for(self._streamed.wait(), None if step.wait == float("inf") else step.wait)
            except asyncio.TimeoutError:
                pass  # the next step says whether something came at the last moment

    async def infer(
        self,
        obs: Mapping[str, Any] | np.ndarray,
        timeout: float | None = 10.0,
        *,
        state: RobotState | None = None,
        session_id: str | None = None,
        **settings: Any,
    ) -> ActionChunk:
        """Send one observation and wait for its chunk (one round trip).

        ``obs`` is a map of observation fields (``image``, ``images``, ``video``, ``deadline_ms``,
        ``prefix_actions``, ``state``, ``timestamp``) or just an H×W×3 uint8 image; ``state=`` is the robot's
        proprio state, and ``session_id`` its policy session, as for :meth:`submit`. ``settings`` are session settings
        for this observation only (``infer(frame, domain_name="droid_lerobot", action_horizon=8)``: no
        ``configure`` is needed when ``domain_name`` is among them). Raises :class:`TimeoutError` (and cancels the
        observation), :class:`ObservationDropped` (:class:`SessionPaused` while an operator has the session
        paused), :class:`SessionStopped`, :class:`ServerError`, :class:`MalformedServerFrame` (the server answered
        with a frame that breaks the protocol) or :class:`ConnectionLost`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self._state.check_running()
        seq = self._state.new_seq()
        future: asyncio.Future[ActionChunk] = asyncio.get_running_loop().create_future()
        self._infers[seq] = future
        self._state.infer_begun(seq, session_id)
        try:
            await self._submit(seq, obs, timeout, state, session_id, settings)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            return await asyncio.wait_for(future, remaining)
        except asyncio.TimeoutError:
            self._state.infer_timed_out(seq)
            if self._connected.is_set():
                try:
                    await self.cancel(seq, session_id=session_id)
                except ConnectionLost:
                    pass
            raise TimeoutError(f"no answer to observation {seq} within {timeout} s") from None
        finally:
            self._infers.pop(seq, None)
            self._state.infer_ended(seq, session_id)
            self._settle()


# ---------------------------------------------------------------------------------------------------
# The blocking client
# ---------------------------------------------------------------------------------------------------


class PolicyClient:
    """Blocking client of ``/v1/actions/realtime``; takes the same arguments as ``AsyncPolicyClient``.

    Methods may be called from any one thread at a time (a control loop); the connection lives on the
    client's own thread, so keepalive pings keep flowing while the robot's thread is busy.
    """

    def __init__(self, url: str = "ws://127.0.0.1:8000", **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="policy-client-loop", daemon=True)
        self._thread.start()
        self._client = self._call(self._make_client(url, options))

    @staticmethod
    async def _make_client(url: str, options: dict[str, Any]) -> AsyncPolicyClient:
        return AsyncPolicyClient(url, **options)  # built on the client loop: its asyncio objects live there

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- the AsyncPolicyClient interface, blocking ----------------------------------------------------

    def connect(self) -> dict[str, Any]:
        """Open the connection (retrying while the server loads); return the server's metadata."""
        return self._call(self._client.connect())

    def configure(self, timeout: float | None = 10.0, **settings: Any) -> dict[str, Any]:
        return self._call(self._client.configure(timeout=timeout, **settings))

    def infer(
        self,
        obs: Mapping[str, Any] | np.ndarray,
        timeout: float | None = 10.0,
        *,
        state: RobotState | None = None,
        session_id: str | None = None,
        **settings: Any,
    ) -> ActionChunk:
        """One round trip; ``state`` is the robot's proprio state, ``session_id`` its policy session, and
        ``settings`` apply to this observation only (see ``AsyncPolicyClient.infer``)."""
        return self._call(self._client.infer(obs, timeout=timeout, state=state, session_id=session_id, **settings))

    def submit(
        self,
        obs: Mapping[str, Any] | np.ndarray,
        timeout: float | None = None,
        *,
        state: RobotState | None = None,
        session_id: str | None = None,
        **settings: Any,
    ) -> int:
        return self._call(self._client.submit(obs, timeout=timeout, state=state, session_id=session_id, **settings))

    def receive(self, timeout: float | None = None) -> ActionChunk:
        return self._call(self._client.receive(timeout=timeout))

    def cancel(self, seq: int | None = None, *, session_id: str | None = None) -> None:
        self._call(self._client.cancel(seq, session_id=session_id))

    def reset(self, timeout: float | None = 10.0, *, session_id: str | None = None) -> None:
        self._call(self._client.reset(timeout=timeout, session_id=session_id))

    def wait_until_running(self, timeout: float | None = None) -> None:
        """Block until an operator resumes the session (at once if running); see ``AsyncPolicyClient``."""
        self._call(self._client.wait_until_running(timeout=timeout))

    def close(self) -> None:
        """Close the connection and stop the client's thread. Idempotent."""
        if not self._thread.is_alive():
            return
        try:
            self._call(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5.0)
            self._loop.close()

    @property
    def metadata(self) -> dict[str, Any]:
        return self._client.metadata

    @property
    def session(self) -> dict[str, Any]:
        return self._client.session

    @property
    def session_state(self) -> str:
        """``running``, ``paused`` or ``stopped``: what an operator last set (read from any thread)."""
        return self._client.session_state

    @property
    def state_reason(self) -> str:
        return self._client.state_reason

    @property
    def paused(self) -> bool:
        return self._client.paused

    @property
    def stats(self) -> ClientStats:
        return self._client.stats

    @property
    def buffered_bytes(self) -> int:
        """Bytes written and not yet acknowledged by the server (see ``AsyncPolicyClient.buffered_bytes``)."""
        return self._client.buffered_bytes

    @property
    def connected(self) -> bool:
        return self._client.connected

    def __enter__(self) -> PolicyClient:
        self.connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
