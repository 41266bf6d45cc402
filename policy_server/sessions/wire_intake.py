"""A session's binary frames decoded within the element budget: small ones at once, large ones on a thread.

Every WebSocket session (native, openpi, vla-eval, SGLang's lock-step) decodes its client's msgpack
frames here. Each frame is first counted from its type bytes (:func:`robot_clients.wire_codec.count_elements`,
nothing built) against the server's :class:`~policy_server.server_settings.FrameBudget`; past it the frame is answered
``payload_too_large`` and the session goes on. A frame that is large in bytes, or whose structure holds
more than :data:`INLINE_VALUES` elements, is counted and decoded on the decode pool, not on the event
loop every session shares: the reader of that one session waits for it (its next frame is not read
meanwhile), every other session goes on. The CPU time decoding takes is charged to the session like the
decoding of its camera frames (``charge``: its next queued observation pays for it in its turn).

Every frame pays before it costs. A frame that parses is an observation or a control, paid for in its
session's turn (above) and bounded by the protocol's shapes. A frame that does not (past the element
budget, malformed, or refused by the protocol once decoded, like an observation of 49,990 empty maps) pays
nothing there, so the CPU time of counting and decoding it is spent from the connection's decode budget
(:class:`DecodeBudget`, ``FrameBudget.decode_share``, :meth:`WireIntake.spend_refused`). A connection in debt is
not read until the budget has refilled, so a client sending such frames back to back is paced to its share
of a core and cannot take the decode pool, or the event loop its threads contend with, from the others. A
frame that fails to parse spends its connection's rate too (``NativeSession.handle``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from robot_clients.protocol import ErrorCode, ProtocolError
from robot_clients.wire_codec import (
    WireFormatError,
    WireLimitError,
    count_elements,
    unpackb,
)

from ..foundation.camera_intake import decode_pool
from ..server_settings import FrameBudget

# A frame of this many bytes or more is decoded on a thread: building it copies its bytes.
OFF_LOOP_BYTES = 256 * 1024
# A smaller frame is counted on the event loop up to this many elements (well under a millisecond); one that
# holds more is counted and decoded on a thread too. Observations hold a few dozen.
INLINE_VALUES = 2048


@dataclass
class _Decoded:
    message: bytes
    value: Any
    error: WireFormatError | None
    cpu_s: float


def _decode(message: bytes, budget: FrameBudget, counted: bool = False) -> _Decoded:
    """Count (unless ``counted`` within the budget already), then build, ``message`` (on whatever thread calls
    it); the CPU seconds it took."""
    started = time.thread_time()
    try:
        if counted:
            value, error = unpackb(message), None
        else:
            value, error = unpackb(message, max_values=budget.max_values, max_depth=budget.max_depth), None
    except WireFormatError as exc:
        value, error = None, exc
    return _Decoded(message, value, error, time.thread_time() - started)


def _small(message: bytes, budget: FrameBudget) -> bool | None:
    """Whether ``message`` is cheap enough to decode on the event loop: True when it was counted within the
    budget here, None when it is malformed (cheap too: it is refused), False when it is not."""
    if len(message) >= OFF_LOOP_BYTES:
        return False
    try:
        count_elements(message, min(INLINE_VALUES, budget.max_values), budget.max_depth)
    except WireLimitError:
        return False
    except WireFormatError:
        return None
    return True


class DecodeBudget:
    """A connection's CPU seconds for decoding its frames: ``share`` of a core on average, ``burst_s`` at once."""

    def __init__(self, share: float, burst_s: float) -> None:
        self.share = share
        self.burst_s = burst_s
        self._credit = burst_s
        self._last = time.monotonic()

    def _refill(self, now: float) -> None:
        self._credit = min(self.burst_s, self._credit + (now - self._last) * self.share)
        self._last = now

    def spend(self, cpu_s: float, now: float | None = None) -> None:
        self._refill(time.monotonic() if now is None else now)
        self._credit -= cpu_s

    def wait_s(self, now: float | None = None) -> float:
        """How long until the budget is out of debt (0: it is not in debt)."""
        if self.share <= 0:  # off
            return 0.0
        self._refill(time.monotonic() if now is None else now)
        return 0.0 if self._credit >= 0 else -self._credit / self.share


class WireIntake:
    """One session's frames on their way in: :meth:`prepare` each frame as it is read (awaited), then
    :meth:`unpack` it where the protocol parses it. ``charge(cpu_s)`` bills the session's decode time."""

    def __init__(self, budget: FrameBudget, charge: Callable[[float], None]) -> None:
        self.budget = budget
        self._charge = charge
        self._ready: _Decoded | None = None
        self.refused = 0  # frames refused for their element budget
        self.cpu = DecodeBudget(budget.decode_share, budget.decode_burst_s)
        self.paused_s = 0.0  # seconds this connection was not read, its decode budget in debt
        self._last_cpu_s = 0.0  # what counting and decoding the last frame read took
        self._counted: bytes | None = None  # the frame prepare counted within the budget

    def spend_refused(self) -> None:
        """The last frame read was refused (it did not decode, or did not parse): its decoding is spent from
        the connection's decode budget, as nothing else pays for it."""
        self.cpu.spend(self._last_cpu_s)
        self._last_cpu_s = 0.0

    async def prepare(self, message: bytes | str) -> None:
        """Wait while the connection's decode budget is in debt, then decode ``message`` ahead, on the decode
        pool, when it is too costly for the event loop."""
        self._ready = None
        wait = self.cpu.wait_s()
        if wait > 0:
            self.paused_s += wait
            await asyncio.sleep(wait)
        self._last_cpu_s = 0.0
        self._counted = None
        if isinstance(message, bytes):
            started = time.thread_time()
            small = _small(message, self.budget)
            self._last_cpu_s = time.thread_time() - started
            if small:
                self._counted = message  # within the budget: unpack need not count it again
            elif small is False:
                self._ready = await decode_pool().run(_decode, message, self.budget)

    def unpack(self, message: bytes) -> Any:
        """``message`` decoded (ahead by :meth:`prepare`, or now if it is small).

        Raises :class:`ProtocolError` ``payload_too_large`` past the budget, :class:`WireFormatError` for a
        frame that is not well-formed (each protocol words that its own way).
        """
        decoded, self._ready = self._ready, None
        counted, self._counted = self._counted is message, None
        if decoded is None or decoded.message is not message:
            decoded = _decode(message, self.budget, counted)
        self._charge(decoded.cpu_s)
        self._last_cpu_s += decoded.cpu_s
        if isinstance(decoded.error, WireLimitError):
            self.refused += 1
            raise ProtocolError(ErrorCode.PAYLOAD_TOO_LARGE, decoded.error.message)
        if decoded.error is not None:
            raise decoded.error
        return decoded.value
