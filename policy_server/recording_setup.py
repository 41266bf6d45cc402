"""The ``--record-*`` options: where and which sessions a server records.

:class:`RecordingOptions` is what ``cosmos3-serve --record-dir DIR`` sets. The command line attaches the
recording feature (:class:`policy_server.recording.server_feature.RecordingFeature`) only when it is set,
so a server that records nothing never loads the writer and its video encoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
