"""The Ray Serve backend for real: a local Ray instance, two CPU replicas of the tiny model, a real
WebSocket client, a replica killed with ``ray.kill`` mid-session.

Ray's start-up costs seconds on this machine, so one Ray instance serves the module and one server with
two replicas serves both tests. Skipped when the ``ray`` extra is not installed.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

pytest.importorskip("ray.serve", reason="the `ray` extra is not installed")

from server_fixtures import DOMAIN, REPO_ROOT, ServerThread, rgb_image, tiny_checkpoint, tiny_engine_loader  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from policy_server.assembly.cli import assemble_server  # noqa: E402
from robot_clients.wire_codec import packb, unpackb  # noqa: E402

SEED = 7


@pytest.fixture(scope="module")
def ray_instance():
    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(proxy_location="Disabled")
    yield ray
    serve.shutdown()
    ray.shutdown()


# The engine as cosmos3-serve loads it for both backends (its default --max-request-cost included); num_cpus 0:
# two replicas plus Serve's controller fit a 2-core Ray instance.
def cli_args(*flags: str):
    from policy_server.assembly.cli import build_parser

    source = str(tiny_checkpoint("distilled"))
    engine = ["--device", "cpu", "--dtype", "float32", "--torch-threads", "1", "--no-warmup"]
    return build_parser().parse_args(["--model", source, *engine, *flags])


RAY_FLAGS = ("--backend", "ray", "--replicas", "2", "--replica-cpus", "0")
# Tier 720 costs 11.1 default chunks of the tiny distilled model's domain, over the default bound of 8.
COSTLY_CONFIGURE = {"type": "configure", "domain_name": DOMAIN, "resolution_tier": 720}


class RayServerThread(ServerThread):
    """A test server whose engine runs on Ray Serve replicas instead of the local worker thread, made by
    cosmos3-serve's own backend factory from its flags."""

    def __init__(self, workdir, **settings) -> None:
        from policy_server.assembly.cli import _ray_backend

        super().__init__(None, **settings)
        factory = _ray_backend(cli_args(*RAY_FLAGS), workdir)
        self.server = assemble_server(None, self.settings, backend=factory, http=self.http)


@pytest.fixture(scope="module")
def ray_server(ray_instance, tmp_path_factory):
    from policy_server.sidecar_settings import SidecarSettings

    http = SidecarSettings(data_dir=tmp_path_factory.mktemp("ray-jobs"), port=0)
    with RayServerThread(tmp_path_factory.mktemp("ray-workdir"), http=http) as running:
        yield running


async def open_session(url: str):
    ws = await connect(url, compression=None, proxy=None, max_size=None)
    metadata = unpackb(await ws.recv())
    await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "seed": SEED}))
    session = unpackb(await ws.recv())
    return ws, metadata, session


async def round_trip(ws, seq: int, image: np.ndarray, timeout: float = 60.0) -> list[dict]:
    """Send one observation; return every frame up to and including its terminal reply."""
    await ws.send(packb({"type": "observation", "seq": seq, "image": image}))
    frames = []
    while True:
        frame = unpackb(await asyncio.wait_for(ws.recv(), timeout))
        frames.append(frame)
        if frame.get("seq") == seq and frame["type"] in ("action_chunk", "dropped", "error"):
            return frames


async def local_actions(image: np.ndarray) -> np.ndarray:
    """The same observation through the local backend (same checkpoint, same seed)."""
    server = await asyncio.to_thread(ServerThread(tiny_engine_loader("distilled")).start)
    try:
        ws, _, _ = await open_session(server.url)
        async with ws:
            return (await round_trip(ws, 0, image))[-1]["actions"]
    finally:
        await asyncio.to_thread(server.stop)


async def test_sessions_spread_over_replicas_and_match_the_local_backend(ray_server):
    image = rgb_image(seed=1)
    expected = await local_actions(image)
    ws_a, metadata, _ = await open_session(ray_server.url)
    ws_b, _, _ = await open_session(ray_server.url)
    async with ws_a, ws_b:
        chunk_a = (await round_trip(ws_a, 0, image))[-1]
        chunk_b = (await round_trip(ws_b, 0, image))[-1]
        assert chunk_a["type"] == chunk_b["type"] == "action_chunk"
        np.testing.assert_array_equal(chunk_a["actions"], expected)
        np.testing.assert_array_equal(chunk_b["actions"], expected)
        topology = ray_server.run(lambda: ray_server.server.context.worker.topology())
        assert topology["backend"] == "ray"
        assert [r["sessions"] for r in topology["replicas"]] == [1, 1]
        assert len({r["actor_name"] for r in topology["replicas"]}) == 2
        assert all(r["completed"] >= 1 for r in topology["replicas"])
    assert metadata["model"]


async def configure_reply(url: str, configure: dict) -> dict:
    async with connect(url, compression=None, proxy=None, max_size=None) as ws:
        unpackb(await ws.recv())
        await ws.send(packb(configure))
        return unpackb(await asyncio.wait_for(ws.recv(), 60))


async def test_a_request_costlier_than_the_bound_is_refused_as_the_local_backend_refuses_it(ray_server):
    """--max-request-cost reaches the replicas through the loader every backend uses: the costly configure is
    refused with the local backend's typed error, naming the bound, before any engine call."""
    via_ray = await configure_reply(ray_server.url, COSTLY_CONFIGURE)
    from policy_server.assembly.cli import _engine_loader

    local = await asyncio.to_thread(ServerThread(_engine_loader(cli_args(), REPO_ROOT)).start)
    try:
        via_local = await configure_reply(local.url, COSTLY_CONFIGURE)
    finally:
        await asyncio.to_thread(local.stop)
    assert via_ray["type"] == "error", f"the Ray backend accepted a request over the bound: {via_ray}"
    assert (via_ray["type"], via_ray["code"], via_ray["field"]) == ("error", "invalid_field", "resolution_tier")
    assert "--max-request-cost" in via_ray["message"] and "bound of 8" in via_ray["message"], via_ray
    fields = ("code", "field", "message")
    assert [via_ray[k] for k in fields] == [via_local[k] for k in fields]


async def test_killed_replica_moves_its_session_which_carries_on(ray_server, ray_instance):
    image = rgb_image(seed=2)
    ws, _, session = await open_session(ray_server.url)
    async with ws:
        first = (await round_trip(ws, 0, image))[-1]
        assert first["type"] == "action_chunk"
        router = ray_server.server.context.queue
        before = ray_server.run(lambda: router.replica_of(session["session_id"]))
        topology = ray_server.run(lambda: ray_server.server.context.worker.topology())
        actor_name = topology["replicas"][before]["actor_name"]

        # Kill the session's replica while its next observation is on the way (in flight or waiting).
        await ws.send(packb({"type": "observation", "seq": 1, "image": image}))
        ray_instance.kill(ray_instance.get_actor(actor_name, namespace="serve"), no_restart=True)
        frames = []
        while not (frames and frames[-1].get("seq") == 1 and frames[-1]["type"] != "session_event"):
            frames.append(unpackb(await asyncio.wait_for(ws.recv(), 60.0)))
        events = [f for f in frames if f["type"] == "session_event"]
        assert [e["event"] for e in events] == ["replica_moved"]
        assert events[0]["from_replica"] == before and events[0]["to_replica"] != before
        # The observation that was on its way is served by the other replica, not answered with an error.
        assert frames[-1]["type"] == "action_chunk", frames[-1]
        np.testing.assert_array_equal(frames[-1]["actions"], first["actions"])
        after = ray_server.run(lambda: router.replica_of(session["session_id"]))
        assert after == events[0]["to_replica"]
        # And the session carries on there.
        assert (await round_trip(ws, 2, image))[-1]["type"] == "action_chunk"
        assert ray_server.run(lambda: ray_server.server.context.worker.failovers) == 1

    # Serve replaces the dead replica; it comes back into service for new sessions.
    await wait_until_all_live(ray_server)


async def wait_until_all_live(ray_server, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while any(
        r["state"] != "live" for r in ray_server.run(lambda: ray_server.server.context.worker.topology())["replicas"]
    ):
        assert time.monotonic() < deadline, "a lost replica was never replaced"
        await asyncio.sleep(0.5)


async def test_video_job_survives_its_replica_and_metadata_shows_the_topology(ray_server, ray_instance):
    import httpx
    from sidecar_fixtures import video_body, wait_for_job

    backend = ray_server.server.context.worker
    await wait_until_all_live(ray_server)
    failovers = ray_server.run(lambda: backend.failovers)
    with httpx.Client(base_url=f"http://127.0.0.1:{ray_server.sidecar.port}", trust_env=False, timeout=60) as client:
        metadata = client.get("/v1/actions/metadata").json()
        assert metadata["topology"]["backend"] == "ray" and len(metadata["topology"]["replicas"]) == 2
        job = client.post("/v1/videos", json=video_body(steps=16)).json()

        def running_on() -> int | None:
            for replica in backend._replicas:
                if replica.dispatcher is not None and replica.dispatcher.current_task is not None:
                    return replica.index
            return None

        deadline = time.monotonic() + 60
        while (index := ray_server.run(running_on)) is None:
            assert time.monotonic() < deadline, "the job never started"
            await asyncio.sleep(0.005)
        actor_name = ray_server.run(lambda: backend.topology())["replicas"][index]["actor_name"]
        ray_instance.kill(ray_instance.get_actor(actor_name, namespace="serve"), no_restart=True)

        done = await asyncio.to_thread(wait_for_job, client, job["id"], timeout=90)
        assert done["status"] == "completed", done
        assert ray_server.run(lambda: backend.failovers) == failovers + 1
        metrics = client.get("/metrics").text
        assert 'cosmos3_replica_up{replica="0"}' in metrics and "cosmos3_replica_failovers" in metrics
