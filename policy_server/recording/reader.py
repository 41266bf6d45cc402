"""A published recording read back: its session, its rows, its camera frames, its event log.

For ``cosmos3-replay`` and, later, the dashboard's replay. Only the recorder's own files are read (the
LeRobot layout plus ``meta/cosmos3/``), with pyarrow and ffmpeg; LeRobot itself is not needed. Camera
frames are streamed, one row at a time from every camera's MP4 in step, so a long episode does not have
to fit in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from .assembly import column_values
from .durable_files import read_lines
from .episode_files import EVENTS_JSONL, FORMAT_NAME, SESSION_JSON
from .lerobot_format import (
    CODEBASE_VERSION,
    DATA_PATH,
    INFO_PATH,
    NO_VALUE,
    TIMING_NAMES,
    EpisodeLayout,
    video_path,
)


class RecordingFormatError(ValueError):
    """The folder is not a recording this server wrote (or not a whole one)."""


@dataclass(frozen=True)
class RecordedRow:
    """One observation of a recording and how it was answered."""

    frame_index: int
    seq: int
    received_at: float  # seconds since the episode started
    request: dict[str, Any] | None  # the engine request's settings (see episode_writer.request_json)
    kind: str  # chunk | dropped | error | unanswered
    reason: str
    message: str
    actions: np.ndarray | None  # (horizon, action_dim) float32 when kind == "chunk"
    seed: int | None
    timing_ms: dict[str, float | None]
    task: str


class RecordedEpisode:
    """A published recording folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.info = json.loads((self.path / INFO_PATH).read_text())
            self.session = json.loads((self.path / SESSION_JSON).read_text())
        except (OSError, ValueError) as exc:
            raise RecordingFormatError(f"{self.path} is not a recording: {exc}") from None
        if self.info.get("codebase_version") != CODEBASE_VERSION or self.session.get("format") != FORMAT_NAME:
            raise RecordingFormatError(f"{self.path} is not a {FORMAT_NAME} in LeRobot's {CODEBASE_VERSION} layout")
        self.layout = EpisodeLayout.from_json(self.session["layout"])
        self.fps = int(self.info["fps"])
        self._data = pq.read_table(self.path / DATA_PATH)

    @property
    def name(self) -> str:
        return self.session.get("name", self.path.name)

    @property
    def num_frames(self) -> int:
        return self._data.num_rows

    def rows(self) -> list[RecordedRow]:
        data = self._data
        features = self.info["features"]
        actions = column_values(data.column("action"), tuple(features["action"]["shape"]))
        timing = column_values(data.column("response.timing_ms"), (len(TIMING_NAMES),))
        tasks_by_index = self._tasks()
        columns = {
            name: data.column(name).to_pylist()
            for name in (
                "frame_index",
                "observation.seq",
                "observation.received_at",
                "observation.request",
                "response.kind",
                "response.reason",
                "response.message",
                "response.seed",
                "task_index",
            )
        }
        rows = []
        for i in range(data.num_rows):
            kind = columns["response.kind"][i]
            seed = columns["response.seed"][i]
            rows.append(
                RecordedRow(
                    frame_index=columns["frame_index"][i],
                    seq=columns["observation.seq"][i],
                    received_at=columns["observation.received_at"][i],
                    request=json.loads(columns["observation.request"][i]),
                    kind=kind,
                    reason=columns["response.reason"][i],
                    message=columns["response.message"][i],
                    actions=actions[i] if kind == "chunk" else None,
                    seed=None if seed < 0 else seed,
                    timing_ms={
                        name: None if value == NO_VALUE else float(value)
                        for name, value in zip(TIMING_NAMES, timing[i])
                    },
                    task=tasks_by_index.get(columns["task_index"][i], ""),
                )
            )
        return rows

    def _tasks(self) -> dict[int, str]:
        table = pq.read_table(self.path / "meta" / "tasks.parquet")
        return dict(zip(table.column("task_index").to_pylist(), table.column("__index_level_0__").to_pylist()))

    def frames(self) -> Iterator[dict[str, np.ndarray]]:
        """Each row's camera frames (the robot's camera name -> H×W×3 uint8, as sent), in row order."""
        import imageio_ffmpeg

        readers, sizes = {}, {}
        try:
            for key, name in self.layout.camera_names.items():
                reader = imageio_ffmpeg.read_frames(str(self.path / video_path(key)), pix_fmt="rgb24")
                width, height = reader.__next__()["size"]
                readers[name], sizes[name] = reader, (height, width, self.layout.frame_sizes[key])
            for _ in range(self.num_frames):
                frames = {}
                for name, reader in readers.items():
                    height, width, (rows, cols) = sizes[name]
                    try:
                        chunk = next(reader)
                    except StopIteration:
                        raise RecordingFormatError(f"{self.path}: camera {name!r} has fewer frames than rows") from None
                    frames[name] = np.frombuffer(chunk, dtype=np.uint8).reshape(height, width, 3)[:rows, :cols]
                yield frames
        except (OSError, RuntimeError) as exc:  # imageio-ffmpeg reports an undecodable file either way
            raise RecordingFormatError(f"{self.path}: a camera's video cannot be decoded: {exc}") from None
        finally:
            for reader in readers.values():
                reader.close()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in read_lines(self.path / EVENTS_JSONL)]
