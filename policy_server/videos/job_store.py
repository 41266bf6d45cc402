"""Where ``forward_dynamics`` video jobs live: what a job is, a SQLite table, and one folder of files per job.

Job states::

    queued ──claim──► in_progress ──► completed
       ▲                  │     └───► failed     (the model refused or failed the request)
       └──── recover ─────┘                       (the server died while it ran)

A job is accepted only once it is durable: its inputs (the first frame and the raw actions) are written
and fsynced into a folder named after the job id, then its row is committed with SQLite's
``synchronous=FULL``. After that, killing the server at any moment (SIGKILL included) loses nothing: on
the next start :meth:`VideoJobStore.recover` puts every job that was running back in the queue, and queued
jobs simply wait their turn. A job interrupted :data:`MAX_ATTEMPTS` times fails with ``interrupted``
instead of running again, so one job that kills the process (out of memory, say) cannot crash-loop the
server.

The table is ``video_jobs.sqlite3`` (WAL mode) in the data directory. Each job's files, kept only while
the job may still run (its inputs are deleted when it finishes), are under the data directory's
``videos/`` folder::

    <job id>/input_reference.png   the first frame as uploaded (.png, .jpg or .webp), or, sent as pixels,
                                   encoded as a lossless PNG (older stores: .npy)
    <job id>/action.npy            T×D float32
    <job id>/video.mp4             once completed (written atomically)

Inputs are kept compact (a 58 KB PNG of a 4096² frame stays 58 KB, not 48 MiB of raw pixels). Paths are
built from job ids only, and only ids that match :data:`JOB_ID_PATTERN` are accepted, so no client input
can name a path.

Retention (:class:`RetentionPolicy`): finished jobs (completed or failed) are deleted, row and files,
once older than ``max_age_s``, and the oldest finished ones go first whenever the store (inputs of jobs
still to run and finished results, as counted in the table) takes more than ``max_bytes``. Queued and
running jobs are never deleted by retention: a submission whose inputs would not fit even after every
finished job made room is refused (:class:`StorageFull`), as is one the disk itself has no room for.
``max_queued`` bounds how many may wait.

The store is thread-safe (one connection behind a lock); the sidecar calls it through
``asyncio.to_thread`` so disk waits never stall the event loop.
"""

from __future__ import annotations

import builtins
import enum
import errno
import io
import json
import logging
import re
import shutil
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..foundation.durable_files import write_folder
from ..sidecar_settings import RetentionPolicy

logger = logging.getLogger(__name__)

# A job interrupted this many times (the server died while running it) fails instead of running again.
MAX_ATTEMPTS = 3


class VideoJobStatus(str, enum.Enum):
    """Where a job stands; each value (the member's name in lower case) is what the store and the API say."""

    # enum.StrEnum does this from Python 3.11; the package supports 3.10.
    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list[Any]) -> str:
        return name.lower()

    def __str__(self) -> str:
        return self.value

    QUEUED = enum.auto()
    IN_PROGRESS = enum.auto()
    COMPLETED = enum.auto()
    FAILED = enum.auto()


FINISHED = (VideoJobStatus.COMPLETED, VideoJobStatus.FAILED)


@dataclass
class VideoJob:
    """One row of the job table. ``params`` are the request's scalar settings, as resolved at submission."""

    id: str
    status: VideoJobStatus
    created_at: float
    params: dict[str, Any]
    progress: int = 0
    started_at: float | None = None
    completed_at: float | None = None
    attempts: int = 0
    error_code: str | None = None
    error_message: str | None = None
    error_field: str | None = None
    result_bytes: int = 0
    result_frames: int = 0
    width: int | None = None
    height: int | None = None
    timing: dict[str, float] = field(default_factory=dict)
    input_bytes: int = 0  # the stored inputs' size while the job may still run (0 once finished)


@dataclass
class VideoJobInputs:
    """The arrays a job needs besides its params (kept in files, not in the table). ``encoded_image`` is
    the first frame as the client sent it (PNG, JPEG or WebP bytes), stored instead of the pixels."""

    image: np.ndarray
    action: np.ndarray
    encoded_image: bytes | None = None


class JobNotFound(KeyError):
    """No job with that id (or the id is not one this store could have made)."""


class StorageFull(Exception):
    """A job or its result could not be stored: the data directory's disk is full (``cap`` False), or the
    store has reached its own size limit, ``RetentionPolicy.max_bytes`` (``cap`` True)."""

    def __init__(self, message: str, *, cap: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.cap = cap


def disk_full(exc: BaseException) -> bool:
    """Whether a failed write was the disk's fault: ENOSPC/EDQUOT anywhere in the exception's chain, or
    SQLite's "database or disk is full" (it reports no errno)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, StorageFull):
            return True
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(seen, sqlite3.Error) and "full" in str(seen):
            return True
        if "No space left on device" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


JOB_ID_PREFIX = "video_"
JOB_ID_PATTERN = re.compile(r"^video_[0-9a-f]{32}$")
JOBS_DIRNAME = "videos"
IMAGE_STEM = "input_reference"
# The first frame's file, by what it holds: an upload kept as received, or pixels encoded losslessly.
IMAGE_SUFFIXES = (".png", ".jpg", ".webp", ".npy")  # .npy: raw arrays, as stores before schema 2 kept them
ACTION_FILE = "action.npy"
VIDEO_FILE = "video.mp4"
# Free space a submission must leave on the data directory's disk beyond its own files (SQLite's log).
FREE_SPACE_MARGIN_BYTES = 1 << 20


def new_job_id() -> str:
    return JOB_ID_PREFIX + uuid.uuid4().hex


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def image_file(inputs: VideoJobInputs) -> tuple[str, bytes]:
    """The first frame's file name and bytes: the upload as received, or the pixels as a lossless PNG."""
    data = inputs.encoded_image
    if data is not None:
        if data.startswith(b"\x89PNG\r\n\x1a\n"):
            return IMAGE_STEM + ".png", data
        if data.startswith(b"\xff\xd8\xff"):
            return IMAGE_STEM + ".jpg", data
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return IMAGE_STEM + ".webp", data
    from PIL import Image

    buffer = io.BytesIO()
    # compress_level 1: a few times faster than the default and most of its gain on camera frames.
    Image.fromarray(np.ascontiguousarray(inputs.image, dtype=np.uint8)).save(buffer, "PNG", compress_level=1)
    return IMAGE_STEM + ".png", buffer.getvalue()


def read_image(path: Path) -> np.ndarray:
    if path.suffix == ".npy":
        array: np.ndarray = np.load(path, allow_pickle=False)
        return array
    from PIL import Image

    with Image.open(path) as image:
        return np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8))


def stored_image(folder: Path) -> Path | None:
    for suffix in IMAGE_SUFFIXES:
        if (folder / (IMAGE_STEM + suffix)).is_file():
            return folder / (IMAGE_STEM + suffix)
    return None


def input_files(inputs: VideoJobInputs) -> dict[str, bytes]:
    """The files a job's inputs are kept in, by name: the first frame and the actions (T×D float32)."""
    image_name, image_data = image_file(inputs)
    return {image_name: image_data, ACTION_FILE: npy_bytes(np.ascontiguousarray(inputs.action, dtype=np.float32))}


def has_inputs(folder: Path) -> bool:
    return stored_image(folder) is not None and (folder / ACTION_FILE).is_file()


def stored_input_bytes(folder: Path) -> int:
    return sum(
        path.stat().st_size
        for path in (stored_image(folder), folder / ACTION_FILE)
        if path is not None and path.is_file()
    )


def read_inputs(folder: Path) -> VideoJobInputs:
    image = stored_image(folder)
    if image is None:
        raise FileNotFoundError(f"{folder}: no {IMAGE_STEM} file")
    return VideoJobInputs(image=read_image(image), action=np.load(folder / ACTION_FILE, allow_pickle=False))


def remove_inputs(folder: Path) -> None:
    for name in [IMAGE_STEM + suffix for suffix in IMAGE_SUFFIXES] + [ACTION_FILE]:
        (folder / name).unlink(missing_ok=True)


DATABASE_NAME = "video_jobs.sqlite3"
SCHEMA_VERSION = 2  # 2: input_bytes


_SCHEMA = """
CREATE TABLE IF NOT EXISTS video_jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    params TEXT NOT NULL,
    progress INTEGER NOT NULL DEFAULT 0,
    started_at REAL,
    completed_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    error_code TEXT,
    error_message TEXT,
    error_field TEXT,
    result_bytes INTEGER NOT NULL DEFAULT 0,
    result_frames INTEGER NOT NULL DEFAULT 0,
    width INTEGER,
    height INTEGER,
    timing TEXT NOT NULL DEFAULT '{}',
    input_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS video_jobs_status_created ON video_jobs (status, created_at);
"""
_MIGRATIONS = {  # from schema version N to N + 1
    1: "ALTER TABLE video_jobs ADD COLUMN input_bytes INTEGER NOT NULL DEFAULT 0",
}


class VideoJobStore:
    """SQLite-backed, crash-safe store of video jobs and their files under ``data_dir``."""

    def __init__(self, data_dir: str | Path, retention: RetentionPolicy | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.jobs_dir = self.data_dir / JOBS_DIRNAME
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.retention = retention or RetentionPolicy()
        self._lock = threading.Lock()
        self._create_lock = threading.Lock()
        self._db = sqlite3.connect(self.data_dir / DATABASE_NAME, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed job survives power loss too, not only a killed process. One fsync per
            # state change is nothing next to a video job.
            self._db.execute("PRAGMA synchronous=FULL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.data_dir / DATABASE_NAME} has schema version {version}; this server knows {SCHEMA_VERSION}"
                )
            # Nothing is written to an up-to-date store here, so a server can start on a full disk.
            if version == 0:  # a new store: the current schema at once
                self._db.executescript(_SCHEMA)
            else:
                for step in range(version, SCHEMA_VERSION):
                    self._db.execute(_MIGRATIONS[step])
            if version != SCHEMA_VERSION:
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        if 0 < version < 2:  # inputs stored before input_bytes was counted
            self._count_stored_inputs()

    def _count_stored_inputs(self) -> None:
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM video_jobs WHERE status IN (?, ?)",
                (VideoJobStatus.QUEUED.value, VideoJobStatus.IN_PROGRESS.value),
            ).fetchall()
        for row in rows:
            self._update(row["id"], input_bytes=stored_input_bytes(self.jobs_dir / row["id"]))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- paths -------------------------------------------------------------------------------------

    def job_dir(self, job_id: str) -> Path:
        if not isinstance(job_id, str) or not JOB_ID_PATTERN.match(job_id):
            raise JobNotFound(job_id)
        return self.jobs_dir / job_id

    def video_path(self, job_id: str) -> Path:
        return self.job_dir(job_id) / VIDEO_FILE

    # -- rows --------------------------------------------------------------------------------------

    @staticmethod
    def _job(row: sqlite3.Row) -> VideoJob:
        values = dict(row)
        values["status"] = VideoJobStatus(values["status"])
        values["params"] = json.loads(values["params"])
        values["timing"] = json.loads(values["timing"] or "{}")
        return VideoJob(**values)

    def _update(self, job_id: str, **values: Any) -> bool:
        for key in ("params", "timing"):
            if key in values:
                values[key] = json.dumps(values[key])
        if "status" in values:
            values["status"] = VideoJobStatus(values["status"]).value
        assignments = ", ".join(f"{name} = ?" for name in values)
        with self._lock:
            cursor = self._db.execute(f"UPDATE video_jobs SET {assignments} WHERE id = ?", (*values.values(), job_id))
        return cursor.rowcount == 1

    # -- the job's life ----------------------------------------------------------------------------

    def create(self, params: dict[str, Any], inputs: VideoJobInputs) -> VideoJob:
        """Persist a new queued job: files first (fsynced), then the row. Returns it once durable.

        Raises :class:`StorageFull` when the inputs do not fit: in the store's size limit (after finished
        jobs, oldest first, made what room they can) or on the disk. Nothing is left behind then.
        """
        job = VideoJob(id=new_job_id(), status=VideoJobStatus.QUEUED, created_at=time.time(), params=params)
        files = input_files(inputs)
        job.input_bytes = sum(len(data) for data in files.values())
        final = self.job_dir(job.id)
        staging = self.jobs_dir / f".staging-{job.id}"
        with self._create_lock:  # the room check and the insert, together
            self._make_room(job.input_bytes)
            try:
                free = shutil.disk_usage(self.jobs_dir).free
            except OSError:
                free = None
            if free is not None and free < job.input_bytes + FREE_SPACE_MARGIN_BYTES:
                raise StorageFull(
                    f"the data directory's disk has {free} bytes free; this job's inputs need "
                    f"{job.input_bytes} and the job table some room to grow"
                )
            try:
                write_folder(staging, final, files)
                with self._lock:
                    self._db.execute(
                        "INSERT INTO video_jobs (id, status, created_at, params, input_bytes) VALUES (?, ?, ?, ?, ?)",
                        (job.id, job.status.value, job.created_at, json.dumps(params), job.input_bytes),
                    )
            except BaseException as exc:
                shutil.rmtree(staging, ignore_errors=True)
                shutil.rmtree(final, ignore_errors=True)
                if isinstance(exc, Exception) and disk_full(exc):
                    raise StorageFull(f"the data directory's disk is full ({exc})") from exc
                raise
        return job

    def stored_bytes(self) -> int:
        """What the store holds, as its table counts it: inputs of jobs still to run plus finished results."""
        with self._lock:
            return int(
                self._db.execute("SELECT COALESCE(SUM(input_bytes + result_bytes), 0) FROM video_jobs").fetchone()[0]
            )

    def _make_room(self, needed: int) -> None:
        """Make ``needed`` bytes fit under ``max_bytes`` by retiring finished jobs, or raise StorageFull."""
        limit = self.retention.max_bytes
        if self.stored_bytes() + needed <= limit:
            return
        self.sweep(reserve=needed)
        stored = self.stored_bytes()
        if stored + needed > limit:
            raise StorageFull(
                f"the video store is at its limit (--video-storage-mib, {limit / 2**20:.1f} MiB): jobs still to "
                f"run and finished videos take {stored / 2**20:.1f} MiB and this job's inputs "
                f"{needed / 2**20:.2f} MiB. Retry once queued jobs have run, or delete finished ones",
                cap=True,
            )

    def get(self, job_id: str) -> VideoJob:
        self.job_dir(job_id)  # validates the id
        with self._lock:
            row = self._db.execute("SELECT * FROM video_jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(job_id)
        return self._job(row)

    def list(self, *, limit: int = 100, after: str | None = None, newest_first: bool = True) -> list[VideoJob]:
        """Jobs in creation order (newest first by default), ``limit`` of them, after the job ``after``."""
        order = "DESC" if newest_first else "ASC"
        with self._lock:
            if after is not None:
                anchor = self._db.execute("SELECT created_at FROM video_jobs WHERE id = ?", (after,)).fetchone()
                if anchor is None:
                    raise JobNotFound(after)
                compare = "<" if newest_first else ">"
                rows = self._db.execute(
                    f"SELECT * FROM video_jobs WHERE (created_at, id) {compare} (?, ?) "
                    f"ORDER BY created_at {order}, id {order} LIMIT ?",
                    (anchor["created_at"], after, limit),
                ).fetchall()
            else:
                rows = self._db.execute(
                    f"SELECT * FROM video_jobs ORDER BY created_at {order}, id {order} LIMIT ?", (limit,)
                ).fetchall()
        return [self._job(row) for row in rows]

    def count_by_status(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) FROM video_jobs GROUP BY status").fetchall()
        counts = {status.value: 0 for status in VideoJobStatus}
        counts.update({row[0]: row[1] for row in rows})
        return counts

    def load_inputs(self, job_id: str) -> VideoJobInputs:
        return read_inputs(self.job_dir(job_id))

    def _drop_inputs(self, job_id: str) -> None:
        """A finished job never runs again: its inputs go (and stop counting against the limit)."""
        remove_inputs(self.job_dir(job_id))

    def claim_next(self) -> VideoJob | None:
        """Mark the oldest queued job ``in_progress`` and return it (None if nothing waits).

        A job already interrupted :data:`MAX_ATTEMPTS` times is failed here instead of claimed.
        """
        while True:
            with self._lock:
                row = self._db.execute(
                    "SELECT * FROM video_jobs WHERE status = ? ORDER BY created_at, id LIMIT 1",
                    (VideoJobStatus.QUEUED.value,),
                ).fetchone()
                if row is None:
                    return None
                job = self._job(row)
                if job.attempts >= MAX_ATTEMPTS:
                    self._db.execute(
                        "UPDATE video_jobs SET status = ?, completed_at = ?, error_code = ?, error_message = ?, "
                        "input_bytes = 0 WHERE id = ?",
                        (
                            VideoJobStatus.FAILED.value,
                            time.time(),
                            "interrupted",
                            f"the server stopped while running this job {job.attempts} times; it will not run again",
                            job.id,
                        ),
                    )
                    self._drop_inputs(job.id)
                    continue
                job.status, job.started_at, job.attempts, job.progress = (
                    VideoJobStatus.IN_PROGRESS,
                    time.time(),
                    job.attempts + 1,
                    0,
                )
                self._db.execute(
                    "UPDATE video_jobs SET status = ?, started_at = ?, attempts = ?, progress = 0 WHERE id = ?",
                    (job.status.value, job.started_at, job.attempts, job.id),
                )
                return job

    def release(self, job_id: str) -> bool:
        """Put a claimed job back in the queue without counting the attempt (it never reached the engine)."""
        with self._lock:
            cursor = self._db.execute(
                "UPDATE video_jobs SET status = ?, progress = 0, started_at = NULL, attempts = MAX(attempts - 1, 0) "
                "WHERE id = ? AND status = ?",
                (VideoJobStatus.QUEUED.value, job_id, VideoJobStatus.IN_PROGRESS.value),
            )
        return cursor.rowcount == 1

    def set_progress(self, job_id: str, progress: int) -> bool:
        return self._update(job_id, progress=int(progress))

    def complete(
        self, job_id: str, *, result_bytes: int, frames: int, width: int, height: int, timing: dict[str, float]
    ) -> bool:
        """Record a finished video (already at :meth:`video_path`). False if the job was deleted meanwhile."""
        recorded = self._update(
            job_id,
            status=VideoJobStatus.COMPLETED,
            progress=100,
            completed_at=time.time(),
            result_bytes=result_bytes,
            result_frames=frames,
            width=width,
            height=height,
            timing=timing,
            input_bytes=0,
        )
        if recorded:
            self._drop_inputs(job_id)
        return recorded

    def fail(self, job_id: str, code: str, message: str, field: str | None = None) -> bool:
        recorded = self._update(
            job_id,
            status=VideoJobStatus.FAILED,
            completed_at=time.time(),
            error_code=code,
            error_message=message,
            error_field=field,
            input_bytes=0,
        )
        if recorded:
            self._drop_inputs(job_id)
        return recorded

    def delete(self, job_id: str) -> bool:
        """Remove the job's row and its folder. False if there was no such job."""
        folder = self.job_dir(job_id)
        with self._lock:
            cursor = self._db.execute("DELETE FROM video_jobs WHERE id = ?", (job_id,))
        shutil.rmtree(folder, ignore_errors=True)
        return cursor.rowcount == 1

    # -- restart and retention ---------------------------------------------------------------------

    def recover(self) -> dict[str, int]:
        """After a restart: re-queue interrupted jobs, drop half-made folders and rows without inputs.

        Returns how many jobs were re-queued, failed (their inputs are gone) and how many stray folders
        were removed.
        """
        with self._lock:
            requeued = self._db.execute(
                "UPDATE video_jobs SET status = ?, progress = 0 WHERE status = ?",
                (VideoJobStatus.QUEUED.value, VideoJobStatus.IN_PROGRESS.value),
            ).rowcount
            known = {row[0]: row[1] for row in self._db.execute("SELECT id, status FROM video_jobs")}
        failed = strays = 0
        for job_id, status in known.items():
            folder = self.jobs_dir / job_id
            if status == VideoJobStatus.QUEUED.value and not has_inputs(folder):
                self.fail(job_id, "inputs_lost", "this job's input files are missing from the data directory")
                failed += 1
        for entry in self.jobs_dir.iterdir():
            # Staging folders of submissions that never committed, folders whose row was deleted (the
            # process died between the DELETE and the rmtree), and partial video files.
            if entry.name not in known:
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
                strays += 1
            elif (entry / (VIDEO_FILE + ".partial")).exists():
                (entry / (VIDEO_FILE + ".partial")).unlink(missing_ok=True)
        if requeued or failed or strays:
            logger.info(
                "video jobs recovered: %d re-queued, %d failed (inputs lost), %d stray folder(s) removed",
                requeued,
                failed,
                strays,
            )
        return {"requeued": requeued, "failed": failed, "strays": strays}

    def expires_at(self, job: VideoJob) -> float | None:
        if job.status not in FINISHED or job.completed_at is None:
            return None
        return job.completed_at + self.retention.max_age_s

    def sweep(self, now: float | None = None, reserve: int = 0) -> builtins.list[str]:
        """Apply the retention policy, leaving room for ``reserve`` more bytes; return the ids of the jobs
        it deleted. Only finished jobs go; inputs of jobs still to run count but stay."""
        now = time.time() if now is None else now
        finished = (VideoJobStatus.COMPLETED.value, VideoJobStatus.FAILED.value)
        with self._lock:
            rows = self._db.execute(
                "SELECT id, completed_at, result_bytes + input_bytes AS stored FROM video_jobs "
                "WHERE status IN (?, ?) ORDER BY completed_at, id",
                finished,
            ).fetchall()
            unfinished = self._db.execute(
                "SELECT COALESCE(SUM(input_bytes + result_bytes), 0) FROM video_jobs WHERE status NOT IN (?, ?)",
                finished,
            ).fetchone()[0]
        doomed = [row["id"] for row in rows if (row["completed_at"] or 0) + self.retention.max_age_s <= now]
        remaining = [row for row in rows if row["id"] not in set(doomed)]
        total = unfinished + reserve + sum(row["stored"] for row in remaining)
        for row in remaining:  # oldest first
            if total <= self.retention.max_bytes:
                break
            doomed.append(row["id"])
            total -= row["stored"]
        for job_id in doomed:
            self.delete(job_id)
        if doomed:
            logger.info("retention removed %d finished video job(s)", len(doomed))
        return doomed

    def queued_count(self) -> int:
        with self._lock:
            count: int = self._db.execute(
                "SELECT COUNT(*) FROM video_jobs WHERE status = ?", (VideoJobStatus.QUEUED.value,)
            ).fetchone()[0]
            return count
