"""One-shot HTTP requests nobody waits for any more (issue 45, item 2: ``/healthz`` never stays ``busy`` for a
job that no session waits for).

A ``POST /v1/actions/generations`` whose client disconnects is cancelled at once, as a closed WebSocket
session's observation is: taken out of the queue if it still waits there, skipped by the worker if it was
taken (held for batch company, or being prepared) but its engine call has not started. Before, nothing
listened for the disconnect: the request waited out ``action_timeout_s`` (120 s) and was run meanwhile.

Real server and sidecar on 127.0.0.1, the tiny distilled checkpoint, engine calls (or their host inputs)
made slower by a known delay; the client that leaves is a raw socket that sends a whole request and closes.
Every wait is a condition with a generous deadline, so the tests hold with a core kept busy.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from server_fixtures import DOMAIN, tiny_checkpoint, tiny_engine_loader, until
from sidecar_fixtures import SidecarServer, png_b64, rgb

pytestmark = pytest.mark.timeout(240)

BODY = {"domain_name": DOMAIN, "image": png_b64(rgb(64, seed=5)), "action_horizon": 8}
PATH = "/v1/actions/generations"
CLIENT = "peer:127.0.0.1"  # every request here comes from one client (one turn)
# Long enough that a disconnect, and the server seeing it, land inside the call on a loaded machine.
ENGINE_CALL_S = 6.0
# How long the worker holds a taken request for batch company: the window in which its client leaves.
BATCH_HOLD_MS = 5000.0
PREPARE_S = 4.0


async def send_and_leave_open(server: SidecarServer) -> asyncio.StreamWriter:
    """Send a whole action generation on a raw connection, and return the connection's writer (closing it
    is the client's disconnect)."""
    body = json.dumps(BODY).encode()
    _, writer = await asyncio.open_connection("127.0.0.1", server.sidecar.port)
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    return writer


async def leave(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


def post_in_background(server: SidecarServer) -> asyncio.Future[Any]:
    return asyncio.ensure_future(asyncio.to_thread(server.client.post, PATH, json=BODY))


def in_flight(server: SidecarServer) -> int:
    return int(server.run(lambda: server.sidecar.actions_in_flight.in_flight(CLIENT)))


async def test_a_queued_request_whose_client_left_is_never_run():
    with SidecarServer(tiny_engine_loader("distilled", delay_s=ENGINE_CALL_S)) as server:
        context = server.server.context
        worker = context.worker
        completed = server.run(lambda: worker.completed)
        first = post_in_background(server)
        await until(lambda: server.run(lambda: bool(worker.current)), "the engine runs the first request")
        leaving = await send_and_leave_open(server)
        await until(lambda: server.run(lambda: len(context.queue)) == 1, "the second request waits in the queue")

        await leave(leaving)
        await until(lambda: server.run(lambda: len(context.queue)) == 0, "the request left the queue", 60)
        # Read now, asserted after the outcome (on a server deaf to disconnects the request leaves the queue
        # only to run, once the first call has ended: the count below says so first).
        left_during_first_call = server.run(lambda: bool(worker.current)) and not first.done()

        assert (await first).status_code == 200
        await until(lambda: server.run(lambda: not worker.current and not len(context.queue)), "the engine is idle", 60)
        assert server.run(lambda: worker.completed) - completed == 1, "the request whose client left was run"
        assert left_during_first_call, "the first call ended before the disconnect was seen: too slow"
        assert in_flight(server) == 0
        health = server.client.get("/healthz").json()
        assert health["busy"] is False and health["engine_call"] == "idle" and health["queue_depth"] == 0, health
        # The sidecar counts it as a request whose client went away, as one that left mid-body.
        assert 'status="499"' in server.client.get("/metrics").text


async def test_a_request_taken_but_not_started_is_not_run_once_its_client_left():
    """The worker holds a taken request up to BATCH_HOLD_MS for others to join its call; its client leaves
    meanwhile. Only the next request reaches the engine (one completed, not two)."""
    with SidecarServer(tiny_engine_loader("distilled"), max_batch=4, max_batch_wait_ms=BATCH_HOLD_MS) as server:
        context = server.server.context
        worker = context.worker
        completed = server.run(lambda: worker.completed)
        puts: list[float] = []
        server.run(lambda: context.queue.add_listener(lambda: puts.append(time.monotonic())))

        leaving = await send_and_leave_open(server)
        await until(lambda: puts and server.run(lambda: len(context.queue)) == 0, "the worker took the request")
        await leave(leaving)
        await until(lambda: in_flight(server) == 0, "the server let the request whose client left go", 60)
        seen_within_hold = time.monotonic() < puts[0] + BATCH_HOLD_MS / 1e3

        response = await post_in_background(server)
        assert response.status_code == 200, response.text
        assert server.run(lambda: worker.completed) - completed == 1, "the request whose client left was run"
        assert server.run(lambda: worker.counters.orphans_skipped) == 1
        assert seen_within_hold, "the disconnect was seen after the hold: too slow"


class SlowPreparingEngine:
    """The real tiny engine, whose host inputs (``prepare_actions``) take PREPARE_S longer: the worker
    prepares an observation inline, on its own thread, when the engine was idle as it arrived."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.preparing = threading.Event()
        self.predicted = 0

    def prepare_actions(self, request: Any) -> Any:
        self.preparing.set()
        time.sleep(PREPARE_S)
        return self.engine.prepare_actions(request)

    def predict_prepared(self, prepared: Any) -> Any:
        self.predicted += 1
        return self.engine.predict_prepared(prepared)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


async def test_a_request_whose_client_left_while_it_was_prepared_inline_is_not_run():
    engines: list[SlowPreparingEngine] = []
    path = tiny_checkpoint("distilled")

    def load() -> SlowPreparingEngine:
        from cosmos3_runtime.engine import Cosmos3Engine

        engines.append(SlowPreparingEngine(Cosmos3Engine.load(path, device="cpu", dtype="float32")))
        return engines[0]

    with SidecarServer(load) as server:
        worker = server.server.context.worker
        engine = engines[0]
        leaving = await send_and_leave_open(server)
        await until(engine.preparing.is_set, "the worker prepares the request")
        await leave(leaving)
        await until(lambda: in_flight(server) == 0, "the server let the request whose client left go", 60)
        seen_while_preparing = server.run(lambda: bool(worker.current)) and engine.predicted == 0

        await until(lambda: server.run(lambda: not worker.current), "the worker is done with it", 60)
        assert engine.predicted == 0, "the request whose client left reached the engine"
        assert server.run(lambda: worker.counters.orphans_skipped) == 1
        assert server.run(lambda: worker.counters.inline_preps) == 1, "not the inline path"
        assert seen_while_preparing, "the preparation ended before the disconnect was seen: too slow"
