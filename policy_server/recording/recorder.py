"""The recorder: sessions hand it what they see and send; one writer thread puts it on disk.

One :class:`Recorder` serves the whole server. Each session gets a :class:`SessionRecording` from
:meth:`Recorder.session` (or :data:`NO_RECORDING`), as a listener of its events a
:class:`RecordingListener`, and calls it on the event loop. Every call is O(1) and never blocks: it offers
a small event holding references to the session's arrays to the bounded :class:`WriteQueue`. When the
queue is full the frame is dropped and counted, never waited for: a slow disk costs recorded frames,
never a late chunk.

The writer thread (:class:`RecordingWriter`, ``recording-writer``, at a lower CPU priority than the
engine) does everything that touches the disk: episode folders, MP4 segments, Parquet, assembly into a
LeRobotDataset, publication, retention and the quota. At start it first recovers what a crash left. A
failure costs at most one session's episode.

If the disk fills up, recording stops with one logged error and the ``disk_full`` counter; what was
committed stays recoverable; sessions go on unaffected, and their frames are counted as not recorded.
Recording resumes by itself once ``min_free_bytes`` are free again (checked every ``disk_retry_s``): the
cut episodes are published up to their last segment and the sessions still running continue in new
episodes. Counters (:meth:`Recorder.stats`) are plain integers, ready for the metrics module.

**Recording as a feature of the server**: its ``--record-*`` options, the recorder started with it, a
recording for each session that is recorded, and what ``/healthz`` and ``/metrics`` say about it.

:class:`RecordingOptions` is what ``cosmos3-serve --record-dir DIR`` sets. The command line imports this
module, and attaches a :class:`RecordingFeature`, only when it is set, so a server that records nothing
never loads the writer and its video encoder. The feature starts the :class:`Recorder` before
the server listens (a directory that cannot be made fails the start), tells the server's context how to
record a session (:class:`~policy_server.context.SessionRecordings`: each recording is a listener of its
session's events, :class:`RecordingListener`), and closes the recorder once every session has
ended its episode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from cosmos3_runtime.description import MODEL_IDENTITY_KEYS

from ..context import ServerContext, SessionRecordings
from ..durable_files import is_out_of_space
from ..sessions.listener import AcceptedObservation, SessionListener
from ..sessions.observation_rules import ChunkReply
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


class Recorder:
    """Records sessions into ``settings.root``. ``start()`` it, hand out :meth:`session`, ``close()`` it."""

    def __init__(self, settings: RecorderSettings) -> None:
        self.settings = settings
        self.store = RecordingStore(settings.root)
        self.counters = RecorderCounters()
        self._queue = WriteQueue(settings.queue_frames, settings.queue_bytes, settings.queue_events)
        self._writer = RecordingWriter(settings, self.store, self.counters, self._queue)
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._accepting = False

    @property
    def state(self) -> RecorderState:
        """``recording``, ``disk_full`` (until space is free again) or ``stopped``; the writer thread sets it."""
        return self._writer.state

    # -- the caller's side (event loop) --------------------------------------------------------------

    def start(self) -> None:
        """Create the directory (a bad path fails here, at startup) and start the writer thread."""
        self.store.create()
        self._writer.state = RecorderState.RECORDING
        self._accepting = True
        self._thread = threading.Thread(target=self._writer.run, name="recording-writer", daemon=True)
        self._thread.start()

    def session(self, session_id: str, protocol: str = "native") -> SessionRecording:
        return SessionRecording(self, next(self._keys), session_id, protocol)

    @property
    def default_fps(self) -> int:
        return self.settings.default_fps

    def offer_frame(self, key: int, record: ObservationRecord, nbytes: int) -> bool:
        if not self._accepting or self.state is not RecorderState.RECORDING:
            self.counters.frames_refused += 1
            return False
        if self._queue.offer_frame(key, record, nbytes):
            self.counters.frames_queued += 1
            return True
        self.counters.frames_dropped_queue_full += 1
        return False

    def offer_event(self, key: int, event: Any) -> None:
        if self._accepting and not self._queue.offer_event(key, event):
            self.counters.events_dropped_queue_full += 1

    def put_control(self, key: int, event: Any) -> None:
        if self._accepting:
            self._queue.put_control(key, event)

    def sync(self, timeout: float = 30.0) -> bool:
        """Wait until the writer has handled everything queued before this call (tests, benchmarks)."""
        if self._thread is None or not self._thread.is_alive():
            return False
        barrier = WriterBarrier()
        self._queue.put_control(None, barrier)
        return barrier.reached.wait(timeout)

    def close(self, timeout: float = 60.0) -> bool:
        """Finish every open episode (flushed, assembled, published) and stop the writer. ``False`` if it
        did not finish in ``timeout`` (what it had committed is recovered at the next start)."""
        if self._thread is None:
            return True
        self._accepting = False
        self._queue.put_control(None, StopWriter())
        self._thread.join(timeout)
        finished = not self._thread.is_alive()
        if not finished:
            logger.warning(
                "recording: the writer did not finish within %.0f s; the next start recovers what it committed", timeout
            )
        return finished

    def stats(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self.counters),
            "state": self.state.value,
            "queue_frames": self._queue.frames,
            "queue_bytes": self._queue.bytes,
            "queue_events": self._queue.events,
            "episodes_open": self._writer.episodes_open,
        }


# -- what one session holds to record itself --------------------------------------------------------


def _check_config(config: Mapping[str, Any]) -> None:
    # The chunk's shape is every row's `action` shape: without it no dataset can be written.
    for name in ("action_horizon", "raw_action_dim"):
        if not isinstance(config.get(name), int):
            raise ValueError(f"a recorded session's config needs an integer {name!r}")


class SessionRecording:
    """What one session calls, from the event loop, to record itself. Every call returns at once.

    Episodes: :meth:`start_episode` when the session is configured (and again after a reset),
    :meth:`end_episode` on reset or close. In between, every observation goes to :meth:`observation`
    and its terminal reply to exactly one of :meth:`chunk`, :meth:`dropped` or :meth:`error`.
    """

    def __init__(self, recorder: Recorder, key: int, session_id: str, protocol: str) -> None:
        self._recorder = recorder
        self._key = key
        self.session_id = session_id
        self.protocol = protocol
        self.active = False
        self.frames_not_queued = 0

    def start_episode(self, config: Mapping[str, Any], model: Mapping[str, Any], fps: int | None = None) -> None:
        """Begin an episode. ``config`` is the resolved configuration (``SessionConfig.resolved``: JSON-able,
        with the chunk's shape); ``model`` the model's identity (``ModelDescription.identity()``: only its keys
        are kept); ``fps`` the dataset's frame rate (default: the robot's declared control rate, else the
        recorder's)."""
        _check_config(config)
        if self.active:
            self.end_episode("restarted")
        if fps is None:
            control_hz = config.get("control_hz")
            fps = max(1, round(control_hz)) if control_hz else self._recorder.default_fps
        now = time.monotonic()
        self.active, self.frames_not_queued = True, 0
        self._recorder.put_control(
            self._key,
            EpisodeStart(
                self.session_id,
                self.protocol,
                dict(config),
                {key: model[key] for key in MODEL_IDENTITY_KEYS if key in model},
                int(fps),
                now,
                time.time(),
            ),
        )

    def configured(self, config: Mapping[str, Any]) -> None:
        """The resolved configuration changed (a new chunk shape starts a new episode)."""
        _check_config(config)
        if self.active:
            self._recorder.put_control(self._key, Reconfigured(dict(config), time.monotonic()))

    def observation(
        self,
        seq: int,
        cameras: Mapping[str, np.ndarray],
        request: Any = None,
        *,
        state: np.ndarray | None = None,
        received_at: float | None = None,
        client_timestamp: float | None = None,
    ) -> bool:
        """Record one observation (``cameras``: name -> H×W×3 uint8; ``request``: the ActionRequest made of
        it; ``received_at``: its ``time.monotonic()`` arrival). ``False`` if it was not queued."""
        if not self.active:
            return False
        nbytes = sum(frame.nbytes for frame in cameras.values())
        record = ObservationRecord(
            seq,
            cameras,
            request,
            state,
            time.monotonic() if received_at is None else received_at,
            client_timestamp,
            nbytes,
        )
        if self._recorder.offer_frame(self._key, record, nbytes):
            return True
        self.frames_not_queued += 1
        return False

    def chunk(self, seq: int, actions: np.ndarray, timing: Mapping[str, float | None], seed: int | None = None) -> None:
        """The ``action_chunk`` sent for ``seq`` (``timing`` as in the frame, ``observation_age_ms``
        included: call this when the frame leaves)."""
        if self.active:
            self._recorder.offer_event(self._key, ChunkReturned(seq, actions, timing, seed, time.monotonic()))

    def dropped(self, seq: int, reason: str, message: str = "") -> None:
        if self.active:
            self._recorder.offer_event(self._key, DropRecord(seq, reason, message, time.monotonic()))

    def error(self, seq: int | None, code: str, message: str, field: str | None = None) -> None:
        if self.active:
            self._recorder.offer_event(self._key, ErrorRecord(seq, code, message, field, time.monotonic()))

    def note(self, kind: str, **details: Any) -> None:
        """A line in the episode's event log (operator controls, replica moves...); ``details`` JSON-able."""
        if self.active:
            self._recorder.offer_event(self._key, NoteRecord(kind, details, time.monotonic()))

    def end_episode(self, reason: str) -> None:
        if self.active:
            self.active = False
            self._recorder.put_control(self._key, EpisodeEnd(reason, time.monotonic(), self.frames_not_queued))


class NullSessionRecording:
    """A session that is not recorded: the same calls as :class:`SessionRecording`, doing nothing."""

    active = False
    frames_not_queued = 0

    def start_episode(self, config: Mapping[str, Any], model: Mapping[str, Any], fps: int | None = None) -> None:
        pass

    def configured(self, config: Mapping[str, Any]) -> None:
        pass

    def observation(self, seq: int, cameras: Mapping[str, np.ndarray], request: Any = None, **_: Any) -> bool:
        return False

    def chunk(self, seq: int, actions: np.ndarray, timing: Mapping[str, float | None], seed: int | None = None) -> None:
        pass

    def dropped(self, seq: int, reason: str, message: str = "") -> None:
        pass

    def error(self, seq: int | None, code: str, message: str, field: str | None = None) -> None:
        pass

    def note(self, kind: str, **details: Any) -> None:
        pass

    def end_episode(self, reason: str) -> None:
        pass


NO_RECORDING = NullSessionRecording()


class RecordingListener(SessionListener):
    """A :class:`SessionRecording` as one of its session's listeners (:mod:`policy_server.sessions.listener`).

    Episodes follow the session: one starts at its first configuration (or at once, when recording starts
    on a configured session), a reset ends it and starts the next with the same configuration, and the
    session's close (or recording stopped) ends it with that reason.
    """

    def __init__(self, recording: SessionRecording) -> None:
        self.recording = recording
        self._configured: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None  # (config, model)

    def configured(self, config: Mapping[str, Any], model: Mapping[str, Any]) -> None:
        self._configured = (config, model)
        if self.recording.active:
            self.recording.configured(config)
        else:
            self.recording.start_episode(config, model)

    def observation(self, event: AcceptedObservation) -> None:
        self.recording.observation(
            event.frame.seq,
            event.cameras,
            event.request,
            received_at=event.received_at,
            client_timestamp=event.frame.client_timestamp,
        )

    def chunk_sent(self, reply: ChunkReply) -> None:
        self.recording.chunk(reply.seq, reply.actions, reply.timing, reply.seed)

    def dropped(self, seq: int, reason: str, message: str) -> None:
        self.recording.dropped(seq, reason, message)

    def error(self, seq: int | None, code: str, message: str, field: str | None) -> None:
        self.recording.error(seq, code, message, field)

    def noted(self, kind: str, details: Mapping[str, Any]) -> None:
        self.recording.note(kind, **details)

    def reset(self) -> None:
        self.recording.end_episode("reset")
        if self._configured is not None:
            self.recording.start_episode(*self._configured)

    def closed(self, reason: str) -> None:
        self.recording.end_episode(reason)


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
                item.seq, RowOutcome("chunk", actions=item.actions, seed=item.seed, timing=item.timing)
            ):
                episode.log("unmatched_chunk", item.at, seq=item.seq)
        elif isinstance(item, DropRecord):
            if episode is not None:
                episode.log("dropped", item.at, seq=item.seq, reason=item.reason, message=item.message)
                episode.resolve(item.seq, RowOutcome("dropped", item.reason, item.message))
        elif isinstance(item, ErrorRecord):
            if episode is not None:
                episode.log("error", item.at, seq=item.seq, code=item.code, message=item.message, field=item.field)
                if item.seq is not None:
                    episode.resolve(item.seq, RowOutcome("error", item.code, item.message))
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


# -- recording as a feature of the server ----------------------------------------------------------


@dataclass(frozen=True)
class RecordingOptions:
    """Where to record, how much to keep, and which sessions."""

    root: Path
    max_bytes: int | None = None  # quota of the directory; the oldest recordings are deleted first
    max_age_s: float | None = None  # retention: recordings older than this are deleted
    # True: every session is recorded from its first `configure` (a session may opt out with `record: false`);
    # False: only sessions that opt in (`record: true`, or the dashboard's toggle).
    every_session: bool = True
    # How long stopping waits for the writer to publish the last episodes (what it had not committed by
    # then is recovered at the next start).
    close_timeout_s: float = 60.0


class RecordingFeature:
    """Records the sessions of the server whose ``context`` it is given, as ``options`` say."""

    def __init__(self, context: ServerContext[Any], options: RecordingOptions) -> None:
        self.context = context
        self.options = options
        self.recorder: Recorder | None = None

    async def start(self) -> None:
        options = self.options
        recorder = Recorder(
            RecorderSettings(root=options.root, max_bytes=options.max_bytes, max_age_s=options.max_age_s)
        )
        recorder.start()
        self.recorder = recorder

        def listener(session_id: str, protocol: str) -> SessionListener:
            return RecordingListener(recorder.session(session_id, protocol))

        self.context.recordings = SessionRecordings(listener, options.every_session, options.root)
        self.context.health_parts["recording"] = self.health
        self.context.stats["recording"] = recorder.stats

    async def stop(self, grace_s: float) -> None:
        """Publish what the sessions recorded and stop the writer (every session has ended its episode)."""
        if self.recorder is not None:
            await asyncio.to_thread(self.recorder.close, self.options.close_timeout_s)

    def health(self) -> dict[str, Any]:
        """The ``recording`` part of ``/healthz`` and the dashboard."""
        assert self.recorder is not None, "start() first"
        stats = self.recorder.stats()
        return {
            "state": stats["state"],
            "every_session": self.options.every_session,
            "episodes_open": stats["episodes_open"],
            "episodes_published": stats["episodes_published"],
            "frames_recorded": stats["frames_recorded"],
            "frames_dropped": stats["frames_dropped_queue_full"]
            + stats["frames_refused"]
            + stats["frames_not_recorded"],
            "disk_full": stats["disk_full"],
            "used_bytes": stats["used_bytes"],
        }
