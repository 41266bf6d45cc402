"""A session's encoded camera frames, decoded off the event loop, one observation at a time.

An observation may carry its cameras as PNG, JPEG or WebP bytes (``docs/protocol.md``, ``docs/openpi.md``).
Decoding a 480×640 JPEG costs a few milliseconds of CPU, which the event loop serving every session must
not spend, so a session hands such an observation to its :class:`DecodeSlot`:

1. every header is read and checked against the frame limits as the frame arrives (microseconds; a
   decompression bomb, a corrupt or unsupported payload is ``invalid_image`` before any pixel exists);
2. the pixels are decoded on the server's small decode pool (:func:`decode_pool`, 2 threads);
3. back on the event loop the session admits the decoded observation exactly as a raw one (rate, seq,
   queue).

One observation per session is decoding at a time and at most one waits behind it: a newer observation
replaces the waiting one, which is answered ``dropped`` (``superseded``), as in the request queue (latest
wins). While the slot is busy a raw observation waits in it too, so a session's observations reach the
queue in the order they were sent.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from robot_clients.protocol import DropReason, ErrorCode, FrameLimits, ProtocolError

from ..media.image_decoding import ImageDecodePool, InvalidImage, decode_clip, decode_image, read_header
from .openpi_observation import OpenpiObservation, compose_cameras

logger = logging.getLogger(__name__)

__all__ = [
    "DecodeSlot",
    "check_encoded",
    "decode_pool",
    "decoded_frame",
    "decoded_image",
    "native_decode",
    "openpi_decode",
]

_POOL: ImageDecodePool | None = None
_POOL_LOCK = threading.Lock()


def decode_pool() -> ImageDecodePool:
    """The process's decode pool (2 threads), made on first use: a server whose robots send raw frames
    starts no decode thread."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ImageDecodePool(workers=2)
        return _POOL


def _protocol_error(error: InvalidImage, seq: int | None) -> ProtocolError:
    return ProtocolError(error.code, error.message, error.field, seq)


def check_encoded(value: Any, field: str, limits: FrameLimits, seq: int | None) -> None:
    """Read the header of an encoded frame (bytes) or of each frame of an encoded clip (a list) and check
    it against ``limits``; arrays pass. Cheap enough for the event loop."""
    frames = [value] if isinstance(value, bytes) else value if isinstance(value, list) else []
    if isinstance(value, list) and not 1 <= len(value) <= limits.max_clip_frames:
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{field}` has {len(value)} frames; between 1 and {limits.max_clip_frames} are allowed",
            field,
            seq,
        )
    try:
        for index, frame in enumerate(frames):
            read_header(frame, field if isinstance(value, bytes) else f"{field}/{index}", limits)
    except InvalidImage as error:
        raise _protocol_error(error, seq) from None


def decoded_image(value: Any, field: str, limits: FrameLimits, seq: int | None) -> Any:
    """An encoded frame (bytes) or clip (list of bytes) as uint8 pixels; anything else as it is."""
    try:
        if isinstance(value, bytes):
            return decode_image(value, field, limits)
        if isinstance(value, list):
            return decode_clip(value, field, limits)
    except InvalidImage as error:
        raise _protocol_error(error, seq) from None
    return value


def decoded_frame(frame: Any, limits: FrameLimits) -> Any:
    """A native :class:`~robot_clients.client_frames.ObservationFrame` with every camera decoded (in place)."""
    frame.image = decoded_image(frame.image, "image", limits, frame.seq)
    frame.video = decoded_image(frame.video, "video", limits, frame.seq)
    if frame.images is not None:
        frame.images = {
            name: decoded_image(image, f"images/{name}", limits, frame.seq) for name, image in frame.images.items()
        }
    return frame


def native_decode(frame: Any, limits: FrameLimits) -> Callable[[], Any] | None:
    """Check the headers of a native observation's encoded cameras now; the decoding to run on the pool
    (None: every camera is an array already)."""
    cameras = {"image": frame.image, "video": frame.video}
    cameras.update({f"images/{name}": image for name, image in (frame.images or {}).items()})
    encoded = {name: value for name, value in cameras.items() if isinstance(value, (bytes, list))}
    for name, value in encoded.items():
        check_encoded(value, name, limits, frame.seq)
    return (lambda: decoded_frame(frame, limits)) if encoded else None


def openpi_decode(obs: OpenpiObservation, video: bool, limits: FrameLimits, seq: int) -> Callable[[], Any] | None:
    """Check the headers of an openpi observation's encoded cameras now; the decoding (then the cameras'
    composition) to run on the pool (None: its image or clip is composed already)."""
    if obs.encoded is None:
        return None
    encoded = obs.encoded
    for key, value in zip(obs.cameras, encoded):
        check_encoded(value, key, limits, seq)

    def decode() -> OpenpiObservation:
        frames = [decoded_image(value, key, limits, seq) for key, value in zip(obs.cameras, encoded)]
        compose_cameras(obs, frames, video, limits)
        obs.encoded = None
        return obs

    return decode


@dataclass
class _Pending:
    seq: int
    received_at: float
    prepare: Callable[[], Any] | None  # run on the pool; None: a raw observation waiting its turn
    admit: Callable[[Any, float], None]  # on the event loop, with what prepare returned
    value: Any = None
    cancelled: bool = field(default=False)


class DecodeSlot:
    """One session's observations between their arrival and the request queue (see the module docstring).

    ``guard(seq, function, *args)`` runs an admission on the event loop the way the session handles a
    frame (a :class:`ProtocolError` becomes an error reply naming the seq); ``drop(seq, reason)`` answers a
    replaced observation.
    """

    def __init__(self, guard: Callable[..., None], drop: Callable[[int, str], None]) -> None:
        self._guard = guard
        self._drop = drop
        self._decoding: _Pending | None = None
        self._waiting: _Pending | None = None
        self._task: asyncio.Task[None] | None = None
        self.decoded = 0

    @property
    def busy(self) -> bool:
        return self._decoding is not None

    def submit(
        self,
        seq: int,
        received_at: float,
        prepare: Callable[[], Any] | None,
        value: Any,
        admit: Callable[[Any, float], None],
    ) -> None:
        """Admit ``prepare()`` (or ``value`` when there is nothing to decode) once it is this observation's
        turn; a newer submission replaces one still waiting, which is dropped ``superseded``."""
        pending = _Pending(seq, received_at, prepare, admit, value)
        if self._decoding is None:
            self._start(pending)
            return
        replaced, self._waiting = self._waiting, pending
        if replaced is not None:
            self._drop(replaced.seq, DropReason.SUPERSEDED)

    def cancel(self, seq: int | None) -> list[int]:
        """Forget ``seq`` (None: everything) here; the seqs forgotten, for the caller to answer."""
        forgotten = []
        for pending in (self._decoding, self._waiting):
            if pending is not None and not pending.cancelled and (seq is None or pending.seq == seq):
                pending.cancelled = True
                forgotten.append(pending.seq)
        if self._waiting is not None and self._waiting.cancelled:
            self._waiting = None
        return forgotten

    def close(self) -> None:
        self.cancel(None)
        if self._task is not None:
            self._task.cancel()

    def _start(self, pending: _Pending) -> None:
        self._decoding = pending
        if pending.prepare is None:
            self._finish(pending)
            return
        self._task = asyncio.get_running_loop().create_task(self._decode(pending), name=f"decode-{pending.seq}")

    async def _decode(self, pending: _Pending) -> None:
        try:
            pending.value = await decode_pool().run(pending.prepare)  # type: ignore[no-untyped-call]
        except ProtocolError as error:
            if not pending.cancelled:
                self._guard(pending.seq, _raise, error)
            self._next()
            return
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - a decoder bug answers this seq and the session goes on
            if not pending.cancelled:
                self._guard(pending.seq, _raise, error)
            self._next()
            return
        self.decoded += 1
        self._finish(pending)

    def _finish(self, pending: _Pending) -> None:
        if not pending.cancelled:
            self._guard(pending.seq, pending.admit, pending.value, pending.received_at)
        self._next()

    def _next(self) -> None:
        self._decoding, self._task = None, None
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            self._start(waiting)


def _raise(error: BaseException) -> None:
    raise error
