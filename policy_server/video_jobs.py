"""Where ``forward_dynamics`` video jobs live: a SQLite table plus one folder of files per job.

A job is accepted only once it is durable: its inputs (the first frame and the raw actions, as ``.npy``
files) are written and fsynced into a folder named after the job id, then its row is committed with
SQLite's ``synchronous=FULL``. After that, killing the server at any moment (SIGKILL included) loses
nothing: on the next start :meth:`VideoJobStore.recover` puts every job that was running back in the
queue, and queued jobs simply wait their turn.

Layout under the data directory::

    video_jobs.sqlite3           the job table (WAL mode)
    videos/<job id>/input_reference.npy   H×W×3 uint8
    videos/<job id>/action.npy            T×D float32
    videos/<job id>/video.mp4             once completed (written atomically by video_encoding)

Job states::

    queued ──claim──► in_progress ──► completed
       ▲                  │     └───► failed     (the model refused or failed the request)
       └──── recover ─────┘                       (the server died while it ran)

A job that was interrupted :data:`MAX_ATTEMPTS` times fails with ``interrupted`` instead of running
again, so one job that kills the process (out of memory, say) cannot crash-loop the server.

Retention (:class:`RetentionPolicy`): finished jobs (completed or failed) are deleted, row and files,
once older than ``max_age_s``, and the oldest finished ones go first whenever their results take more
than ``max_bytes`` on disk. Queued and running jobs are never deleted by retention; ``max_queued`` bounds
how many may wait.

Paths are built from job ids only, and only ids that match :data:`JOB_ID_PATTERN` are accepted, so no
client input can name a path. The store is thread-safe (one connection behind a lock); the sidecar calls
it through ``asyncio.to_thread`` so disk waits never stall the event loop.
"""

from __future__ import annotations

import enum
import json
import logging
import os
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

logger = logging.getLogger(__name__)

JOB_ID_PREFIX = "video_"
JOB_ID_PATTERN = re.compile(r"^video_[0-9a-f]{32}$")
DATABASE_NAME = "video_jobs.sqlite3"
JOBS_DIRNAME = "videos"
IMAGE_FILE = "input_reference.npy"
ACTION_FILE = "action.npy"
VIDEO_FILE = "video.mp4"
# A job interrupted this many times (the server died while running it) fails instead of running again.
MAX_ATTEMPTS = 3
SCHEMA_VERSION = 1


class VideoJobStatus(str, enum.Enum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


FINISHED = (VideoJobStatus.COMPLETED, VideoJobStatus.FAILED)


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished jobs are kept and how much disk their results may take."""

    max_age_s: float = 24 * 3600.0
    max_bytes: int = 2 * 2**30
    max_queued: int = 100


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


@dataclass
class VideoJobInputs:
    """The arrays a job needs besides its params (kept in files, not in the table)."""

    image: np.ndarray
    action: np.ndarray


class JobNotFound(KeyError):
    """No job with that id (or the id is not one this store could have made)."""



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
    timing TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS video_jobs_status_created ON video_jobs (status, created_at);
"""


def new_job_id() -> str:
    return JOB_ID_PREFIX + uuid.uuid4().hex


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as handle:
        np.save(handle, array, allow_pickle=False)
        handle.flush()
        os.fsync(handle.fileno())


class VideoJobStore:
    """SQLite-backed, crash-safe store of video jobs and their files under ``data_dir``."""

    def __init__(self, data_dir: str | Path, retention: RetentionPolicy | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.jobs_dir = self.data_dir / JOBS_DIRNAME
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.retention = retention or RetentionPolicy()
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.data_dir / DATABASE_NAME, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed job survives power loss too, not only a killed process. One fsync per
            # state change is nothing next to a video job.
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise RuntimeError(
                    f"{self.data_dir / DATABASE_NAME} has schema version {version}; this server knows {SCHEMA_VERSION}"
                )
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

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
        """Persist a new queued job: files first (fsynced), then the row. Returns it once durable."""
        job = VideoJob(id=new_job_id(), status=VideoJobStatus.QUEUED, created_at=time.time(), params=params)
        final = self.job_dir(job.id)
        staging = self.jobs_dir / f".staging-{job.id}"
        staging.mkdir()
        try:
            _save_npy(staging / IMAGE_FILE, np.ascontiguousarray(inputs.image, dtype=np.uint8))
            _save_npy(staging / ACTION_FILE, np.ascontiguousarray(inputs.action, dtype=np.float32))
            _fsync_dir(staging)
            os.replace(staging, final)
            _fsync_dir(self.jobs_dir)
            with self._lock:
                self._db.execute(
                    "INSERT INTO video_jobs (id, status, created_at, params) VALUES (?, ?, ?, ?)",
                    (job.id, job.status.value, job.created_at, json.dumps(params)),
                )
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(final, ignore_errors=True)
            raise
        return job

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
        folder = self.job_dir(job_id)
        return VideoJobInputs(
            image=np.load(folder / IMAGE_FILE, allow_pickle=False),
            action=np.load(folder / ACTION_FILE, allow_pickle=False),
        )

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
                        "UPDATE video_jobs SET status = ?, completed_at = ?, error_code = ?, error_message = ? "
                        "WHERE id = ?",
                        (VideoJobStatus.FAILED.value, time.time(), "interrupted",
                         f"the server stopped while running this job {job.attempts} times; it will not run again",
                         job.id),
                    )
                    continue
                job.status, job.started_at, job.attempts, job.progress = (
                    VideoJobStatus.IN_PROGRESS, time.time(), job.attempts + 1, 0,
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

    def complete(self, job_id: str, *, result_bytes: int, frames: int, width: int, height: int,
                 timing: dict[str, float]) -> bool:
        """Record a finished video (already at :meth:`video_path`). False if the job was deleted meanwhile."""
        return self._update(
            job_id, status=VideoJobStatus.COMPLETED, progress=100, completed_at=time.time(),
            result_bytes=result_bytes, result_frames=frames, width=width, height=height, timing=timing,
        )

    def fail(self, job_id: str, code: str, message: str, field: str | None = None) -> bool:
        return self._update(
            job_id, status=VideoJobStatus.FAILED, completed_at=time.time(),
            error_code=code, error_message=message, error_field=field,
        )

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
            if status == VideoJobStatus.QUEUED.value and not (
                (folder / IMAGE_FILE).is_file() and (folder / ACTION_FILE).is_file()
            ):
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
            logger.info("video jobs recovered: %d re-queued, %d failed (inputs lost), %d stray folder(s) removed",
                        requeued, failed, strays)
        return {"requeued": requeued, "failed": failed, "strays": strays}

    def expires_at(self, job: VideoJob) -> float | None:
        if job.status not in FINISHED or job.completed_at is None:
            return None
        return job.completed_at + self.retention.max_age_s

    def sweep(self, now: float | None = None) -> list[str]:
        """Apply the retention policy; return the ids of the jobs it deleted."""
        now = time.time() if now is None else now
        finished = (VideoJobStatus.COMPLETED.value, VideoJobStatus.FAILED.value)
        with self._lock:
            rows = self._db.execute(
                "SELECT id, completed_at, result_bytes FROM video_jobs WHERE status IN (?, ?) "
                "ORDER BY completed_at, id",
                finished,
            ).fetchall()
        doomed = [row["id"] for row in rows if (row["completed_at"] or 0) + self.retention.max_age_s <= now]
        remaining = [row for row in rows if row["id"] not in set(doomed)]
        total = sum(row["result_bytes"] for row in remaining)
        for row in remaining:  # oldest first
            if total <= self.retention.max_bytes:
                break
            doomed.append(row["id"])
            total -= row["result_bytes"]
        for job_id in doomed:
            self.delete(job_id)
        if doomed:
            logger.info("retention removed %d finished video job(s)", len(doomed))
        return doomed

    def queued_count(self) -> int:
        with self._lock:
            return self._db.execute(
                "SELECT COUNT(*) FROM video_jobs WHERE status = ?", (VideoJobStatus.QUEUED.value,)
            ).fetchone()[0]
