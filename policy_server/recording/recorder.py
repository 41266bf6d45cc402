"""The recorder: sessions hand it what they see and send; one writer thread puts it on disk.

One :class:`Recorder` serves the whole server. Each session gets a
:class:`~.session_recording.SessionRecording` from :meth:`Recorder.session` (or ``NO_RECORDING``, which
accepts the same calls and does nothing) and calls it on the event loop. Every call is O(1) and never
blocks: it builds a small event and offers it to a bounded :class:`~.write_queue.WriteQueue`. When the
queue is full, the frame is dropped and counted, never waited for: a slow disk costs recorded frames,
never a late chunk.

The writer thread (``recording-writer``, at a lower CPU priority than the engine) does everything else:
episode folders, MP4 segments, Parquet, assembly into a LeRobotDataset, publication, retention and the
quota. At start it first recovers what a crash left behind (:mod:`.recovery`).

If the disk fills up, recording stops with one logged error and the ``disk_full`` counter; what was
committed stays recoverable; sessions go on unaffected, and their frames are counted as not recorded.
Recording resumes by itself once ``min_free_bytes`` are free again (checked every ``disk_retry_s``): the
cut episodes are published up to their last segment and the sessions still running continue in new
episodes.

Counters (:meth:`Recorder.stats`) are plain integers, ready for the metrics module.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from typing import Any

from .events import ObservationRecord
from .session_recording import SessionRecording
from .settings import RecorderCounters, RecorderSettings, RecorderState
from .store import RecordingStore
from .write_queue import WriteQueue
from .writer_thread import RecordingWriter, StopWriter, WriterBarrier

logger = logging.getLogger(__name__)


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
