"""An episode folder's committed segments into a LeRobotDataset v3.0 dataset, in the same folder.

Used when an episode ends and, after a crash, at the next start: both read only what is on disk
(``meta/cosmos3/session.json`` and the segments whose ``segment.json`` exists), so a crash during assembly
is repaired by assembling again. Every file is written atomically and ``meta/info.json`` last.

Each camera's MP4 segments are joined with ffmpeg's concat demuxer, copying the stream (every segment has
the same size, frame rate and codec settings). Each segment restarts its timestamps at 0 and lasts
exactly its frame count / fps, so frame *i* of the joined file is presented at *i*/fps, which is what
LeRobot's decoder asks for. Decode timestamps must follow one another the same way in every segment:
libx264 reorders frames for B-frames from 3 frames on, shifting a segment's decode times two frames
before its presentation times, and a 1- or 2-frame segment has no such shift; joined, the two kinds make
ffmpeg rewrite timestamps (the average frame rate LeRobot computes frame indices from goes off). So every
segment has at least :data:`MIN_SEGMENT_FRAMES` frames: the recorder flushes no fewer, and an episode that
ends on fewer repeats its last frame after its ``to_timestamp``, where no reader looks.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cosmos3_runtime.lerobot_layout import (
    ANSWERED_KIND,
    DATA_PATH,
    EPISODES_PATH,
    INFO_PATH,
    RESPONSE_KIND,
    STATS_PATH,
    TASKS_PATH,
)
from cosmos3_runtime.mp4_header import probe_video_header

from ..foundation import durable_files
from ..videos.encoding import VideoEncodingError, check_mp4_structure
from .lerobot_format import (
    NO_VALUE,
    SEGMENT_COMMIT,
    SEGMENT_ROWS,
    SEGMENTS_DIR,
    SESSION_JSON,
    EpisodeLayout,
    column,
    data_schema,
    episodes_table,
    image_stats,
    info_json,
    numeric_stats,
    tasks_table,
    video_path,
    write_table,
)

logger = logging.getLogger(__name__)

MIN_SEGMENT_FRAMES = 3
# Where a committed segment that does not read back goes, inside the episode: LeRobot reads nothing under
# meta/cosmos3/, and it is deleted with the recording by retention and the quota.
QUARANTINE_DIR = "meta/cosmos3/quarantine"


def _concat_entry(path: Path) -> str:
    # ffconcat quoting: inside single quotes, a quote is written '\''.
    return "file '" + str(path.resolve()).replace("'", "'\\''") + "'\n"


def join_segments(segments: list[tuple[Path, int]], out: Path) -> None:
    """Write ``segments`` (MP4 files encoded alike, in order, with their frame counts) as one MP4 at
    ``out``, atomically."""
    import imageio_ffmpeg

    if not segments:
        raise VideoEncodingError("no segments to join")
    if any(frames < MIN_SEGMENT_FRAMES for _, frames in segments):
        raise VideoEncodingError(f"every segment needs at least {MIN_SEGMENT_FRAMES} frames to be joined")
    parts = [path for path, _ in segments]
    with durable_files.replacing(out) as tmp:
        if len(parts) == 1:
            shutil.copyfile(parts[0], tmp)
        else:
            listing = out.with_name(out.name + ".segments.txt")
            listing.write_text("ffconcat version 1.0\n" + "".join(_concat_entry(p) for p in parts))
            try:
                result = subprocess.run(
                    [
                        imageio_ffmpeg.get_ffmpeg_exe(),
                        "-nostdin",
                        "-y",
                        "-loglevel",
                        "error",
                        "-f",
                        "concat",
                        "-safe",
                        "0",
                        "-i",
                        str(listing),
                        "-c",
                        "copy",
                        "-movflags",
                        "+faststart",
                        "-f",
                        "mp4",
                        str(tmp),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
            finally:
                listing.unlink(missing_ok=True)
            if result.returncode != 0:
                raise VideoEncodingError(f"ffmpeg could not join {len(parts)} segments: {result.stderr.strip()[-500:]}")
        check_mp4_structure(tmp)


class AssemblyError(RuntimeError):
    """The folder's files do not make an episode (they are not ours, or were changed by hand)."""


@dataclass(frozen=True)
class AssembledEpisode:
    frames: int
    tasks: list[str]


def committed_segments(folder: Path) -> list[Path]:
    """Segment folders in order, up to the first one without its commit file."""
    root = folder / SEGMENTS_DIR
    if not root.is_dir():
        return []
    found = []
    for segment in sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit()):
        if not (segment / SEGMENT_COMMIT).exists():
            break
        found.append(segment)
    return found


def read_segment(
    segment: Path, layout: EpisodeLayout, schema: pa.Schema | None
) -> tuple[dict[str, Any], pa.Table] | str:
    """A committed segment's commit record and rows, or why it does not read back as the recorder committed
    it: its commit file, its rows (``schema``: those of the segments kept before it) and each camera's MP4
    (whole, of the layout's sides and the committed frame count)."""
    try:
        commit = json.loads((segment / SEGMENT_COMMIT).read_text())
        frames, histograms = commit["frames"], commit["histograms"]
        video_frames = int(commit.get("video_frames", frames))
        table = pq.read_table(segment / SEGMENT_ROWS)
    except Exception as exc:  # noqa: BLE001 - any way a file fails to read makes the segment unusable
        return f"{type(exc).__name__}: {exc}"
    if table.num_rows != frames or set(histograms) != set(layout.cameras):
        return f"{table.num_rows} rows and cameras {sorted(histograms)} where it committed {frames} frames"
    if schema is not None and not table.schema.equals(schema, check_metadata=False):
        return "its rows have other columns than the segments before it"
    for key, (height, width) in layout.cameras.items():
        path = segment / f"{key}.mp4"
        try:
            check_mp4_structure(path)
            header = probe_video_header(path.read_bytes())
        except (OSError, VideoEncodingError) as exc:
            return f"{key}.mp4: {exc}"
        if header is None or (header.height, header.width, header.frames) != (height, width, video_frames):
            return f"{key}.mp4 is not {video_frames} frames of {width}x{height}"
    return commit, table


def quarantine(folder: Path, segment: Path, fault: str) -> None:
    """Move a committed segment that does not read back aside, under :data:`QUARANTINE_DIR`, and say so."""
    target = folder / QUARANTINE_DIR / segment.name
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    segment.rename(target)
    durable_files.fsync_dir(segment.parent)
    logger.warning(
        "recording %s: segment %s does not read back (%s); moved to %s, the other segments kept",
        folder.name,
        segment.name,
        fault,
        QUARANTINE_DIR,
    )


def column_values(array: pa.ChunkedArray | pa.Array, shape: tuple[int, ...]) -> np.ndarray:
    """A column of the data file back as a frames-first numpy array of the feature's ``shape``."""
    array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
    rows = len(array)
    for _ in range(len(shape) if shape != (1,) else 0):
        array = pc.list_flatten(array)
    values: np.ndarray = array.to_numpy(zero_copy_only=False)
    return values if shape == (1,) else values.reshape(rows, *shape)


def assemble(folder: Path) -> AssembledEpisode | None:
    """Write the dataset files from the committed segments; ``None`` if not one frame was committed."""
    session_path = folder / SESSION_JSON
    session = json.loads(session_path.read_text())
    if session.get("layout") is None:
        return None
    layout = EpisodeLayout.from_json(session["layout"])
    fps = int(session["fps"])
    segments: list[Path] = []
    tables: list[pa.Table] = []
    histograms = {key: np.zeros((3, 256), np.int64) for key in layout.cameras}
    frame_counts = []
    quarantined = list(session.get("quarantined_segments", []))
    for segment in committed_segments(folder):
        read = read_segment(segment, layout, tables[0].schema if tables else None)
        if isinstance(read, str):  # not what the recorder committed: set it aside, keep the others
            quarantine(folder, segment, read)
            quarantined.append(segment.name)
            continue
        commit, table = read
        segments.append(segment)
        frame_counts.append(int(commit.get("video_frames", table.num_rows)))
        tables.append(table)
        for key, counts in commit["histograms"].items():
            histograms[key] += np.asarray(counts, dtype=np.int64)
    if not segments:
        return None
    rows = pa.concat_tables(tables)
    frames = rows.num_rows

    tasks = list(dict.fromkeys(rows.column("task").to_pylist()))
    task_of = {task: i for i, task in enumerate(tasks)}
    frame_index = np.arange(frames, dtype=np.int64)
    defaults = {
        "timestamp": (frame_index / fps).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.zeros(frames, dtype=np.int64),
        "index": frame_index,
        "task_index": np.array([task_of[t] for t in rows.column("task").to_pylist()], dtype=np.int64),
    }
    features = layout.features(fps)
    schema = data_schema(features)
    data = pa.Table.from_arrays(
        [column(defaults[name], features[name]) if name in defaults else rows.column(name) for name in schema.names],
        schema=schema,
    )
    (folder / DATA_PATH).parent.mkdir(parents=True, exist_ok=True)
    write_table(folder / DATA_PATH, data)

    for key in layout.cameras:
        target = folder / video_path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        join_segments([(segment / f"{key}.mp4", n) for segment, n in zip(segments, frame_counts)], target)

    answered = np.array(rows.column(RESPONSE_KIND).to_pylist()) == ANSWERED_KIND
    client_times = column_values(rows.column("observation.client_timestamp"), (1,))
    kept = {
        "action": answered,
        "response.timing_ms": answered,
        "response.seed": answered,
        "observation.client_timestamp": client_times != NO_VALUE,
    }
    stats = {}
    for name, feature in features.items():
        if feature["dtype"] == "video":
            stats[name] = image_stats(histograms[name], frames)
        elif feature["dtype"] != "string":
            values = defaults[name] if name in defaults else column_values(data.column(name), tuple(feature["shape"]))
            feature_stats = numeric_stats(values, kept.get(name))
            if feature_stats["count"][0] > 0:  # LeRobot's aggregate_stats divides by the count
                stats[name] = feature_stats
    durable_files.write_json(
        folder / STATS_PATH,
        {
            feature: {stat: np.asarray(value).tolist() for stat, value in values.items()}
            for feature, values in stats.items()
        },
    )
    write_table(folder / TASKS_PATH, tasks_table(tasks))
    (folder / EPISODES_PATH).parent.mkdir(parents=True, exist_ok=True)
    write_table(
        folder / EPISODES_PATH,
        episodes_table(tasks=tasks, frames=frames, fps=fps, video_keys=list(layout.cameras), stats=stats),
    )
    session.update(frames=frames, segments=len(segments))
    if quarantined:
        session["quarantined_segments"] = quarantined
    durable_files.write_json(session_path, session)
    robot_type = session.get("config", {}).get("domain_name")
    durable_files.write_json(folder / INFO_PATH, info_json(features, fps, frames, len(tasks), robot_type))
    return AssembledEpisode(frames, tasks)
