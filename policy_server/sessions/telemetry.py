"""The listener every native session has built in: its telemetry (:class:`SessionTelemetry`), what an operator
sees of it (the latest camera frame and chunk, latencies, drops), read by the dashboard's observers.

Each telemetry event costs O(1) and copies nothing (the latest frame is kept by reference), because it runs
on the event loop for every observation whether or not anybody watches; the JPEG an observer sees is made
only when one asks (:meth:`SessionTelemetry.preview`), once per frame however many watch. Telemetry times are
wall-clock (``time.time()``): they are shown to people and plotted in a browser, not used for scheduling.
"""

from __future__ import annotations

import base64
import io
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..session_events import AcceptedObservation, SessionListener

# How many recent chunks and drops a session remembers for the latency timeline.
HISTORY = 200
# Observation arrival times kept for the rate estimate.
RATE_WINDOW = 32


@dataclass(frozen=True)
class ChunkSample:
    """One answered observation, for the latency timeline. Times in ms."""

    t: float
    seq: int
    total_ms: float
    queue_ms: float
    model_ms: float


@dataclass(frozen=True)
class DropSample:
    """One observation that got no actions (``reason`` as in the ``dropped`` frame)."""

    t: float
    seq: int
    reason: str


@dataclass(frozen=True)
class CameraFrame:
    """The latest camera frame of a session: H×W×3 uint8, kept by reference (not a copy)."""

    seq: int
    t: float
    image: np.ndarray


class SessionTelemetry(SessionListener):
    """Recent history of one session, written on the event loop, read by observers on the same loop."""

    def __init__(self) -> None:
        self.opened_at = time.time()
        self.chunks: deque[ChunkSample] = deque(maxlen=HISTORY)
        self.drops: deque[DropSample] = deque(maxlen=HISTORY)
        self.latest_frame: CameraFrame | None = None
        self.latest_actions: np.ndarray | None = None
        self.latest_actions_seq: int | None = None
        self.observations = 0
        self.answered = 0
        self.errors = 0
        self._arrivals: deque[float] = deque(maxlen=RATE_WINDOW)
        self._preview: tuple[CameraFrame, tuple[str, int, int]] | None = None  # (frame, encode_preview's result)

    # -- the session's events ----------------------------------------------------------------------

    def observation(self, event: AcceptedObservation) -> None:
        now = time.time()
        self.observations += 1
        self._arrivals.append(now)
        obs = event.frame
        image = obs.image if obs.images is None else next(iter(obs.images.values()), None)
        video = obs.video
        if isinstance(image, np.ndarray):
            self.latest_frame = CameraFrame(obs.seq, now, image)
        elif isinstance(video, np.ndarray) and len(video):
            self.latest_frame = CameraFrame(obs.seq, now, video[-1])

    def chunk_made(self, seq: int, actions: np.ndarray, timing: Mapping[str, float | None]) -> None:
        self.answered += 1
        self.latest_actions, self.latest_actions_seq = actions, seq
        self.chunks.append(
            ChunkSample(
                time.time(),
                seq,
                float(timing.get("total_ms") or 0.0),
                float(timing.get("queue_ms") or 0.0),
                float(timing.get("model_ms") or 0.0),
            )
        )

    def dropped(self, seq: int, reason: str, message: str) -> None:
        self.drops.append(DropSample(time.time(), seq, reason))

    def error(self, seq: int | None, code: str, message: str, field: str | None) -> None:
        self.errors += 1

    # -- reading (for observers) -----------------------------------------------------------------

    def preview(self, frame: CameraFrame) -> tuple[str, int, int]:
        """``encode_preview`` of ``frame``, encoded once and shared by every observer of this session."""
        if self._preview is None or self._preview[0] is not frame:
            self._preview = (frame, encode_preview(frame.image))
        return self._preview[1]

    def observation_hz(self, now: float | None = None) -> float | None:
        """Observations per second over the recent window; None with fewer than two, or when idle 2 s."""
        now = time.time() if now is None else now
        if len(self._arrivals) < 2 or now - self._arrivals[-1] > 2.0:
            return None
        span = self._arrivals[-1] - self._arrivals[0]
        return (len(self._arrivals) - 1) / span if span > 0 else None

    def latency_ms(self, quantile: float) -> float | None:
        """A quantile of ``total_ms`` (arrival to chunk ready) over the remembered chunks."""
        if not self.chunks:
            return None
        return float(np.quantile(np.fromiter((c.total_ms for c in self.chunks), float), quantile))


def encode_preview(image: np.ndarray, max_side: int = 320, quality: int = 80) -> tuple[str, int, int]:
    """A JPEG of ``image`` for the dashboard, as (base64 text, width, height).

    Shrinks by an integer stride first (cheap, no resampling library) so the longest side is at most
    ``max_side``: an operator needs to see what the robot sees, not every pixel of it.
    """
    from PIL import Image  # the server extra ships pillow; robots never import this module

    stride = max(1, -(-max(image.shape[0], image.shape[1]) // max_side))
    small = np.ascontiguousarray(image[::stride, ::stride, :3], dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(small, "RGB").save(buffer, format="JPEG", quality=quality)
    return base64.b64encode(buffer.getvalue()).decode("ascii"), small.shape[1], small.shape[0]
