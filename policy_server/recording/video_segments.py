"""An episode's camera as MP4 segments, joined into the one MP4 per camera LeRobot expects.

While recording, each flush encodes the frames it holds into one segment with
:func:`policy_server.video_encoding.encode_mp4` (H.264, yuv420p, written atomically): memory stays
bounded by one segment, and a crash loses at most the segment being written. When the episode ends, the
segments are joined with ffmpeg's concat demuxer, copying the compressed stream (no re-encoding: every
segment has the same size, frame rate and codec settings). Each segment restarts its timestamps at 0 and
lasts exactly its frame count / fps, so frame *i* of the joined file is presented at *i*/fps, which is
what LeRobot's decoder asks for.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..video_encoding import VideoEncodingError, check_mp4_structure
from .durable_files import TMP_SUFFIX, publish_file


def _concat_entry(path: Path) -> str:
    # ffconcat quoting: inside single quotes, a quote is written '\''.
    return "file '" + str(path.resolve()).replace("'", "'\\''") + "'\n"


def join_segments(parts: list[Path], out: Path) -> None:
    """Write ``parts`` (MP4 segments encoded alike, in order) as one MP4 at ``out``, atomically."""
    import imageio_ffmpeg

    if not parts:
        raise VideoEncodingError("no segments to join")
    tmp = out.with_name(out.name + TMP_SUFFIX)
    if len(parts) == 1:
        shutil.copyfile(parts[0], tmp)
    else:
        listing = out.with_name(out.name + ".segments.txt")
        listing.write_text("ffconcat version 1.0\n" + "".join(_concat_entry(p) for p in parts))
        try:
            result = subprocess.run(
                [imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-y", "-loglevel", "error", "-f", "concat",
                 "-safe", "0", "-i", str(listing), "-c", "copy", "-movflags", "+faststart", "-f", "mp4", str(tmp)],
                capture_output=True, text=True, timeout=600,
            )
        finally:
            listing.unlink(missing_ok=True)
        if result.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise VideoEncodingError(f"ffmpeg could not join {len(parts)} segments: {result.stderr.strip()[-500:]}")
    try:
        check_mp4_structure(tmp)
        publish_file(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
