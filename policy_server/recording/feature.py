"""Recording as a feature of the server: its ``--record-*`` options, the recorder started with it, a
recording for each session that is recorded, and what ``/healthz`` and ``/metrics`` say about it.

:class:`RecordingOptions` is what ``cosmos3-serve --record-dir DIR`` sets. The command line imports this
module, and attaches a :class:`RecordingFeature`, only when it is set, so a server that records nothing
never loads the writer and its video encoder. The feature starts the :class:`~.recorder.Recorder` before
the server listens (a directory that cannot be made fails the start), tells the server's context how to
record a session (:class:`~policy_server.context.SessionRecordings`: each recording is a listener of its
session's events, :class:`~.recorder.RecordingListener`), and closes the recorder once every session has
ended its episode.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..context import ServerContext, SessionRecordings
from ..session_events import SessionListener
from .recorder import Recorder, RecordingListener
from .writer import RecorderSettings


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
