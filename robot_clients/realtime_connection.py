"""The client side of the native realtime protocol: one session on one connection, kept across reconnects.

:class:`RealtimeConnection` is what :class:`~robot_clients.async_policy_client.AsyncPolicyClient` builds its
requests on. It connects (retrying while the server loads), reads every frame the server sends and routes
it: a chunk to the ``infer`` call waiting for its ``seq`` or to the stream ``receive`` reads, a drop or an
error to the call it ends, a ``session``/``reset_done`` to the control request waiting for it. It follows
the operator's controls (``session_state``: running, paused, stopped; ``session_updated``: an operator's
prompt kept across reconnects), reconnects in the background with backoff when the connection drops, and
fails every waiting call with :class:`ConnectionLost` when it does.

Imports only numpy, msgpack (through the wire codec) and websockets: it runs on the robot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, TypeVar

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from . import protocol
from .client_connection import Backoff, open_session, realtime_url
from .protocol import DropReason, SessionState
from .results import (
    ActionChunk,
    ClientStats,
    ConnectionLost,
    ObservationDropped,
    ServerError,
    SessionPaused,
    SessionStopped,
)
from .wire_codec import packb, unpackb

__all__ = ["PAUSED", "RUNNING", "STOPPED", "RealtimeConnection"]

# The client's one logger, named as before the session was a module of its own (logging configs name it).
logger = logging.getLogger("robot_clients.async_policy_client")

# Session states an operator can set (server frame `session_state`).
RUNNING, PAUSED, STOPPED = SessionState.RUNNING.value, SessionState.PAUSED.value, SessionState.STOPPED.value

_Connection = TypeVar("_Connection", bound="RealtimeConnection")


class RealtimeConnection:
    """The connection to ``/v1/actions/realtime`` and the session on it. Not thread-safe: use it from one
    event loop. ``connect_kwargs`` are websockets' ``connect`` options
    (:func:`~robot_clients.client_connection.connect_options`); the other arguments are
    :class:`~robot_clients.async_policy_client.AsyncPolicyClient`'s of the same names."""

    def __init__(
        self,
        url: str,
        connect_kwargs: dict[str, Any],
        *,
        connect_timeout: float,
        reconnect: bool,
        backoff_initial: float,
        backoff_max: float,
    ) -> None:
        self.url = realtime_url(url)
        self._connect_kwargs = connect_kwargs
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
        self._latest_delivered = -1
        self._waiters: dict[int, asyncio.Future] = {}  # infer() calls waiting for their seq
        self._control_lock = asyncio.Lock()  # one configure/reset at a time: their replies carry no seq
        self._control_reply: asyncio.Future | None = None
        self._stream: asyncio.Queue[ActionChunk | ServerError] = asyncio.Queue()

    # -- connection ------------------------------------------------------------------------------------

    async def connect(self) -> dict[str, Any]:
        """Open the connection (retrying while the server is loading) and return its metadata."""
        self._closing = False
        await self._open(deadline=time.monotonic() + self.connect_timeout)
        self._reader = asyncio.create_task(self._read_loop(), name="policy-client-reader")
        return self.metadata

    async def _open(self, deadline: float | None) -> None:
        """Connect with backoff until ``deadline`` (None: forever), read metadata, re-send the config."""
        opened = await open_session(
            self.url,
            self._connect_kwargs,
            self._settings,
            Backoff(self.backoff_initial, self.backoff_max),
            deadline,
            lambda: self._closing,
        )
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
        await self._stop_sending()
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            try:
                await asyncio.wait_for(self._reader, timeout=5.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._reader.cancel()
        self._fail_waiters(ConnectionLost("the client was closed"))

    async def _stop_sending(self) -> None:
        """Stop what is still held to be sent, before the socket closes (the client's in-flight bound)."""

    async def __aenter__(self: _Connection) -> _Connection:
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
            self._fail_waiters(
                ConnectionLost(f"connection closed (code {ws.close_code}: {ws.close_reason or 'no reason'})")
            )
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

    # -- sending ---------------------------------------------------------------------------------------

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
