"""The recording's writer thread: everything that touches the disk, and the bounded queue it reads.

The writer thread (:class:`RecordingWriter`, ``recording-writer``, at a lower CPU priority than the
engine) does everything that touches the disk: episode folders, MP4 segments, Parquet, assembly into a
LeRobotDataset, publication, retention and the quota. At start it first recovers what a crash left. A
failure costs at most one session's episode. It reads the :class:`WriteQueue` the recorder's sessions
offer their events to, and keeps the recorder's state and counters (:class:`RecorderState`,
:class:`RecorderCounters`).

If the disk fills up, recording stops with one logged error and the ``disk_full`` counter; what was
committed stays recoverable; sessions go on unaffected, and their frames are counted as not recorded.
Recording resumes by itself once ``min_free_bytes`` are free again (checked every ``disk_retry_s``): the
cut episodes are published up to their last segment and the sessions still running continue in new
episodes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from cosmos3_runtime.lerobot_layout import ANSWERED_KIND, DROPPED_KIND, ERROR_KIND

from ..foundation.durable_files import is_out_of_space
from ..videos.encoding import VideoEncodingError
from .assembly import MIN_SEGMENT_FRAMES, assemble
from .episode_writer import EpisodeWriter, UnrecordableObservation
from .events import (
    ChunkReturned,
    DropRecord,
    EpisodeEnd,
    EpisodeStart,
    ErrorRecord,
    NoteRecord,
    ObservationRecord,
    Reconfigured,
    RowOutcome,
)
from .store import RecordingStore, directory_bytes, recover_partials

logger = logging.getLogger(__name__)

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


class WriteQueue:
    """A FIFO of ``(key, item, nbytes)`` with separate allowances for frames and small events."""

    def __init__(self, max_frames: int, max_bytes: int, max_events: int) -> None:
        if max_frames < 1 or max_bytes < 1 or max_events < 1:
            raise ValueError("queue bounds must be positive")
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.max_events = max_events
        self._items: deque[tuple[Any, Any, int]] = deque()
        self._ready = threading.Condition(threading.Lock())
        self.frames = 0
        self.bytes = 0
        self.events = 0

    def offer_frame(self, key: Any, item: Any, nbytes: int) -> bool:
        with self._ready:
            if self.frames >= self.max_frames or self.bytes + nbytes > self.max_bytes:
                return False
            self.frames += 1
            self.bytes += nbytes
            self._items.append((key, item, nbytes))
            self._ready.notify()
            return True

    def offer_event(self, key: Any, item: Any) -> bool:
        with self._ready:
            if self.events >= self.max_events:
                return False
            self.events += 1
            self._items.append((key, item, -1))
            self._ready.notify()
            return True

    def put_control(self, key: Any, item: Any) -> None:
        """Queue ``item`` regardless of the bounds (episode boundaries and the writer's stop signal)."""
        with self._ready:
            self._items.append((key, item, -2))
            self._ready.notify()

    def get(self, timeout: float) -> tuple[Any, Any] | None:
        """The oldest ``(key, item)``, waiting up to ``timeout`` seconds; ``None`` if none came."""
        with self._ready:
            if not self._items and not self._ready.wait_for(lambda: bool(self._items), timeout):
                return None
            key, item, nbytes = self._items.popleft()
            if nbytes >= 0:
                self.frames -= 1
                self.bytes -= nbytes
            elif nbytes == -1:
                self.events -= 1
            return key, item

    def __len__(self) -> int:
        return len(self._items)


# How often the writer wakes up with nothing to do (time-based flushes, retention, disk retry).
TICK_S = 0.25
# Below this many free bytes a failed write is taken for a full disk even without ENOSPC (ffmpeg does not
# always report it).
NEARLY_FULL_BYTES = 1 << 20


class DiskFull(OSError):
    """Free space fell under ``min_free_bytes``: recording stops before the disk refuses a write."""


class StopWriter:
    """Queued last by :meth:`Recorder.close`: finish every open episode and end the thread."""


@dataclass
class WriterBarrier:
    """Set once the writer has handled everything queued before it (:meth:`Recorder.sync`)."""

    reached: threading.Event = dataclasses.field(default_factory=threading.Event)


class RecordingWriter:
    """The writer thread's state: open episodes per session key, the store, and the recorder's counters."""

    def __init__(
        self, settings: RecorderSettings, store: RecordingStore, counters: RecorderCounters, queue: WriteQueue
    ) -> None:
        self.settings = settings
        self.store = store
        self.counters = counters
        self.state = RecorderState.STOPPED
        self._queue = queue
        self._starts: dict[int, EpisodeStart] = {}
        self._fresh_starts: set[int] = set()  # sessions whose EpisodeStart has not opened an episode yet
        self._episodes: dict[int, EpisodeWriter] = {}
        self._episode_numbers: dict[int, int] = {}
        self._over_quota: set[int] = set()
        self._halted_at = 0.0
        self._last_retention = 0.0
        self._newest: str | None = None  # the recording published last: the quota never deletes it

    @property
    def episodes_open(self) -> int:
        return len(self._episodes)

    def run(self) -> None:
        """The thread's body: recover, then handle what comes until :class:`StopWriter`."""
        self._lower_priority()
        self._guarded(self._recover)
        self._guarded(self._enforce)
        while True:
            got = self._queue.get(TICK_S)
            if got is not None:
                key, item = got
                if isinstance(item, StopWriter):
                    self._shutdown()
                    return
                if isinstance(item, WriterBarrier):
                    item.reached.set()
                    continue
                self._guarded(self._handle, key, item)
            self._guarded(self._housekeeping, time.monotonic())

    def _lower_priority(self) -> None:
        # On Linux a thread's nice value is its own, and the ffmpeg processes it starts inherit it.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.settings.writer_nice)
        except (AttributeError, OSError):
            pass

    def _guarded(self, work: Callable[..., object], *args: Any) -> None:
        try:
            work(*args)
        except Exception as exc:  # noqa: BLE001 - the writer outlives any one failure; serving never notices
            try:
                self._failed(exc, args[0] if args and isinstance(args[0], int) else None)
            except Exception:  # noqa: BLE001 - a failure while cleaning up after one: log it, keep the thread
                self.counters.write_errors += 1
                logger.exception("recording: the writer could not clean up after a failure")

    def _failed(self, exc: Exception, key: int | None) -> None:
        """A write failed: a full disk stops recording; anything else costs that session's episode."""
        if (
            is_out_of_space(exc)
            or isinstance(exc, DiskFull)
            or (isinstance(exc, (OSError, VideoEncodingError)) and self._free_bytes() < self._resume_free_bytes)
        ):
            self._halt(exc)
            return
        self.counters.write_errors += 1
        logger.exception("recording: the writer failed (%s)", type(exc).__name__)
        if key is not None and key in self._episodes:
            self._abandon(key)

    @property
    def _resume_free_bytes(self) -> int:
        return max(self.settings.min_free_bytes, NEARLY_FULL_BYTES)

    def _free_bytes(self) -> int:
        try:
            return shutil.disk_usage(self.store.root).free
        except OSError:
            return 0

    def _handle(self, key: int, item: Any) -> None:
        episode = self._episodes.get(key)
        if isinstance(item, ObservationRecord):
            self._on_observation(key, item)
        elif isinstance(item, ChunkReturned):
            if episode is not None and not episode.resolve(
                item.seq, RowOutcome(ANSWERED_KIND, actions=item.actions, seed=item.seed, timing=item.timing)
            ):
                episode.log("unmatched_chunk", item.at, seq=item.seq)
        elif isinstance(item, DropRecord):
            if episode is not None:
                episode.log("dropped", item.at, seq=item.seq, reason=item.reason, message=item.message)
                episode.resolve(item.seq, RowOutcome(DROPPED_KIND, item.reason, item.message))
        elif isinstance(item, ErrorRecord):
            if episode is not None:
                episode.log("error", item.at, seq=item.seq, code=item.code, message=item.message, field=item.field)
                if item.seq is not None:
                    episode.resolve(item.seq, RowOutcome(ERROR_KIND, item.code, item.message))
        elif isinstance(item, NoteRecord):
            if episode is not None:
                episode.log("note", item.at, note=item.kind, **item.details)
        elif isinstance(item, EpisodeStart):
            if episode is not None:
                self._close(key, "restarted", item.started_at)
            self._starts[key] = item
            self._fresh_starts.add(key)
            self._over_quota.discard(key)
            self.counters.episodes_started += 1
        elif isinstance(item, Reconfigured):
            self._on_reconfigured(key, item)
        elif isinstance(item, EpisodeEnd):
            if episode is not None:
                self._close(key, item.reason, item.at, item.frames_not_queued)
            self._starts.pop(key, None)
            self._fresh_starts.discard(key)
            self._over_quota.discard(key)

    def _on_observation(self, key: int, obs: ObservationRecord) -> None:
        if self.state is not RecorderState.RECORDING or key not in self._starts or key in self._over_quota:
            self.counters.frames_not_recorded += 1
            return
        episode = self._episodes.get(key)
        try:
            if episode is not None and not episode.fits(obs):
                episode.log("layout_changed", obs.received_at, seq=obs.seq)
                self._close(key, "layout_changed", obs.received_at)
                episode = None
            if episode is None:
                episode = self._open(key, obs.received_at)
                episode.fits(obs)  # raises UnrecordableObservation before anything is kept
        except UnrecordableObservation as exc:
            self.counters.frames_not_recorded += 1
            if episode is not None:
                episode.log("not_recorded", obs.received_at, seq=obs.seq, reason=str(exc))
            return
        episode.add(obs)

    def _on_reconfigured(self, key: int, item: Reconfigured) -> None:
        start = self._starts.get(key)
        if start is None:
            return
        self._starts[key] = dataclasses.replace(start, config=dict(item.config))
        episode = self._episodes.get(key)
        if episode is None:
            return
        episode.log("configured", item.at, config=dict(item.config))
        if not episode.reconfigure(item.config):
            self._close(key, "reconfigured", item.at)

    def _open(self, key: int, at: float) -> EpisodeWriter:
        """The session's next episode. The first after its ``EpisodeStart`` starts then; one that goes on
        after a split (new layout, new chunk shape, a full disk) starts at ``at``, its first frame."""
        if self._free_bytes() < self.settings.min_free_bytes:
            raise DiskFull(f"less than {self.settings.min_free_bytes} bytes free in {self.store.root}")
        start = self._starts[key]
        if key not in self._fresh_starts:
            start = dataclasses.replace(start, started_at=at, started_wall=time.time() - (time.monotonic() - at))
            self._starts[key] = start
        self._fresh_starts.discard(key)
        number = self._episode_numbers.get(key, 0)
        self._episode_numbers[key] = number + 1
        name = self.store.new_name(start.session_id, start.started_wall, number)
        episode = EpisodeWriter(self.store.partial_path(name), name, start, number, self.settings.video_quality)
        self._episodes[key] = episode
        episode.open()
        self.store.add_partial_bytes(name, directory_bytes(episode.folder))
        return episode

    def _flush(self, key: int, episode: EpisodeWriter, count: int) -> None:
        if self._free_bytes() < self.settings.min_free_bytes:
            raise DiskFull(f"less than {self.settings.min_free_bytes} bytes free in {self.store.root}")
        self._flush_rows(episode, count)
        if self.settings.max_bytes is not None:
            self._enforce()
            if self.store.used_bytes > self.settings.max_bytes:
                logger.warning(
                    "recording %s: the recording quota (%d bytes) is full; this episode ends here",
                    episode.name,
                    self.settings.max_bytes,
                )
                self._close(key, "quota", time.monotonic())
                self._over_quota.add(key)

    def _close(self, key: int, reason: str, at: float, frames_not_queued: int = 0) -> None:
        """Flush what is left, assemble the dataset and publish it (or drop an episode with no frame)."""
        episode = self._episodes[key]
        while episode.rows:
            self._flush_rows(episode, min(len(episode.rows), self.settings.segment_frames))
        del self._episodes[key]
        episode.end(reason, at, frames_not_queued)
        self._finish(episode.name)

    def _flush_rows(self, episode: EpisodeWriter, count: int) -> None:
        written = episode.flush(count)
        self.counters.frames_recorded += count
        self.counters.bytes_written += written
        self.store.add_partial_bytes(episode.name, written)
        self.counters.used_bytes = self.store.used_bytes

    def _finish(self, name: str) -> None:
        assembled = assemble(self.store.partial_path(name))
        if assembled is None:
            self.store.discard_partial(name)
            self.counters.episodes_discarded += 1
            return
        self.store.publish(name)
        self.counters.episodes_published += 1
        self._newest = name
        self._enforce()

    def _abandon(self, key: int) -> None:
        """After an unexpected failure: drop the episode's buffer, publish what it committed if possible."""
        episode = self._episodes.pop(key)
        self.counters.frames_not_recorded += episode.discard_buffer()
        try:
            episode.end("writer_error", time.monotonic(), 0)
            self._finish(episode.name)
        except Exception:  # noqa: BLE001 - recovery at the next start gets another try
            episode.close_files()
            logger.exception("recording %s: could not publish it after a failure; left for recovery", episode.name)

    def _halt(self, exc: BaseException) -> None:
        if self.state is RecorderState.DISK_FULL:
            return
        self.state = RecorderState.DISK_FULL
        self._halted_at = time.monotonic()
        self.counters.disk_full += 1
        logger.error(
            "recording stopped: the disk under %s is full (%s). Serving goes on; recording resumes "
            "when %d bytes are free.",
            self.store.root,
            exc,
            self._resume_free_bytes,
        )
        for episode in self._episodes.values():
            self.counters.frames_not_recorded += episode.discard_buffer()
            try:
                episode.end("disk_full", time.monotonic(), 0)
            except OSError:
                episode.close_files()
        # Their committed segments stay in .partial and are published when recording resumes.
        self._episodes.clear()

    def _housekeeping(self, now: float) -> None:
        if self.state is RecorderState.DISK_FULL:
            if now - self._halted_at >= self.settings.disk_retry_s and self._free_bytes() >= self._resume_free_bytes:
                self._resume()
            return
        settings = self.settings
        # Flushing by age only once the queue is drained: an outcome may still be waiting in it.
        interval = settings.flush_interval_s if len(self._queue) == 0 else None
        for key, episode in list(self._episodes.items()):
            count = episode.due(now, settings.segment_frames, interval)
            if count:
                self._guarded(self._flush, key, episode, count)
            if self.state is not RecorderState.RECORDING:
                return
        while sum(e.buffered_bytes for e in self._episodes.values()) > settings.buffer_bytes:
            flushable = [(k, e) for k, e in self._episodes.items() if len(e.rows) >= MIN_SEGMENT_FRAMES]
            if not flushable:
                break
            key, episode = max(flushable, key=lambda item: item[1].buffered_bytes)
            self._guarded(self._flush, key, episode, min(len(episode.rows), settings.segment_frames))
        if now - self._last_retention >= settings.retention_check_s:
            self._enforce()

    def _resume(self) -> None:
        logger.warning("recording resumed: %s has room again", self.store.root)
        self.state = RecorderState.RECORDING
        self._recover()
        self._enforce()

    def _recover(self) -> None:
        self.store.rescan()
        report = recover_partials(self.store, skip=frozenset(e.name for e in self._episodes.values()))
        self.counters.episodes_recovered += len(report.recovered)
        self.counters.episodes_discarded += len(report.removed)
        self.counters.used_bytes = self.store.used_bytes

    def _enforce(self) -> None:
        """Retention and quota. What is being recorded, and the recording published last, stay: the quota
        deletes older recordings first, and an episode over the quota on its own was cut short there."""
        self._last_retention = time.monotonic()
        protect = {e.name for e in self._episodes.values()} | ({self._newest} if self._newest else set())
        deleted = self.store.enforce(
            max_bytes=self.settings.max_bytes, max_age_s=self.settings.max_age_s, protect=frozenset(protect)
        )
        for _, reason in deleted:
            if reason == "age":
                self.counters.recordings_deleted_age += 1
            else:
                self.counters.recordings_deleted_quota += 1
        self.counters.used_bytes = self.store.used_bytes

    def _shutdown(self) -> None:
        for key in list(self._episodes):
            self._guarded(self._close, key, "server_stopped", time.monotonic())
        self.state = RecorderState.STOPPED
