"""How a server records its sessions: the ``--record-*`` options, the recorder they start, what it reports.

:class:`RecordingOptions` is what ``cosmos3-serve --record-dir DIR`` sets. The server starts one
:class:`~policy_server.recording.Recorder` from it (:func:`start_recorder`) before it listens, hands each
session a recording when the session is to be recorded (every session, or only those that opt in with
``configure``'s ``record: true`` or an operator's ``record`` control), and closes the recorder after its
sessions have ended their episodes. ``policy_server.recording`` is imported only here, and only when
recording is on: a server that records nothing never loads the writer and its video encoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .recording import Recorder


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


class SessionRecorder(Protocol):
    """The server's recorder as sessions, health and metrics see it (``policy_server.recording.Recorder``)."""

    def session(self, session_id: str, protocol: str) -> Any:
        """A new ``SessionRecording`` for that session (the calls of ``sessions.recording_hooks.RecordingHooks``)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Its counters and state, for ``/metrics`` and health."""
        ...


def start_recorder(options: RecordingOptions) -> Recorder:
    """A started recorder writing under ``options.root`` (a directory that cannot be made fails here)."""
    from .recording import Recorder, RecorderSettings

    recorder = Recorder(RecorderSettings(root=options.root, max_bytes=options.max_bytes, max_age_s=options.max_age_s))
    recorder.start()
    return recorder


def recorder_health(recorder: SessionRecorder | None, options: RecordingOptions | None) -> dict[str, Any] | None:
    """The ``recording`` part of ``/healthz`` and the dashboard: None when the server records nothing."""
    if recorder is None or options is None:
        return None
    stats = recorder.stats()
    return {
        "state": stats["state"],
        "every_session": options.every_session,
        "episodes_open": stats["episodes_open"],
        "episodes_published": stats["episodes_published"],
        "frames_recorded": stats["frames_recorded"],
        "frames_dropped": stats["frames_dropped_queue_full"] + stats["frames_refused"] + stats["frames_not_recorded"],
        "disk_full": stats["disk_full"],
        "used_bytes": stats["used_bytes"],
    }
