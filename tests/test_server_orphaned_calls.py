"""Work nobody waits for any more (issue 45, item 2: ``/healthz`` said ``busy`` for 80 s after every session closed).

A robot's observation whose session has closed is an orphan. One still waiting in the queue was always
forgotten; one the worker has already taken (held for batch company, or being prepared) is now skipped before
its engine call; one whose call already runs cannot be interrupted mid-forward, and ``/healthz`` says so:
``busy`` is false (no session waits) and ``engine_call`` is ``orphaned`` until that call returns.

Real server on 127.0.0.1, the tiny distilled checkpoint, engine calls made slower by a known delay
(``DelayedEngine``), every wait a condition with a generous deadline, so the tests hold with a core kept busy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from server_fixtures import DOMAIN, ServerThread, http_get, rgb_image, tiny_engine_loader, until
from websockets.asyncio.client import ClientConnection, connect

from robot_clients.wire_codec import packb, unpackb

IMAGE = rgb_image(64)
# Long enough that the session's close and a /healthz probe land inside the call on a loaded machine.
ORPHAN_CALL_S = 6.0
# How long the worker holds a taken observation for batch company: the window in which its robot leaves.
BATCH_HOLD_MS = 5000.0


async def open_session(server: ServerThread) -> ClientConnection:
    ws = await connect(server.url, compression=None, proxy=None)
    assert unpackb(await ws.recv())["type"] == "metadata"
    await ws.send(packb({"type": "configure", "domain_name": DOMAIN}))
    assert unpackb(await ws.recv())["type"] == "session"
    return ws


async def test_healthz_says_orphaned_not_busy_while_a_call_nobody_waits_for_finishes():
    with ServerThread(tiny_engine_loader("distilled", delay_s=ORPHAN_CALL_S)) as server:
        worker = server.server.context.worker
        ws = await open_session(server)
        await ws.send(packb({"type": "observation", "seq": 0, "image": IMAGE}))
        await until(lambda: server.run(lambda: bool(worker.current)), "the engine runs the observation")
        status, health, _ = await asyncio.to_thread(http_get, server.health_url)
        assert status == 200 and health["busy"] is True and health["engine_call"] == "serving", health

        await ws.close()
        await until(lambda: server.run(lambda: not server.server.context.sessions), "the server saw the close")
        status, health, _ = await asyncio.to_thread(http_get, server.health_url)
        # The premise: the call was still running after the probe answered (it takes ORPHAN_CALL_S).
        assert server.run(lambda: bool(worker.current)), "the call ended before the probe: no orphan to report"
        assert status == 200 and health["sessions"] == 0, health
        assert health["busy"] is False and health["engine_call"] == "orphaned", health

        await until(lambda: server.run(lambda: not worker.current), "the orphaned call returned", ORPHAN_CALL_S * 5)
        status, health, _ = await asyncio.to_thread(http_get, server.health_url)
        assert health["busy"] is False and health["engine_call"] == "idle", health


async def test_an_observation_taken_but_not_started_is_not_run_once_its_robot_left():
    """The worker holds a taken observation up to BATCH_HOLD_MS for others to join its call; its robot leaves
    meanwhile. Only the second robot's observation reaches the engine (one completed, not two)."""
    with ServerThread(tiny_engine_loader("distilled"), max_batch=4, max_batch_wait_ms=BATCH_HOLD_MS) as server:
        context = server.server.context
        worker = context.worker
        completed = server.run(lambda: worker.completed)
        leaving = await open_session(server)
        await leaving.send(packb({"type": "observation", "seq": 0, "image": IMAGE}))

        def taken() -> Any:
            items = [item for s in context.sessions.values() for item in s.rules.in_flight.values()]
            return items[0] if items and items[0].taken_at is not None else None

        item = await until(lambda: server.run(taken), "the worker took the observation")
        await leaving.close()
        await until(lambda: server.run(lambda: not context.sessions), "the server saw the close")
        assert time.monotonic() < item.enqueued_at + BATCH_HOLD_MS / 1e3, "the close came after the hold: too slow"

        staying = await open_session(server)
        async with staying:
            await staying.send(packb({"type": "observation", "seq": 0, "image": IMAGE}))
            reply = unpackb(await asyncio.wait_for(staying.recv(), 60))
        assert reply["type"] == "action_chunk", reply
        assert server.run(lambda: worker.completed) - completed == 1, "the orphan reached the engine"
        assert server.run(lambda: worker.counters.orphans_skipped) == 1
