"""The hand-off between the event loop and the recorder's writer thread: bounded, and never blocking.

Producers (sessions, on the event loop) must never wait for the disk, so every ``offer_*`` returns at
once: ``True`` if the item was queued, ``False`` if a bound was reached (the caller counts the loss).
Three bounds apply:

- camera frames, by count and by bytes: they are what a slow disk would pile up;
- small events (chunks, drops, errors), by count, with a much larger allowance, so that the outcome of a
  frame already queued is almost never lost to a burst of frames;
- episode boundaries are always admitted: there is one per session start, reset or close, and losing
  one would leave an episode open forever.

Bytes are released when the writer takes a frame: from then on it is the writer's to bound (it flushes
to disk before holding more than its own budget).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class WriteQueue:
    """A FIFO of ``(key, item, nbytes)`` with separate allowances for frames and small events."""

    def __init__(self, max_frames: int, max_bytes: int, max_events: int) -> None:
        if max_frames < 1 or max_bytes < 1 or max_events < 1:
            raise ValueError("queue bounds must be positive")
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.max_events = max_events
        self._items: deque[tuple[Any, Any, int]] = deque()
        self._ready = threading.Condition(threading.Lock())
        self.frames = 0
        self.bytes = 0
        self.events = 0

    def offer_frame(self, key: Any, item: Any, nbytes: int) -> bool:
        with self._ready:
            if self.frames >= self.max_frames or self.bytes + nbytes > self.max_bytes:
                return False
            self.frames += 1
            self.bytes += nbytes
            self._items.append((key, item, nbytes))
            self._ready.notify()
            return True

    def offer_event(self, key: Any, item: Any) -> bool:
        with self._ready:
            if self.events >= self.max_events:
                return False
            self.events += 1
            self._items.append((key, item, -1))
            self._ready.notify()
            return True

    def put_control(self, key: Any, item: Any) -> None:
        """Queue ``item`` regardless of the bounds (episode boundaries and the writer's stop signal)."""
        with self._ready:
            self._items.append((key, item, -2))
            self._ready.notify()

    def get(self, timeout: float) -> tuple[Any, Any] | None:
        """The oldest ``(key, item)``, waiting up to ``timeout`` seconds; ``None`` if none came."""
        with self._ready:
            if not self._items and not self._ready.wait_for(lambda: bool(self._items), timeout):
                return None
            key, item, nbytes = self._items.popleft()
            if nbytes >= 0:
                self.frames -= 1
                self.bytes -= nbytes
            elif nbytes == -1:
                self.events -= 1
            return key, item

    def __len__(self) -> int:
        return len(self._items)
