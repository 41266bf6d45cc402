"""SGLang's lock-step clients on ``/v1/actions/realtime``: a dialect of the robots' path, one request
envelope in, one reply envelope out.

One path serves two protocols. A :class:`SglangDialect` is registered by the command line
(``policy_server.cli``, handing it the sidecar's request building) as one of the path's dialects
(:class:`policy_server.sessions.native.Dialect`). The path's native session sends the metadata frame, to
which this dialect adds SGLang's keys (:func:`sglang_keys`, merged by
:func:`policy_server.sglang.actions.merge_metadata`), because an SGLang client reads the metadata before it
sends anything. The client's first frame then decides (:func:`connection_mode`): a map
with ``type`` stays our native protocol v1, unchanged (a frame without ``type`` that is not SGLang's
envelope still gets ``unknown_type`` there); a map without ``type`` that is SGLang's request envelope
(``input``, ``parameters``, ...) is claimed: the connection is handed over to a
:class:`SglangLockstepSession`, which serves that frame and every later one SGLang's way:

* each binary msgpack frame is one envelope (:mod:`policy_server.sglang.actions`: a batch of images, or
  several candidates, is several engine requests, which share this connection's one turn in the queue);
* its answer is SGLang's reply envelope (``output_format`` defaults to ``numpy``, as in SGLang) with
  ``server_timing: {infer_ms, prev_total_ms}``: the time to answer this request, and the previous
  request's whole round, from when the server began waiting for it until its reply was sent (absent on
  the first);
* a wrong frame, or one the engine refuses, is answered ``{"error": {"code", "message", "field"}}``
  without a traceback, and the connection stays open (SGLang sends a traceback and closes with 1011).

The mode's state is sans-I/O (:class:`LockstepSession`: frames in, replies out, the caller tells it the
time); the session around it does the I/O. Lock-step means the client waits for each answer before it
sends the next request, as SGLang's clients do. A frame that arrives while a request is still being
answered is refused (``rate_limited``), not queued: the connection holds at most one request's items in
the engine's queue.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from websockets.asyncio.server import ServerConnection

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.requests import ActionRequest, ActionResult
from robot_clients.protocol import CodedError, DropReason, ErrorCode, FrameLimits, MetadataFrame, ProtocolError
from robot_clients.wire_codec import WireFormatError, packb, unpackb

from ..api_errors import ApiError, HttpErrorCode
from ..context import ServerContext
from ..engine.request_queue import EngineOutcome, PendingObservation, QueueClosed
from ..metadata import public_model_name
from ..session_config import SessionConfig
from ..sessions.base import Session
from ..sessions.native import FirstFrame
from ..sessions.observation_rules import ChunkReply
from .actions import ActionCall, build_reply, is_sglang_envelope, merge_metadata, parse_action_envelope, sglang_metadata

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


# -- the dialect and its session ---------------------------------------------------------------------


def sglang_keys(context: ServerContext[Any]) -> dict[str, Any]:
    """SGLang's metadata keys for the loaded model and this server's settings (its most chunks per request
    is the engine's batch size, its default rate a session's default ``fps``)."""
    assert context.description is not None, "answered once the model is ready"
    settings = context.settings
    return sglang_metadata(
        context.description,
        max_batch_size=settings.max_batch,
        openpi_websocket=settings.openpi is not None,
        default_fps=SessionConfig.fps,
    )


# One engine request per item of a checked envelope, by our own checks (the sidecar's
# ``policy_server.http.requests.item_requests``); raises an ApiError naming the client's field.
ItemRequests = Callable[[ActionCall, ModelDescription, FrameLimits], list[ActionRequest]]


class SglangDialect:
    """SGLang's lock-step mode as a dialect of ``/v1/actions/realtime``: chosen by a first frame without
    ``type`` that is SGLang's request envelope; its keys join the native metadata frame. ``item_requests``
    makes an envelope's engine requests: whoever attaches the dialect hands it over, so that this package
    builds no request of its own and imports nothing of the sidecar."""

    name = SGLANG

    def __init__(self, item_requests: ItemRequests) -> None:
        self.item_requests = item_requests

    def hello(self, context: ServerContext[Session], metadata: MetadataFrame) -> MetadataFrame:
        return dataclasses.replace(metadata, info=merge_metadata(metadata.info, sglang_keys(context)))

    def claims(self, first: FirstFrame) -> bool:
        return connection_mode(first.decoded) == SGLANG

    def session(
        self,
        connection: ServerConnection,
        context: ServerContext[Session],
        session_id: str,
        first: FirstFrame,
        hello_sent_at: float,
    ) -> Session:
        return SglangLockstepSession(connection, context, session_id, first.decoded, hello_sent_at, self.item_requests)


class SglangLockstepSession(Session):
    """A connection that chose SGLang's lock-step mode with its first frame (``first_frame``, decoded)."""

    protocol = "sglang"

    def __init__(
        self,
        connection: ServerConnection,
        context: ServerContext[Session],
        session_id: str,
        first_frame: dict[str, Any],
        hello_sent_at: float,
        item_requests: ItemRequests,
    ) -> None:
        super().__init__(connection, context)
        self.item_requests = item_requests
        self.id = session_id  # the id the metadata frame already told the client
        assert context.description is not None, "sessions open once the model is ready"
        self.lockstep = LockstepSession(
            context.description, max_items=context.settings.max_batch, started_at=hello_sent_at
        )
        self._first_frame: dict[str, Any] | None = first_frame
        self._call: ActionCall | None = None
        self._chunks: dict[int, Any] = {}
        self._started_at = 0.0
        self._next_seq = 0
        self._first_seq = 0  # the seq of the first item of the request being answered

    def opened(self) -> None:
        first, self._first_frame = self._first_frame, None
        self._receive(first)  # type: ignore[arg-type]  # the frame that chose this mode

    # -- frames from the client ----------------------------------------------------------------------

    def handle(self, message: bytes | str | dict[str, Any], received_at: float) -> None:
        if self._call is not None:
            raise ProtocolError(
                ErrorCode.RATE_LIMITED,
                "a request of this connection is still being answered: "
                "SGLang's lock-step mode takes the next request after the reply",
            )
        self.take_rate(received_at)
        description = self.description
        if isinstance(message, bytes):
            try:
                message = self.intake.unpack(message)  # within the element budget
            except WireFormatError as exc:
                raise ProtocolError(
                    ErrorCode.BAD_FRAME, f"the frame is not valid msgpack: {exc.message}", exc.field
                ) from None
        try:
            call = self.lockstep.receive(message, received_at)
            requests = self.item_requests(call, description, self.context.frame_limits)  # the one media check, first
        except ApiError as exc:
            raise ProtocolError(exc.code, exc.message, exc.field) from None
        self.last_observation_at = received_at
        self._call, self._chunks, self._started_at, self._first_seq = call, {}, received_at, self._next_seq
        for request in requests:
            seq, self._next_seq = self._next_seq, self._next_seq + 1
            # Each item its own slot in the queue (a batch must not replace itself), all in this connection's turn.
            item = PendingObservation(
                session_id=f"{self.id}/{seq}",
                seq=seq,
                request=request,
                owner=self,
                received_at=received_at,
                decode_ms=(time.monotonic() - received_at) * 1e3,
                turn=self.id,
            )
            try:
                self.context.queue.put(item)
            except QueueClosed:
                self._fail(ApiError(HttpErrorCode.SHUTTING_DOWN, "the server is shutting down"))
                return
            self.rules.admitted(item, None)

    # -- outcomes ---------------------------------------------------------------------------------------

    def on_result(self, item: PendingObservation, outcome: EngineOutcome) -> None:
        if not self.rules.engine_answered(item):
            return
        call = self._call
        assert call is not None
        if outcome.chunk is None:
            error = outcome.error
            assert error is not None, "an outcome has a chunk or an error"
            self._fail(call.items[item.seq - self._first_seq].relabel(ApiError.of(error)))
            return
        self._chunks[item.seq] = outcome.chunk
        if self.rules.in_flight:
            return
        self.rules.chunk_made()
        chunks = [self._chunks[seq] for seq in sorted(self._chunks)]
        self._call = None
        model = public_model_name(self.context.description.model) if self.context.description is not None else None
        self.put(self.lockstep.reply(call, chunks, infer_ms=(time.monotonic() - self._started_at) * 1e3, model=model))

    def on_dropped(self, item: PendingObservation, reason: str) -> None:
        if self.rules.engine_dropped(item, reason) is not None:  # counted; the request is answered with an error
            code = HttpErrorCode.SHUTTING_DOWN if reason == DropReason.SHUTDOWN else ErrorCode.ENGINE_ERROR
            self._fail(ApiError(code, f"the request was dropped ({reason})"))

    def _fail(self, error: CodedError) -> None:
        """Answer the request being served with ``error``; its other items are no longer wanted."""
        for item in self.rules.cancel(None):
            self.context.queue.cancel(item.session_id)
        self.rules.in_flight.clear()
        self._call = None
        self.send_error(error.code, error.message, error.field)

    def _close(self) -> None:
        for item in self.rules.in_flight.values():
            self.context.queue.cancel(item.session_id)
        super()._close()

    # -- replies ----------------------------------------------------------------------------------------

    def encode_error(self, code: str, message: str, field: str | None, seq: int | None) -> bytes:
        return packb({"error": {"code": code, "message": message, "field": field}})

    def encode_drop(self, seq: int, reason: str, message: str) -> bytes:
        return self.encode_error(ErrorCode.ENGINE_ERROR, message, None, seq)

    def _wire(self, payload: bytes | str | ChunkReply) -> bytes | str:
        wired = super()._wire(payload)
        self.lockstep.sent(time.monotonic())  # prev_total_ms ends as the reply leaves
        return wired
