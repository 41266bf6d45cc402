"""Per-session observation rate limit: a token bucket, checked before an observation is queued.

Latest-observation-wins already bounds what a fast sender costs the *engine* (one waiting observation
per session). What it does not bound is the event loop: every frame is decoded (a 720p camera frame is
2.8 MB of msgpack) before the queue sees it. A client streaming hundreds of frames a second would take
the loop from every other robot; a refused observation at least costs no validation, no request building
and no queue churn, and the client is told to slow down. The bucket refills at ``rate_hz`` and holds
``burst`` observations, so a robot at its control rate never notices it, and a burst after a network
hiccup (frames that queued up in the socket) passes.

An observation over the limit is answered ``error`` with code ``rate_limited`` (its ``seq`` when
known); the session goes on. It is never queued, so it cannot replace the observation that waits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# Robots run at 10-50 Hz; 200/s leaves room for several cameras' worth of frames and never bites a
# well-behaved client, while it bounds a runaway one to a few hundred decodes a second.
DEFAULT_MAX_OBSERVATION_HZ = 200.0
DEFAULT_BURST = 50


@dataclass
class RateLimit:
    """``rate_hz`` observations per second on average, ``burst`` at once; ``rate_hz`` <= 0 turns it off."""

    rate_hz: float = DEFAULT_MAX_OBSERVATION_HZ
    burst: int = DEFAULT_BURST

    @property
    def enabled(self) -> bool:
        return self.rate_hz > 0

    def bucket(self) -> TokenBucket:
        return TokenBucket(self.rate_hz, max(1, self.burst))


class TokenBucket:
    """A classic token bucket; ``take()`` is O(1) and reads the monotonic clock once."""

    def __init__(self, rate_hz: float, burst: int) -> None:
        self.rate_hz = float(rate_hz)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._last = time.monotonic()
        self.refused = 0

    def take(self, now: float | None = None) -> bool:
        """Spend one token if there is one. False (and counted) when the limit is reached."""
        if self.rate_hz <= 0:
            return True
        now = time.monotonic() if now is None else now
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate_hz)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.refused += 1
        return False

    def message(self) -> str:
        return (
            f"more than {self.rate_hz:g} observations per second (burst {self.burst:g}) on this session; "
            "this one was not queued. Send at your control rate: the server always answers the latest"
        )
