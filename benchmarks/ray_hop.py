"""What the Ray hop costs: round trips of one robot against the local backend and the Ray backend.

Same tiny checkpoint, same observation, same seed, one closed-loop client (send an observation, wait for
its chunk, repeat). The Ray backend runs one CPU replica on a local Ray instance; every observation then
crosses the front end -> Serve handle -> replica -> back (two pickled hops inside the machine). Printed:
p50/p90 round trip per backend and the ratio ray/local, plus the difference in ms (the hop's cost).

    .venv/bin/python benchmarks/ray_hop.py --rounds 40

On a GPU machine the engine time shrinks and the hop's absolute cost stays: read the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect

import policy_server  # noqa: F401  (first: OMP_WAIT_POLICY=PASSIVE before torch loads)
from policy_server.assembly.server import PolicyServer
from policy_server.server_settings import ServerSettings
from robot_clients.protocol import REALTIME_PATH
from robot_clients.wire_codec import packb, unpackb

DOMAIN = "bridge_orig_lerobot"


async def round_trips(url: str, rounds: int, warmup: int) -> tuple[list[float], list[float]]:
    """Round trip times, and the engine's own time inside each (preprocess + model + postprocess), in ms."""
    image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    async with connect(url, compression=None, proxy=None, max_size=None) as ws:
        await ws.recv()  # metadata
        await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "seed": 7}))
        await ws.recv()
        times, inside = [], []
        for seq in range(warmup + rounds):
            t0 = time.perf_counter()
            await ws.send(packb({"type": "observation", "seq": seq, "image": image}))
            reply = unpackb(await ws.recv())
            assert reply["type"] == "action_chunk", reply
            if seq >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
                timing = reply["timing"]
                inside.append(timing["preprocess_ms"] + timing["model_ms"] + timing["postprocess_ms"])
        return times, inside


async def measure(server: PolicyServer, rounds: int, warmup: int) -> tuple[list[float], list[float]]:
    await server.start()
    try:
        await server.wait_ready()
        return await round_trips(f"ws://127.0.0.1:{server.port}{REALTIME_PATH}", rounds, warmup)
    finally:
        await server.shutdown()


def summary(name: str, measured: tuple[list[float], list[float]]) -> tuple[float, float, float]:
    times, inside = measured
    p50 = statistics.median(times)
    p90 = sorted(times)[int(0.9 * (len(times) - 1))]
    engine = statistics.median(inside)
    print(
        f"{name:>6}: round trip p50 {p50:7.1f} ms  p90 {p90:7.1f} ms; engine inside p50 {engine:6.1f} ms; "
        f"outside the engine p50 {p50 - engine:6.1f} ms  ({len(times)} round trips)"
    )
    return p50, p90, engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--variant", default="distilled")
    args = parser.parse_args()

    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint

    with tempfile.TemporaryDirectory() as workdir:
        checkpoint = str(build_tiny_checkpoint(Path(workdir) / "tiny", variant=args.variant))
        settings = ServerSettings(port=0, torch_threads=1, openpi=None)

        local = PolicyServer(lambda: Cosmos3Engine.load(checkpoint, device="cpu", dtype="float32"), settings)
        local_times = asyncio.run(measure(local, args.rounds, args.warmup))

        import ray
        from ray import serve

        from policy_server.ray.backend import RayBackendFactory
        from policy_server.ray.deployment import EngineLoader, RayBackendSettings

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        serve.start(proxy_location="Disabled")
        loader = EngineLoader(source=checkpoint, device="cpu", dtype="float32", torch_threads=1)
        factory = RayBackendFactory(RayBackendSettings(replicas=1, num_cpus=0), loader)
        ray_times = asyncio.run(measure(PolicyServer(None, settings, backend=factory), args.rounds, args.warmup))
        serve.shutdown()
        ray.shutdown()

    local_p50, local_p90, local_engine = summary("local", local_times)
    ray_p50, ray_p90, ray_engine = summary("ray", ray_times)
    print(
        f"ratio ray/local: p50 {ray_p50 / local_p50:.2f}x  p90 {ray_p90 / local_p90:.2f}x; round trip "
        f"p50 {ray_p50 - local_p50:+.1f} ms, of which outside the engine "
        f"{(ray_p50 - ray_engine) - (local_p50 - local_engine):+.1f} ms (the hop)"
    )


if __name__ == "__main__":
    main()
