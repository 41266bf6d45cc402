"""Attack: one connection naming 16 ``session_id``s beside robots (issue 45, item 4).

Starts ``cosmos3-serve`` (tiny distilled, WebSocket port only) and ``--robots`` (4) robots in closed loop
(224x224, wait for the chunk, repeat). Phases alternate: unattacked, attacked, ... with the same robots on the
same server. The attacker is one native connection naming ``--names`` (16) policy sessions, each sending an
observation at ``--hz`` (10) per name and reading its replies. It prints the robots' round-trip p50/p99 on each
side and their ratio, and the share of the chunks the attacker got while attacking.

The connection is the unit of fairness: its names wait on its one turn, so it weighs what one robot weighs.
``--server-args "--session-id-turns 16"`` gives each name a turn of its own, as every name had before.

    .venv/bin/python benchmarks/attack_session_ids.py
    .venv/bin/python benchmarks/attack_session_ids.py --server-args "--session-id-turns 16"

The issue's target: the robots' p50 within 1.5x of unattacked.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
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


async def attack(url: str, names: int, hz: float, stats: dict[str, int], stop: asyncio.Event) -> None:
    """One connection, ``names`` session_ids, each sending at ``hz``; counts the replies by type."""
    image = np.random.default_rng(1).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    async with connect(url, proxy=None, max_size=None, compression=None) as ws:
        metadata = unpackb(await ws.recv())
        domain = metadata["defaults"].get("domain_name") or sorted(metadata["domains"])[0]
        await ws.send(packb({"type": "configure", "domain_name": domain}))

        async def read() -> None:
            async for message in ws:
                kind = str(unpackb(message).get("type"))
                stats[kind] = stats.get(kind, 0) + 1

        reader = asyncio.ensure_future(read())
        seq = 0
        while not stop.is_set():
            started = time.monotonic()
            seq += 1
            for k in range(names):
                await ws.send(packb({"type": "observation", "seq": seq, "image": image, "session_id": f"env-{k}"}))
            stats["sent"] = stats.get("sent", 0) + names
            await asyncio.sleep(max(0.0, 1.0 / hz - (time.monotonic() - started)))
        reader.cancel()


async def measure(args: argparse.Namespace, server: ServerProcess) -> None:
    url = f"ws://127.0.0.1:{server.port}{REALTIME_PATH}"
    robots = Robots(url, 224, args.robots)
    await robots.open()
    await robots.run(args.warmup)
    sides: dict[str, list[float]] = {"unattacked": [], "attacked": []}
    robot_chunks = attacker_chunks = 0
    for round_index in range(args.rounds):
        sides["unattacked"] += await robots.run(args.requests)
        stats: dict[str, int] = {}
        stop = asyncio.Event()
        attacker = asyncio.ensure_future(attack(url, args.names, args.hz, stats, stop))
        await asyncio.sleep(args.ramp_s)
        before = stats.get("action_chunk", 0)
        times = await robots.run(args.requests)
        during = stats.get("action_chunk", 0) - before
        sides["attacked"] += times
        robot_chunks += len(times)
        attacker_chunks += during
        stop.set()
        await attacker
        print(f"round {round_index + 1}/{args.rounds}: attacker {stats}", flush=True)
        await asyncio.sleep(args.ramp_s)
    await robots.close()
    load = os.getloadavg()
    print(
        f"\nattack: one connection naming {args.names} session_ids at {args.hz:g} Hz each, {args.robots} robots, "
        f"server args {args.server_args!r}, {args.rounds} rounds of {args.requests} round trips per side; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores"
    )
    for name, values in sides.items():
        print(f"{name:<11} {summary(values)}")
    base, hit = sides["unattacked"], sides["attacked"]
    print(
        f"ratio attacked/unattacked: p50 {percentile(hit, 50) / percentile(base, 50):.2f}x, "
        f"p99 {percentile(hit, 99) / percentile(base, 99):.2f}x (target: p50 within 1.5x); the attacker got "
        f"{attacker_chunks / max(1, attacker_chunks + robot_chunks):.0%} of the chunks while attacking"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--robots", type=int, default=4)
    parser.add_argument("--names", type=int, default=16)
    parser.add_argument("--hz", type=float, default=10.0, help="observations per second per name")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=20, help="round trips per robot per phase")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--ramp-s", type=float, default=3.0)
    parser.add_argument("--server-args", default="")
    args = parser.parse_args()
    server = ServerProcess(["--tiny", "distilled", *shlex.split(args.server_args)])
    try:
        server.wait_ready()
        asyncio.run(measure(args, server))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
