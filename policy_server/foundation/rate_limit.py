"""The rate limit: a token bucket (:class:`TokenBucket`) and its setting (:class:`RateLimit`).

Every robot session holds one for its observations (``--max-observation-hz``, ``--observation-burst``): an
observation beyond it is answered ``rate_limited`` before it is decoded and is never queued, so it cannot
replace the one that waits. Latest wins bounds what a fast sender costs the engine, not what its frames cost
the event loop. Observers and the sidecar's recording pages are held to the same kind of bucket.
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
