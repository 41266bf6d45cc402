"""Attack: one request that would hold the engine for many robots' chunks (issue 45, item 2).

Starts ``cosmos3-serve --tiny base`` (WebSocket port only) and ``--robots`` (1) robot in closed loop. Phases
alternate, unattacked and attacked, with the same robot on the same server. The attacker configures 200 steps,
guidance 7 and tier 720 (12.8 default chunks: 35 steps, guidance 6, tier 480) and sends a 1024x1024
observation every second, reading what comes back. It prints the robot's round-trip p50/p99 on each side,
their ratio, and the attacker's replies.

``--max-request-cost`` (8 by default) refuses the request at ``configure`` and the observations that follow it
(no session settings: the session was never configured). ``--server-args "--max-request-cost 0"`` lifts the
bound: then one such request took 15 s here, and four robots beside it timed out (issue 45).

    .venv/bin/python benchmarks/attack_costly_request.py

The issue's target: refused, or the robot's worst round trip within 3x its baseline p99.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from attack_websocket import Robots, summary  # noqa: E402
from realtime_roundtrip import ServerProcess, percentile  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from robot_clients.protocol import REALTIME_PATH  # noqa: E402
from robot_clients.wire_codec import packb, unpackb  # noqa: E402

COSTLY = {"num_steps": 200, "guidance_scale": 7.0, "resolution_tier": 720}


async def attack(url: str, stats: dict[str, int], stop: asyncio.Event) -> None:
    image = np.random.default_rng(1).integers(0, 256, (1024, 1024, 3), dtype=np.uint8)
    async with connect(url, proxy=None, max_size=None, compression=None) as ws:
        metadata = unpackb(await ws.recv())
        domain = metadata["defaults"].get("domain_name") or sorted(metadata["domains"])[0]

        async def read() -> None:
            async for message in ws:
                reply = unpackb(message)
                kind = str(reply.get("code") or reply.get("type"))
                stats[kind] = stats.get(kind, 0) + 1
                if reply.get("code") and "message" not in stats:
                    stats["message"] = reply["message"]  # type: ignore[assignment]

        reader = asyncio.ensure_future(read())
        seq = 0
        while not stop.is_set():
            seq += 1
            await ws.send(packb({"type": "configure", "domain_name": domain, **COSTLY}))
            await ws.send(packb({"type": "observation", "seq": seq, "image": image, **COSTLY}))
            await asyncio.sleep(1.0)
        reader.cancel()


async def measure(args: argparse.Namespace, server: ServerProcess) -> None:
    url = f"ws://127.0.0.1:{server.port}{REALTIME_PATH}"
    robots = Robots(url, 224, args.robots)
    await robots.open()
    await robots.run(args.warmup)
    sides: dict[str, list[float]] = {"unattacked": [], "attacked": []}
    for round_index in range(args.rounds):
        sides["unattacked"] += await robots.run(args.requests)
        stats: dict[str, int] = {}
        stop = asyncio.Event()
        attacker = asyncio.ensure_future(attack(url, stats, stop))
        sides["attacked"] += await robots.run(args.requests)
        stop.set()
        await attacker
        print(f"round {round_index + 1}/{args.rounds}: attacker {stats}", flush=True)
    await robots.close()
    load = os.getloadavg()
    print(
        f"\nattack: {COSTLY} with a 1024x1024 image every second, {args.robots} robot(s), server args "
        f"{args.server_args!r}, {args.rounds} rounds of {args.requests} round trips per side; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores"
    )
    for name, values in sides.items():
        print(f"{name:<11} {summary(values)}   worst {max(values):8.1f} ms")
    base, hit = sides["unattacked"], sides["attacked"]
    print(
        f"robot's worst attacked round trip / unattacked p99: {max(hit) / percentile(base, 99):.2f}x "
        f"(target: refused, or within 3x); p50 ratio {percentile(hit, 50) / percentile(base, 50):.2f}x"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--robots", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=10, help="round trips per robot per phase")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--server-args", default="")
    args = parser.parse_args()
    server = ServerProcess(["--tiny", "base", *shlex.split(args.server_args)])
    try:
        server.wait_ready()
        asyncio.run(measure(args, server))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
