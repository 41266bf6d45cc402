"""Closes WebSocket connections that hold the server's resources without using them.

Two kinds of client cost memory or a session slot while doing nothing useful:

* **one that stops reading its replies.** Its replies pile up (bounded by its
  :class:`~policy_server.foundation.outbox.Outbox`; latest wins, so it keeps only its newest chunk). Once the
  oldest reply has waited ``reply_timeout_s`` the client is closed with 1008. websockets' own keepalive
  does not catch this case: ``ping()`` writes its frame and then waits for the write buffer to drain,
  which never happens when the peer's receive window is full, so the ping timeout never starts (read in
  ``websockets/asyncio/connection.py``, 17.4: ``keepalive`` -> ``ping`` -> ``send_context`` ->
  ``drain``). Keepalive still covers a silent peer whose buffers are not full.
* **a robot session that sends no observation** for ``idle_timeout_s`` while nothing of it is queued
  or running: closed with 1008 so that idle sockets cannot fill ``--max-sessions``.

Closing a client that does not read cannot use the closing handshake alone: ``close()`` also waits for
the write buffer to drain. :func:`close_connection` gives the close frame ``close_grace_s`` to leave,
then drops the TCP connection.

One task per server (:class:`ConnectionSupervisor`) checks every connection a few times a second; each
connection (native, openpi, observer) offers ``outbox``, ``connection``, ``id`` and ``idle_for(now)``
(:class:`Supervised`; an observer is never idle).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from websockets.asyncio.server import ServerConnection

from .outbox import Outbox, OutboxFull

logger = logging.getLogger(__name__)

# Close code for a client that broke one of these rules (RFC 6455: "policy violation"); the reason says which.
POLICY_CLOSE_CODE = 1008

# An action chunk is a few KB, a `dropped` or `error` frame ~150 bytes: 1024 frames or 1 MiB is far more
# than a client that reads ever has waiting, and bounds one that does not (64 sessions: 64 MiB at most).
DEFAULT_MAX_OUTBOX_FRAMES = 1024
DEFAULT_MAX_OUTBOX_BYTES = 2**20
# Longer than any network hiccup a robot survives anyway (its chunks would be stale), shorter than the
# time a non-reading client needs to matter.
DEFAULT_REPLY_TIMEOUT_S = 10.0
# A robot between episodes may sit a while; an idle socket holding a slot for minutes is a leak.
DEFAULT_IDLE_TIMEOUT_S = 60.0
# What the transport may buffer above the outbox (websockets' write_limit, the high-water mark): once
# above, `send` waits and replies wait in the bounded outbox instead. 32 KiB is websockets' default,
# set explicitly because the outbox's bound relies on it.
WRITE_LIMIT_BYTES = 2**15
# The kernel's send buffer of a WebSocket connection. Left to autotuning it grows to megabytes, and a
# client that does not read can make the server produce that many bytes of replies (tens of thousands of
# frames) before any backpressure reaches the outbox. Replies are small (a chunk is a few KB): 64 KiB
# (Linux doubles it) keeps any link busy and brings the stall after a few thousand frames.
SOCKET_SEND_BUFFER_BYTES = 64 * 1024
# Frames websockets may read ahead of a connection's reader (its max_queue; default 16). A reader waits
# while its outbox is half full (policy_server.foundation.outbox), and what the client sends meanwhile must stay in
# TCP's buffers, not in ours: at most this many frames of up to --max-message-mib each.
MAX_QUEUED_FRAMES = 2


@dataclass(frozen=True)
class SessionLimits:
    """Per-connection bounds (``cosmos3-serve`` flags; docs/security.md). A timeout of 0 turns it off."""

    max_outbox_frames: int = DEFAULT_MAX_OUTBOX_FRAMES
    max_outbox_bytes: int = DEFAULT_MAX_OUTBOX_BYTES
    reply_timeout_s: float = DEFAULT_REPLY_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    # How long a client being closed gets to take the close frame before the TCP connection is dropped.
    close_grace_s: float = 2.0

    def outbox(self) -> Outbox:
        return Outbox(self.max_outbox_frames, self.max_outbox_bytes)

    @property
    def check_interval_s(self) -> float:
        timeouts = [t for t in (self.reply_timeout_s, self.idle_timeout_s) if t > 0]
        return min([0.5] + [t / 4 for t in timeouts]) if timeouts else 0.5


class Supervised(Protocol):
    id: str
    connection: ServerConnection
    outbox: Outbox

    def idle_for(self, now: float) -> float:
        """Seconds it has used nothing while holding a slot (0: busy, or a kind that is never idle)."""
        ...


async def close_connection(connection: ServerConnection, code: int, reason: str, grace_s: float) -> None:
    """Close with ``code`` and ``reason``; if the peer does not take the close frame within ``grace_s``
    (it is not reading, so the write buffer never drains), drop the TCP connection."""
    try:
        await asyncio.wait_for(connection.close(code, reason), timeout=grace_s)
    except asyncio.TimeoutError:
        connection.transport.abort()


class ConnectionSupervisor:
    """Checks every connection ``connections()`` returns each ``limits.check_interval_s`` and closes those
    past a limit."""

    def __init__(self, connections: Callable[[], Iterable[Supervised]], limits: SessionLimits) -> None:
        self.connections = connections
        self.limits = limits
        self.closed_for: dict[str, int] = {"reply_timeout": 0, "outbox_full": 0, "idle": 0}
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="connection-supervisor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.limits.check_interval_s)
            try:
                self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - a bug here must not stop the supervision for good
                logger.exception("connection supervision failed; retrying")

    def check(self, now: float) -> None:
        limits = self.limits
        for conn in self.connections():
            if conn.outbox.closed:
                continue
            stalled = conn.outbox.stalled_for(now)
            if limits.reply_timeout_s > 0 and stalled > limits.reply_timeout_s:
                self.close(
                    conn,
                    "reply_timeout",
                    f"not reading replies: the oldest waited {stalled:.0f} s (limit {limits.reply_timeout_s:g} s)",
                )
                continue
            if limits.idle_timeout_s > 0:
                idle = conn.idle_for(now)
                if idle > limits.idle_timeout_s:
                    self.close(
                        conn, "idle", f"idle: no observation for {idle:.0f} s (limit {limits.idle_timeout_s:g} s)"
                    )

    def overflowed(self, conn: Supervised, full: OutboxFull) -> None:
        """``conn``'s outbox refused a reply: close it rather than lose the reply in silence."""
        self.close(conn, "outbox_full", f"not reading replies: {full.frames} frames, {full.nbytes} bytes wait")

    def close(self, conn: Supervised, cause: str, reason: str) -> None:
        """Stop ``conn``'s replies (what waits is freed) and close it with 1008 and ``reason``. Idempotent."""
        if conn.outbox.closed:
            return
        conn.outbox.close()
        self.closed_for[cause] += 1
        logger.warning("%s closed (%d): %s", conn.id, POLICY_CLOSE_CODE, reason)
        task = asyncio.get_running_loop().create_task(
            close_connection(conn.connection, POLICY_CLOSE_CODE, reason, self.limits.close_grace_s),
            name=f"{conn.id}-close",
        )
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
