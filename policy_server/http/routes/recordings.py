"""``/v1/recordings``: the recorded sessions (``--record-dir``), for the dashboard's replay.

Read-only, behind the server's token like every other route (the sidecar's auth layer runs first).
Recordings are found through :class:`~policy_server.recording.RecordingStore` (only names of the
recorder's own pattern become paths, never through a symlink) and read with
:class:`~policy_server.recording.replay.RecordedEpisode`. Reading (Parquet, MP4 decoding) runs on a
helper thread, never on the event loop; frames come in bounded pages.

* ``GET /v1/recordings?offset=I&limit=N``: the published recordings, newest first, a page at a time
  (``total`` and ``next_offset`` say what is left);
* ``GET /v1/recordings/{name}``: one episode's session, rows (seq, arrival time, answer, actions, timing)
  and event log;
* ``GET /v1/recordings/{name}/frames?start=I&count=N``: rows ``I..I+N-1``'s camera frames as JPEGs
  (base64), at most :data:`MAX_FRAMES_PER_PAGE` a page.

Decoding a page (the episode's MP4s, then a JPEG per frame) costs tens of milliseconds of CPU per frame,
which the engine needs: 8 clients paging in a loop moved a robot's p50 from 39 to 967 ms. So pages are
decoded by :class:`ReplayPages`: one thread for the whole server, at a lower CPU priority than the
engine's (ffmpeg, started from it, inherits that), the last :data:`CACHED_PAGES` pages kept (a published
episode never changes), and each client (token, or peer address) held to :data:`PAGES_PER_S` pages a
second beyond a burst (429 ``rate_limited``; cached pages count too: they cost the loop's time).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request

from robot_clients.protocol import ErrorCode

from ...foundation.api_errors import ApiError, HttpErrorCode
from ...foundation.rate_limit import TokenBucket
from ...sessions.telemetry import encode_preview
from ..parts import SidecarParts
from ..turns import client_identity

# Frames of one page: each is a JPEG of at most 320 px a side, ~10-30 KB in base64.
MAX_FRAMES_PER_PAGE = 32
# Recordings one listing page holds by default, and at most.
DEFAULT_RECORDINGS_PER_PAGE = 100
MAX_RECORDINGS_PER_PAGE = 1000
# The largest row index or offset a client may ask for: beyond any episode or listing (a recording at 50 Hz
# for a year has 1.6e9 rows), and within what every reader's index type holds (2^31 - 1).
MAX_INDEX = 2**31 - 1
RECORDINGS_PATH = "/v1/recordings"


def _root(parts: SidecarParts) -> Path:
    recordings = parts.host.recordings
    if recordings is None:
        raise ApiError(HttpErrorCode.NOT_FOUND, "this server records nothing: it was started without --record-dir")
    return recordings.root


def _episode(root: Path, name: str) -> Any:
    from ...recording import InvalidRecordingName, RecordingStore
    from ...recording.replay import RecordedEpisode, RecordingFormatError

    try:
        return RecordedEpisode(RecordingStore(root).path(name))
    except (InvalidRecordingName, FileNotFoundError, RecordingFormatError):
        raise ApiError(HttpErrorCode.NOT_FOUND, f"no recording named {name[:80]!r}", "name") from None


def list_recordings(root: Path, offset: int = 0, limit: int = DEFAULT_RECORDINGS_PER_PAGE) -> dict[str, Any]:
    """Recordings ``offset..offset+limit-1`` of the listing (newest first), the total, and the offset of the
    next page (None on the last)."""
    from ...recording import RecordingStore

    listed = RecordingStore(root).list()
    page = [
        {
            "name": info.name,
            "session": info.session,
            "started_at": info.started_at,
            "bytes": info.num_bytes,
            "published_at": info.published_at,
        }
        for info in listed[offset : offset + limit]
    ]
    following = offset + limit
    return {"recordings": page, "total": len(listed), "next_offset": following if following < len(listed) else None}


def episode_body(root: Path, name: str) -> dict[str, Any]:
    """What the dashboard plays back, except the frames: rows with their actions, timing and arrival times."""
    episode = _episode(root, name)
    rows = []
    for row in episode.rows():
        body = dataclasses.asdict(row)
        body["actions"] = row.actions.tolist() if row.actions is not None else None
        rows.append(body)
    return {
        "name": episode.name,
        "fps": episode.fps,
        "num_frames": episode.num_frames,
        "cameras": list(episode.layout.camera_names.values()),
        "session": episode.session,
        "rows": rows,
        "events": episode.events(),
    }


def frame_page(root: Path, name: str, start: int, count: int) -> dict[str, Any]:
    """Rows ``start..start+count-1``'s camera frames (fewer at the end), as JPEG previews."""
    from ...recording.replay import RecordingFormatError

    episode = _episode(root, name)
    frames = []
    try:
        for cameras in itertools.islice(episode.frames(), start, start + count):
            frames.append(
                {
                    camera: dict(zip(("jpeg_base64", "width", "height"), encode_preview(image)))
                    for camera, image in cameras.items()
                }
            )
    except RecordingFormatError as exc:
        raise ApiError(
            HttpErrorCode.INTERNAL_ERROR, f"the recording's videos cannot be read: {exc}", status=500
        ) from None
    return {"name": name, "start": start, "frames": frames}


# Replay decoding: one thread, this much nicer than the server (the engine's threads), the pages kept,
# and each client's pages per second (and burst). The dashboard fetches a page every few seconds of replay.
REPLAY_NICENESS = 10
CACHED_PAGES = 32
PAGES_PER_S = 4.0
PAGES_BURST = 8
# Clients whose buckets are kept; beyond, the full (idle) ones are forgotten.
MAX_TRACKED_CLIENTS = 1024


def _lower_priority() -> None:
    """On the replay thread: make it (and what it starts: ffmpeg) yield the CPU to the engine."""
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + REPLAY_NICENESS))
    except (AttributeError, OSError):  # not Linux: the one-thread cap and the cache still hold
        pass


class ReplayPages:
    """Frame pages, decoded one at a time on a low-priority thread, cached, rate-limited per client."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="recording-replay", initializer=_lower_priority)
        self._cache: OrderedDict[tuple[str, str, int, int], dict[str, Any]] = OrderedDict()
        self._buckets: dict[str, TokenBucket] = {}
        self.decoded = 0  # pages decoded (not answered from the cache)

    async def page(self, client: str, root: Path, name: str, start: int, count: int) -> dict[str, Any]:
        self._admit(client)
        key = (str(root), name, start, count)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        page = await asyncio.get_running_loop().run_in_executor(self._executor, frame_page, root, name, start, count)
        self.decoded += 1
        self._cache[key] = page
        while len(self._cache) > CACHED_PAGES:
            self._cache.popitem(last=False)
        return page

    def _admit(self, client: str) -> None:
        bucket = self._buckets.get(client)
        if bucket is None:
            if len(self._buckets) >= MAX_TRACKED_CLIENTS:
                for idle in [c for c, b in self._buckets.items() if b.take() and b.take()]:
                    del self._buckets[idle]
            bucket = self._buckets[client] = TokenBucket(PAGES_PER_S, PAGES_BURST)
        if not bucket.take():
            raise ApiError(
                ErrorCode.RATE_LIMITED,
                f"more than {PAGES_PER_S:g} pages of recorded frames a second (burst {PAGES_BURST}) from this "
                "client; replay decoding yields to the robots: retry shortly",
                headers={"Retry-After": "1"},
            )


_REPLAY: ReplayPages | None = None
_REPLAY_LOCK = threading.Lock()


def replay_pages() -> ReplayPages:
    """The process's replay decoder, made on first use: one thread however many sidecars a process runs
    (as the sessions' decode pool), so that replay never takes more than one core's share from engines."""
    global _REPLAY
    with _REPLAY_LOCK:
        if _REPLAY is None:
            _REPLAY = ReplayPages()
        return _REPLAY


def router(parts: SidecarParts) -> APIRouter:
    routes = APIRouter()
    replay = replay_pages()

    @routes.get(RECORDINGS_PATH, tags=["recordings"], summary="Recorded sessions, newest first, a page at a time")
    async def recordings(
        offset: int = Query(0, ge=0, le=MAX_INDEX),
        limit: int = Query(DEFAULT_RECORDINGS_PER_PAGE, ge=1, le=MAX_RECORDINGS_PER_PAGE),
    ) -> dict[str, Any]:
        return await asyncio.to_thread(list_recordings, _root(parts), offset, limit)

    @routes.get(RECORDINGS_PATH + "/{name}", tags=["recordings"], summary="One recorded episode, without frames")
    async def recording(name: str) -> dict[str, Any]:
        return await asyncio.to_thread(episode_body, _root(parts), name)

    @routes.get(RECORDINGS_PATH + "/{name}/frames", tags=["recordings"], summary="A page of an episode's frames")
    async def recording_frames(
        request: Request,
        name: str,
        start: int = Query(0, ge=0, le=MAX_INDEX),
        count: int = Query(MAX_FRAMES_PER_PAGE, ge=1, le=MAX_FRAMES_PER_PAGE),
    ) -> dict[str, Any]:
        return await replay.page(client_identity(request.scope), _root(parts), name, start, count)

    return routes
