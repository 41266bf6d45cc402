"""A connection's bounded outbox: replies wait here for the socket, within a frame and a byte budget.

Every server-side connection (a native session, an openpi session, an observer) writes its replies
through one :class:`Outbox` drained by one sender task, so the code that makes a reply never waits for a
slow client's socket. Without a bound, a client that never reads would make the server keep every reply
it ever made (measured: 2 GiB in a minute of tiny frames).

What the outbox does when a client falls behind:

* **Latest wins for replies too.** An entry put with a ``latest`` key replaces the unsent entry with the
  same key (an action chunk the client has not read yet, an observer's stale snapshot). The replaced one
  is handed to the ``replaced`` callback, which says what takes its place: nothing (a snapshot is just
  state) or a short reply in its position (a chunk becomes a ``dropped`` frame, so every ``seq`` still
  gets its one terminal reply). The entry being written to the socket is never replaced.
* **Everything else is kept, in order**: errors, drops, session and control replies are what a robot
  must still hear.
* **The reader waits for room.** A connection stops reading its client's frames while its outbox is more
  than half full (:meth:`Outbox.wait_for_room`), so a client that sends without reading is pushed back by
  TCP instead of making replies faster than they leave (a burst of frames read in one go could
  otherwise fill the outbox before the sender task gets a turn).
* **A full outbox refuses** with :class:`OutboxFull` instead of growing; the connection is then closed
  (``policy_server.foundation.connection_supervisor``), never made to lose a reply in silence. Only replies the
  server makes on its own (a chunk, an operator's control) can still arrive while the reader waits, so
  this is a safety net. One frame larger than the byte budget is accepted when the outbox is empty, so a
  big-but-legal frame still leaves.

:meth:`Outbox.stalled_for` is how long the oldest reply has waited (the one on the wire included): the
supervisor closes a connection whose replies stay stuck past a time limit.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# A reply that must be sent in place of a replaced one: (payload, its size in bytes), or None for none.
Replacement = tuple[Any, int] | None


class OutboxFull(Exception):
    """The client is not reading: its outbox holds as many frames or bytes as it may."""

    def __init__(self, frames: int, nbytes: int) -> None:
        super().__init__(f"{frames} replies ({nbytes} bytes) wait unread")
        self.frames = frames
        self.nbytes = nbytes


@dataclass
class OutboxEntry:
    payload: Any
    nbytes: int
    latest: str | None  # entries with a key: a newer one with the same key replaces this one if unsent
    queued_at: float


class Outbox:
    """Replies of one connection on their way to the socket. Single event loop; not thread-safe."""

    def __init__(self, max_frames: int, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_frames = max(1, max_frames)
        self.max_bytes = max(1, max_bytes)
        self._clock = clock
        self._waiting: deque[OutboxEntry] = deque()
        self._in_flight: OutboxEntry | None = None
        self._bytes = 0  # waiting + in flight
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closed = False
        self.replaced = 0  # entries replaced by a newer one before they were sent

    def __len__(self) -> int:
        """Frames held: waiting plus the one being written."""
        return len(self._waiting) + (self._in_flight is not None)

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def closed(self) -> bool:
        return self._closed

    def put(
        self,
        payload: Any,
        nbytes: int,
        *,
        latest: str | None = None,
        replaced: Callable[[Any], Replacement] | None = None,
    ) -> None:
        """Queue a reply of ``nbytes`` bytes. Raises :class:`OutboxFull` (and queues nothing) when full.

        With ``latest``, an unsent entry with the same key is replaced: ``replaced(old_payload)`` returns
        what takes its place (or None to remove it). A closed outbox silently takes nothing: the
        connection is going away and nobody will read.
        """
        if self._closed:
            return
        now = self._clock()
        if latest is not None:
            for index, entry in enumerate(self._waiting):
                if entry.latest == latest:
                    self.replaced += 1
                    self._bytes -= entry.nbytes
                    substitute = replaced(entry.payload) if replaced is not None else None
                    if substitute is None:
                        del self._waiting[index]
                    else:
                        # In the old one's place and with its age: the stall clock keeps running.
                        self._waiting[index] = OutboxEntry(substitute[0], substitute[1], None, entry.queued_at)
                        self._bytes += substitute[1]
                    break
        held = len(self)
        if held and (held + 1 > self.max_frames or self._bytes + nbytes > self.max_bytes):
            raise OutboxFull(held, self._bytes)
        self._waiting.append(OutboxEntry(payload, nbytes, latest, now))
        self._bytes += nbytes
        self._ready.set()

    async def get(self) -> OutboxEntry | None:
        """The next entry to write (it counts as in flight until :meth:`sent`); None once closed."""
        assert self._in_flight is None, "call sent() for the previous entry first"
        while not self._waiting:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        self._in_flight = self._waiting.popleft()
        return self._in_flight

    def sent(self) -> None:
        """The entry from :meth:`get` has left (or failed to); it no longer counts."""
        if self._in_flight is not None:
            self._bytes -= self._in_flight.nbytes
            self._in_flight = None
        if self.has_room():
            self._room.set()

    def has_room(self) -> bool:
        """At most half full (frames and bytes): the connection may read its client's next frame."""
        return len(self) <= self.max_frames // 2 and self._bytes <= self.max_bytes // 2

    async def wait_for_room(self) -> None:
        """Return once the outbox is at most half full, or closed."""
        while not self._closed and not self.has_room():
            self._room.clear()
            await self._room.wait()

    def stalled_for(self, now: float | None = None) -> float:
        """Seconds the oldest held reply has waited (0 when empty): how far behind the client is."""
        oldest = self._in_flight or (self._waiting[0] if self._waiting else None)
        if oldest is None:
            return 0.0
        return max(0.0, (self._clock() if now is None else now) - oldest.queued_at)

    def waiting(self, latest: str) -> int:
        """Unsent entries with this ``latest`` key (0 or 1; a producer may skip making a newer one)."""
        return sum(entry.latest == latest for entry in self._waiting)

    def empty(self) -> bool:
        return not self._waiting and self._in_flight is None

    def close(self, discard: bool = True) -> None:
        """Stop taking replies and wake the sender; ``discard`` frees what waits (nobody will read it)."""
        self._closed = True
        if discard:
            self._bytes -= sum(entry.nbytes for entry in self._waiting)
            self._waiting.clear()
        self._ready.set()
        self._room.set()

    async def pump(self, send: Callable[[Any], Awaitable[None]], encode: Callable[[Any], Any] | None = None) -> None:
        """The sender task's loop: ``send(encode(payload))`` each entry in order until the outbox is closed.

        ``send``'s exceptions (the connection closed) end the loop and propagate; the outbox is then
        closed, which also wakes a reader waiting for room (nothing will ever leave again).
        """
        try:
            while (entry := await self.get()) is not None:
                try:
                    await send(encode(entry.payload) if encode is not None else entry.payload)
                finally:
                    self.sent()
        except BaseException:
            self.close()
            raise


async def paced(messages: AsyncIterable[Any], outbox: Outbox) -> AsyncIterator[Any]:
    """A connection's incoming frames, read only while its outbox has room.

    A client that does not read its replies is not read either (TCP then pushes back on it); once its
    outbox is closed (it is being closed, or the connection is gone) reading stops: what it still sends is
    never parsed (a flood buffered in the kernel would otherwise cost the loop seconds). Each frame yields
    the event loop: one socket read can hold thousands of small frames, and other connections must not
    wait for them all.
    """
    async for message in messages:
        if outbox.closed:
            return
        yield message
        if not outbox.has_room():
            await outbox.wait_for_room()
        await asyncio.sleep(0)


def payload_size(payload: bytes | str) -> int:
    """The bytes an encoded reply holds in the outbox."""
    return len(payload) if isinstance(payload, bytes) else len(payload.encode())
