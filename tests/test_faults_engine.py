"""Engine faults against a real server: the engine raises, and the engine hangs (the watchdog).

The engine is the real tiny Cosmos3 engine wrapped in :class:`FaultyEngine`, which injects one known
fault on demand and otherwise passes every call through:

* ``prompt == "raise"``: ``predict_actions`` raises ``RuntimeError`` (an internal failure, not a typed
  validation error), as a CUDA error or a bug in a kernel would;
* ``switch.hang_next`` set: the next engine call blocks until ``switch.release`` is set (at most 60 s),
  as a stuck driver would. The event is consumed by that call, so the engine the watchdog reloads
  serves normally.

Other faults of the issue are covered where the machinery lives: a client vanishing mid-inference in
``test_server_scheduling.py``, SIGTERM draining in ``test_server_lifecycle.py``, SIGKILL and restart
losing no accepted video job in ``test_sidecar_restart.py``, a full disk in
``test_faults_disk_full.py``.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import DOMAIN, ServerThread, http_get, rgb_image, tiny_checkpoint
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from policy_server.sidecar_settings import SidecarSettings
from robot_clients.wire_codec import packb, unpackb

ENGINE_TIMEOUT_S = 1.0


class FaultSwitch:
    """Shared by every engine the server loads, so a fault can be armed from the test."""

    def __init__(self) -> None:
        self.hang_next = threading.Event()
        self.release = threading.Event()
        self.hung_calls = 0
        self.loads = 0
        # While set, a (re)load waits for `load_release`: the test can look at the server mid-restart.
        self.hold_loads = threading.Event()
        self.load_release = threading.Event()


class FaultyEngine:
    """A real engine plus the two injected faults described in the module docstring."""

    def __init__(self, engine: Any, switch: FaultSwitch) -> None:
        self.engine = engine
        self.switch = switch

    def _maybe_fail(self, requests) -> None:
        if any(getattr(r, "prompt", "") == "raise" for r in requests):
            raise RuntimeError("injected engine failure")
        if self.switch.hang_next.is_set():
            self.switch.hang_next.clear()
            self.switch.hung_calls += 1
            self.switch.release.wait(60)

    def predict_actions(self, request):
        self._maybe_fail([request])
        return self.engine.predict_actions(request)

    def predict_actions_batch(self, requests):
        self._maybe_fail(requests)
        return self.engine.predict_actions_batch(requests)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def faulty():
    switch = FaultSwitch()
    path = tiny_checkpoint("distilled")

    def load():
        from cosmos3_runtime.engine import Cosmos3Engine

        switch.loads += 1
        if switch.hold_loads.is_set():
            switch.load_release.wait(60)
        return FaultyEngine(Cosmos3Engine.load(path, device="cpu", dtype="float32"), switch)

    with tempfile.TemporaryDirectory(prefix="faults-engine-") as data_dir:
        with ServerThread(
            load, warmup=False, engine_timeout_s=ENGINE_TIMEOUT_S, http=SidecarSettings(data_dir=Path(data_dir), port=0)
        ) as server:
            server.switch = switch
            server.readyz_url = f"http://127.0.0.1:{server.sidecar.port}/readyz"
            try:
                yield server
            finally:
                switch.release.set()  # let an abandoned thread finish
                switch.load_release.set()


async def open_session(server: ServerThread):
    ws = await connect(server.url, compression=None, proxy=None, max_size=None)
    assert unpackb(await ws.recv())["type"] == "metadata"
    await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8}))
    assert unpackb(await ws.recv())["type"] == "session"
    return ws


async def replies(ws, count: int, timeout: float = 60.0) -> list[dict]:
    return [unpackb(await asyncio.wait_for(ws.recv(), timeout)) for _ in range(count)]


async def wait_ready(server: ServerThread, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while http_get(server.health_url)[1]["status"] != "ready":
        assert time.monotonic() < deadline, "the engine never came back"
        await asyncio.sleep(0.1)


async def test_an_engine_exception_fails_only_that_request(faulty):
    a, b = await open_session(faulty), await open_session(faulty)
    try:
        # Both observations wait together, so the engine may take them as one batch: the failure of
        # one must not fail its batch mate (the worker reruns a failed batch one by one).
        await a.send(packb({"type": "observation", "seq": 0, "image": rgb_image(64), "prompt": "raise"}))
        await b.send(packb({"type": "observation", "seq": 0, "image": rgb_image(64, seed=1)}))
        (error,), (chunk,) = await replies(a, 1), await replies(b, 1)
        assert error["type"] == "error" and error["code"] == "engine_error" and error["seq"] == 0
        assert "ref " in error["message"] and "injected" not in error["message"]  # no internals leak
        assert chunk["type"] == "action_chunk"
        # The failing session goes on.
        await a.send(packb({"type": "observation", "seq": 1, "image": rgb_image(64)}))
        (after,) = await replies(a, 1)
        assert after["type"] == "action_chunk" and after["seq"] == 1
    finally:
        await a.close()
        await b.close()


async def test_a_hung_engine_call_times_out_reports_not_ready_and_the_engine_is_reloaded(faulty):
    loads_before, restarts_before = faulty.switch.loads, faulty.run(lambda: faulty.server.context.worker.restarts)
    ws = await open_session(faulty)
    try:
        faulty.switch.hang_next.set()
        faulty.switch.hold_loads.set()  # keep the fresh engine loading until the checks below are done
        started = time.monotonic()
        await ws.send(packb({"type": "observation", "seq": 0, "image": rgb_image(64)}))
        (timeout,) = await replies(ws, 1, timeout=30)
        waited = time.monotonic() - started
        assert timeout["type"] == "error" and timeout["code"] == "engine_timeout" and timeout["seq"] == 0, timeout
        assert ENGINE_TIMEOUT_S <= waited < ENGINE_TIMEOUT_S + 5, waited
        assert faulty.switch.hung_calls >= 1
        # Not ready while the fresh engine loads: /healthz says so (alive: 200), /readyz is 503, and a
        # new robot is told to come back (503 + Retry-After); the open session stays open.
        status, health, _ = http_get(faulty.health_url)
        assert status == 200 and health["status"] in ("restarting", "loading"), health
        status, readiness, _ = http_get(faulty.readyz_url)
        assert status == 503 and readiness["ready"] is False, readiness
        with pytest.raises(InvalidStatus) as refused:
            await connect(faulty.url, proxy=None)
        assert refused.value.response.status_code == 503
        assert faulty.run(lambda: faulty.server.context.worker.restarts) == restarts_before + 1
        faulty.switch.hold_loads.clear()
        faulty.switch.load_release.set()
        await wait_ready(faulty)
        assert http_get(faulty.readyz_url)[0] == 200
        metrics = http_get(faulty.readyz_url.replace("/readyz", "/metrics"))[1]["text"]
        restarts = faulty.run(lambda: faulty.server.context.worker.restarts)
        assert f'cosmos3_replica_failovers_total{{replica="0"}} {float(restarts)}' in metrics  # operators see it
        assert faulty.switch.loads == loads_before + 1
        # The session that saw the timeout is served by the new engine.
        await ws.send(packb({"type": "observation", "seq": 1, "image": rgb_image(64)}))
        (chunk,) = await replies(ws, 1)
        assert chunk["type"] == "action_chunk" and chunk["seq"] == 1
        # The abandoned call finishes now; its late result must not reach anyone.
        faulty.switch.release.set()
        await asyncio.sleep(0.5)
        await ws.send(packb({"type": "observation", "seq": 2, "image": rgb_image(64)}))
        (last,) = await replies(ws, 1)
        assert last["type"] == "action_chunk" and last["seq"] == 2  # not a stray reply for seq 0
    finally:
        faulty.switch.release.set()
        await ws.close()
