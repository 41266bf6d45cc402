"""A session's encoded camera frames, decoded off the event loop, one observation at a time.

An observation may carry its cameras as PNG, JPEG or WebP bytes (``docs/protocol.md``, ``docs/openpi.md``).
Decoding a 480×640 JPEG costs a few milliseconds of CPU, which the event loop serving every session must
not spend, so a session hands such an observation to its :class:`DecodeSlot`:

1. every header is read and checked as the frame arrives, by the one media check every protocol uses
   (:mod:`policy_server.media.media_check`: sides, clip lengths, the composed frame and the bytes it all
   decodes to; microseconds): a decompression bomb, a corrupt or unsupported payload is
   ``invalid_image``, a clip of frames too large together ``payload_too_large``, before any pixel exists;
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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from robot_clients.protocol import CodedError, DropReason, FrameLimits, ProtocolError

from ..media.image_decoding import ImageDecodePool, InvalidImage, decode_clip, decode_image
from ..media.media_check import DecodedTooLarge, check_media
from .openpi_observation import OpenpiObservation, compose_cameras

logger = logging.getLogger(__name__)

__all__ = [
    "DecodeSlot",
    "check_cameras",
    "decode_pool",
    "decoded_frame",
    "decoded_image",
    "native_decode",
    "openpi_decode",
]

# How often a held decode checks whether its session may decode again (see DecodeSlot's hold).
HOLD_RECHECK_S = 0.01

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


def _protocol_error(error: CodedError, seq: int | None) -> ProtocolError:
    return ProtocolError(error.code, error.message, error.field, seq)


def check_cameras(
    cameras: list[tuple[str, Any]], limits: FrameLimits, seq: int | None, *, side_by_side: bool, fit_side: int | None
) -> None:
    """The one media check (:func:`policy_server.media.media_check.check_media`: headers, clip lengths,
    the composed frame, the decoded bytes) as this protocol's error. Cheap enough for the event loop."""
    try:
        check_media(cameras, limits, side_by_side=side_by_side, fit_side=fit_side)
    except (InvalidImage, DecodedTooLarge) as error:
        raise _protocol_error(error, seq) from None


def decoded_image(value: Any, field: str, limits: FrameLimits, seq: int | None, fit_side: int | None = None) -> Any:
    """An encoded frame (bytes) or clip (list of bytes) as uint8 pixels; anything else as it is."""
    try:
        if isinstance(value, bytes):
            return decode_image(value, field, limits, fit_side)
        if isinstance(value, list):
            return decode_clip(value, field, limits, fit_side)
    except InvalidImage as error:
        raise _protocol_error(error, seq) from None
    return value


def decoded_frame(frame: Any, limits: FrameLimits, fit_side: int | None = None) -> Any:
    """A native :class:`~robot_clients.client_frames.ObservationFrame` with every camera decoded (in place)."""
    frame.image = decoded_image(frame.image, "image", limits, frame.seq, fit_side)
    frame.video = decoded_image(frame.video, "video", limits, frame.seq, fit_side)
    if frame.images is not None:
        frame.images = {
            name: decoded_image(image, f"images/{name}", limits, frame.seq, fit_side)
            for name, image in frame.images.items()
        }
    return frame


def native_decode(
    frame: Any, limits: FrameLimits, *, side_by_side: bool = False, fit_side: int | None = None
) -> Callable[[], Any] | None:
    """Check a native observation's cameras now (before anything is decoded); the decoding to run on the
    pool (None: every camera is an array already). ``side_by_side``: its named images are composed
    (``concat_view``); ``fit_side``: the canvas side its JPEGs may decode down to."""
    cameras = [("image", frame.image), ("video", frame.video)]
    cameras.extend((f"images/{name}", image) for name, image in (frame.images or {}).items())
    check_cameras(cameras, limits, frame.seq, side_by_side=side_by_side, fit_side=fit_side)
    if not any(isinstance(value, (bytes, list)) for _, value in cameras):
        return None
    return lambda: decoded_frame(frame, limits, fit_side)


def openpi_decode(
    obs: OpenpiObservation, video: bool, limits: FrameLimits, seq: int, fit_side: int | None = None
) -> Callable[[], Any] | None:
    """Check an openpi observation's chosen cameras now (composed side by side, before anything is
    decoded); the decoding (then the composition) to run on the pool (None: composed already)."""
    if obs.encoded is None:
        return None
    encoded = obs.encoded
    check_cameras(list(zip(obs.cameras, encoded)), limits, seq, side_by_side=True, fit_side=fit_side)

    def decode() -> OpenpiObservation:
        frames = [decoded_image(value, key, limits, seq, fit_side) for key, value in zip(obs.cameras, encoded)]
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

    def __init__(
        self,
        guard: Callable[..., None],
        drop: Callable[[int, str], None],
        hold: Callable[[], bool] = lambda: False,
    ) -> None:
        self._guard = guard
        self._drop = drop
        # True while the session owes the queue turns and its last observation still waits there: the
        # next one is decoded only once that one is taken (decoding it now would be replaced unserved).
        self._hold = hold
        self._held = False  # a recheck of the hold is scheduled
        self._closed = False
        self._decoding: _Pending | None = None
        self._waiting: _Pending | None = None
        self._task: asyncio.Task[None] | None = None
        self.decoded = 0
        self._cpu_s = 0.0  # CPU seconds decoding took since take_cpu_s() was last called

    def take_cpu_s(self) -> float:
        """CPU seconds spent decoding since the last call (what the session's next queued observation is
        charged for in the queue, replaced decodes included), and start counting again."""
        spent, self._cpu_s = self._cpu_s, 0.0
        return spent

    @property
    def busy(self) -> bool:
        return self._decoding is not None or self._waiting is not None

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
        if self._decoding is None and self._waiting is None:
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
        self._closed = True
        self.cancel(None)
        if self._task is not None:
            self._task.cancel()

    def _start(self, pending: _Pending) -> None:
        if pending.prepare is not None and self._hold():
            self._waiting = pending  # newer submissions replace it meanwhile (latest wins)
            if not self._held:
                self._held = True
                asyncio.get_running_loop().call_later(HOLD_RECHECK_S, self._recheck)
            return
        self._decoding = pending
        if pending.prepare is None:
            self._finish(pending)
            return
        self._task = asyncio.get_running_loop().create_task(self._decode(pending), name=f"decode-{pending.seq}")

    async def _decode(self, pending: _Pending) -> None:
        try:
            pending.value, cpu_s = await decode_pool().run(_timed, pending.prepare)
            self._cpu_s += cpu_s
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
        if not self._held:
            self._start_waiting()

    def _recheck(self) -> None:
        self._held = False
        if not self._closed and self._decoding is None:
            self._start_waiting()

    def _start_waiting(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            self._start(waiting)


def _raise(error: BaseException) -> None:
    raise error


def _timed(prepare: Callable[[], Any]) -> tuple[Any, float]:
    """``prepare()`` and the CPU seconds it took on this thread (waiting for the pool is not counted)."""
    started = time.thread_time()
    return prepare(), time.thread_time() - started
