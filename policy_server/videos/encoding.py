"""Frames to an MP4 file and back, with the ffmpeg that ships inside the ``imageio-ffmpeg`` wheel.

No system ffmpeg is needed: ``imageio-ffmpeg`` (PyPI) bundles a static binary, and this module drives it
through its ``write_frames`` / ``read_frames`` generators (raw RGB over a pipe, so no frame is ever
re-encoded through an intermediate format).

Output: H.264 (libx264) in an MP4 container, yuv420p (the pixel format every browser and player
decodes), ``+faststart`` (the index at the front, so a player can start before the download ends).
yuv420p needs even sides: an odd height or width is padded by one replicated edge row/column rather
than rescaled, so no pixel the model produced is resampled.

Writes are atomic: the file is written next to its destination under a temporary name, flushed to disk
and renamed, so a reader (or a restarted server) sees either no file or the whole file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cosmos3_runtime.mp4_header import probe_video_header

MP4_MEDIA_TYPE = "video/mp4"
# libx264's constant-quality scale as imageio-ffmpeg maps it (0-10, 10 best): 8 keeps the tiny
# details of robot scenes (gripper fingers, cables) at a modest size.
DEFAULT_QUALITY = 8


class VideoEncodingError(RuntimeError):
    """The frames could not be encoded (or an MP4 could not be read back)."""


@dataclass(frozen=True)
class EncodedVideo:
    path: Path
    num_bytes: int
    frames: int
    width: int
    height: int
    fps: float


def _even_sided(frames: np.ndarray) -> np.ndarray:
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if not (pad_h or pad_w):
        return frames
    return np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")


def encode_mp4(frames: np.ndarray, fps: float, path: str | Path, quality: int = DEFAULT_QUALITY) -> EncodedVideo:
    """Encode ``frames`` (T×H×W×3 uint8 RGB) at ``fps`` into an H.264 MP4 at ``path``, atomically."""
    import imageio_ffmpeg

    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise VideoEncodingError(f"expected T×H×W×3 uint8 frames, got {getattr(frames, 'shape', None)}")
    if frames.shape[0] == 0:
        raise VideoEncodingError("no frames to encode")
    frames = np.ascontiguousarray(_even_sided(frames))
    height, width = frames.shape[1], frames.shape[2]
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    writer = imageio_ffmpeg.write_frames(
        str(partial),
        (width, height),
        fps=float(fps),
        codec="libx264",
        pix_fmt_in="rgb24",
        pix_fmt_out="yuv420p",
        quality=quality,
        macro_block_size=1,  # sides are already even; never let the writer rescale
        ffmpeg_log_level="error",
        # -f mp4: the temporary name has no .mp4 extension for ffmpeg to infer the container from.
        output_params=["-movflags", "+faststart", "-f", "mp4"],
    )
    try:
        writer.send(None)  # start ffmpeg
        for frame in frames:
            writer.send(frame)
        writer.close()
    except Exception as exc:  # noqa: BLE001 - ffmpeg's failures come as assorted exception types
        writer.close()
        partial.unlink(missing_ok=True)
        raise VideoEncodingError(f"ffmpeg failed to encode {frames.shape[0]} frames: {exc}") from exc
    try:
        # imageio-ffmpeg ignores ffmpeg's exit status: a disk that fills up while the trailer is written
        # leaves a truncated file behind without any exception. Never publish one.
        check_mp4_structure(partial)
        with open(partial, "rb+") as handle:
            os.fsync(handle.fileno())
    except (OSError, VideoEncodingError):
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)
    return EncodedVideo(path, path.stat().st_size, int(frames.shape[0]), width, height, float(fps))


def check_mp4_structure(path: str | Path) -> None:
    """Raise :class:`VideoEncodingError` unless ``path`` is a whole MP4: its top-level boxes tile the file
    exactly and include ``ftyp``, ``moov`` and ``mdat`` (a truncated write breaks one or the other)."""
    path = Path(path)
    size = path.stat().st_size
    seen: set[bytes] = set()
    offset = 0
    with open(path, "rb") as handle:
        while offset < size:
            handle.seek(offset)
            header = handle.read(16)
            if len(header) < 8:
                break
            box_size, kind = int.from_bytes(header[:4], "big"), header[4:8]
            if box_size == 1 and len(header) == 16:
                box_size = int.from_bytes(header[8:16], "big")
            elif box_size == 0:
                box_size = size - offset
            if box_size < 8:
                break
            seen.add(kind)
            offset += box_size
    missing = {b"ftyp", b"moov", b"mdat"} - seen
    if offset != size or missing:
        raise VideoEncodingError(
            f"ffmpeg wrote an incomplete MP4 ({size} bytes; boxes end at {offset}; missing "
            f"{sorted(m.decode() for m in missing) or 'none'}): was the disk full?"
        )


def read_mp4(path: str | Path) -> np.ndarray:
    """Decode an MP4 (or any video ffmpeg reads) into T×H×W×3 uint8 RGB frames."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    try:
        meta = reader.__next__()
        width, height = meta["size"]
        frames = [np.frombuffer(chunk, dtype=np.uint8).reshape(height, width, 3) for chunk in reader]
    except Exception as exc:  # noqa: BLE001
        raise VideoEncodingError(f"could not decode the video: {exc}") from exc
    finally:
        reader.close()
    if not frames:
        raise VideoEncodingError("the video has no frames")
    return np.stack(frames)


# The sides in ffmpeg's log line for a video stream: "Stream #0:0: Video: h264 (...), yuv420p, 8192x8192 [SAR ...".
_STREAM_SIDES = re.compile(r"Stream #\S+: Video: [^\n]*?, (\d+)x(\d+)[ ,\[\n]")


def read_video_bytes(
    data: bytes,
    max_frames: int,
    *,
    max_bytes: int | None = None,
    check: Callable[[int | None, int, int], None] | None = None,
    max_pixels: int | None = None,
    workdir: str | Path | None = None,
) -> np.ndarray:
    """Decode an uploaded video held in memory into T×H×W×3 uint8 frames, within bounds.

    Sizes are known before anything is decoded: ``check(frames, height, width)`` is called with what the
    container says (MP4/QuickTime: sample count and sides, read from its boxes), then with the size of
    ffmpeg's output stream (frames unknown: None) before the first frame is read, then with the running
    frame count whenever the frames read would pass ``max_bytes``; it raises to refuse. ffmpeg itself
    is told to decode no frame larger than ``max_pixels`` and no more than ``max_frames + 1`` frames, and
    frames go straight into one preallocated array (no list of frames to stack).

    ffmpeg reads from a file: the bytes go to a temporary file with a name of our own (a client's file
    name is never used as a path), which is removed afterwards.
    """
    import tempfile

    import imageio_ffmpeg

    header = probe_video_header(data)
    if header is not None and check is not None:
        check(header.frames, header.height, header.width)
    input_params = ["-max_pixels", str(int(max_pixels))] if max_pixels else []
    with tempfile.NamedTemporaryFile(prefix="upload-", suffix=".video", dir=workdir) as handle:
        handle.write(data)
        handle.flush()
        reader = imageio_ffmpeg.read_frames(
            handle.name, pix_fmt="rgb24", input_params=input_params, output_params=["-frames:v", str(max_frames + 1)]
        )
        try:
            try:
                meta = reader.__next__()
                width, height = meta["size"]
            except Exception as exc:  # noqa: BLE001 - ffmpeg reports undecodable input in several ways
                # A stream over -max_pixels never gets a decoder, but ffmpeg's log still names its size.
                sides = _STREAM_SIDES.search(str(exc))
                if sides is not None and check is not None:
                    check(None, int(sides.group(2)), int(sides.group(1)))
                raise VideoEncodingError("the upload is not a video ffmpeg can decode") from exc
            if check is not None:
                check(None, height, width)
            frame_bytes = max(1, width * height * 3)
            capacity = max_frames if max_bytes is None else max(1, min(max_frames, max_bytes // frame_bytes))
            clip = np.empty((capacity, height, width, 3), dtype=np.uint8)
            count = 0
            try:
                for chunk in reader:
                    if count == capacity:
                        if capacity < max_frames and check is not None:
                            check(count + 1, height, width)  # over the byte budget: the caller's refusal
                        raise VideoEncodingError(f"the video has more than {max_frames} frames")
                    clip[count] = np.frombuffer(chunk, dtype=np.uint8).reshape(height, width, 3)
                    count += 1
            except VideoEncodingError:
                raise
            except Exception as exc:  # noqa: BLE001 - a frame ffmpeg could not decode (or that broke -max_pixels)
                if count == 0:
                    raise VideoEncodingError("the upload is not a video ffmpeg can decode") from exc
                raise VideoEncodingError(f"the video could not be decoded past frame {count}") from exc
        finally:
            reader.close()
    if count == 0:
        raise VideoEncodingError("the video has no frames")
    return clip[:count]
