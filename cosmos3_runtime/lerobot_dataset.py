"""The training dataset reader: a LeRobot v3.0 dataset, possibly made by a stranger, read within bounds.

The layout (:mod:`cosmos3_runtime.lerobot_layout`) is the one LeRobot writes and ``policy_server.recording``
records (``meta/info.json`` with its ``features`` and path templates, ``meta/tasks.parquet``,
``meta/episodes/chunk-*/file-*.parquet``, the data files named by ``data_path``, a camera either in the data
file as LeRobot's ``image`` feature or in the MP4 files named by ``video_path``). The runtime has no networking
and no pandas: files are read with pyarrow, images with Pillow, videos with imageio's ffmpeg.

A dataset is untrusted input, so :func:`read_dataset` checks before it reads:

- **Paths.** ``data_path`` and ``video_path`` are filled with LeRobot's three fields only (``chunk_index``,
  ``file_index``, ``video_key``; an integer format such as ``:03d``), never with ``str.format`` (which would
  walk attributes: ``{video_key.__class__}``). A filled path is relative, has no ``..``, and every file read
  resolves inside the dataset and is a regular file. A file may be a symlink to another inside; in the Hub's
  cache (a dataset at ``<repo>/snapshots/<revision>``) its files are symlinks into ``<repo>/blobs``, which
  counts as inside.
- **Rows.** Every Parquet file's footer is bounded; the episodes index holds no more rows than the data files
  (their footers' counts), and the lengths it declares add up to the data's rows and to ``total_frames``.
- **Pixels.** Before a frame is decoded, its sides come from the PNG's or the MP4's header (sides and sample
  count, as the server's media check reads them) and are checked against ``max_image_side``, the feature's
  declared shape and the episode span; the frames of the episodes read, all together, against
  ``max_frames_mib``. Data is read a few rows at a time and a video is decoded frame by frame into its
  episodes' arrays, so memory grows with the frames kept, not with the files.

Every failure is a :class:`DatasetError` naming the file (relative to the dataset) and the field.

``action`` is either one row per frame (a demonstration dataset) or a chunk per frame (a recording of the
server); :class:`DatasetEpisode` keeps what the file has. A recording holds a row for every observation,
answered or not, so its ``response.kind`` column is read too: only a row the server answered with a chunk
holds one (the others hold zeros), and :attr:`DatasetEpisode.answered` says which. A chunk-labelled dataset
may also have ``action.prefix_rows`` (:data:`~cosmos3_runtime.lerobot_layout.PREFIX_ROWS`): how many leading
rows of each frame's chunk are a given prefix, kept as :attr:`DatasetEpisode.prefix_rows`.
"""

from __future__ import annotations

import io
import json
import math
import mmap
import os
import re
import stat
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .description import EngineLimits
from .errors import CheckpointError
from .lerobot_layout import (
    ANSWERED_KIND,
    CODEBASE_VERSION,
    EPISODES_GLOB,
    INFO_PATH,
    PREFIX_ROWS,
    RESPONSE_KIND,
    RESPONSE_KINDS,
    TASKS_PATH,
    TEMPLATE_FIELDS,
)
from .mp4_header import probe_video_header
from .parquet_pages import PageHeaderError, column_pages

# An integer field's format: LeRobot's ``:03d``, or a plain ``{chunk_index}``.
_INDEX_FORMAT = re.compile(r"(0?[1-9])?d?")
MAX_TEMPLATE_CHARS = 512
MAX_INFO_BYTES = 4 * 2**20  # meta/info.json: features and templates, a few kB in practice
MAX_FOOTER_BYTES = 16 * 2**20  # one Parquet file's metadata
MAX_TASKS = 100_000
MAX_ROW_VALUES = 65_536  # numbers in one frame's action or state (a chunk of 64 rows of 1,024 is far past any robot)
ROWS_PER_BATCH = 16  # data rows held as Arrow values at a time, before they go into their episode's arrays
# A task is the prompt training runs with: the server's own prompt bound, in characters.
MAX_TASK_CHARS = EngineLimits().max_prompt_chars
# What one value of a column may take once its page is decompressed (a byte array's 4-byte length included),
# and what its levels and encodings may add: 4 bytes a value, and a few kB a page.
MAX_TEXT_VALUE_BYTES = 4 + 4 * MAX_TASK_CHARS  # UTF-8 takes at most 4 bytes a character
LEVEL_BYTES = 4
PAGE_SLACK_BYTES = 4096
_PHYSICAL_BYTES = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


class DatasetError(CheckpointError):
    """The dataset is not a LeRobot v3.0 dataset this trainer can read, or declares more than its bounds."""


@dataclass(frozen=True)
class DatasetBounds:
    """What a dataset may cost before anything is decoded (``cosmos3-train --max-image-side``, ...)."""

    max_image_side: int = 1024
    max_frames_mib: int = 4096  # the decoded camera frames of every episode read, together (RGB bytes)


@dataclass
class DatasetEpisode:
    """One episode's frames in order."""

    index: int
    images: np.ndarray  # (T, H, W, 3) uint8
    state: np.ndarray | None  # (T, D) float32
    actions: np.ndarray  # (T, D) float32, or (T, H, D) for a recording's chunks
    task: str
    answered: np.ndarray | None  # (T,) bool: a recording's frames answered with a chunk; None: every row is real
    # (T,) int: how many leading rows of each frame's chunk are a given prefix, not a label (0: none); None:
    # the dataset has no such column
    prefix_rows: np.ndarray | None = None

    @property
    def target_frames(self) -> np.ndarray:
        """The frames whose action is a training target: a recording's answered ones, else every frame."""
        return np.arange(len(self.actions)) if self.answered is None else np.flatnonzero(self.answered)


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

    @property
    def recorded_chunk(self) -> int | None:
        """The rows of each frame's action chunk in a recording of the server; None for one action a frame."""
        actions = self.episodes[0].actions
        return int(actions.shape[1]) if actions.ndim == 3 else None


def read_dataset(
    root: str | Path, camera: str | None = None, max_episodes: int | None = None, bounds: DatasetBounds | None = None
) -> LeRobotDataset:
    """Read ``root``'s episodes (their frames from ``camera``, default the first camera feature), within
    ``bounds``; raise :class:`DatasetError` on anything else."""
    return _Reader(Path(root), bounds or DatasetBounds()).read(camera, max_episodes)


@dataclass(frozen=True)
class ColumnBound:
    """What one row of a column may hold: ``values`` leaf values (a list column's declared shape), each byte
    array (string or binary) of at most ``value_bytes`` bytes."""

    values: int = 1
    value_bytes: int = MAX_TEXT_VALUE_BYTES


@dataclass(frozen=True)
class _EpisodeEntry:
    """One row of the episodes index: where its frames are."""

    index: int
    length: int
    data_file: tuple[int, int]  # (chunk_index, file_index)
    video_file: tuple[int, int] | None
    video_start: int | None  # the episode's first frame in its MP4


def fill_template(template: object, name: str, values: Mapping[str, int | str]) -> PurePosixPath:
    """``info.json``'s path template ``name`` filled with ``values``: only LeRobot's named fields, an integer
    field formatted as ``03d`` at most, the result a relative path without ``..``."""
    where = f"{INFO_PATH}: {name}"
    if not isinstance(template, str) or not template or len(template) > MAX_TEMPLATE_CHARS:
        raise DatasetError(f"{where} is not a path template of at most {MAX_TEMPLATE_CHARS} characters", name)
    allowed = TEMPLATE_FIELDS[name]
    try:
        pieces = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise DatasetError(f"{where} {template!r} is not a path template: {exc}", name) from exc
    out: list[str] = []
    for literal, field_name, spec, conversion in pieces:
        out.append(literal)
        if field_name is None:
            continue
        if field_name not in allowed or conversion is not None:
            raise DatasetError(
                f"{where} {template!r} names {{{field_name}{'!' + conversion if conversion else ''}}}; "
                f"a template may name only {', '.join('{' + f + '}' for f in allowed)}",
                name,
            )
        value = values[field_name]
        if isinstance(value, str):
            if spec:
                raise DatasetError(f"{where} {template!r} formats {{{field_name}}}, which takes no format", name)
            out.append(value)
        else:
            if not _INDEX_FORMAT.fullmatch(spec or ""):
                raise DatasetError(f"{where} {template!r} formats {{{field_name}}} as {spec!r}, not as 03d", name)
            out.append(format(value, spec or "d"))
    return relative_path("".join(out), where, name)


def relative_path(text: str, where: str, field: str) -> PurePosixPath:
    """``text`` as a path relative to the dataset that cannot leave it by name."""
    path = PurePosixPath(text)
    if "\\" in text or "\x00" in text or path.is_absolute() or ".." in path.parts or not path.parts:
        raise DatasetError(f"{where} gives {text!r}: a path must be relative, inside the dataset, without '..'", field)
    return path


class _Reader:
    def __init__(self, root: Path, bounds: DatasetBounds) -> None:
        self.root = root
        self.bounds = bounds
        try:
            self.real_root = Path(os.path.realpath(root))
        except OSError as exc:
            raise DatasetError(f"not a folder: {exc}") from exc
        if not self.real_root.is_dir():
            raise DatasetError("not a folder")
        # Where the dataset's files may lie once every symlink is followed: the dataset, and, for a Hub cache
        # snapshot, the blob store of the same repository (huggingface_hub links snapshot files into it).
        self.real_homes = [self.real_root]
        if self.real_root.parent.name == "snapshots" and (self.real_root.parent.parent / "blobs").is_dir():
            self.real_homes.append(self.real_root.parent.parent / "blobs")

    # -- files ---------------------------------------------------------------------------------

    def file(self, rel: PurePosixPath, field: str, what: str) -> Path:
        """The dataset's file ``rel``: its folder and the file itself resolved inside the dataset (every
        symlink followed), a regular file. Returns the resolved path, so what is checked is what is read."""
        path = self.root.joinpath(*rel.parts)
        folder = Path(os.path.realpath(path.parent))
        if not folder.is_relative_to(self.real_root):
            raise DatasetError(f"{rel}: its folder leads outside the dataset (to {folder})", field)
        real = Path(os.path.realpath(path))
        if not any(real.is_relative_to(home) for home in self.real_homes):
            raise DatasetError(f"{rel}: the {what} is a link that leads outside the dataset (to {real})", field)
        try:
            status = real.stat()
        except OSError:
            raise DatasetError(f"{rel}: the {what} is missing", field) from None
        if not stat.S_ISREG(status.st_mode):
            raise DatasetError(f"{rel}: the {what} is not a regular file", field)
        return real

    def parquet(self, rel: PurePosixPath, field: str, what: str) -> pq.ParquetFile:
        """A Parquet file whose footer is within bounds, opened (its metadata read, no row)."""
        path = self.file(rel, field, what)
        try:
            with path.open("rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                if size < 12:
                    raise DatasetError(f"{rel}: the {what} is not a Parquet file ({size} bytes)", field)
                handle.seek(size - 8)
                tail = handle.read(8)
            footer = int.from_bytes(tail[:4], "little")
            if tail[4:] != b"PAR1":
                raise DatasetError(f"{rel}: the {what} is not a Parquet file (no PAR1 footer)", field)
            if footer > min(MAX_FOOTER_BYTES, size - 12):
                raise DatasetError(
                    f"{rel}: the {what}'s footer declares {footer:,} bytes (at most {MAX_FOOTER_BYTES:,})", field
                )
            return pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as exc:
            raise DatasetError(f"{rel}: the {what} is not a Parquet file pyarrow can read: {exc}", field) from exc

    def batches(
        self,
        rel: PurePosixPath,
        parquet: pq.ParquetFile,
        columns: list[str],
        field: str,
        bounds: Mapping[str, ColumnBound] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """``columns`` of ``parquet``, :data:`ROWS_PER_BATCH` rows at a time, each page of them sized from its
        header first (:meth:`check_pages`; ``bounds``: per column, else one value a row, text-sized)."""
        names = set(parquet.schema_arrow.names)
        for name in columns:
            if name not in names:
                raise DatasetError(f"{rel}: no column {name!r}", name)
        self.check_pages(rel, parquet, columns, bounds or {}, field)
        try:
            yield from parquet.iter_batches(batch_size=ROWS_PER_BATCH, columns=columns, use_threads=False)
        except (OSError, pa.ArrowException) as exc:
            raise DatasetError(f"{rel}: the Parquet file is corrupt: {exc}", field) from exc

    def check_pages(
        self,
        rel: PurePosixPath,
        parquet: pq.ParquetFile,
        columns: list[str],
        bounds: Mapping[str, ColumnBound],
        field: str,
    ) -> None:
        """Before any value of ``columns`` is decoded: every page of theirs, sized by its own header (what
        pyarrow will decompress it to), holds no more than its values' bound, and each column chunk's pages
        no more values than its rows may (``bounds``). A 33 kB task list with a 1 GiB task string in a
        zstd-compressed dictionary page is refused here, from the header's 1 GiB."""
        path = self.file(rel, field, "file")
        meta = parquet.metadata
        try:
            with path.open("rb") as handle:
                for group in range(meta.num_row_groups):
                    rows = meta.row_group(group).num_rows
                    for index in range(meta.num_columns):
                        chunk = meta.row_group(group).column(index)
                        name = _owner(chunk.path_in_schema, columns)
                        if name is None:
                            continue
                        bound = bounds.get(name, ColumnBound())
                        leaf = _PHYSICAL_BYTES.get(chunk.physical_type)
                        if leaf is None:  # a byte array, or a fixed one (its length is in the schema)
                            fixed = parquet.schema.column(index).length
                            leaf = fixed if chunk.physical_type == "FIXED_LEN_BYTE_ARRAY" else bound.value_bytes
                        start = chunk.data_page_offset
                        if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                            start = min(start, chunk.dictionary_page_offset)
                        self.check_chunk(rel, name, handle, start, chunk.total_compressed_size, rows, bound, leaf)
        except PageHeaderError as exc:
            raise DatasetError(f"{rel}: a page of columns {', '.join(columns)} is unreadable: {exc}", field) from None
        except OSError as exc:
            raise DatasetError(f"{rel}: the Parquet file cannot be read: {exc}", field) from None

    @staticmethod
    def check_chunk(
        rel: PurePosixPath,
        name: str,
        handle: Any,
        start: int,
        length: int,
        rows: int,
        bound: ColumnBound,
        leaf: int,
    ) -> None:
        most_values = rows * bound.values
        values = {True: 0, False: 0}  # dictionary entries, data values
        for page in column_pages(handle, start, length):
            dictionary = page.kind == 2
            values[dictionary] += page.values
            most_bytes = page.values * (leaf + LEVEL_BYTES) + PAGE_SLACK_BYTES
            if page.uncompressed_bytes > most_bytes or values[dictionary] > most_values:
                what = "dictionary page" if dictionary else "page"
                raise DatasetError(
                    f"{rel}: a {what} of column {name!r} decompresses to {page.uncompressed_bytes:,} bytes for "
                    f"{page.values:,} values (at most {most_bytes:,}; {rows:,} rows of {bound.values:,} values, "
                    f"a value of at most {leaf:,} bytes)",
                    name,
                )

    # -- metadata ------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        rel = PurePosixPath(INFO_PATH)
        path = self.file(rel, "info", "dataset's info")
        try:
            with path.open("rb") as handle:
                text = handle.read(MAX_INFO_BYTES + 1)
            if len(text) > MAX_INFO_BYTES:
                raise DatasetError(f"{rel}: more than {MAX_INFO_BYTES:,} bytes", "info")
            info = json.loads(text)
        except (OSError, ValueError, RecursionError) as exc:
            raise DatasetError(f"{rel}: not JSON this reader can read: {exc}", "info") from None
        if not isinstance(info, dict):
            raise DatasetError(f"{rel}: not a JSON object", "info")
        if info.get("codebase_version") != CODEBASE_VERSION:
            raise DatasetError(
                f"{rel}: codebase_version {info.get('codebase_version')!r}, expected {CODEBASE_VERSION!r}",
                "codebase_version",
            )
        return info

    def count(self, info: Mapping[str, Any], name: str, least: int = 1) -> int:
        value = info.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise DatasetError(f"{INFO_PATH}: {name} is {value!r}, not a whole number of at least {least}", name)
        return value

    def features(self, info: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        features = info.get("features")
        if not isinstance(features, dict) or not features:
            raise DatasetError(
                f"{INFO_PATH}: no 'features' (a mapping of feature names to their dtype and shape)", "features"
            )
        for name, feature in features.items():
            if not isinstance(feature, dict) or not isinstance(feature.get("dtype"), str):
                raise DatasetError(f"{INFO_PATH}: features[{name!r}] has no dtype", f"features.{name}")
        return features

    def shape(self, features: Mapping[str, Any], name: str) -> tuple[int, ...]:
        shape = features[name].get("shape")
        if (
            not isinstance(shape, list)
            or not 1 <= len(shape) <= 3
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape)
        ):
            raise DatasetError(f"{INFO_PATH}: features[{name!r}].shape is {shape!r}, not 1 to 3 sides", f"{name}.shape")
        return tuple(shape)

    def camera_sides(self, features: Mapping[str, Any], camera: str) -> tuple[int, int]:
        """A camera's declared (height, width), within ``max_image_side``."""
        shape = self.shape(features, camera)
        if len(shape) != 3 or shape[2] != 3:
            raise DatasetError(
                f"{INFO_PATH}: features[{camera!r}].shape is {list(shape)}, not [height, width, 3]", f"{camera}.shape"
            )
        self.check_sides(shape[0], shape[1], f"{INFO_PATH}: features[{camera!r}]", f"{camera}.shape")
        return shape[0], shape[1]

    def check_sides(self, height: int, width: int, where: str, field: str) -> None:
        if max(height, width) > self.bounds.max_image_side:
            raise DatasetError(
                f"{where}: frames of {width}x{height}, over the largest side read ({self.bounds.max_image_side}; "
                "--max-image-side)",
                field,
            )

    def tasks(self) -> dict[int, str]:
        rel = PurePosixPath(TASKS_PATH)
        if not (self.root / TASKS_PATH).is_file():
            return {}
        parquet = self.parquet(rel, "tasks", "task list")
        if parquet.metadata.num_rows > MAX_TASKS:
            raise DatasetError(f"{rel}: {parquet.metadata.num_rows:,} tasks (at most {MAX_TASKS:,})", "tasks")
        names = parquet.schema_arrow.names
        text = "task" if "task" in names else "__index_level_0__"
        out: dict[int, str] = {}
        for batch in self.batches(rel, parquet, ["task_index", text], "tasks"):
            for index, name in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                if isinstance(index, int) and isinstance(name, str):
                    if len(name) > MAX_TASK_CHARS:
                        raise DatasetError(
                            f"{rel}: task {index} has {len(name):,} characters, over the prompt bound "
                            f"{MAX_TASK_CHARS:,}",
                            "task",
                        )
                    out[index] = name
        return out

    # -- the episodes index ----------------------------------------------------------------------

    def data_rows(self, template: object) -> int:
        """Rows in every data file the ``data_path`` template can name (their footers' counts)."""
        pattern = fill_template(template, "data_path", {"chunk_index": 0, "file_index": 0})
        glob = str(fill_template_glob(template))
        rows = 0
        for path in sorted(self.root.glob(glob)):
            rel = PurePosixPath(path.relative_to(self.root).as_posix())
            rows += self.parquet(rel, "data_path", "data file").metadata.num_rows
        if rows == 0:
            raise DatasetError(f"{pattern.parent}: no data files ({glob})", "data_path")
        return rows

    def episodes_index(self, camera: str | None, video: bool, data_rows: int, total_frames: int) -> list[_EpisodeEntry]:
        files = sorted(self.root.glob(EPISODES_GLOB))
        if not files:
            raise DatasetError(f"meta/episodes: no episodes index ({EPISODES_GLOB})", "episodes")
        opened = []
        for path in files:
            rel = PurePosixPath(path.relative_to(self.root).as_posix())
            opened.append((rel, self.parquet(rel, "episodes", "episodes index")))
        rows = sum(p.metadata.num_rows for _, p in opened)
        if rows > data_rows:
            raise DatasetError(
                f"meta/episodes: {rows:,} episodes, more than the data's {data_rows:,} frames (every episode has one)",
                "episodes",
            )
        columns = ["episode_index", "length", "data/chunk_index", "data/file_index"]
        if video:
            columns += [
                f"videos/{camera}/chunk_index",
                f"videos/{camera}/file_index",
                f"videos/{camera}/from_timestamp",
            ]
        entries: list[_EpisodeEntry] = []
        for rel, parquet in opened:
            for batch in self.batches(rel, parquet, columns, "episodes"):
                values = [batch.column(i).to_pylist() for i in range(len(columns))]
                for row in zip(*values):
                    entries.append(self.episode_entry(rel, columns, row, video))
        lengths = sum(e.length for e in entries)
        if lengths != data_rows or lengths != total_frames:
            raise DatasetError(
                f"meta/episodes: the episodes' lengths add up to {lengths:,} frames; the data files hold {data_rows:,} "
                f"and {INFO_PATH} says total_frames {total_frames:,}",
                "length",
            )
        if len({e.index for e in entries}) != len(entries):
            raise DatasetError("meta/episodes: an episode_index appears twice", "episode_index")
        return sorted(entries, key=lambda e: e.index)

    def episode_entry(self, rel: PurePosixPath, columns: list[str], row: tuple[Any, ...], video: bool) -> _EpisodeEntry:
        for name, value in zip(columns, row):
            if name.endswith("from_timestamp"):
                if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                    raise DatasetError(f"{rel}: {name} is {value!r}, not a time in seconds", name)
            elif not isinstance(value, int) or value < 0 or (name == "length" and value < 1):
                raise DatasetError(f"{rel}: {name} is {value!r}, not a count", name)
        index, length, chunk, file = row[:4]
        return _EpisodeEntry(
            index,
            length,
            (chunk, file),
            (row[4], row[5]) if video else None,
            None if not video else int(round(row[6] * self.fps)),
        )

    # -- the whole read --------------------------------------------------------------------------

    def read(self, camera: str | None, max_episodes: int | None) -> LeRobotDataset:
        info = self.info()
        features = self.features(info)
        fps = info.get("fps")
        if not isinstance(fps, (int, float)) or isinstance(fps, bool) or not 0 < fps <= 1000:
            raise DatasetError(f"{INFO_PATH}: fps is {fps!r}, not a rate in (0, 1000]", "fps")
        self.fps = float(fps)
        cameras = [k for k, ft in features.items() if ft["dtype"] in ("image", "video")]
        if not cameras:
            raise DatasetError(f"{INFO_PATH}: no camera feature (dtype image or video)", "features")
        camera = camera or cameras[0]
        if camera not in cameras:
            raise DatasetError(f"{INFO_PATH}: no camera {camera!r}; it has {', '.join(cameras)}", "features")
        if "action" not in features:
            raise DatasetError(f"{INFO_PATH}: no 'action' feature", "features")
        video = features[camera]["dtype"] == "video"
        height, width = self.camera_sides(features, camera)
        action_shape = self.shape(features, "action")
        state_shape = self.shape(features, "observation.state") if "observation.state" in features else None
        for name, shape in (("action", action_shape), ("observation.state", state_shape)):
            if shape is not None and (len(shape) > 2 or math.prod(shape) > MAX_ROW_VALUES):
                raise DatasetError(
                    f"{INFO_PATH}: features[{name!r}].shape is {list(shape)}: at most 2 sides, "
                    f"{MAX_ROW_VALUES:,} values",
                    f"{name}.shape",
                )
        total_frames = self.count(info, "total_frames")
        data_template = info.get("data_path")
        data_rows = self.data_rows(data_template)
        if video:
            fill_template(
                info.get("video_path"), "video_path", {"video_key": camera, "chunk_index": 0, "file_index": 0}
            )
        entries = self.episodes_index(camera, video, data_rows, total_frames)
        chosen = entries[:max_episodes] if max_episodes is not None else entries
        frames = sum(e.length for e in chosen)
        budget = self.bounds.max_frames_mib * 2**20
        if frames * height * width * 3 > budget:
            raise DatasetError(
                f"{INFO_PATH}: {frames:,} frames of {width}x{height} ({camera}) decode to "
                f"{frames * height * width * 3 / 2**20:,.0f} MiB, over {self.bounds.max_frames_mib:,} MiB "
                "(--max-frames-mib)",
                camera,
            )
        kinds = len(action_shape) == 2 and RESPONSE_KIND in features  # a recording: a chunk per frame, and its outcome
        prefixed = PREFIX_ROWS in features
        if prefixed and not kinds:
            raise DatasetError(
                f"{INFO_PATH}: features[{PREFIX_ROWS!r}] needs a chunk per frame (an action of 2 sides and "
                f"{RESPONSE_KIND!r})",
                PREFIX_ROWS,
            )
        episodes = {
            e.index: _EpisodeArrays(e, (height, width), action_shape, state_shape, kinds, prefixed) for e in chosen
        }
        tasks = self.tasks()
        self.read_data(data_template, camera if not video else None, episodes, (height, width))
        if video:
            self.read_videos(info.get("video_path"), camera, episodes, (height, width))
        out = [arrays.episode(tasks) for arrays in episodes.values()]
        return LeRobotDataset(self.root, self.fps, camera, out)

    def read_data(
        self,
        template: object,
        image_camera: str | None,
        episodes: dict[int, _EpisodeArrays],
        sides: tuple[int, int],
    ) -> None:
        """Every chosen episode's rows, data file by data file, a few rows at a time."""
        by_file: dict[tuple[int, int], list[_EpisodeArrays]] = {}
        for arrays in episodes.values():
            by_file.setdefault(arrays.entry.data_file, []).append(arrays)
        for (chunk, file), held in sorted(by_file.items()):
            rel = fill_template(template, "data_path", {"chunk_index": chunk, "file_index": file})
            parquet = self.parquet(rel, "data_path", "data file")
            columns = ["episode_index", "frame_index", "task_index", "action"]
            state_shape = None if held[0].state is None else held[0].state.shape[1:]
            columns += ["observation.state"] if state_shape is not None else []
            columns += [image_camera] if image_camera else []
            kinds = held[0].answered is not None
            columns += [RESPONSE_KIND] if kinds else []
            prefixed = held[0].prefix_rows is not None
            columns += [PREFIX_ROWS] if prefixed else []
            bounds = {
                "action": ColumnBound(values=math.prod(held[0].actions.shape[1:])),
                RESPONSE_KIND: ColumnBound(value_bytes=4 + max(map(len, RESPONSE_KINDS))),
                PREFIX_ROWS: ColumnBound(),
            }
            if state_shape is not None:
                bounds["observation.state"] = ColumnBound(values=math.prod(state_shape))
            if image_camera:  # LeRobot's image: {bytes: a PNG, path}; a PNG holds its pixels at worst unpacked
                bounds[image_camera] = ColumnBound(value_bytes=2 * sides[0] * (3 * sides[1] + 1) + 2**16)
            for batch in self.batches(rel, parquet, columns, "data_path", bounds):
                ids = _integers(rel, batch, "episode_index")
                frame_ids = _integers(rel, batch, "frame_index")
                task_ids = _integers(rel, batch, "task_index")
                actions = _numbers(rel, batch, "action", held[0].actions.shape[1:])
                states = None if state_shape is None else _numbers(rel, batch, "observation.state", state_shape)
                answered = _answered(rel, batch) if kinds else None
                prefix_rows = _prefix_rows(rel, batch, held[0].actions.shape[1]) if prefixed else None
                images = batch.column(image_camera) if image_camera else None
                for k, (episode, frame) in enumerate(zip(ids.tolist(), frame_ids.tolist())):
                    into = episodes.get(episode)
                    if into is None:
                        continue
                    into.put(
                        rel,
                        frame,
                        int(task_ids[k]),
                        actions[k],
                        None if states is None else states[k],
                        None if answered is None else bool(answered[k]),
                        None if prefix_rows is None else int(prefix_rows[k]),
                    )
                    if images is not None:
                        into.put_image(frame, _image(rel, image_camera or "", images[k].as_py(), sides, self))
        for arrays in episodes.values():
            arrays.check_complete()

    def read_videos(
        self, template: object, camera: str, episodes: dict[int, _EpisodeArrays], sides: tuple[int, int]
    ) -> None:
        """Every chosen episode's frames of ``camera``, each MP4 checked by its header then decoded once,
        frame by frame into the episodes it holds."""
        by_file: dict[tuple[int, int], list[_EpisodeArrays]] = {}
        for arrays in episodes.values():
            assert arrays.entry.video_file is not None
            by_file.setdefault(arrays.entry.video_file, []).append(arrays)
        height, width = sides
        for (chunk, file), held in sorted(by_file.items()):
            values: dict[str, int | str] = {"video_key": camera, "chunk_index": chunk, "file_index": file}
            rel = fill_template(template, "video_path", values)
            path = self.file(rel, "video_path", "video")
            spans = sorted(held, key=lambda a: a.start)
            for before, after in zip(spans, spans[1:]):
                if before.start + before.entry.length > after.start:
                    raise DatasetError(
                        f"{rel}: episodes {before.entry.index} and {after.entry.index} share frames", "from_timestamp"
                    )
            end = spans[-1].start + spans[-1].entry.length
            try:
                with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    header = probe_video_header(data)
            except (OSError, ValueError) as exc:
                raise DatasetError(f"{rel}: not an MP4 file: {exc}", "video_path") from exc
            if header is None or header.frames is None:
                raise DatasetError(f"{rel}: not an MP4 whose header gives its video's sides and frames", "video_path")
            self.check_sides(header.height, header.width, str(rel), camera)
            if (header.height, header.width) != (height, width):
                raise DatasetError(
                    f"{rel}: the MP4's frames are {header.width}x{header.height}; features[{camera!r}] says "
                    f"{width}x{height}",
                    f"{camera}.shape",
                )
            if header.frames < end:
                raise DatasetError(
                    f"{rel}: the MP4 holds {header.frames} frames; the episodes index needs {end}", "from_timestamp"
                )
            self.decode(rel, path, spans, end, sides)

    def decode(
        self, rel: PurePosixPath, path: Path, spans: list[_EpisodeArrays], end: int, sides: tuple[int, int]
    ) -> None:
        import imageio_ffmpeg

        height, width = sides
        reader = imageio_ffmpeg.read_frames(
            str(path),
            pix_fmt="rgb24",
            input_params=["-max_pixels", str(height * width)],
            output_params=["-frames:v", str(end)],
        )
        try:
            try:
                meta = reader.__next__()
            except Exception as exc:  # noqa: BLE001 - ffmpeg reports undecodable input in several ways
                raise DatasetError(f"{rel}: not a video ffmpeg can decode", "video_path") from exc
            if tuple(meta["size"]) != (width, height):
                raise DatasetError(
                    f"{rel}: ffmpeg decodes {meta['size']}, its header says {width}x{height}", "video_path"
                )
            position, at = 0, 0
            try:
                for raw in reader:
                    while at < len(spans) and position >= spans[at].start + spans[at].entry.length:
                        at += 1
                    if at == len(spans):
                        break
                    if position >= spans[at].start:
                        spans[at].images[position - spans[at].start] = np.frombuffer(raw, np.uint8).reshape(
                            height, width, 3
                        )
                    position += 1
            except Exception as exc:  # noqa: BLE001 - a frame ffmpeg could not decode
                raise DatasetError(
                    f"{rel}: the video could not be decoded past frame {position}", "video_path"
                ) from exc
            if position < end:
                raise DatasetError(
                    f"{rel}: the video ends at frame {position}; the episodes index needs {end}", "video_path"
                )
        finally:
            reader.close()


def _owner(path_in_schema: str, columns: list[str]) -> str | None:
    """The column of ``columns`` a leaf (``action.list.element``, ``observation.images.front.bytes``) belongs to."""
    owners = [c for c in columns if path_in_schema == c or path_in_schema.startswith(c + ".")]
    return max(owners, key=len) if owners else None


def fill_template_glob(template: object) -> PurePosixPath:
    """The ``data_path`` template with each field a ``*``: the data files it can name."""
    assert isinstance(template, str)  # fill_template checked it
    out = [
        literal + ("*" if field_name is not None else "")
        for literal, field_name, _, _ in string.Formatter().parse(template)
    ]
    return PurePosixPath("".join(out))


class _EpisodeArrays:
    """One chosen episode's arrays, allocated from what the index declares and filled row by row."""

    def __init__(
        self,
        entry: _EpisodeEntry,
        sides: tuple[int, int],
        action_shape: tuple[int, ...],
        state_shape: tuple[int, ...] | None,
        kinds: bool,
        prefixed: bool = False,
    ) -> None:
        """``kinds``: the rows carry a recording's ``response.kind``, kept as :attr:`answered`; ``prefixed``:
        they carry ``action.prefix_rows``, kept as :attr:`prefix_rows`."""
        self.entry = entry
        self.start = entry.video_start or 0
        length = entry.length
        self.images = np.zeros((length, *sides, 3), np.uint8)
        self.actions = np.zeros((length, *action_shape), np.float32)
        self.state = np.zeros((length, *state_shape), np.float32) if state_shape else None
        self.answered = np.zeros(length, bool) if kinds else None
        self.prefix_rows = np.zeros(length, np.int64) if prefixed else None
        self.seen = np.zeros(length, bool)
        self.task_index = -1

    def put(
        self,
        rel: PurePosixPath,
        frame: int,
        task: int,
        action: np.ndarray,
        state: np.ndarray | None,
        answered: bool | None,
        prefix_rows: int | None = None,
    ) -> None:
        if not 0 <= frame < self.entry.length or self.seen[frame]:
            raise DatasetError(
                f"{rel}: episode {self.entry.index} has frame_index {frame} "
                f"{'twice' if 0 <= frame < self.entry.length else f'past its length {self.entry.length}'}",
                "frame_index",
            )
        self.seen[frame] = True
        self.actions[frame] = action
        if self.state is not None and state is not None:
            self.state[frame] = state
        if self.answered is not None and answered is not None:
            self.answered[frame] = answered
        if self.prefix_rows is not None and prefix_rows is not None:
            self.prefix_rows[frame] = prefix_rows
        if frame == 0:
            self.task_index = task

    def put_image(self, frame: int, image: np.ndarray) -> None:
        self.images[frame] = image

    def check_complete(self) -> None:
        if not self.seen.all():
            missing = int(np.argmin(self.seen))
            raise DatasetError(
                f"data: episode {self.entry.index} has {int(self.seen.sum())} of its {self.entry.length} frames "
                f"(frame_index {missing} is missing)",
                "frame_index",
            )

    def episode(self, tasks: Mapping[int, str]) -> DatasetEpisode:
        return DatasetEpisode(
            self.entry.index,
            self.images,
            self.state,
            self.actions,
            tasks.get(self.task_index, ""),
            self.answered,
            self.prefix_rows,
        )


def _integers(rel: PurePosixPath, batch: pa.RecordBatch, name: str) -> np.ndarray:
    column = batch.column(name)
    if not pa.types.is_integer(column.type) or column.null_count:
        raise DatasetError(f"{rel}: column {name!r} is {column.type}, not whole numbers without gaps", name)
    return np.asarray(column.to_numpy(zero_copy_only=False), np.int64)


def _answered(rel: PurePosixPath, batch: pa.RecordBatch) -> np.ndarray:
    """A recording's ``response.kind`` column as whether each row was answered with a chunk."""
    column = batch.column(RESPONSE_KIND)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) or column.null_count:
        raise DatasetError(f"{rel}: column {RESPONSE_KIND!r} is {column.type}, not strings without gaps", RESPONSE_KIND)
    kinds: list[str] = column.to_pylist()
    for kind in kinds:
        if kind not in RESPONSE_KINDS:
            shown = kind if len(kind) <= 40 else kind[:40] + "..."
            raise DatasetError(
                f"{rel}: column {RESPONSE_KIND!r} holds {shown!r}, not one of {', '.join(RESPONSE_KINDS)}",
                RESPONSE_KIND,
            )
    return np.array([kind == ANSWERED_KIND for kind in kinds], bool)


def _prefix_rows(rel: PurePosixPath, batch: pa.RecordBatch, chunk_rows: int) -> np.ndarray:
    """``action.prefix_rows``: whole numbers from 0 to one less than a chunk's rows (a prefix leaves at least
    one row to learn)."""
    rows = _integers(rel, batch, PREFIX_ROWS)
    bad = (rows < 0) | (rows >= chunk_rows)
    if bad.any():
        raise DatasetError(
            f"{rel}: column {PREFIX_ROWS!r} holds {int(rows[bad][0])}, not 0 to {chunk_rows - 1} "
            f"(a chunk has {chunk_rows} rows)",
            PREFIX_ROWS,
        )
    return rows


def _numbers(rel: PurePosixPath, batch: pa.RecordBatch, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A numeric (list) column as (rows, *shape) float32, its values counted before they are reshaped."""
    column: pa.Array = batch.column(name)
    while (
        pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type) or pa.types.is_large_list(column.type)
    ):
        if column.null_count:
            break
        column = column.flatten()
    if column.null_count or not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        raise DatasetError(f"{rel}: column {name!r} holds {column.type} values with gaps or not numbers", name)
    if len(column) != batch.num_rows * math.prod(shape):
        raise DatasetError(
            f"{rel}: column {name!r} holds {len(column) / max(1, batch.num_rows):g} values a row; "
            f"its feature's shape {list(shape)} says {math.prod(shape)}",
            name,
        )
    values: np.ndarray = np.asarray(column.to_numpy(zero_copy_only=False), np.float32).reshape(batch.num_rows, *shape)
    return values


def _image(rel: PurePosixPath, camera: str, value: object, sides: tuple[int, int], reader: _Reader) -> np.ndarray:
    """One frame of an ``image`` feature (LeRobot stores ``{"bytes": ..., "path": ...}``), its header
    checked before its pixels are decoded."""
    from PIL import Image, UnidentifiedImageError

    data = value.get("bytes") if isinstance(value, dict) else value
    if not isinstance(data, bytes):
        raise DatasetError(f"{rel}: a frame of {camera!r} has no image bytes", camera)
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            reader.check_sides(height, width, str(rel), camera)
            if (height, width) != sides:
                raise DatasetError(
                    f"{rel}: a frame of {camera!r} is {width}x{height}; its feature says {sides[1]}x{sides[0]}", camera
                )
            return np.asarray(image.convert("RGB"))
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError, ValueError) as exc:
        raise DatasetError(f"{rel}: a frame of {camera!r} is not an image Pillow can decode: {exc}", camera) from exc
