"""Files and folders that are either whole or absent: write under a temporary name, flush to disk, rename.

A recording or a video job must survive ``SIGKILL`` and power loss without leaving a file that breaks a
reader. Every file the recorder writes goes through here: the bytes land in ``NAME.tmp`` in the same
directory, are fsynced, and replace ``NAME`` with one ``rename`` (atomic on POSIX); the directory is
fsynced so the rename itself is durable. A crash leaves at worst a stray ``.tmp`` file, which recovery
removes. A video job's inputs are a folder made the same way (:func:`write_folder`).

Appends (the episode's event log) cannot be atomic; :func:`append_line` writes whole lines and readers
ignore a last line without its newline.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

TMP_SUFFIX = ".tmp"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """``with replacing(path) as tmp:`` write ``tmp``; on success it becomes ``path`` (fsynced, renamed),
    on failure it is removed and ``path`` is untouched."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: Path, value: Any) -> None:
    """JSON with LeRobot's formatting (4-space indent, UTF-8 kept as is)."""
    write_bytes(path, json.dumps(value, indent=4, ensure_ascii=False).encode())


def write_folder(staging: Path, final: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into ``staging``, fsync them, and rename the folder to ``final`` (durably). A full
    disk raises OSError(ENOSPC) here."""
    staging.mkdir()
    for name, data in files.items():
        with open(staging / name, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    fsync_dir(staging)
    os.replace(staging, final)
    fsync_dir(final.parent)


def append_line(handle: TextIO, line: str) -> None:
    """Append one whole line (``handle`` opened in text append mode) and push it to the OS."""
    handle.write(line + "\n")
    handle.flush()


def read_lines(path: Path) -> list[str]:
    """The complete lines of an append-only log (a torn last line, from a crash, is left out)."""
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    return [line for line in lines[:-1] if line]


def is_out_of_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is the disk or the quota being full."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
