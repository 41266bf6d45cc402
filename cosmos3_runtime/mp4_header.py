"""What an MP4 (ISO BMFF) file says about its video track, read from its boxes alone: no decoding, no ffmpeg.

The server's media check reads it from an upload (``policy_server/videos/encoding.py``), the training
dataset reader from a dataset's MP4 files (``lerobot_dataset.py``), so that frames are bounded before any
is decoded. ``data`` may be ``bytes`` or an ``mmap`` of a file (only the boxes walked are paged in).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MP4Bytes = bytes | mmap.mmap


@dataclass(frozen=True)
class VideoHeader:
    """What a container says about its video track, read without decoding: sides and sample count."""

    width: int
    height: int
    frames: int | None


def _boxes(data: MP4Bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, content start, content end) of the ISO BMFF boxes between ``start`` and ``end``; stops at the
    first box whose size does not fit."""
    offset = start
    while offset + 8 <= end:
        size, kind = int.from_bytes(data[offset : offset + 4], "big"), data[offset + 4 : offset + 8]
        header = 8
        if size == 1 and offset + 16 <= end:
            size, header = int.from_bytes(data[offset + 8 : offset + 16], "big"), 16
        elif size == 0:
            size = end - offset
        if size < header or offset + size > end:
            return
        yield kind, offset + header, offset + size
        offset += size


def _track_header(data: MP4Bytes, start: int, end: int) -> VideoHeader | None:
    """One ``trak`` box: its media handler, its first sample entry's sides and its sample count."""
    found: dict[str, Any] = {}

    def walk(begin: int, stop: int, depth: int) -> None:
        for kind, inner, inner_end in _boxes(data, begin, stop):
            if kind in (b"mdia", b"minf", b"stbl") and depth < 3:
                walk(inner, inner_end, depth + 1)
            elif kind == b"hdlr" and depth == 1 and inner_end - inner >= 12:  # mdia's: the track's media type
                found["handler"] = data[inner + 8 : inner + 12]
            elif kind == b"stsd" and inner_end - inner >= 8 + 36:
                # full box (4) + entry count (4), then the first entry: size, format, 6 reserved bytes, data
                # reference index, 16 bytes of visual-entry fields, then width and height (16 bits each).
                entry = inner + 8
                found["sides"] = (
                    int.from_bytes(data[entry + 32 : entry + 34], "big"),
                    int.from_bytes(data[entry + 34 : entry + 36], "big"),
                )
            elif kind in (b"stsz", b"stz2") and inner_end - inner >= 12:
                found["frames"] = int.from_bytes(data[inner + 8 : inner + 12], "big")

    walk(start, end, 0)
    if found.get("handler") != b"vide" or "sides" not in found:
        return None
    width, height = found["sides"]
    return VideoHeader(width=width, height=height, frames=found.get("frames"))


def probe_video_header(data: MP4Bytes) -> VideoHeader | None:
    """The largest video track of an MP4/QuickTime file, from its boxes alone (no decoding, no ffmpeg).

    None if the bytes are not ISO BMFF or carry no video sample table (Matroska/WebM, say): then only
    ffmpeg's stream header says how big the frames are.
    """
    if data[4:8] not in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip"):
        return None
    tracks = [
        track
        for kind, begin, stop in _boxes(data, 0, len(data))
        if kind == b"moov"
        for inner_kind, inner, inner_end in _boxes(data, begin, stop)
        if inner_kind == b"trak"
        for track in [_track_header(data, inner, inner_end)]
        if track is not None
    ]
    if not tracks:
        return None
    widest = max(tracks, key=lambda track: track.width * track.height)
    counts = [track.frames for track in tracks if track.frames is not None]
    return VideoHeader(widest.width, widest.height, max(counts) if counts else None)
