"""Several robots on one model: ``policy_server`` against a lock-step server, 1 to 8 clients.

Three servers run side by side, each its own process, each with the same engine: the tiny distilled
Cosmos3 checkpoint (real model, no added delay; its cost per request is roughly fixed, ~0.1 s here):

* ``ours``: ``cosmos3-serve --tiny distilled --no-http --openpi-view-point concat_view`` (batching on, the
  default: sessions already waiting share transformer calls);
* ``ours mb1``: the same with ``--max-batch 1`` (no batching: one request per engine call);
* ``lock-step``: ``benchmarks/lockstep_baseline.py lockstep``: openpi-style, the model inline on the
  event loop, ``/healthz`` through the same loop.

For each client count (1, 2, 4, 8) and each server, in turn (the server order rotates with the count
so no server always follows the same one), N clients connect to the openpi endpoint and each runs a
closed loop for ``--seconds``: send the two-camera LIBERO observation of ``benchmarks/transport.py``
(two 224×224 cameras + state, composed side by side by both servers), wait for the actions, repeat.
Meanwhile a prober sends ``GET /healthz`` on the same port about ten times a second; every client
keeps the engine busy, so the probes land during inference. Printed per cell: chunks/s (all clients,
and per client: mean and slowest), round-trip p50/p99, the server's own engine-call time per reply
(p50; with batching one call answers several clients), ``/healthz`` p50/p99, and ratios to the
lock-step server at the same client count.

    .venv/bin/python benchmarks/concurrency.py                          # 8 s per cell, ~2.5 min
    .venv/bin/python benchmarks/concurrency.py --seconds 30 --passes 2 --clients 1,2,4,8,16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS.parent))
sys.path.insert(0, str(BENCHMARKS))

from lockstep_baseline import BaselineProcess, serving  # noqa: E402
from realtime_roundtrip import ServerProcess, percentile  # noqa: E402
from transport import CONNECT, PROMPT, SCENARIOS, VIEW_POINT, machine_description  # noqa: E402

from robot_clients.wire_codec import packb, unpackb  # noqa: E402

TARGETS = ("ours", "ours mb1", "lock-step")
OURS = ["--tiny", "distilled", "--no-http", "--openpi-view-point", VIEW_POINT]  # the sidecar is not measured
STARTERS = {
    "ours": lambda: ServerProcess(OURS),
    "ours mb1": lambda: ServerProcess([*OURS, "--max-batch", "1"]),
    "lock-step": lambda: BaselineProcess("lockstep", ["--view-point", VIEW_POINT]),
}


@dataclass
class Cell:
    """What one (client count, server) run measured."""

    clients: int
    target: str
    seconds: float
    latencies_ms: list[list[float]] = field(default_factory=list)  # per client
    rates: list[float] = field(default_factory=list)  # chunks/s per client
    engine_ms: list[float] = field(default_factory=list)  # the server's engine call, per reply
    health_ms: list[float] = field(default_factory=list)
    health_busy: int = 0  # probes answered "busy": true (only the policy server says so)

    @property
    def all_latencies(self) -> list[float]:
        return [x for client in self.latencies_ms for x in client]


async def closed_loop(
    url: str,
    frames: list[bytes],
    warmup: int,
    ready: asyncio.Event,
    start: asyncio.Event,
    until: list[float],
    latencies: list[float],
    engine_ms: list[float],
) -> float:
    """One robot: connect, warm up, then send / await reply until the window ends; returns chunks/s."""
    from websockets.asyncio.client import connect

    async with connect(url, **CONNECT) as ws:
        unpackb(await ws.recv())  # metadata
        for i in range(warmup):
            await ws.send(frames[i % len(frames)])
            await ws.recv()
        ready.set()
        await start.wait()
        began, done, last = time.perf_counter(), 0, time.perf_counter()
        while time.perf_counter() < until[0]:
            sent = time.perf_counter()
            await ws.send(frames[done % len(frames)])
            reply = await ws.recv()
            last = time.perf_counter()
            if isinstance(reply, str):
                raise RuntimeError(f"server error: {reply}")
            latencies.append((last - sent) * 1e3)
            engine_ms.append(unpackb(reply)["server_timing"]["infer_ms"])
            done += 1
        return done / (last - began) if done else 0.0


async def get_healthz(port: int) -> tuple[float, dict]:
    """One plain ``GET /healthz`` on the WebSocket port; (milliseconds to the whole response, body)."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        response = await reader.read()  # the server closes after answering
    finally:
        writer.close()
    elapsed = (time.perf_counter() - started) * 1e3
    try:
        body = json.loads(response.split(b"\r\n\r\n", 1)[1])
    except (IndexError, ValueError):
        body = {}
    return elapsed, body


async def probe_health(port: int, cell: Cell, until: list[float]) -> None:
    """``/healthz`` every 50-150 ms (jittered, so it does not lock to the inference phase)."""
    rng = random.Random(cell.clients)
    while time.perf_counter() < until[0]:
        elapsed, body = await asyncio.wait_for(get_healthz(port), timeout=30)
        cell.health_ms.append(elapsed)
        cell.health_busy += bool(body.get("busy"))
        await asyncio.sleep(rng.uniform(0.05, 0.15))


async def run_cell(port: int, target: str, clients: int, seconds: float, frames: list[bytes]) -> Cell:
    cell = Cell(clients, target, seconds)
    cell.latencies_ms = [[] for _ in range(clients)]
    start, until = asyncio.Event(), [float("inf")]
    readies = [asyncio.Event() for _ in range(clients)]
    url = f"ws://127.0.0.1:{port}/"
    robots = [
        asyncio.create_task(closed_loop(url, frames, 2, readies[i], start, until, cell.latencies_ms[i], cell.engine_ms))
        for i in range(clients)
    ]
    # The window opens once every robot is connected and warm (two round trips each).
    while not all(ready.is_set() for ready in readies):
        failed = [task for task in robots if task.done()]
        if failed:
            start.set()
            await asyncio.gather(*robots)  # raises the robot's error
            raise RuntimeError("a client ended before the measurement started")
        await asyncio.sleep(0.02)
    until[0] = time.perf_counter() + seconds
    start.set()
    prober = asyncio.create_task(probe_health(port, cell, until))
    cell.rates = list(await asyncio.gather(*robots))
    await prober
    return cell


def run_grid(ports: dict[str, int], counts: list[int], seconds: float, passes: int) -> list[Cell]:
    frames = [packb(obs) for obs in SCENARIOS[0].observations(seed=0)]
    cells = []
    for pass_index in range(passes):
        for index, clients in enumerate(counts):
            shift = (index + pass_index) % len(TARGETS)
            for target in TARGETS[shift:] + TARGETS[:shift]:
                cell = asyncio.run(run_cell(ports[target], target, clients, seconds, frames))
                cells.append(cell)
                print(f"  {clients} clients, {target}: {sum(cell.rates):.2f} chunks/s", file=sys.stderr, flush=True)
    return cells


def merge(cells: list[Cell]) -> dict[tuple[int, str], Cell]:
    """Pool the passes of each (clients, target) cell."""
    merged: dict[tuple[int, str], Cell] = {}
    for cell in cells:
        key = (cell.clients, cell.target)
        if key not in merged:
            merged[key] = Cell(cell.clients, cell.target, 0.0, [[] for _ in range(cell.clients)], [0.0] * cell.clients)
        pooled = merged[key]
        passes = sum(1 for c in cells if (c.clients, c.target) == key)
        for i in range(cell.clients):
            pooled.latencies_ms[i] += cell.latencies_ms[i]
            pooled.rates[i] += cell.rates[i] / passes
        pooled.health_ms += cell.health_ms
        pooled.engine_ms += cell.engine_ms
        pooled.health_busy += cell.health_busy
        pooled.seconds += cell.seconds
    return merged


def report(cells: list[Cell], counts: list[int]) -> None:
    merged = merge(cells)
    header = (
        f"{'clients':>7} {'server':<10} | {'chunks/s':>8} {'per client':>10} {'slowest':>7} | "
        f"{'rt p50':>7} {'rt p99':>7} {'engine p50':>10} | {'healthz p50':>11} {'p99':>7} {'n':>4} | "
        f"{'x lock rate':>11} {'x lock rt p99':>13} {'x lock hz p99':>13}"
    )
    print(header)
    print("-" * len(header))
    for clients in counts:
        lock = merged[(clients, "lock-step")]
        for target in TARGETS:
            cell = merged[(clients, target)]
            rt = cell.all_latencies
            total = sum(cell.rates)
            print(
                f"{clients:>7} {target:<10} | {total:8.2f} {np.mean(cell.rates):10.2f} {min(cell.rates):7.2f} | "
                f"{percentile(rt, 50):7.0f} {percentile(rt, 99):7.0f} {percentile(cell.engine_ms, 50):10.0f} | "
                f"{percentile(cell.health_ms, 50):11.1f} {percentile(cell.health_ms, 99):7.1f} "
                f"{len(cell.health_ms):>4} | {total / sum(lock.rates):11.2f} "
                f"{percentile(rt, 99) / percentile(lock.all_latencies, 99):13.2f} "
                f"{percentile(cell.health_ms, 99) / percentile(lock.health_ms, 99):13.3f}"
            )
        print()
    busy = {
        t: sum(merged[(c, t)].health_busy for c in counts) / sum(len(merged[(c, t)].health_ms) for c in counts)
        for t in TARGETS
        if t != "lock-step"
    }
    print(
        "share of /healthz probes answered while the engine was busy: "
        + ", ".join(f"{t} {share:.0%}" for t, share in busy.items())
        + " (the lock-step server cannot answer during inference, so it cannot say)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,2,4,8", help="client counts (default 1,2,4,8)")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per cell (default 8)")
    parser.add_argument("--passes", type=int, default=1, help="repeat the whole grid and pool (default 1)")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.clients.split(",")]

    print(machine_description())
    with serving(STARTERS) as servers:
        started = time.monotonic()
        cells = run_grid({name: process.port for name, process in servers.items()}, counts, args.seconds, args.passes)
        print(f"measured in {time.monotonic() - started:.0f} s; after: {machine_description()}")
    print(
        f"openpi endpoint, {SCENARIOS[0].description}, closed loop per client, {args.seconds:g} s per cell "
        f"x {args.passes} pass(es); prompt {PROMPT!r}"
    )
    report(cells, counts)
    if args.json:
        Path(args.json).write_text(json.dumps([vars(c) for c in cells]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
