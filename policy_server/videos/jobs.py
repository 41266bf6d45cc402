"""What a ``forward_dynamics`` video job is: its states, its row, its inputs, and the store's errors.

Job states::

    queued ──claim──► in_progress ──► completed
       ▲                  │     └───► failed     (the model refused or failed the request)
       └──── recover ─────┘                       (the server died while it ran)

A job that was interrupted :data:`MAX_ATTEMPTS` times fails with ``interrupted`` instead of running
again, so one job that kills the process (out of memory, say) cannot crash-loop the server.
:mod:`.job_store` keeps jobs; :mod:`.job_files` their files.
"""

from __future__ import annotations

import enum
import errno
import sqlite3
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A job interrupted this many times (the server died while running it) fails instead of running again.
MAX_ATTEMPTS = 3


class VideoJobStatus(str, enum.Enum):
    """Where a job stands; each value (the member's name in lower case) is what the store and the API say."""

    # enum.StrEnum does this from Python 3.11; the package supports 3.10.
    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list) -> str:
        return name.lower()

    def __str__(self) -> str:
        return self.value

    QUEUED = enum.auto()
    IN_PROGRESS = enum.auto()
    COMPLETED = enum.auto()
    FAILED = enum.auto()


FINISHED = (VideoJobStatus.COMPLETED, VideoJobStatus.FAILED)


@dataclass(frozen=True)
class RetentionPolicy:
    """How long finished jobs are kept and how much disk their results may take."""

    max_age_s: float = 24 * 3600.0
    max_bytes: int = 2 * 2**30  # inputs of jobs still to run plus finished results
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
