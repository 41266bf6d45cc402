"""The clients' one observation waiting to be sent: a newer one replaces it, so the newest can overtake.

On a slow link, a robot that writes every frame to its socket builds a queue there (the kernel's send
buffer, the transport's write buffer): the newest frame waits behind all the older ones, and the server's
"latest wins" cannot help because it never sees the newest. :class:`LatestObservationSender` holds at
most one observation that is not on the wire yet and sends it only once what the socket still holds
(written, not yet acknowledged) is below ``max_buffered_bytes``; an observation put while one waits
replaces it (the replaced one is reported to ``replaced``, never sent).

:func:`buffered_bytes` is what a connection holds: the transport's write buffer plus, on Linux, the
socket's send queue (bytes written and not yet acknowledged by the server).
"""

from __future__ import annotations

import asyncio
import struct
import sys
from collections.abc import Awaitable, Callable
from typing import Any

try:
    import fcntl
except ImportError:  # not on Linux: the transport's own buffer is all that is counted
    fcntl = None  # type: ignore[assignment]

__all__ = ["LatestObservationSender", "buffered_bytes"]

_TIOCOUTQ = 0x5411  # Linux: bytes in a TCP socket's send queue


def buffered_bytes(ws: Any) -> int:
    """Bytes written to ``ws`` (a websockets connection) and not yet acknowledged by the server."""
    transport = getattr(ws, "transport", None)
    if transport is None:
        return 0
    total = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None and fcntl is not None and sys.platform.startswith("linux"):
        try:
            total += struct.unpack("i", fcntl.ioctl(sock.fileno(), _TIOCOUTQ, b"\0\0\0\0"))[0]
        except (OSError, ValueError):  # the socket is closed (its descriptor is -1)
            pass
    return total


class LatestObservationSender:
    """Sends observations one at a time, latest wins (see the module docstring).

    ``current()`` is the connection now (None while reconnecting), ``connection()`` waits for one;
    ``replaced(seq)`` is told of an observation a newer one replaced before it was sent, ``sent(seq,
    nbytes)`` of each one written. At any moment one observation is being written and one waits.
    """

    def __init__(
        self,
        current: Callable[[], Any],
        connection: Callable[[], Awaitable[Any]],
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
        self._sending: tuple[int, bytes] | None = None
        self._waiting: tuple[int, bytes] | None = None
        self._ready = asyncio.Event()
        self._task: asyncio.Task | None = None

    def put(self, seq: int, payload: bytes) -> None:
        """Queue ``payload`` to be sent (at once if the link is free); one still waiting is replaced."""
        if self._waiting is not None:
            self._replaced(self._waiting[0])
        self._waiting = (seq, payload)
        ws = self._current()
        if self._sending is None and ws is not None and buffered_bytes(ws) <= self.max_buffered_bytes:
            self._sending, self._waiting = self._waiting, None  # taken now: a next put cannot replace it
        self._ready.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="policy-client-sender")

    @property
    def waiting(self) -> int | None:
        """The seq of the observation waiting to be sent, if any."""
        return None if self._waiting is None else self._waiting[0]

    async def _run(self) -> None:
        try:
            while True:
                if self._sending is None:
                    await self._ready.wait()
                    ws = await self._connection()
                    while buffered_bytes(ws) > self.max_buffered_bytes:  # the link still carries older bytes
                        await asyncio.sleep(self.poll_s)
                    self._ready.clear()
                    if self._waiting is None:
                        continue
                    self._sending, self._waiting = self._waiting, None
                ws = await self._connection()
                seq, payload = self._sending
                try:
                    await ws.send(payload)
                except Exception:  # noqa: BLE001 - the connection dropped: the reader reconnects
                    if self._waiting is None:  # nothing newer: send this one on the next connection
                        self._waiting = self._sending
                    self._sending = None
                    self._ready.set()
                    await asyncio.sleep(self.poll_s)
                    continue
                self._sending = None
                self._sent(seq, len(payload))
        except Exception:  # noqa: BLE001 - no connection any more (the client is closing or gave up)
            self._sending = self._waiting = None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        self._task = None
