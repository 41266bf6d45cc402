"""What a session tells the recorder: typed events that cross from the event loop to the writer thread.

A session's ``SessionRecording`` builds one of these per call and the writer thread consumes them in
order. They hold references, never copies:
camera frames, states and action arrays are the very arrays the session decoded or the engine returned,
and nobody mutates those after the fact (the session sends them and forgets them). Everything that costs
more than a few attribute reads (JSON encoding, stacking frames, statistics) happens on the writer
thread.

All ``*_at`` times are ``time.monotonic()`` seconds, the clock sessions already stamp frames with; the
writer turns them into seconds since the episode started.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos3_runtime.lerobot_layout import UNANSWERED_KIND
from cosmos3_runtime.requests import ActionRequest


@dataclass(frozen=True, slots=True)
class EpisodeStart:
    """A session starts (or restarts after a reset) an episode.

    ``config`` is the session's resolved configuration (JSON-able; it must name ``action_horizon`` and
    ``raw_action_dim``, the shape of every chunk); ``model`` identifies the model that answers (JSON-able,
    e.g. the checkpoint, variant and dtype from the engine's ``describe()``). ``fps`` is the dataset's
    nominal frame rate (LeRobot's clock: frame *i* is at *i*/fps); real arrival times are recorded too.
    """

    session_id: str
    protocol: str
    config: Mapping[str, Any]
    model: Mapping[str, Any]
    fps: int
    started_at: float
    started_wall: float


@dataclass(frozen=True, slots=True)
class Reconfigured:
    """The session's resolved configuration changed mid-episode (a ``configure`` frame, an operator)."""

    config: Mapping[str, Any]
    at: float


@dataclass(frozen=True, slots=True)
class ObservationRecord:
    """One observation as it entered the session: its cameras, its state, the engine request made of it.

    ``cameras`` maps the robot's camera names to H×W×3 uint8 frames. ``request`` is the
    :class:`~cosmos3_runtime.ActionRequest` the session queued for it (``None`` if it never became one);
    the recorder keeps its settings so that ``cosmos3-replay`` can send the same request again.
    """

    seq: int
    cameras: Mapping[str, np.ndarray]
    request: ActionRequest | None
    state: np.ndarray | None
    received_at: float
    client_timestamp: float | None
    nbytes: int


@dataclass(frozen=True, slots=True)
class ChunkReturned:
    """The chunk of actions a session sent for observation ``seq``, with the timing the robot saw."""

    seq: int
    actions: np.ndarray
    timing: Mapping[str, float | None]
    seed: int | None
    at: float


@dataclass(frozen=True, slots=True)
class DropRecord:
    """Observation ``seq`` got a ``dropped`` reply (``reason`` as in the frame)."""

    seq: int
    reason: str
    message: str
    at: float


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """An ``error`` reply, about observation ``seq`` or (``seq`` None) about the session's traffic."""

    seq: int | None
    code: str
    message: str
    field: str | None
    at: float


@dataclass(frozen=True, slots=True)
class NoteRecord:
    """Something else worth a line in the episode's event log (operator controls, replica moves)."""

    kind: str
    details: Mapping[str, Any]
    at: float


@dataclass(frozen=True, slots=True)
class EpisodeEnd:
    """The episode is over (``reason``: ``closed``, ``reset``, ``stopped``...).

    ``frames_not_queued`` counts this episode's observations the session could not hand to the writer
    (its queue was full or recording had stopped): they are missing from the dataset, and its
    ``session.json`` says how many.
    """

    reason: str
    at: float
    frames_not_queued: int = 0


EpisodeEvent = (
    EpisodeStart | Reconfigured | ObservationRecord | ChunkReturned | DropRecord | ErrorRecord | NoteRecord | EpisodeEnd
)


@dataclass(slots=True)
class RowOutcome:
    """How an observation was answered, as the dataset row records it (filled on the writer thread)."""

    kind: str = UNANSWERED_KIND  # one of RESPONSE_KINDS
    reason: str = ""
    message: str = ""
    actions: np.ndarray | None = None
    seed: int | None = None
    timing: Mapping[str, float | None] = field(default_factory=dict)
