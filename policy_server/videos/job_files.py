"""The files of a video job: one folder per job, named after its id, written durably.

Layout under the data directory's ``videos/`` folder::

    <job id>/input_reference.png   the first frame as uploaded (.png, .jpg or .webp), or, sent as pixels,
                                   encoded as a lossless PNG (older stores: .npy)
    <job id>/action.npy            T×D float32
    <job id>/video.mp4             once completed (written atomically by :mod:`.encoding`)

Inputs are kept compact (a 58 KB PNG of a 4096² frame stays 58 KB, not 48 MiB of raw pixels). Paths are
built from job ids only, and only ids that match :data:`JOB_ID_PATTERN` are accepted, so no client input
can name a path.
"""

from __future__ import annotations

import io
import os
import re
import uuid
from pathlib import Path

import numpy as np

from .jobs import VideoJobInputs

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


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` and fsync it; a full disk raises OSError(ENOSPC) here (numpy's writer hid it)."""
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


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
        return np.load(path, allow_pickle=False)
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


def write_folder(staging: Path, final: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into ``staging``, fsync them, and rename the folder to ``final`` (durably)."""
    staging.mkdir()
    for name, data in files.items():
        write_durably(staging / name, data)
    fsync_dir(staging)
    os.replace(staging, final)
    fsync_dir(final.parent)


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
