"""A robot's round trip while the WebSocket port is attacked, against the same robot unattacked.

Starts ``cosmos3-serve`` (tiny distilled, WebSocket port only) and one robot in closed loop (one 224x224
observation, wait for its chunk, repeat). The run alternates phases: unattacked, attacked, unattacked,
attacked, ... with the same robot on the same server, so both sides see the same machine load; the
attacker runs in a process of its own. It prints the robot's round-trip p50/p99 for each side and their
ratio, the server's resident memory (peak per side), and what the attacker got.

Attacks (one subcommand each; issue 18):

* ``observers``: ``--observers`` (1000) dashboard observers on ``/v1/observe``, each subscribed to the
  robot's session and reading what it is sent; refused ones retry every ``--retry-s`` (1 s: with the
  default cap of 16 observers that is also a flood of ~1000 refused handshakes a second);
* ``non-reading``: ``--clients`` (4) connections that flood frames and never read a reply; closed ones
  reconnect after ``--retry-s``.
* ``costly-frames`` (issue 25.2): ``--clients`` (1) sessions streaming ``--attack-side`` (4096) square
  camera frames at ``--attack-hz`` (30), as ``--attack-frame`` ``jpeg`` (about 100 KB each), ``raw``
  arrays or ``noise-jpeg`` (issue 36.2: 3.76 MB at 2048², about 90 ms each to decode), reading their
  replies: each costs the server decoding and resizing that its turn in the queue does not count.
  ``--robots`` (3) robots are measured, all at once.

* ``element-bursts`` (issue 45.1): ``--clients`` (4) connections sending, back to back and reading their
  replies, observation frames just under the 100,000-element budget: a map of 49,990 empty maps
  (``--attack-frame empty-maps``, 99,985 elements in 400 kB) or a list of 99,990 nils (``nils``). Each one is
  counted and decoded in full and then refused (``invalid_field``): what it costs is its decoding.
  ``--robots`` (4) robots are measured, all at once.

Run it::

    .venv/bin/python benchmarks/attack_websocket.py observers
    .venv/bin/python benchmarks/attack_websocket.py observers --observers 1000 --server-args "--max-observers 1000"
    .venv/bin/python benchmarks/attack_websocket.py non-reading --clients 4
    .venv/bin/python benchmarks/attack_websocket.py costly-frames --attack-side 4096 --attack-frame jpeg
    .venv/bin/python benchmarks/attack_websocket.py costly-frames --attack-side 2560 --attack-frame raw
    .venv/bin/python benchmarks/attack_websocket.py costly-frames --attack-side 2048 --attack-frame noise-jpeg \
        --attack-hz 69 --robots 3
    .venv/bin/python benchmarks/attack_websocket.py element-bursts --attack-frame empty-maps

The issue's target: the attacked p99 within 2x of the unattacked p99 (``costly-frames``: the robots'
p50 within 1.5x of unattacked).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from realtime_roundtrip import ServerProcess, percentile  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

from robot_clients.protocol import REALTIME_PATH  # noqa: E402
from robot_clients.wire_codec import packb, unpackb  # noqa: E402

# -- the robot ---------------------------------------------------------------------------------------


class Robot:
    """One native session in closed loop; ``run(n)`` returns n round trips in ms."""

    def __init__(self, url: str, size: int) -> None:
        self.url = url
        rng = np.random.default_rng(0)
        self.images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(8)]
        self.ws = None
        self.seq = 0
        self.session_id = ""

    async def open(self) -> None:
        self.ws = await connect(self.url, proxy=None, max_size=None, compression=None)
        metadata = unpackb(await self.ws.recv())
        self.session_id = metadata["session_id"]
        domain = metadata["defaults"].get("domain_name") or sorted(metadata["domains"])[0]
        await self.ws.send(packb({"type": "configure", "domain_name": domain}))
        assert unpackb(await self.ws.recv())["type"] == "session"

    async def run(self, count: int) -> list[float]:
        times = []
        for _ in range(count):
            self.seq += 1
            frame = packb({"type": "observation", "seq": self.seq, "image": self.images[self.seq % 8]})
            started = time.perf_counter()
            await self.ws.send(frame)
            while True:
                reply = unpackb(await asyncio.wait_for(self.ws.recv(), 120))
                if reply.get("seq") == self.seq:
                    break
            if reply["type"] != "action_chunk":
                raise RuntimeError(f"the robot got {reply}")
            times.append((time.perf_counter() - started) * 1e3)
        return times


# -- the attacker (a process of its own) -----------------------------------------------------------------


def count_outcome(stats: dict, exc: Exception) -> None:
    """Count how an attacking connection ended: refused (HTTP status), closed (code), or a socket error."""
    if isinstance(exc, InvalidStatus):
        key = f"refused_{exc.response.status_code}"
    elif isinstance(exc, ConnectionClosed):
        key = f"closed_{exc.rcvd.code if exc.rcvd else 1006}"
    else:
        key = "os_errors"
    stats[key] = stats.get(key, 0) + 1


async def attack_observers(port: int, count: int, session_id: str, retry_s: float, stats: dict) -> None:
    async def one() -> None:
        while True:
            try:
                async with connect(f"ws://127.0.0.1:{port}/v1/observe", proxy=None, max_size=None) as ws:
                    stats["accepted"] += 1
                    await ws.send(json.dumps({"type": "subscribe", "session_id": session_id}))
                    async for _ in ws:
                        stats["frames"] += 1
            except (InvalidStatus, ConnectionClosed, OSError) as exc:
                count_outcome(stats, exc)
            await asyncio.sleep(retry_s)

    await asyncio.gather(*(one() for _ in range(count)))


async def attack_non_reading(port: int, count: int, retry_s: float, stats: dict) -> None:
    bogus = packb({"type": "bogus"})  # answered with an error each: replies the attacker never reads

    async def one() -> None:
        while True:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            try:
                sock.connect(("127.0.0.1", port))
                sock.setblocking(False)
                async with connect(
                    f"ws://127.0.0.1:{port}{REALTIME_PATH}", sock=sock, max_queue=1, proxy=None, ping_interval=None
                ) as ws:
                    stats["accepted"] += 1
                    while True:
                        await ws.send(bogus)
                        stats["frames"] += 1
                        await asyncio.sleep(0)
            except (InvalidStatus, ConnectionClosed, OSError) as exc:
                count_outcome(stats, exc)
            finally:
                sock.close()
            await asyncio.sleep(retry_s)

    await asyncio.gather(*(one() for _ in range(count)))


def costly_frame(side: int, kind: str) -> np.ndarray | bytes:
    """A ``side``² camera frame of smooth content: as a raw array, or as a JPEG (about 100 KB at 4096²);
    ``noise-jpeg``: of noise, the costliest JPEG to decode (3.76 MB at 2048², quality 90; its entropy
    decoding does not shrink with the reduced-size decode)."""
    from PIL import Image

    if kind == "noise-jpeg":
        noise = np.random.default_rng(1).integers(0, 256, (side, side, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(noise).save(buffer, "JPEG", quality=90)
        return buffer.getvalue()
    small = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((side, side), Image.BILINEAR)
    if kind == "raw":
        return np.asarray(image)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=60)
    return buffer.getvalue()


async def attack_costly_frames(port: int, count: int, frame: np.ndarray | bytes, hz: float, stats: dict) -> None:
    async def one() -> None:
        while True:
            try:
                async with connect(f"ws://127.0.0.1:{port}{REALTIME_PATH}", proxy=None, max_size=None) as ws:
                    metadata = unpackb(await ws.recv())
                    domain = metadata["defaults"].get("domain_name") or sorted(metadata["domains"])[0]
                    await ws.send(packb({"type": "configure", "domain_name": domain}))
                    stats["accepted"] += 1

                    async def read() -> None:
                        async for message in ws:
                            kind = unpackb(message).get("type")
                            stats[kind] = stats.get(kind, 0) + 1

                    reader = asyncio.ensure_future(read())
                    seq = 0
                    while not reader.done():
                        seq += 1
                        await ws.send(packb({"type": "observation", "seq": seq, "image": frame}))
                        stats["frames"] += 1
                        await asyncio.sleep(1.0 / hz)
            except (InvalidStatus, ConnectionClosed, OSError) as exc:
                count_outcome(stats, exc)
            await asyncio.sleep(1.0)

    await asyncio.gather(*(one() for _ in range(count)))


def element_burst_frame(kind: str) -> bytes:
    """An observation just under the element budget: 49,990 empty maps (``empty-maps``) or 99,990 nils."""
    body: object = {str(i): {} for i in range(49_990)} if kind == "empty-maps" else [None] * 99_990
    return packb({"type": "observation", "seq": 1, "image": body})


async def attack_element_bursts(port: int, count: int, frame: bytes, stats: dict) -> None:
    async def one() -> None:
        while True:
            try:
                async with connect(f"ws://127.0.0.1:{port}{REALTIME_PATH}", proxy=None, max_size=None) as ws:
                    metadata = unpackb(await ws.recv())
                    domain = metadata["defaults"].get("domain_name") or sorted(metadata["domains"])[0]
                    await ws.send(packb({"type": "configure", "domain_name": domain}))
                    stats["accepted"] += 1

                    async def read() -> None:
                        async for message in ws:
                            reply = unpackb(message)
                            kind = str(reply.get("code") or reply.get("type"))
                            stats[kind] = stats.get(kind, 0) + 1

                    reader = asyncio.ensure_future(read())
                    while not reader.done():
                        await ws.send(frame)  # back to back: only the socket's backpressure paces it
                        stats["frames"] += 1
            except (InvalidStatus, ConnectionClosed, OSError) as exc:
                count_outcome(stats, exc)
            await asyncio.sleep(1.0)

    await asyncio.gather(*(one() for _ in range(count)))


def attacker_main(argv: list[str]) -> int:
    kind, port, count, session_id, retry_s = argv[0], int(argv[1]), int(argv[2]), argv[3], float(argv[4])
    stats = {"accepted": 0, "frames": 0}
    side, frame_kind, hz = int(argv[5]), argv[6], float(argv[7])

    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        if kind == "observers":
            attack = attack_observers(port, count, session_id, retry_s, stats)
        elif kind == "costly-frames":
            attack = attack_costly_frames(port, count, costly_frame(side, frame_kind), hz, stats)
        elif kind == "element-bursts":
            attack = attack_element_bursts(port, count, element_burst_frame(frame_kind), stats)
        else:
            attack = attack_non_reading(port, count, retry_s, stats)
        asyncio.ensure_future(attack)
        await stop.wait()
        # Report and go at once: an attacker does not close politely (its sockets just vanish).
        print(json.dumps(stats), flush=True)
        os._exit(0)

    asyncio.run(run())
    return 0


# -- the run ---------------------------------------------------------------------------------------------


class RssSampler:
    """Peak resident memory of a process, sampled every 0.1 s while ``running``."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.1)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def summary(values: list[float]) -> str:
    return f"p50 {percentile(values, 50):8.1f} ms   p99 {percentile(values, 99):8.1f} ms   n={len(values)}"


class Robots:
    """``count`` robots in closed loop at once; ``run(n)`` returns every robot's n round trips in ms."""

    def __init__(self, url: str, size: int, count: int) -> None:
        self.robots = [Robot(url, size) for _ in range(count)]

    @property
    def session_id(self) -> str:
        return self.robots[0].session_id

    async def open(self) -> None:
        for robot in self.robots:
            await robot.open()

    async def run(self, count: int) -> list[float]:
        return [t for times in await asyncio.gather(*(robot.run(count) for robot in self.robots)) for t in times]

    async def close(self) -> None:
        for robot in self.robots:
            await robot.ws.close()


async def measure(args: argparse.Namespace, server: ServerProcess) -> None:
    robot = Robots(f"ws://127.0.0.1:{server.port}{REALTIME_PATH}", args.size, args.robots)
    await robot.open()
    await robot.run(args.warmup)
    count = args.observers if args.attack == "observers" else args.clients
    sides: dict[str, dict] = {
        name: {"rt": [], "rss": 0, "server_cpu": 0.0, "attacker_cpu": 0.0, "wall": 0.0}
        for name in ("unattacked", "attacked")
    }
    attacker_stats = []
    server_process = psutil.Process(server.proc.pid)

    def cpu(process: psutil.Process) -> float:
        times = process.cpu_times()
        return times.user + times.system

    for round_index in range(args.rounds):
        started, server_cpu = time.monotonic(), cpu(server_process)
        with RssSampler(server.proc.pid) as rss:
            sides["unattacked"]["rt"] += await robot.run(args.requests)
        sides["unattacked"]["rss"] = max(sides["unattacked"]["rss"], rss.peak)
        sides["unattacked"]["server_cpu"] += cpu(server_process) - server_cpu
        sides["unattacked"]["wall"] += time.monotonic() - started
        attacker = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "_attacker",
                args.attack,
                str(server.port),
                str(count),
                robot.session_id,
                str(args.retry_s),
                str(args.attack_side),
                args.attack_frame,
                str(args.attack_hz),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        await asyncio.sleep(args.ramp_s)  # let the attack reach its steady state
        attacker_process = psutil.Process(attacker.pid)
        started, server_cpu, attacker_cpu = time.monotonic(), cpu(server_process), cpu(attacker_process)
        with RssSampler(server.proc.pid) as rss:
            sides["attacked"]["rt"] += await robot.run(args.requests)
        sides["attacked"]["rss"] = max(sides["attacked"]["rss"], rss.peak)
        sides["attacked"]["server_cpu"] += cpu(server_process) - server_cpu
        sides["attacked"]["attacker_cpu"] += cpu(attacker_process) - attacker_cpu
        sides["attacked"]["wall"] += time.monotonic() - started
        attacker.send_signal(signal.SIGTERM)
        out, _ = attacker.communicate(timeout=60)
        attacker_stats.append(json.loads(out.strip().splitlines()[-1]) if out.strip() else {})
        print(f"round {round_index + 1}/{args.rounds}: attacker {attacker_stats[-1]}", flush=True)
        await asyncio.sleep(args.ramp_s)  # the attack's connections go away
    await robot.close()

    load = os.getloadavg()
    print(
        f"\nattack: {args.attack} ({count} {'observers' if args.attack == 'observers' else 'clients'}, "
        f"retrying every {args.retry_s:g} s"
        + (
            f"; {args.attack_side}x{args.attack_side} {args.attack_frame} frames at {args.attack_hz:g} Hz"
            if args.attack == "costly-frames"
            else f"; {args.attack_frame} frames back to back"
            if args.attack == "element-bursts"
            else ""
        )
        + f"), {args.robots} robot(s), "
        f"server args {args.server_args!r}, {args.size}x{args.size} frames, {args.rounds} rounds of "
        f"{args.requests} round trips per side; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{os.cpu_count()} cores"
    )
    for name, side in sides.items():
        print(
            f"{name:<11} {summary(side['rt'])}   server RSS peak {side['rss'] / 2**20:7.1f} MiB   "
            f"CPU cores busy: server {side['server_cpu'] / side['wall']:.2f}, "
            f"attacker {side['attacker_cpu'] / side['wall']:.2f}"
        )
    base, hit = sides["unattacked"]["rt"], sides["attacked"]["rt"]
    print(
        f"ratio attacked/unattacked: p50 {percentile(hit, 50) / percentile(base, 50):.2f}x, "
        f"p99 {percentile(hit, 99) / percentile(base, 99):.2f}x (target: p99 within 2x; costly-frames: p50 within 1.5x)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_attacker":
        return attacker_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("attack", choices=("observers", "non-reading", "costly-frames", "element-bursts"))
    parser.add_argument("--observers", type=int, default=1000, help="observers the attacker keeps trying to hold")
    parser.add_argument("--clients", type=int, default=None, help="attacking connections (non-reading 4, costly 1)")
    parser.add_argument("--robots", type=int, default=1, help="robots measured at once (default 1)")
    parser.add_argument("--attack-side", type=int, default=4096, help="costly-frames: the frames' side")
    parser.add_argument(
        "--attack-frame",
        choices=("jpeg", "raw", "noise-jpeg", "empty-maps", "nils"),
        default=None,
        help="costly-frames: their form (jpeg); element-bursts: empty-maps or nils (empty-maps)",
    )
    parser.add_argument("--attack-hz", type=float, default=30.0, help="costly-frames: frames per second sent")
    parser.add_argument(
        "--retry-s",
        type=float,
        default=1.0,
        help="a refused or closed attacking connection tries again after this long (default 1)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="unattacked/attacked phase pairs (default 3)")
    parser.add_argument("--requests", type=int, default=60, help="round trips per phase (default 60)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--ramp-s", type=float, default=5.0, help="wait after starting/stopping the attack")
    parser.add_argument("--size", type=int, default=224, help="the robot's image side (default 224)")
    parser.add_argument("--server-args", default="", help="extra cosmos3-serve flags, e.g. '--max-observers 1000'")
    args = parser.parse_args(argv)
    if args.clients is None:
        args.clients = 1 if args.attack == "costly-frames" else 4
    if args.attack_frame is None:
        args.attack_frame = "empty-maps" if args.attack == "element-bursts" else "jpeg"
    server = ServerProcess(["--tiny", "distilled", *shlex.split(args.server_args)])
    try:
        health = server.wait_ready()
        print(f"server ready: worker {health.get('worker')}", flush=True)
        asyncio.run(measure(args, server))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
