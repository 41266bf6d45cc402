"""The recorder: sessions hand it what they see and send, and its writer thread puts it on disk.

One :class:`Recorder` serves the whole server. Each session gets a :class:`SessionRecording` from
:meth:`Recorder.session` (or :data:`NO_RECORDING`), as a listener of its events a
:class:`RecordingListener`, and calls it on the event loop. Every call is O(1) and never blocks: it offers
a small event holding references to the session's arrays to the bounded
:class:`~.writer.WriteQueue`. When the queue is full the frame is dropped and counted, never waited for:
a slow disk costs recorded frames, never a late chunk. The writer thread (:mod:`.writer`) does the rest.
Counters (:meth:`Recorder.stats`) are plain integers, ready for the metrics module.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from cosmos3_runtime.description import MODEL_IDENTITY_KEYS

from ..session_events import AcceptedObservation, SessionListener
from .events import (
    ChunkReturned,
    DropRecord,
    EpisodeEnd,
    EpisodeStart,
    ErrorRecord,
    NoteRecord,
    ObservationRecord,
    Reconfigured,
)
from .store import RecordingStore
from .writer import (
    RecorderCounters,
    RecorderSettings,
    RecorderState,
    RecordingWriter,
    StopWriter,
    WriteQueue,
    WriterBarrier,
)

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
    """A :class:`SessionRecording` as one of its session's listeners (:mod:`policy_server.session_events`).

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

    def chunk_sent(self, seq: int, actions: np.ndarray, timing: Mapping[str, float | None], seed: int | None) -> None:
        self.recording.chunk(seq, actions, timing, seed)

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
