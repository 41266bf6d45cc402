"""The robot's clients of the native realtime protocol (version 1): ``AsyncPolicyClient`` (asyncio) and
``PolicyClient`` (blocking, on top of it), with the chunks they return and the errors they raise.

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

Imports only numpy, msgpack (through the wire codec) and websockets (Pillow to encode frames): it runs on
the robot.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from ssl import SSLContext
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.frames import CloseCode

from . import protocol
from .camera_frames import ImageEncoding, canvas_bins, encode_frame, resize_frame, send_size
from .client_frames import SETTINGS_BY_NAME
from .protocol import REALTIME_PATH, CodedError, DropReason, SessionState
from .wire_codec import FRAME_MAX_DEPTH, FRAME_MAX_VALUES, WireFormatError, WireLimitError, packb, unpackb

try:
    import fcntl
except ImportError:  # not on Linux: the transport's own buffer is all that is counted
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

SUPPORTED_PROTOCOL_VERSION = protocol.PROTOCOL_VERSION

# Session states an operator can set (server frame `session_state`).
RUNNING, PAUSED, STOPPED = SessionState.RUNNING.value, SessionState.PAUSED.value, SessionState.STOPPED.value
# The drop reason of an observation replaced on the robot, before it was sent (the in-flight bound).
UNSENT = "unsent"

T = TypeVar("T")
# The robot's proprio state as a caller hands it over: [state_dim] or [history_length, state_dim] numbers,
# sent as float32.
RobotState = np.ndarray | Sequence[float] | Sequence[Sequence[float]]


# ---------------------------------------------------------------------------------------------------
# What a call returns or raises
# ---------------------------------------------------------------------------------------------------


@dataclass
class ActionChunk:
    """A chunk of actions answering observation ``seq``: ``actions`` is float32, horizon × action width.

    ``timing`` is the server's breakdown in milliseconds (``queue_ms``, ``preprocess_ms``, ``model_ms``,
    ``postprocess_ms``, ``total_ms``, ``observation_age_ms``, ...); ``round_trip_ms`` is what this client
    measured from sending the observation to decoding the chunk.
    """

    seq: int
    actions: np.ndarray
    action_mode: str
    domain_name: str
    domain_id: int
    raw_action_dim: int
    num_steps: int | None = None
    seed: int | None = None
    timing: dict[str, float] = field(default_factory=dict)
    round_trip_ms: float | None = None
    # The other settings the server used for this chunk (an observation's own, else the session's).
    prompt: str | None = None
    resolution_tier: int | None = None
    view_point: str | None = None
    guidance_scale: float | None = None
    shift: float | None = None
    fps: float | None = None
    # The policy session it answers, as the observation named it (None: the connection's own session).
    session_id: str | None = None

    @property
    def action_horizon(self) -> int:
        return int(self.actions.shape[0])

    @classmethod
    def from_frame(cls, frame: dict[str, Any], round_trip_ms: float | None) -> ActionChunk:
        # The settings a chunk may report (its optional fields the table names): None when the frame has none.
        reported = {f.name: frame.get(f.name) for f in fields(cls) if f.name in SETTINGS_BY_NAME and f.default is None}
        return cls(
            seq=frame["seq"],
            # The wire codec gives a read-only view on the received bytes; a robot may want to edit it.
            actions=np.array(frame["actions"], dtype=np.float32, copy=True),
            action_mode=frame.get("action_mode", ""),
            domain_name=frame.get("domain_name", ""),
            domain_id=frame.get("domain_id", -1),
            raw_action_dim=frame.get("raw_action_dim", -1),
            timing=dict(frame.get("timing") or {}),
            round_trip_ms=round_trip_ms,
            session_id=frame.get(protocol.SESSION_ID),
            **reported,
        )


class PolicyClientError(Exception):
    """Base of the errors a policy client raises."""


class ServerError(PolicyClientError, CodedError):
    """The server answered with an ``error`` frame: ``code`` is stable, ``field`` names the culprit."""

    def __init__(self, code: str, message: str, field: str | None = None, seq: int | None = None) -> None:
        CodedError.__init__(self, code, message, field)
        self.args = (self.text(),)
        self.seq = seq


class ObservationDropped(PolicyClientError):
    """The server will not answer this observation (``reason``: superseded, deadline, cancelled,
    shutdown), or the client discarded its answer because a newer one was already delivered (stale)."""

    def __init__(self, seq: int, reason: str, message: str = "") -> None:
        super().__init__(f"observation {seq} dropped: {reason}" + (f" ({message})" if message else ""))
        self.seq: int | None = seq  # None only for a SessionPaused refused before it was sent
        self.reason = reason


class ConnectionLost(PolicyClientError):
    """The connection closed before the answer came. The client reconnects in the background."""


class SessionPaused(ObservationDropped):
    """An operator paused the session: observations are not answered until it is resumed. Hold the robot.

    Raised for observations the server dropped because of the pause, and at once, without sending, for
    observations submitted while the client knows the session is paused.
    """

    def __init__(self, seq: int | None, message: str = "") -> None:
        PolicyClientError.__init__(
            self, "the session is paused by an operator" + (f" ({message})" if message else "") + "; hold"
        )
        self.seq = seq  # None: refused before it was sent
        self.reason = "paused"


class SessionStopped(PolicyClientError):
    """An operator stopped the session. The server closed the connection; the client does not reconnect."""

    reason = "stopped"


@dataclass
class ClientStats:
    """Counters of what happened to this client's observations (across reconnects)."""

    sent: int = 0
    answered: int = 0
    errors: int = 0
    stale: int = 0  # chunks discarded because a newer seq had already been delivered
    reconnects: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # by reason ("unsent": replaced on the robot, never sent)
    bytes_sent: int = 0  # observation frames written to the socket
    buffered_bytes: int = 0  # written and not yet acknowledged by the server, at the last submit
    buffered_bytes_max: int = 0


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
    metadata: dict[str, Any]
    session: dict[str, Any] | None  # the server's resolved configuration; None when nothing was re-sent


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
    while True:
        try:
            return await _handshake(url, options, settings)
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


def decode_server_frame(message: bytes) -> Any:
    """One server frame, decoded within the element budget the server holds a robot's frames to (a chunk, a
    session config or the metadata hold a few hundred elements): a broken or hostile server cannot make the
    robot build millions of objects. Raises :class:`~robot_clients.wire_codec.WireFormatError`
    (:class:`~robot_clients.wire_codec.WireLimitError` past the budget)."""
    return unpackb(message, max_values=FRAME_MAX_VALUES, max_depth=FRAME_MAX_DEPTH)


async def _handshake(url: str, options: Mapping[str, Any], settings: Mapping[str, Any]) -> OpenedSession:
    ws = await connect(url, **options)
    try:
        frame = decode_server_frame(await ws.recv(decode=False))
    except WireFormatError as exc:
        await ws.close(_close_code(exc), "undecodable metadata frame")
        raise ConnectionError(f"{url}: the server's first frame could not be decoded: {exc}") from None
    if frame.get("type") != protocol.METADATA:
        raise ConnectionError(f"expected a metadata frame first, got {frame.get('type')!r}")
    if frame.get("protocol_version") != SUPPORTED_PROTOCOL_VERSION:
        await ws.close()
        raise ServerError(
            "protocol_version",
            f"server speaks protocol {frame.get('protocol_version')}, this client {SUPPORTED_PROTOCOL_VERSION}",
        )
    session = None
    if settings:
        await ws.send(packb(protocol.configure_frame(settings)))
        try:
            reply = decode_server_frame(await ws.recv(decode=False))
        except WireFormatError as exc:
            await ws.close(_close_code(exc), "undecodable session frame")
            raise ConnectionError(f"{url}: the server's reply to configure could not be decoded: {exc}") from None
        if reply.get("type") == protocol.SESSION:
            session = reply.get("config", {})
        else:
            logger.warning("the server refused the configuration on reconnect: %s", reply.get("message"))
    return OpenedSession(ws, frame, session)


def _close_code(error: WireFormatError) -> int:
    """How the client closes a connection whose server sent a frame it does not decode."""
    return CloseCode.MESSAGE_TOO_BIG if isinstance(error, WireLimitError) else CloseCode.INVALID_DATA


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


class LatestObservationSender:
    """Sends observations one at a time, latest wins.

    On a slow link, a robot that writes every frame to its socket builds a queue there (the kernel's send
    buffer, the transport's write buffer): the newest frame waits behind all the older ones, and the
    server's "latest wins" cannot help because it never sees the newest. This sender holds at most one
    observation that is not on the wire yet and sends it only once what the socket still holds is below
    ``max_buffered_bytes``; an observation put while one waits replaces it.

    ``current()`` is the connection now (None while reconnecting), ``connection()`` waits for one;
    ``replaced(seq)`` is told of each observation that will never be sent (a newer one replaced it, its
    write failed with a newer one waiting, or the sender closed or has no connection any more), ``sent(seq,
    nbytes)`` of each one written: every observation put is told exactly once, unless taken back with
    :meth:`withdraw`. At any moment one observation is being written and one waits per policy session
    (``session``: the observation's ``session_id``; a newer one replaces only its own session's), the
    oldest sent first.
    """

    def __init__(
        self,
        current: Callable[[], ClientConnection | None],
        connection: Callable[[], Awaitable[ClientConnection]],
        replaced: Callable[[int], None],
        sent: Callable[[int, int], None],
        max_buffered_bytes: int = 32 * 1024,
        poll_s: float = 0.002,
    ) -> None:
        self._current = current
        self._connection = connection
        self._replaced = replaced
        self._sent = sent
        self.max_buffered_bytes = max_buffered_bytes
        self.poll_s = poll_s
        self._sending: tuple[str | None, int, bytes] | None = None
        self._waiting: dict[str | None, tuple[int, bytes]] = {}  # by policy session, oldest first
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def put(self, seq: int, payload: bytes, session: str | None = None) -> None:
        """Queue ``payload`` to be sent (at once if the link is free); one of ``session`` still waiting is
        replaced."""
        replaced = self._waiting.pop(session, None)
        if replaced is not None:
            self._replaced(replaced[0])
        self._waiting[session] = (seq, payload)
        ws = self._current()
        if self._sending is None and ws is not None and buffered_bytes(ws) <= self.max_buffered_bytes:
            self._sending = self._take()  # taken now: a next put cannot replace it
        self._ready.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="policy-client-sender")

    def withdraw(self, session: str | None, seq: int | None = None) -> int | None:
        """Take back the observation of ``session`` waiting to be sent (only if it is ``seq``, when given);
        return its seq, or None when none was taken. The one being written is on its way already."""
        waiting = self._waiting.get(session)
        if waiting is None or (seq is not None and waiting[0] != seq):
            return None
        del self._waiting[session]
        return waiting[0]

    def _take(self) -> tuple[str | None, int, bytes]:
        """The oldest waiting observation, taken out, with its session (one must wait)."""
        session = next(iter(self._waiting))
        return (session, *self._waiting.pop(session))

    @property
    def waiting(self) -> int | None:
        """The seq of the oldest observation waiting to be sent, if any."""
        return next(iter(self._waiting.values()), (None,))[0]

    async def _run(self) -> None:
        try:
            while True:
                if self._sending is None:
                    if not self._waiting:
                        self._ready.clear()
                        await self._ready.wait()
                    ws = await self._connection()
                    while buffered_bytes(ws) > self.max_buffered_bytes:  # the link still carries older bytes
                        await asyncio.sleep(self.poll_s)
                    # A put() during the awaits above may have taken one already, when it found the link
                    # free: taking another now would drop that one without a word.
                    if self._sending is None:
                        if not self._waiting:
                            continue
                        self._sending = self._take()
                ws = await self._connection()
                assert self._sending is not None
                session, seq, payload = self._sending
                try:
                    await ws.send(payload)
                except asyncio.CancelledError:
                    # close() stopped it while the write waited for the link to drain: its bytes are in the
                    # socket's buffers already and leave ahead of the close frame.
                    self._sending = None
                    self._sent(seq, len(payload))
                    raise
                except Exception:  # noqa: BLE001 - the connection dropped: the reader reconnects
                    if session not in self._waiting:  # nothing newer: send this one on the next connection
                        self._waiting[session] = (seq, payload)
                    else:  # a newer one was put while this one was written: this one will never be sent
                        self._replaced(seq)
                    self._sending = None
                    self._ready.set()
                    await asyncio.sleep(self.poll_s)
                    continue
                self._sending = None
                self._sent(seq, len(payload))
        except Exception:  # noqa: BLE001 - no connection any more (the client is closing or gave up)
            self._abandon()

    def _abandon(self) -> None:
        """Nothing held will be sent: each is told, as one replaced before it was sent, not forgotten."""
        abandoned = [] if self._sending is None else [self._sending[1]]
        abandoned += [seq for seq, _ in self._waiting.values()]
        self._sending = None
        self._waiting.clear()
        for seq in abandoned:
            self._replaced(seq)

    async def close(self) -> None:
        """Stop sending. What is still held is abandoned: kept, it would go out on a later connection."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        self._task = None
        self._abandon()


# ---------------------------------------------------------------------------------------------------
# The asyncio client
# ---------------------------------------------------------------------------------------------------


def _observation_frame(
    seq: int, obs: Mapping[str, Any], settings: Mapping[str, Any], state: RobotState | None = None
) -> dict[str, Any]:
    # ``settings`` are this observation's own (the server applies them to it alone).
    frame = protocol.observation_frame(seq, obs, settings)
    if state is not None:  # a list of joint readings travels as the float32 array the protocol names
        frame["state"] = np.ascontiguousarray(state, dtype=np.float32)
    # Opaque to the server, which echoes it in the chunk: this is how the client measures round trips.
    frame.setdefault("timestamp", time.monotonic())
    return frame


def _frame_seq(frame: Mapping[str, Any]) -> int | None:
    """The ``seq`` a server frame is about (None: the session's, or a frame without one)."""
    seq = frame.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


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
        self.reconnect = reconnect
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max

        self.metadata: dict[str, Any] = {}
        self.session: dict[str, Any] = {}  # the server's resolved configuration (`session` frame)
        self.session_state = RUNNING  # set by the server's `session_state` frames (an operator's controls)
        self.state_reason = ""
        self._running = asyncio.Event()
        self._running.set()
        self.stats = ClientStats()
        self._settings: dict[str, Any] = {}  # everything sent in `configure`, re-sent after a reconnect
        self._ws: ClientConnection | None = None
        self._connected = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        # The newest seq handed to the robot, per policy session (None: the connection's own).
        self._latest_delivered: dict[str | None, int] = {}
        self._waiters: dict[int, asyncio.Future[ActionChunk]] = {}  # infer() calls waiting for their seq
        self._control_lock = asyncio.Lock()  # one configure/reset at a time: their replies carry no seq
        self._control_reply: asyncio.Future[dict[str, Any]] | None = None
        # Replies still to come on this connection for control calls that stopped waiting (timed out): the
        # server answers control frames in order, so the next ones to come are theirs, not a later call's.
        self._control_replies_owed = 0
        self._stream: asyncio.Queue[ActionChunk | ServerError] = asyncio.Queue()
        self._next_seq = 0
        self._frames = OutgoingFrames(images, resize)
        self._sender = (
            None
            if max_buffered_bytes is None
            else LatestObservationSender(
                lambda: self._ws if self._connected.is_set() else None,
                lambda: self._wait_connected(None),
                self._replaced_unsent,
                self._observation_sent,
                max_buffered_bytes,
            )
        )

    # -- connection ------------------------------------------------------------------------------------

    async def connect(self) -> dict[str, Any]:
        """Open the connection (retrying while the server is loading) and return its metadata."""
        self._closing = False
        await self._open(deadline=time.monotonic() + self.connect_timeout)
        self._reader = asyncio.create_task(self._read_loop(), name="policy-client-reader")
        return self.metadata

    async def _open(self, deadline: float | None) -> ClientConnection:
        """Connect with backoff until ``deadline`` (None: forever), read metadata, re-send the config."""
        opened = await open_session(
            self.url,
            self._connect_kwargs,
            self._settings,
            Backoff(self.backoff_initial, self.backoff_max),
            deadline,
            lambda: self._closing,
        )
        if self._closing:  # close() was called while this connection was being made: nobody will use it
            await opened.ws.close()
            raise ConnectionLost("the client was closed while it connected")
        self.metadata = opened.metadata
        if opened.session is not None:
            self.session = opened.session
        self._ws = opened.ws
        self._control_replies_owed = 0  # a new connection owes nothing of the last one's
        self._set_state(RUNNING, "")  # a new connection is a new session: it starts running
        self._connected.set()
        return opened.ws

    async def close(self) -> None:
        """Close the connection and stop reconnecting."""
        self._closing = True
        self._connected.clear()
        # Calls waiting now hear that the client closed (not that their observation was replaced unsent,
        # which the sender says next of what it still holds).
        self._fail_waiters(ConnectionLost("the client was closed"))
        if self._sender is not None:  # stop what is still held to be sent before the socket closes
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
        self._fail_waiters(ConnectionLost("the client was closed"))

    async def __aenter__(self) -> AsyncPolicyClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def _read_loop(self) -> None:
        ws = self._ws
        assert ws is not None  # connect() opened it before starting this loop
        while True:
            try:
                async for message in ws:
                    try:
                        frame = decode_server_frame(message) if isinstance(message, bytes) else message
                    except WireFormatError as exc:
                        # The server broke the protocol: this connection's frames can no longer be trusted.
                        logger.error("the server sent a frame this client does not decode (%s); closing", exc)
                        await ws.close(_close_code(exc), "undecodable server frame")
                        break
                    self._dispatch(frame)
            except ConnectionClosed:
                pass
            self._connected.clear()
            if self.session_state == STOPPED:  # an operator ended the session: reconnecting would undo that
                self._fail_waiters(SessionStopped(f"the session was stopped by an operator ({self.state_reason})"))
                return
            self._fail_waiters(
                ConnectionLost(f"connection closed (code {ws.close_code}: {ws.close_reason or 'no reason'})")
            )
            if self._closing or not self.reconnect:
                return
            logger.info("connection lost (code %s); reconnecting", ws.close_code)
            try:
                ws = await self._open(deadline=None)
            except Exception as exc:  # noqa: BLE001 - give up only on errors retrying cannot fix
                if not self._closing:
                    logger.error("reconnecting failed for good: %s", exc)
                # Calls made while it reconnected wait for that connection: they end now, not at their timeout.
                self._fail_waiters(
                    ConnectionLost("the client was closed" if self._closing else f"reconnecting failed for good: {exc}")
                )
                return
            self.stats.reconnects += 1

    def _fail_waiter(self, seq: int | None, exc: Exception) -> bool:
        """End the ``infer`` call waiting for ``seq`` (if any) with ``exc``; say whether there was one."""
        waiter = self._waiters.pop(seq, None) if seq is not None else None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        return waiter is not None

    def _fail_waiters(self, exc: Exception) -> None:
        for future in list(self._waiters.values()):
            if not future.done():
                future.set_exception(exc)
        self._waiters.clear()
        if self._control_reply is not None and not self._control_reply.done():
            self._control_reply.set_exception(exc)

    # -- frames from the server ------------------------------------------------------------------------

    def _dispatch(self, frame: Any) -> None:
        if not isinstance(frame, dict):
            logger.debug("ignoring a server frame that is not a map: %r", type(frame).__name__)
            return
        kind = frame.get("type")
        seq = _frame_seq(frame)
        if kind == protocol.ACTION_CHUNK:
            self._on_chunk(frame)
        elif kind == protocol.DROPPED:
            reason = str(frame.get("reason", ""))
            message = str(frame.get("message", ""))
            self.stats.dropped[reason] += 1
            if reason == DropReason.PAUSED:
                self._fail_waiter(seq, SessionPaused(seq, self.state_reason))
            elif reason == DropReason.STOPPED:
                self._fail_waiter(seq, SessionStopped(message))
            elif seq is not None:
                self._fail_waiter(seq, ObservationDropped(seq, reason, message))
        elif kind == protocol.ERROR:
            self.stats.errors += 1
            error = ServerError(frame.get("code", ""), frame.get("message", ""), frame.get("field"), seq)
            if seq is None:
                if not self._control_answered(error):
                    logger.warning("server error: %s", error)
            elif not self._fail_waiter(seq, error):
                self._stream.put_nowait(error)  # a streamed observation's: receive() raises it
        elif kind in (protocol.SESSION, protocol.RESET_DONE):
            self._control_answered(frame)
        elif kind == protocol.SESSION_STATE:
            state, reason = frame.get("state", RUNNING), frame.get("reason") or ""
            logger.info("the session is now %s%s", state, f" ({reason})" if reason else "")
            self._set_state(state, reason)
        elif kind == protocol.SESSION_UPDATED:
            self.session = dict(frame.get("config") or {})
            if "prompt" in (frame.get("changed") or ()):
                # The operator's prompt is the session's now: keep it across reconnects too.
                self._settings["prompt"] = self.session.get("prompt", "")
            logger.info("an operator changed %s", ", ".join(frame.get("changed") or ()))
        else:
            logger.debug("ignoring a %r frame", kind)

    def _control_answered(self, answer: dict[str, Any] | ServerError) -> bool:
        """A reply to a control frame (a ``session`` or ``reset_done`` frame, or an error with no seq): it ends
        the waiting call, or is the late one of a call that stopped waiting. Says whether it was taken."""
        if self._control_replies_owed:
            self._control_replies_owed -= 1
            logger.debug("a reply came after its control call stopped waiting: %r", answer)
            return True
        reply = self._control_reply
        if reply is None or reply.done():
            return False
        if isinstance(answer, ServerError):
            reply.set_exception(answer)
        else:
            reply.set_result(answer)
        return True

    def _on_chunk(self, frame: dict[str, Any]) -> None:
        sent_at = frame.get("timestamp")
        round_trip = (time.monotonic() - sent_at) * 1e3 if isinstance(sent_at, float) else None
        chunk = ActionChunk.from_frame(frame, round_trip)
        seq = chunk.seq
        if seq <= self._latest_delivered.get(chunk.session_id, -1):
            self.stats.stale += 1  # a newer chunk already reached the robot: this one is wrong now
            self._fail_waiter(seq, ObservationDropped(seq, "stale", "a newer chunk was already delivered"))
            return
        waiter = self._waiters.pop(seq, None)
        self.stats.answered += 1
        if waiter is None:
            self._stream.put_nowait(chunk)
        elif not waiter.done():
            self._latest_delivered[chunk.session_id] = seq
            waiter.set_result(chunk)
        # else its infer gave up (timed out) and is still sending its cancel: the chunk reaches nobody, so it
        # is not delivered and must not make an older chunk the robot can still receive look stale.

    def _set_state(self, state: str, reason: str) -> None:
        self.session_state, self.state_reason = state, reason
        if state == RUNNING:
            self._running.set()
        else:
            self._running.clear()

    @property
    def paused(self) -> bool:
        """True while an operator has this session paused: hold the robot, send nothing."""
        return self.session_state == PAUSED

    def _check_running(self) -> None:
        if self.session_state == PAUSED:
            raise SessionPaused(None, self.state_reason)
        if self.session_state == STOPPED:
            raise SessionStopped(f"the session was stopped by an operator ({self.state_reason})")

    async def wait_until_running(self, timeout: float | None = None) -> None:
        """Return once the session is running (at once if it is). Raises :class:`SessionStopped` if an
        operator stops it, :class:`TimeoutError` if it is still paused after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._running.wait(), timeout)
        except asyncio.TimeoutError:
            if self.session_state == STOPPED:
                self._check_running()
            raise TimeoutError(f"the session is still {self.session_state} after {timeout} s") from None

    # -- sending ---------------------------------------------------------------------------------------

    async def _wait_connected(self, timeout: float | None) -> ClientConnection:
        if not self._connected.is_set():
            reader = self._reader
            if self._closing or reader is None or reader.done():
                raise ConnectionLost("not connected (call connect() first)")
            # The reader reconnects; when it gives up (or the client closes) it ends, and nothing would ever
            # set the event: wait for either, so that a caller hears at once instead of at its timeout.
            connected = asyncio.ensure_future(self._connected.wait())
            try:
                await asyncio.wait((connected, reader), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                connected.cancel()
            if not self._connected.is_set():
                if reader.done() or self._closing:
                    raise ConnectionLost("the connection was lost and the client stopped reconnecting")
                raise TimeoutError("not connected to the policy server (reconnecting)")
        assert self._ws is not None
        return self._ws

    async def _send(self, frame: dict[str, Any], timeout: float | None = None) -> None:
        ws = await self._wait_connected(timeout)
        try:
            await ws.send(packb(frame))
        except ConnectionClosed:
            raise ConnectionLost("the connection closed while sending") from None

    async def _control(self, frame: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        async with self._control_lock:
            reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._control_reply = reply
            ws: ClientConnection | None = None
            try:
                await self._send(frame, timeout)
                ws = self._ws
                return await asyncio.wait_for(reply, timeout)
            finally:
                self._control_reply = None
                if reply.done() and not reply.cancelled():
                    # Answered, or failed (connection lost) while the frame was still being sent: then the call
                    # raised that already; read it here so the loop does not log it again as never retrieved.
                    reply.exception()
                elif ws is not None and ws is self._ws:
                    self._control_replies_owed += 1  # it stopped waiting, but its reply is on its way

    # -- requests --------------------------------------------------------------------------------------

    async def configure(self, timeout: float | None = 10.0, **settings: Any) -> dict[str, Any]:
        """Set session settings (the protocol's ``configure`` settings: ``SESSION_SETTINGS`` in
        :mod:`robot_clients.client_frames`, listed in ``docs/protocol.md``).

        Settings accumulate across calls and are re-sent after a reconnect. Returns the server's resolved
        configuration; raises :class:`ServerError` if the server refuses it (nothing is kept then).
        """
        reply = await self._control(protocol.configure_frame(settings), timeout)
        self._settings.update(settings)
        self.session = reply.get("config", {})
        return self.session

    async def reset(self, timeout: float | None = 10.0, *, session_id: str | None = None) -> None:
        """Drop everything this session (or its policy session ``session_id``) has waiting or running, and
        start its sequence over; the configuration is kept.

        The server answers each observation the reset drops with ``dropped`` (``cancelled``) before
        ``reset_done``; one of this session still waiting on the robot to be sent is dropped here
        (``unsent``). One submitted while the reset is on its way reaches the server after it and is
        answered as usual.
        """
        if self._sender is not None:
            # Held back by a slow link, it would reach the server after the reset and be answered.
            withdrawn = self._sender.withdraw(session_id)
            if withdrawn is not None:
                self._replaced_unsent(withdrawn, "the session was reset before it was sent")
        # Nothing is failed once the reset is done: every observation still awaited then was sent after the
        # reset (the server answered all the others first), and its answer is on its way.
        await self._control(protocol.reset_frame(session_id), timeout)
        self._latest_delivered.pop(session_id, None)

    async def cancel(self, seq: int | None = None, *, session_id: str | None = None) -> None:
        """Ask the server not to answer ``seq`` (or any outstanding observation when ``None``) of this
        session, or of its policy session ``session_id``."""
        await self._send(protocol.cancel_frame(seq, session_id))

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
        self._check_running()
        seq = self._next_seq
        self._next_seq += 1
        fields = self._frames.prepare(
            {"image": obs} if isinstance(obs, np.ndarray) else obs, self.metadata, self.session, settings
        )
        frame = _observation_frame(seq, fields, settings, state)
        if session_id is not None:
            frame[protocol.SESSION_ID] = session_id
        if self._sender is None:
            await self._send(frame, timeout)
            self._observation_sent(seq, 0)
        else:
            if not self._connected.is_set() and (self._closing or self._reader is None or self._reader.done()):
                raise ConnectionLost("not connected (call connect() first)")
            self._sender.put(
                seq, packb(frame), session_id
            )  # while reconnecting, the newest waits for the new connection
            # Let the sender write it now: a robot loop that is behind its schedule may never await otherwise,
            # and then nothing would leave (and the keepalive would go unanswered) until it caught up.
            await asyncio.sleep(0)
        self.stats.buffered_bytes = self.buffered_bytes
        self.stats.buffered_bytes_max = max(self.stats.buffered_bytes_max, self.stats.buffered_bytes)
        return seq

    @property
    def buffered_bytes(self) -> int:
        """Bytes written to the connection and not yet acknowledged by the server (the socket's send queue
        and the transport's buffer): what a slow link holds of this client's frames right now."""
        return buffered_bytes(self._ws) if self._ws is not None else 0

    def _observation_sent(self, seq: int, nbytes: int) -> None:
        self.stats.sent += 1
        self.stats.bytes_sent += nbytes

    def _replaced_unsent(self, seq: int, message: str = "a newer observation replaced it before it was sent") -> None:
        """``seq`` will never be written (a newer observation replaced it, a reset or its own call ended first,
        or no connection will come): it never reaches the server."""
        self.stats.dropped[UNSENT] += 1
        self._fail_waiter(seq, ObservationDropped(seq, UNSENT, message))

    async def receive(self, timeout: float | None = None) -> ActionChunk:
        """The next streamed chunk newer than any already delivered. Raises :class:`ServerError` when the
        server refused a streamed observation, :class:`TimeoutError` when nothing came in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._stream.empty():
                # Taken at once: wait_for given no time left (a robot polling with timeout=0) cancels the get
                # before it runs, and would report a chunk that already came as not arrived in time.
                item = self._stream.get_nowait()
            else:
                self._check_running()  # nothing will come while paused: say so instead of timing out
                try:
                    item = await asyncio.wait_for(self._stream.get(), remaining)
                except asyncio.TimeoutError:
                    raise TimeoutError("no action chunk arrived in time") from None
            if isinstance(item, ServerError):
                raise item
            if item.seq <= self._latest_delivered.get(item.session_id, -1):
                self.stats.stale += 1
                continue
            self._latest_delivered[item.session_id] = item.seq
            return item

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
        paused), :class:`SessionStopped`, :class:`ServerError` or :class:`ConnectionLost`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        future = asyncio.get_running_loop().create_future()
        seq = self._next_seq
        self._waiters[seq] = future
        try:
            await self.submit(obs, timeout, state=state, session_id=session_id, **settings)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            return await asyncio.wait_for(future, remaining)
        except asyncio.TimeoutError:
            if self._connected.is_set():
                try:
                    await self.cancel(seq, session_id=session_id)
                except ConnectionLost:
                    pass
            raise TimeoutError(f"no answer to observation {seq} within {timeout} s") from None
        finally:
            self._waiters.pop(seq, None)
            # Ended without its chunk (timed out, connection lost, cancelled) while its observation still waits
            # to be sent (for a new connection, say): sent now, it would be answered, and its chunk handed to the
            # next receive(). Nobody waits for it: it is not sent.
            if self._sender is not None and self._sender.withdraw(session_id, seq) is not None:
                self._replaced_unsent(seq, "its infer call ended before it was sent")


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
