"""SGLang's lock-step clients on ``/v1/actions/realtime``: one request envelope in, one reply envelope out.

The path's native session (:mod:`.native`) sends the metadata frame, which carries our keys and SGLang's,
and reads the client's first frame. A map without ``type`` that is SGLang's request envelope
(:func:`policy_server.sglang.realtime.connection_mode`) hands the connection over to a
:class:`SglangLockstepSession`, which serves that frame and every later one SGLang's way:

* each binary msgpack frame is one envelope (:mod:`policy_server.sglang.actions`: a batch of images, or
  several candidates, is several engine requests, which share this connection's one turn in the queue);
* its answer is SGLang's reply envelope with ``server_timing: {infer_ms, prev_total_ms}``
  (:class:`policy_server.sglang.realtime.LockstepSession` keeps that state);
* a wrong frame, or one the engine refuses, is answered ``{"error": {"code", "message", "field"}}``
  without a traceback, and the connection stays open (SGLang sends a traceback and closes with 1011).

Lock-step means the client waits for each answer before it sends the next request, as SGLang's clients
do. A frame that arrives while a request is still being answered is refused (``rate_limited``), not
queued: the connection holds at most one request's items in the engine's queue.
"""

from __future__ import annotations

import time
from typing import Any

from robot_clients.protocol import CodedError, DropReason, ErrorCode, ProtocolError
from robot_clients.wire_codec import packb

from ..engine.outcome import EngineOutcome
from ..engine.request_queue import PendingObservation, QueueClosed
from ..http.errors import ApiError, HttpErrorCode
from ..http.sglang_bodies import item_requests
from ..sglang.actions import ActionCall
from ..sglang.realtime import LockstepSession
from .base import Session
from .replies import ChunkReply


class SglangLockstepSession(Session):
    """A connection that chose SGLang's lock-step mode with its first frame (``first_frame``, decoded)."""

    protocol = "sglang"

    def __init__(
        self, *args: Any, session_id: str, first_frame: dict[str, Any], hello_sent_at: float, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.id = session_id  # the id the metadata frame already told the client
        host = self.host
        assert host.description is not None, "sessions open once the model is ready"
        self.lockstep = LockstepSession(host.description, max_items=host.settings.max_batch, started_at=hello_sent_at)
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

    def handle(self, message: bytes | str | dict, received_at: float) -> None:
        if self._call is not None:
            raise ProtocolError(
                ErrorCode.RATE_LIMITED,
                "a request of this connection is still being answered: "
                "SGLang's lock-step mode takes the next request after the reply",
            )
        self.take_rate(received_at)
        description = self.host.description
        try:
            call = self.lockstep.receive(message, received_at)
            requests = item_requests(call, description, self.host.frame_limits)  # the one media check, first
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
                self.host.queue.put(item)
            except QueueClosed:
                self._fail(ApiError(HttpErrorCode.SHUTTING_DOWN, "the server is shutting down"))
                return
            self.in_flight[seq] = item

    # -- outcomes ---------------------------------------------------------------------------------------

    def on_result(self, item: PendingObservation, outcome: EngineOutcome) -> None:
        if not self._expects(item):
            return
        del self.in_flight[item.seq]
        call = self._call
        assert call is not None
        if outcome.chunk is None:
            error = outcome.error
            assert error is not None, "an outcome has a chunk or an error"
            self._fail(call.items[item.seq - self._first_seq].relabel(ApiError.of(error)))
            return
        self._chunks[item.seq] = outcome.chunk
        if self.in_flight:
            return
        self.answered += 1
        chunks = [self._chunks[seq] for seq in sorted(self._chunks)]
        self._call = None
        self.put(
            self.lockstep.reply(
                call, chunks, infer_ms=(time.monotonic() - self._started_at) * 1e3, model=self.host.description.model
            )
        )

    def on_dropped(self, item: PendingObservation, reason: str) -> None:
        if self._expects(item):
            self.dropped += 1
            code = HttpErrorCode.SHUTTING_DOWN if reason == DropReason.SHUTDOWN else ErrorCode.ENGINE_ERROR
            self._fail(ApiError(code, f"the request was dropped ({reason})"))

    def _fail(self, error: CodedError) -> None:
        """Answer the request being served with ``error``; its other items are no longer wanted."""
        for item in list(self.in_flight.values()):
            self.host.queue.cancel(item.session_id)
            item.cancelled = True
        self.in_flight.clear()
        self._call = None
        self.send_error(error.code, error.message, error.field)

    def _close(self) -> None:
        for item in self.in_flight.values():
            self.host.queue.cancel(item.session_id)
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
