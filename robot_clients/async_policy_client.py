"""``AsyncPolicyClient``: the asyncio client of the native realtime protocol (version 1).

One round trip::

    async with AsyncPolicyClient("ws://robot-server:8000") as client:
        await client.configure(domain_name="droid_lerobot")
        chunk = await client.infer({"image": rgb}, timeout=0.5)

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
  ``"paused"``), :meth:`infer` and :meth:`submit` raise :class:`SessionPaused` without sending and the
  robot should hold (:meth:`wait_until_running` waits for the resume); once stopped, calls raise
  :class:`SessionStopped` and the client does not reconnect. A prompt set by an operator replaces the
  client's own, also after a reconnect.

Imports only numpy, msgpack (through the wire codec) and websockets: it runs on the robot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Mapping

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from . import protocol
from .client_connection import Backoff, connect_options, open_session, realtime_url
from .observation_sender import LatestObservationSender, buffered_bytes
from .outgoing_frames import OutgoingFrames
from .protocol import DropReason, SessionState
from .results import (
    ActionChunk, ClientStats, ConnectionLost, ObservationDropped, ServerError, SessionPaused, SessionStopped,
)
from .wire_codec import packb, unpackb

logger = logging.getLogger(__name__)

# Session states an operator can set (server frame `session_state`).
RUNNING, PAUSED, STOPPED = SessionState.RUNNING.value, SessionState.PAUSED.value, SessionState.STOPPED.value
# The drop reason of an observation replaced on the robot, before it was sent (the in-flight bound).
UNSENT = "unsent"


def _observation_frame(seq: int, obs: Mapping[str, Any], settings: Mapping[str, Any],
                       state: Any = None) -> dict[str, Any]:
    # ``settings`` are this observation's own (the server applies them to it alone).
    frame = protocol.observation_frame(seq, obs, settings)
    if state is not None:  # a list of joint readings travels as the float32 array the protocol names
        frame["state"] = np.ascontiguousarray(state, dtype=np.float32)
    # Opaque to the server, which echoes it in the chunk: this is how the client measures round trips.
    frame.setdefault("timestamp", time.monotonic())
    return frame


class AsyncPolicyClient:
    """Client of ``/v1/actions/realtime``. Not thread-safe: use it from one event loop.

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
            ``"png"`` (quality 90), or a :class:`~robot_clients.frame_encoding.ImageEncoding` (another quality).
            Encoding needs Pillow (the ``images`` extra).
        resize: shrink every camera to the size the server would shrink it to (the served tier's canvas,
            from the metadata frame) before sending, so the link carries no pixels the server throws away.
        max_buffered_bytes: the in-flight bound. An observation is written to the socket only once what it
            still holds from earlier ones (written, not yet acknowledged) is below this; meanwhile at most
            one observation waits, and a newer one replaces it (counted in ``stats.dropped["unsent"]``), so
            on a slow link the newest frame overtakes instead of queueing behind stale ones. ``submit``
            returns at once. ``None``: no bound; ``submit`` waits while the socket's buffer is full.
    """

    def __init__(
        self,
        url: str = "ws://127.0.0.1:8000",
        *,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
        ssl: Any = None,
        connect_timeout: float = 30.0,
        reconnect: bool = True,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        max_message_bytes: int = 64 * 2**20,
        proxy: str | bool | None = None,
        images: Any = "raw",
        resize: bool = False,
        max_buffered_bytes: int | None = 32 * 1024,
    ) -> None:
        self.url = realtime_url(url)
        self._connect_kwargs = connect_options(
            headers=headers, token=token, ssl=ssl, connect_timeout=connect_timeout, ping_interval=ping_interval,
            ping_timeout=ping_timeout, max_message_bytes=max_message_bytes, proxy=proxy)
        self.connect_timeout = connect_timeout
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
        self._reader: asyncio.Task | None = None
        self._closing = False
        self._next_seq = 0
        self._latest_delivered = -1
        self._waiters: dict[int, asyncio.Future] = {}  # infer() calls waiting for their seq
        self._control_lock = asyncio.Lock()  # one configure/reset at a time: their replies carry no seq
        self._control_reply: asyncio.Future | None = None
        self._stream: asyncio.Queue[ActionChunk | ServerError] = asyncio.Queue()
        self._frames = OutgoingFrames(images, resize)
        self._sender = None if max_buffered_bytes is None else LatestObservationSender(
            lambda: self._ws if self._connected.is_set() else None, lambda: self._wait_connected(None),
            self._replaced_unsent, self._observation_sent, max_buffered_bytes)

    # -- connection ------------------------------------------------------------------------------------

    async def connect(self) -> dict[str, Any]:
        """Open the connection (retrying while the server is loading) and return its metadata."""
        self._closing = False
        await self._open(deadline=time.monotonic() + self.connect_timeout)
        self._reader = asyncio.create_task(self._read_loop(), name="policy-client-reader")
        return self.metadata

    async def _open(self, deadline: float | None) -> None:
        """Connect with backoff until ``deadline`` (None: forever), read metadata, re-send the config."""
        opened = await open_session(self.url, self._connect_kwargs, self._settings,
                                    Backoff(self.backoff_initial, self.backoff_max), deadline, lambda: self._closing)
        self.metadata = opened.metadata
        if opened.session is not None:
            self.session = opened.session
        self._ws = opened.ws
        self._set_state(RUNNING, "")  # a new connection is a new session: it starts running
        self._connected.set()

    async def close(self) -> None:
        """Close the connection and stop reconnecting."""
        self._closing = True
        self._connected.clear()
        if self._sender is not None:
            await self._sender.close()
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            try:
                await asyncio.wait_for(self._reader, timeout=5.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._reader.cancel()
        self._fail_waiters(ConnectionLost("the client was closed"))

    async def __aenter__(self) -> "AsyncPolicyClient":
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def _read_loop(self) -> None:
        while True:
            ws = self._ws
            try:
                async for message in ws:
                    self._dispatch(unpackb(message))
            except ConnectionClosed:
                pass
            self._connected.clear()
            if self.session_state == STOPPED:  # an operator ended the session: reconnecting would undo that
                self._fail_waiters(SessionStopped(f"the session was stopped by an operator ({self.state_reason})"))
                return
            self._fail_waiters(ConnectionLost(f"connection closed (code {ws.close_code}: {ws.close_reason or 'no reason'})"))
            if self._closing or not self.reconnect:
                return
            logger.info("connection lost (code %s); reconnecting", ws.close_code)
            try:
                await self._open(deadline=None)
            except Exception as exc:  # noqa: BLE001 - give up only on errors retrying cannot fix
                logger.error("reconnecting failed for good: %s", exc)
                return
            self.stats.reconnects += 1

    def _fail_waiter(self, seq: int, exc: Exception) -> bool:
        """End the ``infer`` call waiting for ``seq`` (if any) with ``exc``; say whether there was one."""
        waiter = self._waiters.pop(seq, None)
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

    def _dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        seq = frame.get("seq")
        if kind == protocol.ACTION_CHUNK:
            sent_at = frame.get("timestamp")
            round_trip = (time.monotonic() - sent_at) * 1e3 if isinstance(sent_at, float) else None
            chunk = ActionChunk.from_frame(frame, round_trip)
            if seq <= self._latest_delivered:
                self.stats.stale += 1  # a newer chunk already reached the robot: this one is wrong now
                self._fail_waiter(seq, ObservationDropped(seq, "stale", "a newer chunk was already delivered"))
                return
            waiter = self._waiters.pop(seq, None)
            self.stats.answered += 1
            if waiter is not None:
                self._latest_delivered = seq
                if not waiter.done():
                    waiter.set_result(chunk)
            else:
                self._stream.put_nowait(chunk)
        elif kind == protocol.DROPPED:
            reason = frame.get("reason", "")
            self.stats.dropped[reason] += 1
            if reason == DropReason.PAUSED:
                self._fail_waiter(seq, SessionPaused(seq, self.state_reason))
            elif reason == DropReason.STOPPED:
                self._fail_waiter(seq, SessionStopped(frame.get("message", "")))
            else:
                self._fail_waiter(seq, ObservationDropped(seq, reason, frame.get("message", "")))
        elif kind == protocol.ERROR:
            self.stats.errors += 1
            error = ServerError(frame.get("code", ""), frame.get("message", ""), frame.get("field"), seq)
            if seq is None and self._control_reply is not None and not self._control_reply.done():
                self._control_reply.set_exception(error)
            elif seq is not None and not self._fail_waiter(seq, error):
                self._stream.put_nowait(error)  # a streamed observation's: receive() raises it
            elif seq is None:
                logger.warning("server error: %s", error)
        elif kind in (protocol.SESSION, protocol.RESET_DONE):
            if self._control_reply is not None and not self._control_reply.done():
                self._control_reply.set_result(frame)
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

    # -- requests --------------------------------------------------------------------------------------

    async def _wait_connected(self, timeout: float | None) -> ClientConnection:
        if not self._connected.is_set():
            if self._closing or self._reader is None or self._reader.done():
                raise ConnectionLost("not connected (call connect() first)")
            try:
                await asyncio.wait_for(self._connected.wait(), timeout)
            except asyncio.TimeoutError:
                raise TimeoutError("not connected to the policy server (reconnecting)") from None
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
            self._control_reply = asyncio.get_running_loop().create_future()
            try:
                await self._send(frame, timeout)
                return await asyncio.wait_for(self._control_reply, timeout)
            finally:
                self._control_reply = None

    async def configure(self, timeout: float | None = 10.0, **settings: Any) -> dict[str, Any]:
        """Set session settings (``domain_name``, ``action_mode``, ``action_horizon``, ``prompt``, ...).

        Settings accumulate across calls and are re-sent after a reconnect. Returns the server's resolved
        configuration; raises :class:`ServerError` if the server refuses it (nothing is kept then).
        """
        reply = await self._control(protocol.configure_frame(settings), timeout)
        self._settings.update(settings)
        self.session = reply.get("config", {})
        return self.session

    async def reset(self, timeout: float | None = 10.0) -> None:
        """Drop everything this session has waiting or running; the configuration is kept."""
        await self._control(protocol.reset_frame(), timeout)
        for seq in list(self._waiters):
            self._waiters.pop(seq).set_exception(ObservationDropped(seq, DropReason.CANCELLED, "reset"))

    async def cancel(self, seq: int | None = None) -> None:
        """Ask the server not to answer ``seq`` (or any outstanding observation when ``None``)."""
        await self._send(protocol.cancel_frame(seq))

    async def submit(self, obs: Mapping[str, Any] | np.ndarray, timeout: float | None = None, *,
                     state: Any = None, **settings: Any) -> int:
        """Send an observation without waiting for its chunk; return its ``seq``. See :meth:`receive`.

        ``state`` is the robot's proprio state (``[state_dim]`` or ``[history_length, state_dim]``, sent as
        float32) for a domain that conditions on it (``state_dim`` in the metadata's ``domains``). ``settings`` (``domain_name``, ``action_horizon``, ``action_mode``, ``prompt``, ``seed``, ...) apply
        to this observation only, over the session's configuration; the chunk reports what was used.
        Raises :class:`SessionPaused` (nothing is sent) while an operator has the session paused.
        """
        self._check_running()
        seq = self._next_seq
        self._next_seq += 1
        fields = self._frames.prepare({"image": obs} if isinstance(obs, np.ndarray) else obs, self.metadata,
                                      self.session, settings)
        frame = _observation_frame(seq, fields, settings, state)
        if self._sender is None:
            await self._send(frame, timeout)
            self._observation_sent(seq, 0)
        else:
            if not self._connected.is_set() and (self._closing or self._reader is None or self._reader.done()):
                raise ConnectionLost("not connected (call connect() first)")
            self._sender.put(seq, packb(frame))  # while reconnecting, the newest waits for the new connection
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

    def _replaced_unsent(self, seq: int) -> None:
        """A newer observation replaced ``seq`` before it was written: it never reaches the server."""
        self.stats.dropped[UNSENT] += 1
        self._fail_waiter(seq, ObservationDropped(seq, UNSENT, "a newer observation replaced it before it was sent"))

    async def receive(self, timeout: float | None = None) -> ActionChunk:
        """The next streamed chunk newer than any already delivered. Raises :class:`ServerError` when the
        server refused a streamed observation, :class:`TimeoutError` when nothing came in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._stream.empty():
                self._check_running()  # nothing will come while paused: say so instead of timing out
            try:
                item = await asyncio.wait_for(self._stream.get(), remaining)
            except asyncio.TimeoutError:
                raise TimeoutError("no action chunk arrived in time") from None
            if isinstance(item, ServerError):
                raise item
            if item.seq <= self._latest_delivered:
                self.stats.stale += 1
                continue
            self._latest_delivered = item.seq
            return item

    async def infer(self, obs: Mapping[str, Any] | np.ndarray, timeout: float | None = 10.0, *,
                    state: Any = None, **settings: Any) -> ActionChunk:
        """Send one observation and wait for its chunk (one round trip).

        ``obs`` is a map of observation fields (``image``, ``images``, ``video``, ``deadline_ms``,
        ``prefix_actions``, ``state``, ``timestamp``) or just an H×W×3 uint8 image; ``state=`` is the robot's
        proprio state, as for :meth:`submit`. ``settings`` are session settings
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
            await self.submit(obs, timeout, state=state, **settings)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            return await asyncio.wait_for(future, remaining)
        except asyncio.TimeoutError:
            if self._connected.is_set():
                try:
                    await self.cancel(seq)
                except ConnectionLost:
                    pass
            raise TimeoutError(f"no answer to observation {seq} within {timeout} s") from None
        finally:
            self._waiters.pop(seq, None)
