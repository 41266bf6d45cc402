"""One episode being recorded, on the writer thread: rows buffered until answered, flushed in segments.

An observation becomes a row when it arrives; the row waits in memory until the session reports its
outcome (a chunk, a drop or an error: every observation gets exactly one), then goes to disk with the
rows around it as one *segment*: one MP4 per camera, the rows as Parquet, and ``segment.json`` last,
which commits the segment. So a crash loses at most the rows not yet flushed, and what was flushed stays
readable: the dataset is assembled from the committed segments, at the episode's end or at the next start.

A flush happens when a segment's worth of leading rows is answered, when the oldest row has waited
``flush_interval_s`` (rows still unanswered after twice that are recorded as ``unanswered``; a late
answer goes to the event log), or when the recorder needs the memory back; never with fewer than
``MIN_SEGMENT_FRAMES`` rows, except at the episode's end.

The episode's layout (cameras, their sizes, the state's width, the chunk's shape) is fixed by its first
observation and its configuration; :meth:`EpisodeWriter.fits` tells the recorder when a later
observation needs a new episode.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa

from cosmos3_runtime.lerobot_layout import ANSWERED_KIND, DROPPED_KIND, ERROR_KIND, RESPONSE_KIND, UNANSWERED_KIND
from robot_clients.client_frames import REQUEST_SETTINGS

from ..foundation import durable_files
from ..foundation.camera_intake import side_by_side
from ..videos.encoding import encode_mp4
from .assembly import MIN_SEGMENT_FRAMES
from .events import EpisodeStart, ObservationRecord, RowOutcome
from .lerobot_format import (
    EVENTS_JSONL,
    FORMAT_NAME,
    FORMAT_VERSION,
    NO_VALUE,
    SEGMENT_COMMIT,
    SEGMENT_ROWS,
    SEGMENTS_DIR,
    SESSION_JSON,
    TIMING_NAMES,
    VIDEO_KEY_PREFIX,
    EpisodeLayout,
    channel_histograms,
    column,
    write_table,
)
from .store import directory_bytes

_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")
# The ActionRequest settings a row keeps (everything but the arrays), so a replay can send it again.
REQUEST_FIELDS = (
    *(setting.name for setting in REQUEST_SETTINGS if setting.recorded),
    "guidance_interval",  # the engine's, set by no client: recorded so that a replay sends the same request
)


# The count an episode's summary keeps of each answered kind of row.
COUNTED_AS = {ANSWERED_KIND: "chunks", DROPPED_KIND: "dropped", ERROR_KIND: "errors"}


class UnrecordableObservation(ValueError):
    """An observation the dataset cannot hold (a camera that is not H×W×3 uint8, a malformed state)."""


def iso_utc(wall: float) -> str:
    return datetime.fromtimestamp(wall, tz=timezone.utc).isoformat()


def camera_keys(names: list[str]) -> dict[str, str]:
    """Video keys (``observation.images.<name>``, LeRobot's convention) for the robot's camera names.

    LeRobot's feature names cannot hold ``/`` and the key is a folder name, so anything but ASCII
    letters, digits and ``_`` becomes ``_``; clashes get a numeric suffix.
    """
    keys: dict[str, str] = {}
    for name in names:
        base = _KEY_UNSAFE.sub("_", name)[:48].strip("_") or "camera"
        key, n = VIDEO_KEY_PREFIX + base, 2
        while key in keys:
            key, n = f"{VIDEO_KEY_PREFIX}{base}_{n}", n + 1
        keys[key] = name
    return keys


def _checked_frame(name: str, frame: Any) -> np.ndarray:
    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise UnrecordableObservation(f"camera {name!r} is not an H×W×3 uint8 frame")
    return frame


def _image_source(request: Any, cameras: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
    """Which recorded camera(s) became the model's image: the same array, equal pixels, or the cameras
    side by side (the ``concat_view`` composition). ``None`` if the image came from elsewhere."""
    image = request.image
    if image is None:
        return {"clip": True} if request.video is not None else None
    for name, frame in cameras.items():
        if frame is image:
            return {"camera": name}
    for name, frame in cameras.items():
        if frame.shape == image.shape and np.array_equal(frame, image):
            return {"camera": name}
    if len(cameras) > 1:
        try:
            composed = side_by_side(list(cameras.values()))
        except Exception:  # noqa: BLE001 - not composable: the image came from elsewhere
            return None
        if composed.shape == image.shape and np.array_equal(composed, image):
            return {"side_by_side": list(cameras)}
    return None


def request_json(request: Any, cameras: Mapping[str, np.ndarray]) -> str:
    if request is None:
        return "null"
    fields: dict[str, Any] = request.named_settings()
    if fields["guidance_interval"] is not None:
        fields["guidance_interval"] = list(fields["guidance_interval"])
    prefix = request.prefix_actions
    fields["prefix_actions"] = None if prefix is None else np.asarray(prefix, dtype=np.float32).tolist()
    fields["image_source"] = _image_source(request, cameras)
    return json.dumps(fields)


@dataclass(slots=True)
class _Row:
    seq: int
    received_at: float
    client_timestamp: float | None
    request: Any
    cameras: Mapping[str, np.ndarray]
    state: np.ndarray | None
    task: str
    nbytes: int
    outcome: RowOutcome


class EpisodeWriter:
    """One episode's folder under ``.partial`` and the rows it has not flushed yet (writer thread only)."""

    def __init__(self, folder: Path, name: str, start: EpisodeStart, episode: int, quality: int) -> None:
        self.folder = folder
        self.name = name
        self.start = start
        self.episode = episode
        self.quality = quality
        self.config: dict[str, Any] = dict(start.config)
        self.layout: EpisodeLayout | None = None
        self.rows: list[_Row] = []
        self.by_seq: dict[int, _Row] = {}
        self.buffered_bytes = 0
        self.segments = 0
        self.frames_flushed = 0
        self.frames_lost = 0
        self.counts = {"observations": 0, "chunks": 0, "dropped": 0, "errors": 0}
        self._events: TextIO | None = None

    # -- files ---------------------------------------------------------------------------------------

    def open(self) -> None:
        (self.folder / SEGMENTS_DIR).mkdir(parents=True)
        (self.folder / SESSION_JSON).parent.mkdir(parents=True, exist_ok=True)
        self._events = open(self.folder / EVENTS_JSONL, "a", encoding="utf-8")
        self.write_session()
        self.log("episode_start", self.start.started_at, config=self.config)

    def write_session(self, end: Mapping[str, Any] | None = None) -> None:
        start = self.start
        durable_files.write_json(
            self.folder / SESSION_JSON,
            {
                "format": FORMAT_NAME,
                "version": FORMAT_VERSION,
                "name": self.name,
                "session_id": start.session_id,
                "protocol": start.protocol,
                "episode": self.episode,
                "started_at": iso_utc(start.started_wall),
                "fps": start.fps,
                "config": self.config,
                "model": dict(start.model),
                "layout": None if self.layout is None else self.layout.to_json(),
                "counts": dict(self.counts),
                "frames_lost": self.frames_lost,
                **(end or {}),
            },
        )

    def log(self, kind: str, at: float, **details: Any) -> None:
        line = {"t": round(at - self.start.started_at, 6), "kind": kind, **details}
        assert self._events is not None, "the episode's files are not open"
        durable_files.append_line(self._events, json.dumps(line, default=str))

    def close_files(self) -> None:
        if self._events is not None:
            events, self._events = self._events, None
            try:
                events.close()
            except OSError:
                pass  # a full disk refused the last line; the file is closed all the same

    # -- rows ------------------------------------------------------------------------------------------

    def _layout_of(self, obs: ObservationRecord) -> EpisodeLayout:
        if not obs.cameras:
            raise UnrecordableObservation("the observation has no camera frame")
        keys = camera_keys(list(obs.cameras))
        cameras, frame_sizes = {}, {}
        for key, name in keys.items():
            height, width = _checked_frame(name, obs.cameras[name]).shape[:2]
            cameras[key] = (height + height % 2, width + width % 2)
            frame_sizes[key] = (height, width)
        state_dim = None
        if obs.state is not None:
            state = np.asarray(obs.state)
            if state.dtype.kind not in "fiub" or state.size == 0:
                raise UnrecordableObservation("the state is not a numeric vector")
            state_dim = int(state.size)
        horizon, dim = self.config["action_horizon"], self.config["raw_action_dim"]
        return EpisodeLayout(
            cameras=cameras,
            frame_sizes=frame_sizes,
            camera_names=keys,
            state_dim=state_dim,
            action_shape=(int(horizon), int(dim)),
        )

    def fits(self, obs: ObservationRecord) -> bool:
        """Whether ``obs`` has this episode's layout (``UnrecordableObservation`` if it has none)."""
        layout = self._layout_of(obs)
        return self.layout is None or layout == self.layout

    def add(self, obs: ObservationRecord) -> None:
        if self.layout is None:
            self.layout = self._layout_of(obs)
            self.write_session()
        task = obs.request.prompt if obs.request is not None else str(self.config.get("prompt") or "")
        row = _Row(
            obs.seq,
            obs.received_at - self.start.started_at,
            obs.client_timestamp,
            obs.request,
            obs.cameras,
            obs.state,
            task,
            obs.nbytes,
            RowOutcome(),
        )
        self.rows.append(row)
        self.by_seq[obs.seq] = row
        self.buffered_bytes += obs.nbytes
        self.counts["observations"] += 1

    def resolve(self, seq: int, outcome: RowOutcome) -> bool:
        """Give row ``seq`` its outcome; ``False`` if no waiting row has that seq (already flushed, or
        never recorded: the caller logs the outcome instead)."""
        row = self.by_seq.get(seq)
        if row is None or row.outcome.kind != UNANSWERED_KIND:
            return False
        if (
            outcome.actions is not None
            and self.layout is not None
            and tuple(outcome.actions.shape) != tuple(self.layout.action_shape)
        ):
            # Not a chunk the episode can hold: recorded as an error, so that no reader trains on it or
            # counts it in the action statistics.
            outcome = RowOutcome(
                ERROR_KIND,
                "shape_mismatch",
                f"the chunk's shape {tuple(outcome.actions.shape)} is not the episode's "
                f"{tuple(self.layout.action_shape)}",
                None,
                outcome.seed,
                outcome.timing,
            )
        row.outcome = outcome
        return True

    def reconfigure(self, config: Mapping[str, Any]) -> bool:
        """Take a new configuration; ``False`` if it changes the chunk's shape (a new episode is needed)."""
        if self.layout is not None and (int(config["action_horizon"]), int(config["raw_action_dim"])) != tuple(
            self.layout.action_shape
        ):
            return False
        self.config = dict(config)
        return True

    # -- flushing ------------------------------------------------------------------------------------

    def due(self, now: float, segment_frames: int, flush_interval_s: float | None) -> int:
        """How many leading rows to flush now (0: none yet); never fewer than MIN_SEGMENT_FRAMES.
        ``flush_interval_s`` None: only by size (the writer is behind, and outcomes may be queued)."""
        if len(self.rows) < MIN_SEGMENT_FRAMES:
            return 0
        if len(self.rows) >= 2 * segment_frames:
            return segment_frames
        answered = 0
        for row in self.rows[:segment_frames]:
            if row.outcome.kind == UNANSWERED_KIND:
                break
            answered += 1
        if answered == segment_frames or flush_interval_s is None:
            return answered if answered == segment_frames else 0
        waited = now - (self.start.started_at + self.rows[0].received_at)
        if waited >= 2 * flush_interval_s:
            return min(len(self.rows), segment_frames)
        if waited >= flush_interval_s and answered >= MIN_SEGMENT_FRAMES:
            return answered
        return 0

    def flush(self, count: int) -> int:
        """Write the first ``count`` rows as the next segment; returns the bytes it took on disk."""
        rows, layout = self.rows[:count], self.layout
        assert layout is not None, "an episode with rows has a layout"
        folder = self.folder / SEGMENTS_DIR / f"{self.segments:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        fps = self.start.fps
        histograms = {}
        # Only the episode's last segment can be this short: it repeats its last frame (MIN_SEGMENT_FRAMES).
        padding = max(0, MIN_SEGMENT_FRAMES - len(rows))
        for key, name in layout.camera_names.items():
            frames = np.stack([row.cameras[name] for row in rows] + [rows[-1].cameras[name]] * padding)
            histograms[key] = channel_histograms(frames[: len(rows)]).tolist()
            encode_mp4(frames, fps, folder / f"{key}.mp4", quality=self.quality)
            del frames
        write_table(folder / SEGMENT_ROWS, self._rows_table(rows))
        durable_files.write_json(
            folder / SEGMENT_COMMIT,
            {"frames": len(rows), "video_frames": len(rows) + padding, "histograms": histograms},
        )
        self.segments += 1
        self.frames_flushed += len(rows)
        self._forget(rows)
        for row in rows:
            if row.outcome.kind != UNANSWERED_KIND:
                self.counts[
                    {ANSWERED_KIND: "chunks", DROPPED_KIND: "dropped", ERROR_KIND: "errors"}[row.outcome.kind]
                ] += 1
        return directory_bytes(folder)

    def discard_buffer(self) -> int:
        """Forget every unflushed row (the disk cannot take them); returns how many were lost."""
        lost = len(self.rows)
        self._forget(list(self.rows))
        self.frames_lost += lost
        return lost

    def _forget(self, rows: list[_Row]) -> None:
        del self.rows[: len(rows)]
        for row in rows:
            self.by_seq.pop(row.seq, None)
            self.buffered_bytes -= row.nbytes

    def _rows_table(self, rows: list[_Row]) -> pa.Table:
        layout = self.layout
        assert layout is not None, "an episode with rows has a layout"
        features = layout.features(self.start.fps)
        horizon, dim = layout.action_shape
        # No NaN anywhere: LeRobot's tools (aggregate_datasets goes through pandas) turn NaN into nulls,
        # which its loader cannot read. What has no value gets NO_VALUE (timings, timestamps) or zeros
        # (the chunk of an observation that got none); `response.kind` says which rows hold a chunk.
        no_chunk = np.zeros((horizon, dim), dtype=np.float32)
        outcomes = [row.outcome for row in rows]
        timing = np.array(
            [[NO_VALUE if (ms := o.timing.get(n)) is None else float(ms) for n in TIMING_NAMES] for o in outcomes],
            dtype=np.float32,
        ).reshape(len(rows), len(TIMING_NAMES))
        columns: dict[str, pa.Array] = {}
        if layout.state_dim is not None:
            states = np.stack([np.asarray(r.state, dtype=np.float32).reshape(-1) for r in rows])
            columns["observation.state"] = column(states, features["observation.state"])
        actions = np.stack([no_chunk if o.actions is None else np.asarray(o.actions, np.float32) for o in outcomes])
        columns["action"] = column(actions, features["action"])
        values = {
            "observation.seq": np.array([r.seq for r in rows], dtype=np.int64),
            "observation.received_at": np.array([r.received_at for r in rows], dtype=np.float64),
            "observation.client_timestamp": np.array(
                [NO_VALUE if r.client_timestamp is None else r.client_timestamp for r in rows], dtype=np.float64
            ),
            "observation.request": [request_json(r.request, r.cameras) for r in rows],
            RESPONSE_KIND: [o.kind for o in outcomes],
            "response.reason": [o.reason for o in outcomes],
            "response.message": [o.message for o in outcomes],
            "response.seed": np.array([-1 if o.seed is None else o.seed for o in outcomes], dtype=np.int64),
            "response.timing_ms": timing,
        }
        for name, value in values.items():
            columns[name] = (
                column(value, features[name]) if isinstance(value, np.ndarray) else pa.array(value, pa.string())
            )
        columns["task"] = pa.array([r.task for r in rows], pa.string())
        return pa.table(columns)

    def end(self, reason: str, at: float, frames_not_queued: int) -> None:
        """Record why the episode ended (the rows must have been flushed or discarded)."""
        self.log("episode_end", at, reason=reason)
        self.close_files()
        self.write_session(
            {"ended_at": iso_utc(time.time()), "end_reason": reason, "frames_not_queued": frames_not_queued}
        )
