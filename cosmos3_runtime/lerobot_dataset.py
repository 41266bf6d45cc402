"""Reading a LeRobot v3.0 dataset for training: episodes of camera frames, state and actions.

The layout is the one LeRobot writes and ``policy_server.recording`` records (``meta/info.json`` with its
``features`` and path templates, ``meta/tasks.parquet``, ``data/chunk-*/file-*.parquet``, a camera either
in the data file as LeRobot's ``image`` feature or as ``videos/<key>/chunk-*/file-*.mp4``). The runtime has
no networking and no pandas: files are read with pyarrow, images with Pillow, videos with imageio's ffmpeg.

``action`` is either one row per frame (a demonstration dataset) or a chunk per frame (a recording of the
server, whose rows are what it answered); :class:`DatasetEpisode` keeps what the file has.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from .errors import CheckpointError

IMAGE_PREFIX = "observation.images."


class DatasetError(CheckpointError):
    """The dataset is not a LeRobot v3.0 dataset this trainer can read."""


@dataclass
class DatasetEpisode:
    """One episode's frames in order."""

    index: int
    images: np.ndarray  # (T, H, W, 3) uint8
    state: np.ndarray | None  # (T, D) float32
    actions: np.ndarray  # (T, D) float32, or (T, H, D) for a recording's answered chunks
    task: str


@dataclass
class LeRobotDataset:
    root: Path
    fps: float
    camera: str  # the feature key of the camera the episodes hold
    episodes: list[DatasetEpisode]

    @property
    def action_dim(self) -> int:
        return int(self.episodes[0].actions.shape[-1])

    @property
    def frames(self) -> int:
        return sum(len(e.images) for e in self.episodes)


def read_dataset(root: str | Path, camera: str | None = None, max_episodes: int | None = None) -> LeRobotDataset:
    """Read ``root``'s episodes (their frames from ``camera``, default the first camera feature)."""
    root = Path(root)
    info_path = root / "meta" / "info.json"
    try:
        info = json.loads(info_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{root} is not a LeRobot dataset: cannot read {info_path}: {exc}") from exc
    if info.get("codebase_version") != "v3.0":
        raise DatasetError(f"{root}: codebase_version {info.get('codebase_version')!r}, expected 'v3.0'")
    features = info["features"]
    cameras = [k for k, ft in features.items() if ft.get("dtype") in ("image", "video")]
    if not cameras:
        raise DatasetError(f"{root} has no camera feature")
    camera = camera or cameras[0]
    if camera not in cameras:
        raise DatasetError(f"{root} has no camera {camera!r}; it has {', '.join(cameras)}")
    if "action" not in features:
        raise DatasetError(f"{root} has no 'action' feature")
    tasks = _tasks(root)

    files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    if not files:
        raise DatasetError(f"{root} has no data files")
    columns = ["episode_index", "frame_index", "action", "task_index"]
    columns += [c for c in ("observation.state",) if c in features]
    if features[camera]["dtype"] == "image":
        columns.append(camera)
    tables = [pq.read_table(f, columns=columns) for f in files]
    episodes: dict[int, list[dict[str, Any]]] = {}
    for table in tables:
        for row in table.to_pylist():
            episodes.setdefault(int(row["episode_index"]), []).append(row)
    chosen = sorted(episodes)[:max_episodes] if max_episodes is not None else sorted(episodes)
    videos = _video_frames(root, info, camera) if features[camera]["dtype"] == "video" else None
    out = []
    for index in chosen:
        rows = sorted(episodes[index], key=lambda r: r["frame_index"])
        if videos is not None:
            images = videos[index][: len(rows)]
        else:
            images = np.stack([_decode_image(r[camera]) for r in rows])
        state = (
            np.asarray([r["observation.state"] for r in rows], np.float32) if "observation.state" in columns else None
        )
        actions = np.asarray([r["action"] for r in rows], np.float32)
        out.append(DatasetEpisode(index, images, state, actions, tasks.get(int(rows[0]["task_index"]), "")))
    return LeRobotDataset(root, float(info["fps"]), camera, out)


def _tasks(root: Path) -> dict[int, str]:
    path = root / "meta" / "tasks.parquet"
    if not path.is_file():
        return {}
    table = pq.read_table(path).to_pydict()
    names = table.get("task") or table.get("__index_level_0__") or []
    return {int(i): str(n) for i, n in zip(table["task_index"], names)}


def _decode_image(value: dict[str, Any] | bytes) -> np.ndarray:
    from PIL import Image

    data = value["bytes"] if isinstance(value, dict) else value
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _video_frames(root: Path, info: dict[str, Any], camera: str) -> dict[int, np.ndarray]:
    """Every episode's frames of ``camera`` from its MP4 files, cut by each episode's timestamps."""
    import imageio.v3 as iio

    episodes = pq.read_table(sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))[0]).to_pylist()
    fps = float(info["fps"])
    decoded: dict[tuple[int, int], np.ndarray] = {}
    out = {}
    for ep in episodes:
        chunk, file = ep[f"videos/{camera}/chunk_index"], ep[f"videos/{camera}/file_index"]
        if (chunk, file) not in decoded:
            path = root / info["video_path"].format(video_key=camera, chunk_index=chunk, file_index=file)
            decoded[(chunk, file)] = np.asarray(iio.imread(path, plugin="FFMPEG"))
        start = int(round(ep[f"videos/{camera}/from_timestamp"] * fps))
        out[int(ep["episode_index"])] = decoded[(chunk, file)][start : start + int(ep["length"])]
    return out
