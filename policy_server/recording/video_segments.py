"""An episode's camera as MP4 segments, joined into the one MP4 per camera LeRobot expects.

While recording, each flush encodes the frames it holds into one segment with
:func:`policy_server.videos.encoding.encode_mp4` (H.264, yuv420p, written atomically): memory stays
bounded by one segment, and a crash loses at most the segment being written. When the episode ends, the
segments are joined with ffmpeg's concat demuxer, copying the compressed stream (no re-encoding: every
segment has the same size, frame rate and codec settings). Each segment restarts its timestamps at 0 and
lasts exactly its frame count / fps, so frame *i* of the joined file is presented at *i*/fps, which is
what LeRobot's decoder asks for.

Decode timestamps must also follow one another, the same way in every segment. libx264 (as the
bundled ffmpeg drives it) reorders frames for B-frames from 3 frames on, which starts a segment's decode
times two frames before its presentation times; a 1- or 2-frame segment has no such shift. Joined, the
two kinds overlap in decode order or leave a gap, and ffmpeg then rewrites timestamps: the file's average
frame rate is off (LeRobot computes frame indices from it) and players repeat or skip frames. So every
segment has at least :data:`MIN_SEGMENT_FRAMES` frames: the recorder flushes no fewer, and an episode
that ends on fewer repeats its last frame to fill its last segment. Those repeats lie after the
episode's ``to_timestamp``, where no reader looks.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..videos.encoding import VideoEncodingError, check_mp4_structure
from . import durable_files

MIN_SEGMENT_FRAMES = 3


def _concat_entry(path: Path) -> str:
    # ffconcat quoting: inside single quotes, a quote is written '\''.
    return "file '" + str(path.resolve()).replace("'", "'\\''") + "'\n"


def join_segments(segments: list[tuple[Path, int]], out: Path) -> None:
    """Write ``segments`` (MP4 files encoded alike, in order, with their frame counts) as one MP4 at
    ``out``, atomically."""
    import imageio_ffmpeg

    if not segments:
        raise VideoEncodingError("no segments to join")
    if any(frames < MIN_SEGMENT_FRAMES for _, frames in segments):
        raise VideoEncodingError(f"every segment needs at least {MIN_SEGMENT_FRAMES} frames to be joined")
    parts = [path for path, _ in segments]
    with durable_files.replacing(out) as tmp:
        if len(parts) == 1:
            shutil.copyfile(parts[0], tmp)
        else:
            listing = out.with_name(out.name + ".segments.txt")
            listing.write_text("ffconcat version 1.0\n" + "".join(_concat_entry(p) for p in parts))
            try:
                result = subprocess.run(
                    [
                        imageio_ffmpeg.get_ffmpeg_exe(),
                        "-nostdin",
                        "-y",
                        "-loglevel",
                        "error",
                        "-f",
                        "concat",
                        "-safe",
                        "0",
                        "-i",
                        str(listing),
                        "-c",
                        "copy",
                        "-movflags",
                        "+faststart",
                        "-f",
                        "mp4",
                        str(tmp),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
            finally:
                listing.unlink(missing_ok=True)
            if result.returncode != 0:
                raise VideoEncodingError(f"ffmpeg could not join {len(parts)} segments: {result.stderr.strip()[-500:]}")
        check_mp4_structure(tmp)
