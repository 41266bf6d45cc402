"""What an :class:`~robot_clients.action_chunker.ActionChunker` reports: each chunk it used, and its counters.

Imports only numpy and the standard library: it runs on the robot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class ChunkRecord:
    """One chunk as the chunker used it (handed to ``on_chunk`` when it takes effect)."""

    index: int
    requested_at_step: int  # the tick whose observation it answers: its action 0 is for this step
    arrived_at_step: int  # the tick that picked it up
    applied_at_step: int  # the tick it started executing at (later than arrival for open_loop)
    latency_s: float  # from sending the observation to the chunk coming back
    actions: np.ndarray  # as received, H x D
    prefix_length: int = 0  # rtc: actions sent as prefix_actions
    prefix_error: float | None = None  # rtc: max |chunk[:K] - prefix|, 0 when the server honoured it


@dataclass
class ChunkerStats:
    """What happened so far, across episodes."""

    steps: int = 0
    requests: int = 0
    chunks: int = 0
    stall_steps: int = 0  # ticks that had no planned action and repeated the last one
    stalls: int = 0  # boundary stalls: runs of consecutive stall steps
    dropped: int = 0  # observations the server dropped (superseded, deadline, cancelled) or timed out
    errors: int = 0  # observations the server refused, or a failed connection
    stale_chunks: int = 0  # chunks that arrived after every action in them was due
    prefix_overruns: int = 0  # rtc: chunks that arrived after their prefix had been executed
    held_steps: int = 0  # ticks that held the last action because an operator paused (or stopped) the session
    holds: int = 0  # pauses: runs of consecutive held steps
    startup_s: float | None = None
    latencies_s: list[float] = field(default_factory=list)

    def latency_ms(self, quantile: float) -> float | None:
        """A quantile of the chunk latencies (``0.5``: p50), in milliseconds; None before any chunk."""
        if not self.latencies_s:
            return None
        return float(np.quantile(np.asarray(self.latencies_s), quantile) * 1e3)

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "requests": self.requests,
            "chunks": self.chunks,
            "chunk_latency_p50_ms": self.latency_ms(0.5),
            "chunk_latency_p99_ms": self.latency_ms(0.99),
            "stalls": self.stalls,
            "stall_steps": self.stall_steps,
            "dropped": self.dropped,
            "errors": self.errors,
            "stale_chunks": self.stale_chunks,
            "prefix_overruns": self.prefix_overruns,
            "held_steps": self.held_steps,
            "holds": self.holds,
            "startup_s": self.startup_s,
        }
