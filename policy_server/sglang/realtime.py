"""SGLang's lock-step WebSocket mode on ``/v1/actions/realtime``, as a sans-I/O session.

One path serves two protocols. Every connection is first sent one metadata frame that carries both our
``metadata`` frame and SGLang's keys (:func:`policy_server.sglang.metadata.merge_metadata`), because an
SGLang client reads the metadata before it sends anything. The client's first frame then decides
(:func:`connection_mode`):

* a map with ``type``: our native protocol v1, unchanged (a frame without ``type`` that is not SGLang's
  envelope still gets ``unknown_type`` there);
* a map without ``type`` that is SGLang's envelope (``input``, ``parameters``, ...): SGLang's lock-step
  mode for the rest of the connection.

In lock-step mode each binary msgpack frame is one request envelope and gets one reply envelope
(``output_format`` defaults to ``numpy``, as in SGLang) with
``server_timing: {"infer_ms", "prev_total_ms"}``: the time to answer this request, and the previous
request's whole round, from when the server began waiting for it until its reply was sent (absent on
the first). A wrong frame gets ``{"error": {"code", "message", "field"}}`` and the connection stays
open: SGLang sends a traceback and closes.

:class:`LockstepSession` holds the mode's state; the caller does the I/O and tells it the time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.requests import ActionResult
from robot_clients.protocol import ErrorCode
from robot_clients.wire_codec import WireFormatError, packb, unpackb

from ..http.errors import ApiError
from .actions import ActionCall, build_reply, is_sglang_envelope, parse_action_envelope

NATIVE = "native"
SGLANG = "sglang"


def connection_mode(first_frame: Any) -> str:
    """:data:`SGLANG` if a connection's first decoded frame is SGLang's envelope without ``type``."""
    if isinstance(first_frame, dict) and "type" not in first_frame and is_sglang_envelope(first_frame):
        return SGLANG
    return NATIVE


class LockstepSession:
    """The state of one lock-step connection: frames in, replies and errors out, no I/O.

    Use: ``call = session.receive(frame, now)`` (raises :class:`ApiError`), build the engine requests
    from ``call.items``, then send ``session.reply(...)`` or ``session.error(exc)`` and call
    ``session.sent(now)`` once the frame is out. One request at a time: the caller reads the next frame
    only after answering this one, as SGLang does.
    """

    def __init__(self, description: ModelDescription, *, max_items: int, started_at: float) -> None:
        self._description = description
        self._max_items = max_items
        self._waiting_since = started_at
        self._prev_total_ms: float | None = None
        self._answered = False

    def receive(self, frame: bytes | bytearray | memoryview | str | dict[str, Any], now: float) -> ActionCall:
        """Check one client frame (raw bytes, or the first frame already decoded) into an :class:`ActionCall`."""
        if isinstance(frame, str):
            raise ApiError(ErrorCode.BAD_FRAME, "SGLang's lock-step mode takes binary msgpack frames, got a text frame")
        if isinstance(frame, (bytes, bytearray, memoryview)):
            try:
                frame = unpackb(frame)
            except WireFormatError as exc:
                raise ApiError(
                    ErrorCode.BAD_FRAME, f"the frame is not valid msgpack: {exc.message}", exc.field
                ) from None
        if not isinstance(frame, dict):
            raise ApiError(ErrorCode.BAD_FRAME, f"a frame must be a msgpack map, got {type(frame).__name__}")
        if "type" in frame:
            raise ApiError(
                ErrorCode.INVALID_FIELD,
                "this connection speaks SGLang's lock-step protocol (its first "
                "frame had no `type`); send protocol v1 frames on a new connection",
                "type",
            )
        return parse_action_envelope(frame, self._description, max_items=self._max_items, msgpack_reply=True)

    def reply(
        self,
        call: ActionCall,
        chunks: Sequence[ActionResult],
        *,
        infer_ms: float,
        model: str | None,
        prefix_cache_hit: bool | None = None,
    ) -> bytes:
        """The reply frame for ``call``: SGLang's envelope (or raw form) with ``server_timing``."""
        body = build_reply(call, chunks, model=model, prefix_cache_hit=prefix_cache_hit)
        timing = {"infer_ms": float(infer_ms)}
        if self._prev_total_ms is not None:
            timing["prev_total_ms"] = self._prev_total_ms
        body["server_timing"] = timing
        self._answered = True
        return packb(body)

    def error(self, error: ApiError) -> bytes:
        """The error frame: our one error shape, no traceback; the connection stays open."""
        self._answered = False
        return packb(error.body())

    def sent(self, now: float) -> None:
        """The frame built last went out at ``now`` (monotonic seconds)."""
        if self._answered:
            self._prev_total_ms = (now - self._waiting_since) * 1e3
        self._answered = False
        self._waiting_since = now
