"""What one session holds to record itself: :class:`SessionRecording` (or :data:`NO_RECORDING`), and the
same as a listener of the session's events (:class:`RecordingListener`).

A session calls these on the event loop. Every call is O(1) and never blocks: it builds one small event
holding references to the session's arrays and offers it to the recorder's bounded queue through a
:class:`RecordingSink` (the recorder; a Protocol so that the recorder may import this module). A frame the
queue has no room for is counted here and dropped; the session never waits.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from cosmos3_runtime.description import MODEL_IDENTITY_KEYS

from ..sessions.listener import AcceptedObservation, SessionListener
from ..sessions.observation_rules import ChunkReply
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


def _check_config(config: Mapping[str, Any]) -> None:
    # The chunk's shape is every row's `action` shape: without it no dataset can be written.
    for name in ("action_horizon", "raw_action_dim"):
        if not isinstance(config.get(name), int):
            raise ValueError(f"a recorded session's config needs an integer {name!r}")


class RecordingSink(Protocol):
    """Where a session's events go: the recorder's queue (see :class:`~.recorder.Recorder`)."""

    @property
    def default_fps(self) -> int: ...

    def offer_frame(self, key: int, record: ObservationRecord, nbytes: int) -> bool: ...

    def offer_event(self, key: int, event: Any) -> None: ...

    def put_control(self, key: int, event: Any) -> None: ...


class SessionRecording:
    """What one session calls, from the event loop, to record itself. Every call returns at once.

    Episodes: :meth:`start_episode` when the session is configured (and again after a reset),
    :meth:`end_episode` on reset or close. In between, every observation goes to :meth:`observation`
    and its terminal reply to exactly one of :meth:`chunk`, :meth:`dropped` or :meth:`error`.
    """

    def __init__(self, sink: RecordingSink, key: int, session_id: str, protocol: str) -> None:
        self._sink = sink
        self._key = key
        self.session_id = session_id
        self.protocol = protocol
        self.active = False
        self.frames_not_queued = 0

    def start_episode(self, config: Mapping[str, Any], model: Mapping[str, Any], fps: int | None = None) -> None:
        """Begin an episode. ``config`` is the resolved configuration (JSON-able, with
        ``action_horizon`` and ``raw_action_dim``); ``model`` the model's identity (``ModelDescription.identity()``:
        only its keys are kept);
        ``fps`` the dataset's frame rate (default: the config's ``control_hz``, else the recorder's)."""
        _check_config(config)
        if self.active:
            self.end_episode("restarted")
        if fps is None:
            control_hz = config.get("control_hz")
            fps = max(1, round(control_hz)) if control_hz else self._sink.default_fps
        now = time.monotonic()
        self.active, self.frames_not_queued = True, 0
        self._sink.put_control(
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
            self._sink.put_control(self._key, Reconfigured(dict(config), time.monotonic()))

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
        if self._sink.offer_frame(self._key, record, nbytes):
            return True
        self.frames_not_queued += 1
        return False

    def chunk(self, seq: int, actions: np.ndarray, timing: Mapping[str, float | None], seed: int | None = None) -> None:
        """The ``action_chunk`` sent for ``seq`` (``timing`` as in the frame, ``observation_age_ms``
        included: call this when the frame leaves)."""
        if self.active:
            self._sink.offer_event(self._key, ChunkReturned(seq, actions, timing, seed, time.monotonic()))

    def dropped(self, seq: int, reason: str, message: str = "") -> None:
        if self.active:
            self._sink.offer_event(self._key, DropRecord(seq, reason, message, time.monotonic()))

    def error(self, seq: int | None, code: str, message: str, field: str | None = None) -> None:
        if self.active:
            self._sink.offer_event(self._key, ErrorRecord(seq, code, message, field, time.monotonic()))

    def note(self, kind: str, **details: Any) -> None:
        """A line in the episode's event log (operator controls, replica moves...); ``details`` JSON-able."""
        if self.active:
            self._sink.offer_event(self._key, NoteRecord(kind, details, time.monotonic()))

    def end_episode(self, reason: str) -> None:
        if self.active:
            self.active = False
            self._sink.put_control(self._key, EpisodeEnd(reason, time.monotonic(), self.frames_not_queued))


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
