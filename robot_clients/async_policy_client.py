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

The connection and the session on it (reconnecting, routing the server's frames, the operator's controls)
are :class:`~robot_clients.realtime_connection.RealtimeConnection`'s, which this class extends with the
requests; how an observation reaches the socket (resized, encoded, held under the in-flight bound) is
this module's. Imports only numpy, msgpack (through the wire codec) and websockets: it runs on the robot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import protocol
from .client_connection import connect_options
from .observation_sender import LatestObservationSender, buffered_bytes
from .outgoing_frames import OutgoingFrames
from .protocol import DropReason
from .realtime_connection import RealtimeConnection
from .results import ActionChunk, ConnectionLost, ObservationDropped, ServerError
from .wire_codec import packb

__all__ = ["AsyncPolicyClient"]

# The drop reason of an observation replaced on the robot, before it was sent (the in-flight bound).
UNSENT = "unsent"


def _observation_frame(
    seq: int, obs: Mapping[str, Any], settings: Mapping[str, Any], state: Any = None
) -> dict[str, Any]:
    # ``settings`` are this observation's own (the server applies them to it alone).
    frame = protocol.observation_frame(seq, obs, settings)
    if state is not None:  # a list of joint readings travels as the float32 array the protocol names
        frame["state"] = np.ascontiguousarray(state, dtype=np.float32)
    # Opaque to the server, which echoes it in the chunk: this is how the client measures round trips.
    frame.setdefault("timestamp", time.monotonic())
    return frame


class AsyncPolicyClient(RealtimeConnection):
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
        super().__init__(
            url,
            connect_options(
                headers=headers,
                token=token,
                ssl=ssl,
                connect_timeout=connect_timeout,
                ping_interval=ping_interval,
                ping_timeout=ping_timeout,
                max_message_bytes=max_message_bytes,
                proxy=proxy,
            ),
            connect_timeout=connect_timeout,
            reconnect=reconnect,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )
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

    async def _stop_sending(self) -> None:
        if self._sender is not None:
            await self._sender.close()

    # -- requests --------------------------------------------------------------------------------------

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

    async def submit(
        self, obs: Mapping[str, Any] | np.ndarray, timeout: float | None = None, *, state: Any = None, **settings: Any
    ) -> int:
        """Send an observation without waiting for its chunk; return its ``seq``. See :meth:`receive`.

        ``state`` is the robot's proprio state (``[state_dim]`` or ``[history_length, state_dim]``, sent as
        float32) for a domain that conditions on it (``state_dim`` in the metadata's ``domains``).
        ``settings`` (``domain_name``, ``action_horizon``, ``action_mode``, ``prompt``, ``seed``, ...) apply to
        this observation only, over the session's configuration; the chunk reports what was used.
        Raises :class:`SessionPaused` (nothing is sent) while an operator has the session paused.
        """
        self._check_running()
        seq = self._next_seq
        self._next_seq += 1
        fields = self._frames.prepare(
            {"image": obs} if isinstance(obs, np.ndarray) else obs, self.metadata, self.session, settings
        )
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

    async def infer(
        self, obs: Mapping[str, Any] | np.ndarray, timeout: float | None = 10.0, *, state: Any = None, **settings: Any
    ) -> ActionChunk:
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
