"""``POST /v1/actions/generations``: one chunk of actions for one observation, for clients without a WebSocket.

The request's observation enters the server's one request queue like a robot's (each client's requests
share one turn, with a bounded number in flight: :mod:`policy_server.http.turns`); the handler waits for
its outcome and answers it in JSON, or in msgpack when ``Accept`` asks for it. Once the body is read, the
handler also listens for the client's disconnect: a request whose client went away leaves the queue (or is
marked cancelled, so the worker skips it if it has taken it), as a closed WebSocket session's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.types import Receive

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.requests import ActionRequest, ActionResult
from robot_clients.protocol import DropReason
from robot_clients.wire_codec import packb

from ...engine.request_queue import EngineOutcome, PendingObservation, QueueClosed
from ...foundation.api_errors import ApiError, HttpErrorCode
from ...session_config import chunk_report
from ...sglang.actions import build_reply
from .. import codecs as http_codecs
from .. import requests as http_requests
from .. import turns as http_turns
from ..bodies import ERROR_RESPONSES, body_schema, read_fields
from ..parts import SidecarParts
from ..requests import ACTION_UPLOADS, sglang_envelope, sglang_requests
from ..schemas import (
    ActionArray,
    ActionGeneration,
    ActionGenerationItem,
    ActionGenerationParams,
    ActionUsage,
    ErrorResponse,
)


class OneShotActionWaiter:
    """The owner of an action generation's observation: resolves a future instead of sending a frame."""

    request_kind = "action_generation"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[EngineOutcome | str] = loop.create_future()

    def on_result(self, item: PendingObservation, outcome: EngineOutcome) -> None:
        if not self.future.done():
            self.future.set_result(outcome)

    def on_dropped(self, item: PendingObservation, reason: str) -> None:
        if not self.future.done():
            self.future.set_result(reason)


async def client_disconnected(receive: Receive) -> None:
    """Return once the client of a request whose body has been read disconnects.

    Each ``receive()`` blocks until the server has something to say (uvicorn's cycle waits on an event
    that only the connection's loss sets once the body is complete), so this waits without polling."""
    while (await receive())["type"] != "http.disconnect":
        pass  # the body was read before this started: nothing else arrives


@contextlib.asynccontextmanager
async def disconnect_watch(request: Request) -> AsyncIterator[asyncio.Future[None]]:
    """A future done once ``request``'s client disconnects, watched for the ``async with`` block (start it
    only after the body has been read: it takes the messages ``receive()`` gives)."""
    watch = asyncio.ensure_future(client_disconnected(request.receive))
    try:
        yield watch
    finally:
        watch.cancel()
        if watch.done() and not watch.cancelled():
            watch.exception()  # a receive that failed counts as a disconnect; nothing to log


def _timed(function: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``function(*args)`` and the CPU seconds it took on this thread: what decoding a body cost the host."""
    started = time.thread_time()
    return function(*args), time.thread_time() - started


def reported_fields(chunk: ActionResult, schema: type[BaseModel]) -> dict[str, Any]:
    """What the engine reports about the chunk it made (the settings it ran with, its horizon, domain id and
    width: :func:`~policy_server.session_config.chunk_report`, and its accounting) that ``schema`` declares
    too, by name: copied over without a second list of them."""
    report = {**chunk_report(chunk), "transformer_forwards": chunk.transformer_forwards, "batch_size": chunk.batch_size}
    return {name: value for name, value in report.items() if name in schema.model_fields}


def router(parts: SidecarParts) -> APIRouter:
    """The action generation route: observations into ``parts.host.queue``, one client's turn each."""
    routes = APIRouter(tags=["actions"])
    settings = parts.settings

    @routes.post(
        "/v1/actions/generations",
        response_model=ActionGeneration,
        summary="One chunk of actions for one observation (policy or inverse_dynamics)",
        responses={
            **ERROR_RESPONSES,
            200: {"content": {http_codecs.MSGPACK_TYPE: {}}, "description": "JSON, or msgpack when Accept asks for it"},
            429: {"model": ErrorResponse, "description": "this client has too many requests in flight"},
        },
        openapi_extra=body_schema(ActionGenerationParams, {"image": "PNG, JPEG or WebP", "video": "MP4/WebM clip"}),
    )
    async def generate_actions(request: Request) -> Any:
        client = http_turns.client_identity(request.scope)
        with parts.turns.admit(client):  # before the body is read: a refusal costs nothing
            return await _generate_actions(request, client)

    async def _generate_actions(request: Request, client: str) -> Any:
        received = time.monotonic()
        description = parts.require_ready()
        fields, kind = await read_fields(request, ACTION_UPLOADS, settings.max_json_values, parts.body_budget)
        as_msgpack = http_codecs.wants_msgpack(request.headers.get("accept"), kind)
        envelope = sglang_envelope(fields, kind)
        async with disconnect_watch(request) as gone:
            if envelope is not None:
                return await _generate_for_sglang(envelope, description, client, received, as_msgpack, gone)
            action_request, cpu_s = await asyncio.to_thread(
                _timed, http_requests.action_request, fields, description, parts.media_limits(description)
            )
            item, outcome, chunk = await _run(action_request, client, received, gone, decode_cpu_s=cpu_s)
        generation = ActionGeneration(
            id=f"actgen_{uuid.uuid4().hex}",
            created=int(time.time()),
            model=description.model,
            data=[
                ActionGenerationItem(
                    index=0,
                    action=ActionArray(
                        shape=list(chunk.actions.shape),
                        values=http_requests.actions_payload(chunk.actions, as_msgpack),
                        **reported_fields(chunk, ActionArray),
                    ),
                )
            ],
            usage=ActionUsage(
                **reported_fields(chunk, ActionUsage),
                queue_ms=item.queue_ms,
                model_ms=outcome.engine_ms,
                total_ms=(time.monotonic() - received) * 1e3,
            ),
        )
        if as_msgpack:
            body = generation.model_dump()
            body["data"][0]["action"]["values"] = generation.data[0].action.values  # keep the ndarray
            return Response(packb(body), media_type=http_codecs.MSGPACK_TYPE)
        return generation

    async def _generate_for_sglang(
        envelope: dict[str, Any],
        description: ModelDescription,
        client: str,
        received: float,
        as_msgpack: bool,
        gone: asyncio.Future[None],
    ) -> Any:
        """SGLang's envelope: one engine request per batch item and candidate, answered in its reply.

        Every item waits in the calling client's one turn, and each item past the first takes one more of
        the client's places in flight (the request's own place covers the first), so a batch is bounded
        by the same per-client limit as separate requests."""
        limits = parts.media_limits(description)
        (call, requests), cpu_s = await asyncio.to_thread(
            _timed, sglang_requests, envelope, description, limits, parts.host.settings.max_batch, as_msgpack
        )
        with contextlib.ExitStack() as places:
            for _ in requests[1:]:
                places.enter_context(parts.turns.admit(client))
            runs = [
                asyncio.ensure_future(
                    _run(action_request, client, received, gone, item.relabel, decode_cpu_s=cpu_s / len(requests))
                )
                for action_request, item in zip(requests, call.items)
            ]
            try:
                results = await asyncio.gather(*runs)
            finally:
                for run in runs:
                    run.cancel()
        timings = {
            "queue_ms": max(item.queue_ms for item, _, _ in results),
            "model_ms": max(outcome.engine_ms for _, outcome, _ in results),
            "total_ms": (time.monotonic() - received) * 1e3,
        }
        reply = build_reply(call, [chunk for _, _, chunk in results], model=description.model, timings=timings)
        if as_msgpack:
            return Response(packb(reply), media_type=http_codecs.MSGPACK_TYPE)
        return JSONResponse(reply)

    async def _run(
        action_request: ActionRequest,
        client: str,
        received: float,
        gone: asyncio.Future[None],
        relabel: Callable[[ApiError], ApiError] = lambda error: error,
        decode_cpu_s: float = 0.0,
    ) -> tuple[PendingObservation, EngineOutcome, ActionResult]:
        """Put one request in the queue in ``client``'s turn and wait for its chunk (or raise its error);
        ``decode_cpu_s``, the CPU its body's decoding took, is charged to that turn. If ``gone`` (the
        client's disconnect) comes first, the request is cancelled like a closed session's observation
        (never run unless its engine call already started) and :class:`ClientDisconnect` is raised."""
        if gone.done():  # the client left while its body was decoded: nothing to queue
            raise ClientDisconnect()
        waiter = OneShotActionWaiter(asyncio.get_running_loop())
        item = PendingObservation(
            session_id=f"http-{uuid.uuid4().hex[:12]}",
            seq=0,
            request=action_request,
            owner=waiter,
            received_at=received,
            decode_ms=(time.monotonic() - received) * 1e3,
            decode_cpu_s=decode_cpu_s,
            turn=client,
        )
        queue = parts.host.queue
        try:
            queue.put(item)
        except QueueClosed:
            raise ApiError(HttpErrorCode.SHUTTING_DOWN, "the server is shutting down") from None
        try:
            # Neither future is cancelled by the wait: the outcome may still arrive, to be discarded.
            await asyncio.wait(
                (waiter.future, gone), timeout=settings.action_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:  # another item of its batch failed: nobody waits
            queue.cancel(item.session_id)
            item.cancelled = True
            raise
        if not waiter.future.done():  # nobody waits for it any more: out of the queue, or skipped once taken
            queue.cancel(item.session_id)
            item.cancelled = True
            if gone.done():
                raise ClientDisconnect()
            raise ApiError(
                HttpErrorCode.TIMEOUT, f"no engine slot within {settings.action_timeout_s:.0f} s; retry later"
            )
        outcome = waiter.future.result()
        if isinstance(outcome, str):  # dropped
            code = HttpErrorCode.SHUTTING_DOWN if outcome == DropReason.SHUTDOWN else HttpErrorCode.TIMEOUT
            raise ApiError(code, f"the request was dropped ({outcome})")
        if outcome.chunk is None:
            assert outcome.error is not None, "an outcome without a chunk carries its error"
            raise relabel(ApiError.of(outcome.error))
        return item, outcome, outcome.chunk

    return routes
