"""What a recorder is told (:class:`RecorderSettings`) and what it tells (:class:`RecorderCounters`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from .video_segments import MIN_SEGMENT_FRAMES

# imageio-ffmpeg's 1-10 scale (libx264 -crf 51*(1 - q/10)): 5 is crf 25. Camera noise makes the project's
# default for generated videos (8, crf 10) about 4x slower to encode and ~80x bigger (docs/recording.md).
RECORDING_QUALITY = 5


class RecorderState(str, Enum):
    RECORDING = "recording"
    DISK_FULL = "disk_full"
    STOPPED = "stopped"


@dataclass(frozen=True)
class RecorderSettings:
    """Where and how much to record. Sizes in bytes, times in seconds; ``None`` means no limit."""

    root: Path
    max_bytes: int | None = None  # quota for the whole directory; the oldest recordings go first
    max_age_s: float | None = None  # retention: recordings older than this are deleted
    segment_frames: int = 32  # frames per flush (one MP4 segment per camera)
    flush_interval_s: float = 5.0  # a slow robot's frames reach the disk at least this often
    queue_frames: int = 64
    queue_bytes: int = 256 << 20
    queue_events: int = 4096
    buffer_bytes: int = 512 << 20  # frames the writer may hold awaiting their flush, all sessions together
    min_free_bytes: int = 64 << 20  # stop recording before the disk has less free than this
    disk_retry_s: float = 30.0
    retention_check_s: float = 60.0
    default_fps: int = 10  # the dataset's frame rate when the session declares no control_hz
    video_quality: int = RECORDING_QUALITY
    writer_nice: int = 10  # the writer (and its ffmpeg) yields the CPU to the engine

    def __post_init__(self) -> None:
        if self.segment_frames < MIN_SEGMENT_FRAMES:
            raise ValueError(f"segment_frames must be at least {MIN_SEGMENT_FRAMES}")
        if self.flush_interval_s <= 0 or self.default_fps < 1:
            raise ValueError("flush_interval_s and default_fps must be positive")


@dataclass
class RecorderCounters:
    """What the recorder did. Each counter is written by one thread only (caller or writer)."""

    episodes_started: int = 0
    episodes_published: int = 0
    episodes_recovered: int = 0
    episodes_discarded: int = 0  # ended before a frame reached the disk, or not recoverable
    frames_queued: int = 0
    frames_dropped_queue_full: int = 0  # the caller's frames the queue had no room for
    frames_refused: int = 0  # the caller's frames while recording was stopped (disk full, closing)
    frames_recorded: int = 0  # frames written to disk
    frames_not_recorded: int = 0  # reached the writer but not the disk (disk full, quota, unrecordable)
    events_dropped_queue_full: int = 0
    bytes_written: int = 0
    used_bytes: int = 0  # the directory's size, as the writer last counted it
    recordings_deleted_age: int = 0
    recordings_deleted_quota: int = 0
    disk_full: int = 0  # times recording stopped because the disk was full
    write_errors: int = 0  # other failures of the writer (logged with a traceback)
