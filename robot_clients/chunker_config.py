"""How an :class:`~robot_clients.action_chunker.ActionChunker` executes chunks: its strategy and settings.

Imports only the standard library: it runs on the robot.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ChunkStrategy(str, enum.Enum):
    """How a new chunk is merged with the rest of the one being executed (see the module docstring)."""

    OPEN_LOOP = "open_loop"
    REPLACE = "replace"
    BLEND = "blend"
    REAL_TIME_CHUNKING = "rtc"


class ChunkerError(RuntimeError):
    """The chunker cannot produce actions (the first chunk never came, or the chunker is closed)."""


@dataclass(frozen=True)
class ChunkerConfig:
    """How chunks are executed.

    Args:
        strategy: a :class:`ChunkStrategy` or its value (``open_loop``, ``replace``, ``blend``, ``rtc``).
        control_hz: the rate the robot executes actions at; turns measured latency into steps.
        execute_horizon: actions executed of each chunk before the next one should take over (k). ``None``:
            the whole chunk. For ``open_loop`` it is a hard limit; the other strategies keep executing the
            rest of the chunk if the next one is late, and stall only when it is exhausted.
        request_threshold: ask for the next chunk when this many actions of the execution window remain.
            ``None``: the latency estimate in steps plus ``latency_margin_steps``, re-measured every chunk.
        latency_margin_steps: steps of slack added to the measured latency (jitter, the tick that picks the
            chunk up).
        blend_steps: ``blend`` cross-fades over at most this many steps; ``None``: the whole overlap.
        latency_window: how many recent chunk latencies the estimate looks at.
        latency_quantile: which quantile of them it takes (0.9: plan for a slow chunk, not the median).
        startup_timeout_s: how long the first call waits for the first chunk.
    """

    strategy: ChunkStrategy | str = ChunkStrategy.REAL_TIME_CHUNKING
    control_hz: float = 20.0
    execute_horizon: int | None = None
    request_threshold: int | None = None
    latency_margin_steps: int = 2
    blend_steps: int | None = None
    latency_window: int = 16
    latency_quantile: float = 0.9
    startup_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "strategy", ChunkStrategy(self.strategy))
        except ValueError:
            known = ", ".join(s.value for s in ChunkStrategy)
            raise ValueError(f"unknown chunk strategy {self.strategy!r}; expected one of {known}") from None
        if not self.control_hz > 0:
            raise ValueError(f"control_hz must be > 0, got {self.control_hz}")
        if self.execute_horizon is not None and self.execute_horizon < 1:
            raise ValueError(f"execute_horizon must be >= 1, got {self.execute_horizon}")
        if self.request_threshold is not None and self.request_threshold < 0:
            raise ValueError(f"request_threshold must be >= 0, got {self.request_threshold}")
        if self.latency_margin_steps < 0:
            raise ValueError(f"latency_margin_steps must be >= 0, got {self.latency_margin_steps}")
        if self.blend_steps is not None and self.blend_steps < 1:
            raise ValueError(f"blend_steps must be >= 1, got {self.blend_steps}")
        if not 0.0 < self.latency_quantile <= 1.0:
            raise ValueError(f"latency_quantile must be in (0, 1], got {self.latency_quantile}")
