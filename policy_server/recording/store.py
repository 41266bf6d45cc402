"""The recording directory: names that cannot escape it, what is in it, what may be deleted, and recovery.

Layout of ``--record-dir DIR``::

    DIR/20260101T120000Z_0a1b2c3d4e5f_000/     one published recording: a LeRobotDataset v3.0 folder
    DIR/.partial/20260101T120500Z_.../         an episode being recorded (or cut short by a crash)

A recording's name is ``<UTC start>_<session>_<episode>``: digits, ASCII letters and ``-`` only, checked
against one pattern before any path is made from it, so a name from a URL or a command line cannot
point outside ``DIR`` (no separators, no dots, no symlinks followed). The session part is the session's
id reduced to those characters.

A recording appears under ``DIR`` by one ``rename`` from ``.partial`` once it is complete, so a reader
never sees half of one. :meth:`RecordingStore.enforce` applies the retention age and the disk quota,
oldest first; it never touches what is still being recorded. After a crash, :func:`recover_partials`
publishes every episode left in ``.partial`` up to its last committed segment (``"end_reason":
"interrupted"`` unless it had recorded its own), or removes it: nothing that would break a loader stays.

The directory is created private to the server's user (0700): recordings hold camera images.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..foundation import durable_files
from ..foundation.durable_files import TMP_SUFFIX, fsync_dir
from .assembly import assemble
from .lerobot_format import SEGMENTS_DIR, SESSION_JSON

logger = logging.getLogger(__name__)

PARTIAL_DIR = ".partial"
DELETING_PREFIX = "deleting-"
NAME_PATTERN = re.compile(r"\A(\d{8}T\d{6}Z)_([A-Za-z0-9-]{1,32})_(\d{3,6})\Z")
_SESSION_UNSAFE = re.compile(r"[^A-Za-z0-9-]+")


class InvalidRecordingName(ValueError):
    """A recording name that is not one this store makes (and so cannot be a path inside it)."""


def session_slug(session_id: str) -> str:
    """The session part of a recording name: ``session_id`` reduced to ``[A-Za-z0-9-]``, 32 at most."""
    slug = _SESSION_UNSAFE.sub("-", session_id)[:32].strip("-")
    return slug or "session"


def recording_name(session_id: str, started_wall: float, episode: int) -> str:
    stamp = datetime.fromtimestamp(started_wall, tz=timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}_{session_slug(session_id)}_{episode:03d}"


def directory_bytes(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


def sweep_published(folder: Path) -> None:
    """Drop a published recording's leftovers from recording: ``segments/`` and temporary files."""
    shutil.rmtree(folder / SEGMENTS_DIR, ignore_errors=True)
    for leftover in list(folder.rglob(f"*{TMP_SUFFIX}")) + list(folder.rglob("*.partial")):
        if leftover.is_file() and not leftover.is_symlink():
            leftover.unlink(missing_ok=True)


@dataclass(frozen=True)
class RecordingInfo:
    """A published recording, as the directory shows it."""

    name: str
    path: Path
    session: str
    started_at: str  # UTC, ISO 8601 basic format, from the name
    num_bytes: int
    published_at: float  # wall-clock seconds


class RecordingStore:
    """One recording directory. Listing and path resolution are safe from any thread; the accounting
    (:meth:`rescan`, :meth:`enforce`, :meth:`publish`) belongs to the recorder's writer thread."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.partial_root = self.root / PARTIAL_DIR
        self._published: dict[str, tuple[int, float]] = {}
        self._partial: dict[str, int] = {}

    def create(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.partial_root.mkdir(exist_ok=True, mode=0o700)

    # -- names and paths -------------------------------------------------------------------------

    @staticmethod
    def check_name(name: str) -> str:
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise InvalidRecordingName(f"{name!r} is not a recording name (expected <UTC start>_<session>_<episode>)")
        return name

    def path(self, name: str) -> Path:
        """The folder of published recording ``name``; raises :class:`InvalidRecordingName` or
        ``FileNotFoundError``. Never a path outside the directory, never through a symlink."""
        path = self.root / self.check_name(name)
        if path.is_symlink() or not path.is_dir():
            raise FileNotFoundError(f"no recording named {name}")
        return path

    def partial_path(self, name: str) -> Path:
        return self.partial_root / self.check_name(name)

    def new_name(self, session_id: str, started_wall: float, episode: int) -> str:
        """A fresh name: the episode number grows until neither a recording nor a partial has it."""
        while True:
            name = recording_name(session_id, started_wall, episode)
            if not (self.root / name).exists() and not (self.partial_root / name).exists():
                return name
            episode += 1

    # -- what is there -----------------------------------------------------------------------------

    def list(self) -> list[RecordingInfo]:
        """Published recordings, newest first."""
        found = []
        for entry in self.root.iterdir() if self.root.is_dir() else ():
            match = NAME_PATTERN.match(entry.name)
            if not match or entry.is_symlink() or not entry.is_dir():
                continue
            found.append(
                RecordingInfo(
                    entry.name, entry, match.group(2), match.group(1), directory_bytes(entry), entry.stat().st_mtime
                )
            )
        return sorted(found, key=lambda info: (info.started_at, info.name), reverse=True)

    def partial_names(self) -> builtins.list[str]:
        if not self.partial_root.is_dir():
            return []
        return sorted(
            e.name
            for e in self.partial_root.iterdir()
            if NAME_PATTERN.match(e.name) and e.is_dir() and not e.is_symlink()
        )

    # -- accounting (writer thread) ----------------------------------------------------------------

    def rescan(self) -> None:
        self._published = {info.name: (info.num_bytes, info.published_at) for info in self.list()}
        self._partial = {name: directory_bytes(self.partial_root / name) for name in self.partial_names()}

    @property
    def used_bytes(self) -> int:
        return sum(size for size, _ in self._published.values()) + sum(self._partial.values())

    def add_partial_bytes(self, name: str, num_bytes: int) -> None:
        self._partial[name] = self._partial.get(name, 0) + num_bytes

    def publish(self, name: str) -> Path:
        """Move a finished episode from ``.partial`` into the directory (one rename: the commit point),
        then remove what only recording needed (its segments, temporary files)."""
        source, target = self.partial_path(name), self.root / name
        os.rename(source, target)
        fsync_dir(self.root)
        fsync_dir(self.partial_root)
        self._partial.pop(name, None)
        sweep_published(target)
        self._published[name] = (directory_bytes(target), time.time())
        return target

    def sweep(self) -> None:
        """Remove what a crash can leave behind outside the partial episodes: half-deleted recordings, and
        segments or temporary files inside published ones."""
        if self.partial_root.is_dir():
            for entry in self.partial_root.iterdir():
                if entry.name.startswith(DELETING_PREFIX) and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
        for info in self.list():
            sweep_published(info.path)

    def discard_partial(self, name: str) -> None:
        shutil.rmtree(self.partial_path(name), ignore_errors=True)
        self._partial.pop(name, None)

    def delete(self, name: str) -> None:
        """Delete published recording ``name``."""
        path = self.root / self.check_name(name)
        if path.is_symlink():
            raise InvalidRecordingName(f"{name} is a symlink, not a recording")
        # Rename first so that a crash mid-delete leaves no half recording that looks whole.
        doomed = self.partial_root / f"{DELETING_PREFIX}{name}"
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        self._published.pop(name, None)

    def enforce(
        self,
        *,
        max_bytes: int | None,
        max_age_s: float | None,
        now: float | None = None,
        protect: frozenset[str] = frozenset(),
    ) -> builtins.list[tuple[str, str]]:
        """Delete published recordings older than ``max_age_s``, then the oldest until the directory
        fits in ``max_bytes``. ``protect`` is never deleted. Returns ``(name, "age" | "quota")`` pairs."""
        now = time.time() if now is None else now
        deleted: list[tuple[str, str]] = []
        oldest_first = sorted(self._published, key=lambda n: (self._published[n][1], n))
        for name in oldest_first:
            if max_age_s is not None and name not in protect and now - self._published[name][1] > max_age_s:
                self._delete_quietly(name, "age", deleted)
        for name in oldest_first:
            if max_bytes is None or self.used_bytes <= max_bytes:
                break
            if name in self._published and name not in protect:
                self._delete_quietly(name, "quota", deleted)
        return deleted

    def _delete_quietly(self, name: str, reason: str, deleted: builtins.list[tuple[str, str]]) -> None:
        try:
            self.delete(name)
        except OSError as exc:
            logger.warning("recording %s: could not delete it (%s): %s", name, reason, exc)
            self._published.pop(name, None)
            return
        logger.info(
            "recording %s deleted (%s)",
            name,
            "older than the retention age" if reason == "age" else "over the recording quota",
        )
        deleted.append((name, reason))


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
        logger.warning("recording %s: cut short; recovered %d committed frames", name, assembled.frames)
        report.recovered.append(name)
    return report
