"""An episode's files on disk: the LeRobotDataset v3.0 layout, its statistics, and the recorder's own files.

This mirrors LeRobot's own writer (``lerobot/datasets/lerobot_dataset.py`` and ``utils.py``, published
standalone as ``lerobot-dataset`` 0.4.4, ``CODEBASE_VERSION = "v3.0"``) so that LeRobot's
``LeRobotDataset`` loads a recording as one of its own (``tests/test_recording_lerobot.py`` checks it with
the real package). Its paths and the ``response.kind`` column's kinds are spelled once, in
:mod:`cosmos3_runtime.lerobot_layout`, for the trainer that reads them too; the recorder adds its own files:

    meta/cosmos3/session.json                       the recorder's own: session, configuration, model,
                                                    layout, why and when the episode ended, frames lost
    meta/cosmos3/events.jsonl                       drops, errors, reconfigurations, notes; one a line

LeRobot reads nothing under ``meta/cosmos3/``. While an episode is recorded its flushed frames wait in
``segments/NNNNNN/`` (``rows.parquet``, one MP4 per camera, and ``segment.json``, written last: a segment
without it was cut short and is ignored); the folder is removed once the episode is published.

A recording holds one episode, so every chunk and file index is 0. Frame *i* is at ``timestamp`` *i*/fps,
which is also its presentation time in each MP4 (LeRobot decodes a frame by that time, to 0.1 ms).
Columns are stored with the Arrow types Hugging Face ``datasets`` gives LeRobot's features, and the data
file carries the same ``huggingface`` schema metadata; only pyarrow is needed.

Statistics follow LeRobot's ``compute_episode_stats`` (its ``aggregate_stats`` merges them across
episodes): a numeric feature gets one value per last dimension over every frame; a camera one value per
channel, shape (3, 1, 1), in [0, 1], computed exactly from one 256-bin histogram per channel so that no
frame is kept. Frames with no value are masked out, and a feature no frame has a value for gets none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from cosmos3_runtime.lerobot_layout import (
    CODEBASE_VERSION,
    DATA_PATH_TEMPLATE,
    RESPONSE_KIND,
    VIDEO_PATH_TEMPLATE,
)

from ..foundation.durable_files import replacing

# LeRobot's defaults for how many files a chunk folder holds and how big files grow before a new one.
CHUNKS_SIZE = 1000
DATA_FILES_SIZE_IN_MB = 100
VIDEO_FILES_SIZE_IN_MB = 200


VIDEO_KEY_PREFIX = "observation.images."

# Columns every LeRobot frame has, after the dataset's own features (LeRobot's DEFAULT_FEATURES).
DEFAULT_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": (1,), "names": None},
    "frame_index": {"dtype": "int64", "shape": (1,), "names": None},
    "episode_index": {"dtype": "int64", "shape": (1,), "names": None},
    "index": {"dtype": "int64", "shape": (1,), "names": None},
    "task_index": {"dtype": "int64", "shape": (1,), "names": None},
}

# The timing a robot sees with each chunk, in this order, in the `response.timing_ms` vector.
TIMING_NAMES = ("decode_ms", "queue_ms", "model_ms", "engine_ms", "total_ms", "observation_age_ms")
# A timing or timestamp that was not measured or not sent (a recording holds no NaN: see episode_writer).
NO_VALUE = -1.0

# The per-frame columns of a recording, besides cameras, state, action and LeRobot's defaults.
SCALAR_FEATURES: dict[str, dict[str, Any]] = {
    "observation.seq": {"dtype": "int64", "shape": (1,), "names": None},
    # Seconds from the episode's start to the observation's arrival (the real clock; `timestamp` is the
    # nominal one).
    "observation.received_at": {"dtype": "float64", "shape": (1,), "names": None},
    "observation.client_timestamp": {"dtype": "float64", "shape": (1,), "names": None},
    # The engine request made of this observation (settings, prefix actions, which camera fed the
    # model), as JSON: what cosmos3-replay sends again.
    "observation.request": {"dtype": "string", "shape": (1,), "names": None},
    RESPONSE_KIND: {"dtype": "string", "shape": (1,), "names": None},
    "response.reason": {"dtype": "string", "shape": (1,), "names": None},
    "response.message": {"dtype": "string", "shape": (1,), "names": None},
    "response.seed": {"dtype": "int64", "shape": (1,), "names": None},
    "response.timing_ms": {"dtype": "float32", "shape": (len(TIMING_NAMES),), "names": list(TIMING_NAMES)},
}

_ARROW_SCALARS = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "float32": pa.float32(),
    "string": pa.string(),
    "bool": pa.bool_(),
}


@dataclass(frozen=True)
class EpisodeLayout:
    """What every frame of one episode holds; fixed by its first observation and its configuration.

    ``cameras`` maps each video key to the (height, width) its MP4 has (even sides: H.264's yuv420p
    needs them, so an odd side gains one replicated edge row or column), ``frame_sizes`` to the size the
    robot sent (a reader crops the padding off), and ``camera_names`` to the robot's own name for it.
    """

    cameras: Mapping[str, tuple[int, int]]
    frame_sizes: Mapping[str, tuple[int, int]]
    camera_names: Mapping[str, str]
    state_dim: int | None
    action_shape: tuple[int, int]

    def features(self, fps: int) -> dict[str, dict[str, Any]]:
        """LeRobot's ``features`` dict, in column order (video features first, defaults last)."""
        features: dict[str, dict[str, Any]] = {}
        for key, (height, width) in self.cameras.items():
            features[key] = {
                "dtype": "video",
                "shape": (height, width, 3),
                "names": ["height", "width", "channels"],
                "info": video_info(height, width, fps),
            }
        if self.state_dim is not None:
            features["observation.state"] = {"dtype": "float32", "shape": (self.state_dim,), "names": None}
        features["action"] = {
            "dtype": "float32",
            "shape": tuple(self.action_shape),
            "names": ["chunk_step", "action_dim"],
        }
        features.update(SCALAR_FEATURES)
        features.update(DEFAULT_FEATURES)
        return features

    def to_json(self) -> dict[str, Any]:
        return {
            "cameras": {k: list(v) for k, v in self.cameras.items()},
            "frame_sizes": {k: list(v) for k, v in self.frame_sizes.items()},
            "camera_names": dict(self.camera_names),
            "state_dim": self.state_dim,
            "action_shape": list(self.action_shape),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> EpisodeLayout:
        def sizes(table: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
            return {k: (int(v[0]), int(v[1])) for k, v in table.items()}

        return cls(
            cameras=sizes(value["cameras"]),
            frame_sizes=sizes(value["frame_sizes"]),
            camera_names=dict(value["camera_names"]),
            state_dim=None if value["state_dim"] is None else int(value["state_dim"]),
            action_shape=(int(value["action_shape"][0]), int(value["action_shape"][1])),
        )


def video_info(height: int, width: int, fps: int) -> dict[str, Any]:
    """The ``info`` LeRobot reads from a feature's first MP4 (``get_video_info``), for ours."""
    return {
        "video.height": height,
        "video.width": width,
        "video.codec": "h264",
        "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False,
        "video.fps": fps,
        "video.channels": 3,
        "has_audio": False,
    }


def video_path(video_key: str) -> str:
    return VIDEO_PATH_TEMPLATE.format(video_key=video_key, chunk_index=0, file_index=0)


def arrow_type(feature: Mapping[str, Any]) -> pa.DataType:
    """The Arrow type ``datasets`` stores a non-video LeRobot feature as."""
    scalar = _ARROW_SCALARS[feature["dtype"]]
    shape = tuple(feature["shape"])
    if shape == (1,):
        return scalar
    if len(shape) == 1:
        return pa.list_(scalar, shape[0])
    if len(shape) == 2:
        return pa.list_(pa.list_(scalar))
    raise ValueError(f"no column type for a feature of shape {shape}")


def _hf_feature(feature: Mapping[str, Any]) -> dict[str, Any]:
    shape = tuple(feature["shape"])
    value = {"dtype": feature["dtype"], "_type": "Value"}
    if shape == (1,):
        return value
    if len(shape) == 1:
        return {"feature": value, "length": shape[0], "_type": "List"}
    return {"shape": list(shape), "dtype": feature["dtype"], "_type": f"Array{len(shape)}D"}


def data_schema(features: Mapping[str, Mapping[str, Any]]) -> pa.Schema:
    """The data file's schema: every non-video feature, with ``datasets``' metadata as LeRobot writes it."""
    columns = {name: ft for name, ft in features.items() if ft["dtype"] != "video"}
    metadata = {"info": {"features": {name: _hf_feature(ft) for name, ft in columns.items()}}}
    return pa.schema(
        [pa.field(name, arrow_type(ft)) for name, ft in columns.items()], metadata={"huggingface": json.dumps(metadata)}
    )


def column(values: np.ndarray, feature: Mapping[str, Any]) -> pa.Array:
    """``values`` (one entry per frame) as the Arrow array of ``feature``, without a Python loop."""
    kind = arrow_type(feature)
    shape = tuple(feature["shape"])
    if shape == (1,):
        return pa.array(values, type=kind)
    flat = pa.array(np.ascontiguousarray(values).reshape(-1), type=_ARROW_SCALARS[feature["dtype"]])
    if len(shape) == 1:
        return pa.FixedSizeListArray.from_arrays(flat, shape[0])
    rows, inner = values.shape[0] * shape[0], shape[1]
    steps = pa.ListArray.from_arrays(pa.array(np.arange(0, rows * inner + 1, inner, dtype=np.int32)), flat)
    return pa.ListArray.from_arrays(pa.array(np.arange(0, rows + 1, shape[0], dtype=np.int32)), steps)


def write_table(path: Path, table: pa.Table) -> None:
    """A Parquet file the way LeRobot writes its own (snappy, dictionary encoding, one row group), whole or
    absent."""
    with (
        replacing(path) as tmp,
        pq.ParquetWriter(tmp, schema=table.schema, compression="snappy", use_dictionary=True) as writer,
    ):
        writer.write_table(table)


def tasks_table(tasks: list[str]) -> pa.Table:
    """``meta/tasks.parquet``: LeRobot writes a pandas DataFrame indexed by the task string; this is the
    same file (the index as ``__index_level_0__`` and the pandas metadata that makes it the index again)."""
    pandas_metadata = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    schema = pa.schema(
        [pa.field("task_index", pa.int64()), pa.field("__index_level_0__", pa.string())],
        metadata={"pandas": json.dumps(pandas_metadata)},
    )
    return pa.table(
        {"task_index": pa.array(range(len(tasks)), pa.int64()), "__index_level_0__": pa.array(tasks, pa.string())},
        schema=schema,
    )


def info_json(
    features: Mapping[str, Mapping[str, Any]], fps: int, frames: int, tasks: int, robot_type: str | None
) -> dict[str, Any]:
    """``meta/info.json`` for a one-episode dataset (LeRobot's ``create_empty_dataset_info``, filled)."""
    return {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": 1,
        "total_frames": frames,
        "total_tasks": tasks,
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": DATA_FILES_SIZE_IN_MB,
        "video_files_size_in_mb": VIDEO_FILES_SIZE_IN_MB,
        "fps": fps,
        "splits": {"train": "0:1"},
        "data_path": DATA_PATH_TEMPLATE,
        "video_path": VIDEO_PATH_TEMPLATE,
        "features": {name: {**ft, "shape": list(ft["shape"])} for name, ft in features.items()},
    }


def episodes_table(
    *, tasks: list[str], frames: int, fps: int, video_keys: list[str], stats: Mapping[str, Mapping[str, np.ndarray]]
) -> pa.Table:
    """``meta/episodes/chunk-000/file-000.parquet``: the one episode's row, columns in LeRobot's order."""
    row: dict[str, Any] = {
        "episode_index": 0,
        "tasks": tasks,
        "length": frames,
        "data/chunk_index": 0,
        "data/file_index": 0,
        "dataset_from_index": 0,
        "dataset_to_index": frames,
    }
    for key in video_keys:
        row[f"videos/{key}/chunk_index"] = 0
        row[f"videos/{key}/file_index"] = 0
        row[f"videos/{key}/from_timestamp"] = 0.0
        row[f"videos/{key}/to_timestamp"] = frames / fps
    for feature, values in stats.items():
        for name, value in values.items():
            row[f"stats/{feature}/{name}"] = np.asarray(value).tolist()
    row["meta/episodes/chunk_index"] = 0
    row["meta/episodes/file_index"] = 0
    return pa.Table.from_pylist([row])


SESSION_JSON = "meta/cosmos3/session.json"
EVENTS_JSONL = "meta/cosmos3/events.jsonl"
SEGMENTS_DIR = "segments"
SEGMENT_ROWS = "rows.parquet"
SEGMENT_COMMIT = "segment.json"
FORMAT_NAME = "cosmos3-recording"
FORMAT_VERSION = 1


QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{int(q * 100):02d}" for q in QUANTILES)
# Pixels are sampled on a grid about this many pixels wide (LeRobot also downsamples to ~150 px).
HISTOGRAM_TARGET_SIDE = 150


def numeric_stats(values: np.ndarray, kept: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Statistics of ``values`` (frames first) per last dimension, over the frames ``kept`` (a boolean
    mask; default all)."""
    values = np.asarray(values)
    if kept is not None:
        values = values[kept]
    width = 1 if values.ndim == 1 else values.shape[-1]
    flat = values.reshape(-1, width)
    count = np.array([values.shape[0]], dtype=np.int64)
    if flat.shape[0] == 0:  # no frame has a value: only the count means anything
        zeros = np.zeros(width, dtype=np.float64)
        return {
            "min": zeros,
            "max": zeros,
            "mean": zeros,
            "std": zeros,
            "count": count,
            **{key: zeros for key in QUANTILE_KEYS},
        }
    as_float = flat.astype(np.float64)
    stats = {
        "min": flat.min(axis=0),
        "max": flat.max(axis=0),
        "mean": as_float.mean(axis=0),
        "std": as_float.std(axis=0),
        "count": count,
    }
    for key, value in zip(QUANTILE_KEYS, np.quantile(as_float, QUANTILES, axis=0)):
        stats[key] = value
    return stats


def channel_histograms(frames: np.ndarray) -> np.ndarray:
    """Pixel counts per channel and value (3×256 int64) of T×H×W×3 uint8 ``frames``, on a sampled grid."""
    height, width = frames.shape[1], frames.shape[2]
    stride = max(1, max(height, width) // HISTOGRAM_TARGET_SIDE)
    sample = frames[:, ::stride, ::stride, :]
    return np.stack([np.bincount(sample[..., c].reshape(-1), minlength=256) for c in range(3)]).astype(np.int64)


def image_stats(histograms: np.ndarray, frames: int) -> dict[str, np.ndarray]:
    """LeRobot's per-channel camera statistics (each (3, 1, 1), in [0, 1]) from :func:`channel_histograms`."""
    levels = np.arange(256, dtype=np.float64) / 255.0
    totals = histograms.sum(axis=1).astype(np.float64)
    seen = histograms > 0
    mean = (histograms * levels).sum(axis=1) / totals
    variance = (histograms * (levels[None, :] - mean[:, None]) ** 2).sum(axis=1) / totals
    cumulative = np.cumsum(histograms, axis=1) / totals[:, None]

    def per_channel(values: npt.ArrayLike) -> np.ndarray:
        return np.asarray(values, dtype=np.float64).reshape(3, 1, 1)

    stats = {
        "min": per_channel([levels[np.argmax(row)] for row in seen]),
        "max": per_channel([levels[255 - np.argmax(row[::-1])] for row in seen]),
        "mean": per_channel(mean),
        "std": per_channel(np.sqrt(variance)),
        "count": np.array([frames], dtype=np.int64),
    }
    for key, q in zip(QUANTILE_KEYS, QUANTILES):
        stats[key] = per_channel([levels[min(255, int(np.searchsorted(row, q)))] for row in cumulative])
    return stats
