"""What a robot's client keeps after a hostile server's floods (issue 46 item 4).

A fake server (a process of its own) sends a real ``metadata`` hello, then floods the robot with frames about
nothing it sent, then answers the robot's observation with a real chunk:

* ``chunks``: ``--count`` (40) ``action_chunk`` frames of ``--chunk-mib`` (40) MiB of actions, each with a
  ``seq`` the robot never sent;
* ``dropped``: ``--count`` (200,000) ``dropped`` frames, each with a reason of its own.

The robot (``AsyncPolicyClient``, in this process) connects, calls ``infer`` (which returns once the flood is
read: frames arrive in order) and then holds the client open; the script prints this process's resident
memory before the flood, at its peak, and after it (what the client keeps), against the bound of 128 MiB.
``--tree`` imports ``robot_clients`` from another checkout, to measure an older client the same way.

Run it::

    .venv/bin/python benchmarks/attack_client_flood.py chunks
    .venv/bin/python benchmarks/attack_client_flood.py dropped
    .venv/bin/python benchmarks/attack_client_flood.py chunks --tree /path/to/an/older/checkout
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

BOUND_MIB = 128.0
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / 2**20


async def serve(port_file: Path, attack: str, count: int, chunk_mib: float) -> None:
    from websockets.asyncio.server import serve as ws_serve

    from robot_clients.protocol import PROTOCOL_VERSION
    from robot_clients.wire_codec import packb, unpackb

    hello = packb({"type": "metadata", "protocol_version": PROTOCOL_VERSION, "session_id": "s", "defaults": {}})
    width = 64
    rows = max(1, int(chunk_mib * 2**20 / (4 * width)))
    big = np.zeros((rows, width), np.float32)

    async def handler(ws: Any) -> None:
        await ws.send(hello)
        if attack == "chunks":
            for i in range(count):
                frame = {"type": "action_chunk", "seq": 10_000_000 + i, "actions": big, "timing": {}}
                await ws.send(packb(frame))
        else:
            for i in range(count):
                await ws.send(packb({"type": "dropped", "seq": 10_000_000 + i, "reason": f"r{i}", "message": ""}))
        async for message in ws:
            frame = unpackb(message)
            if frame.get("type") == "observation":
                answer = {
                    "type": "action_chunk",
                    "seq": frame["seq"],
                    "actions": np.zeros((2, 3), np.float32),
                    "domain_id": 0,
                    "raw_action_dim": 3,
                    "action_horizon": 2,
                    "timing": {},
                }
                await ws.send(packb(answer))

    async with ws_serve(handler, "127.0.0.1", 0, max_size=None, compression=None) as listener:
        port_file.write_text(str(listener.sockets[0].getsockname()[1]))
        await asyncio.Future()


async def robot(url: str, samples: list[float]) -> dict[str, Any]:
    from robot_clients import AsyncPolicyClient

    client = AsyncPolicyClient(url, reconnect=False, max_message_bytes=64 * 2**20)
    await client.connect()
    try:
        started = time.monotonic()
        chunk = await client.infer(np.zeros((16, 16, 3), np.uint8), timeout=600)
        took = time.monotonic() - started
        gc.collect()
        await asyncio.sleep(0.5)
        samples.append(rss_mib())
        stats = client.stats
        return {
            "seq": chunk.seq,
            "took_s": took,
            "unsolicited": getattr(stats, "unsolicited", None),
            "dropped_names": len(stats.dropped),
        }
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attack", choices=["chunks", "dropped"])
    parser.add_argument("--count", type=int, default=None, help="frames in the flood (40 chunks, 200,000 drops)")
    parser.add_argument("--chunk-mib", type=float, default=40.0)
    parser.add_argument("--tree", type=Path, default=None, help="import robot_clients from this checkout")
    parser.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    count = args.count if args.count is not None else (40 if args.attack == "chunks" else 200_000)
    if args.tree is not None:
        sys.path.insert(0, str(args.tree.resolve()))
    if args.serve is not None:
        asyncio.run(serve(args.serve, args.attack, count, args.chunk_mib))
        return

    import robot_clients

    port_file = Path(f"/tmp/attack_client_flood.{os.getpid()}.port")
    port_file.unlink(missing_ok=True)
    server = subprocess.Popen(
        [sys.executable, __file__, args.attack, "--count", str(count), "--chunk-mib", str(args.chunk_mib)]
        + ["--serve", str(port_file)]
    )
    try:
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        url = f"ws://127.0.0.1:{port_file.read_text()}"
        import robot_clients.client  # noqa: F401 - loaded before the baseline, so it is not counted as kept

        gc.collect()
        before = rss_mib()
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak.append(rss_mib())
                time.sleep(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        after: list[float] = []
        result = asyncio.run(robot(url, after))
        stop.set()
        sampler.join()
    finally:
        server.terminate()
        server.wait()
        port_file.unlink(missing_ok=True)
    kept = after[0] - before
    what = f"{count} unsolicited {args.chunk_mib:g} MiB chunks" if args.attack == "chunks" else f"{count} drops"
    print(f"client from {Path(robot_clients.__file__).parent.parent}")
    print(f"flood: {what}; the infer after it answered (seq {result['seq']}) in {result['took_s']:.2f} s")
    print(f"counted unsolicited: {result['unsolicited']}; names in stats.dropped: {result['dropped_names']}")
    print(f"resident memory: before {before:.0f} MiB, peak {max(peak):.0f} MiB, after {after[0]:.0f} MiB")
    verdict = "within" if kept <= BOUND_MIB else "OVER"
    print(f"kept after the flood: {kept:+.0f} MiB (bound {BOUND_MIB:.0f} MiB: {verdict})")


if __name__ == "__main__":
    main()
