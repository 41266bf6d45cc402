"""After a crash: every episode left in ``.partial`` is published up to its last committed segment, or
removed. Nothing that would break a loader stays in the recording directory.

Runs on the recorder's writer thread before it takes any work (and again when recording resumes after
the disk was full). An episode is recovered when its committed segments assemble into a dataset
(:func:`~policy_server.recording.assembly.assemble`); its ``session.json`` then says
``"end_reason": "interrupted"`` (unless it had recorded its own reason before the crash). An episode
with no committed segment, or whose files do not assemble, is deleted and logged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from . import durable_files
from .assembly import assemble
from .episode_files import SESSION_JSON
from .store import RecordingStore

logger = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    recovered: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def recover_partials(store: RecordingStore, skip: frozenset[str] = frozenset()) -> RecoveryReport:
    """Publish or remove every partial episode except those in ``skip`` (being recorded right now)."""
    report = RecoveryReport()
    store.sweep()
    for name in store.partial_names():
        if name in skip:
            continue
        folder = store.partial_path(name)
        try:
            session_path = folder / SESSION_JSON
            session = json.loads(session_path.read_text())
            if not session.get("end_reason"):
                session["end_reason"] = "interrupted"
                durable_files.write_json(session_path, session)
            assembled = assemble(folder)
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with it, it must not stay half-written
            if durable_files.is_out_of_space(exc):
                raise  # the episode is fine; the disk is not: try again when there is room
            logger.warning("recording %s: cut short and not recoverable (%s); removed", name, exc)
            store.discard_partial(name)
            report.removed.append(name)
            continue
        if assembled is None:
            logger.info("recording %s: cut short before its first frame reached the disk; removed", name)
            store.discard_partial(name)
            report.removed.append(name)
            continue
        store.publish(name)
        logger.warning("recording %s: cut short; recovered its first %d frames", name, assembled.frames)
        report.recovered.append(name)
    return report
