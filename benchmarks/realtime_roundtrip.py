"""Client-observed round trip of the realtime endpoint, against the server's own model time.

Starts ``cosmos3-serve`` (a tiny distilled checkpoint unless ``--model`` or ``--url`` says otherwise)
in a subprocess on 127.0.0.1, connects a blocking :class:`robot_clients.PolicyClient`, and sends one
224×224 RGB observation at a time, waiting for each chunk (a closed control loop). It prints p50/p99
of:

* ``round trip``: what the robot sees, from ``infer()`` called to the chunk in hand;
* ``model``: the engine's own model time (VAE encode + denoising), from the chunk's ``timing``;
* ``engine``: the whole ``predict_actions`` call (model + its pre/post-processing);
* ``overhead``: round trip minus model time, per request: the cost of serving (codec, socket, queue,
  thread hand-offs, request building), which is what this server is responsible for;
* ``echo``: a raw WebSocket echo of the same observation bytes (a ``websockets`` client against an echo
  server in a process of its own, on the same machine, measured in blocks before and after the round trips),
  and the overhead's p50 as a multiple of the echo's p50: what serving costs beyond moving the bytes, in a
  unit that follows the machine's load.

Run it::

    .venv/bin/python benchmarks/realtime_roundtrip.py                  # tiny distilled, 200 requests
    .venv/bin/python benchmarks/realtime_roundtrip.py --requests 500 --size 224
    .venv/bin/python benchmarks/realtime_roundtrip.py --url ws://host:8000 --domain droid_lerobot
    .venv/bin/python benchmarks/realtime_roundtrip.py --against 468070b --rounds 5   # side by side

``--against REV`` checks ``REV`` out in a temporary git worktree and runs its own copy of this benchmark
and this tree's, alternating, ``--rounds`` times, each in a process of its own on the same virtualenv (so
client and server are each tree's own), then prints each tree's serving overhead per round and the ratio
of their medians: a change's cost measured side by side, in one run, under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from robot_clients import PolicyClient  # noqa: E402
from robot_clients.protocol import observation_frame  # noqa: E402
from robot_clients.wire_codec import packb  # noqa: E402

# An echo server in a process of its own: it prints its port, then sends every binary frame back.
ECHO_SERVER = """
import asyncio
from websockets.asyncio.server import serve

async def echo(ws):
    async for message in ws:
        await ws.send(message)

async def main():
    async with serve(echo, "127.0.0.1", 0, max_size=None, compression=None) as listener:
        print(listener.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()

asyncio.run(main())
"""


def percentile(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def summarize(name: str, values) -> str:
    return (
        f"{name:<22} p50 {percentile(values, 50):8.2f} ms   p99 {percentile(values, 99):8.2f} ms   "
        f"mean {np.mean(values):8.2f} ms"
    )


class ServerProcess:
    """``python -m policy_server.assembly.cli`` on an ephemeral port; stops it with SIGTERM on exit."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        # No HTTP sidecar: these benchmarks need only the WebSocket port, and a fixed sidecar port (8001)
        # would collide with any other server on the machine.
        command = [
            sys.executable,
            "-m",
            "policy_server.assembly.cli",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-http",
            *args,
        ]
        self.proc = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.port: int | None = None
        self.log: list[str] = []
        self._port_known = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            match = re.search(r"listening on wss?://[^:]+:(\d+)/", line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._port_known.set()

    def wait_ready(self, timeout: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout
        while not self._port_known.wait(0.2):  # fail at once if the server dies before listening
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server did not start:\n" + "".join(self.log))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            health = get_health(f"http://127.0.0.1:{self.port}/healthz")
            if health.get("status") == "ready":
                return health
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError("server never became ready:\n" + "".join(self.log))

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(60)


def get_health(url: str) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as response:
            return json.loads(response.read())
    except OSError:
        return {}


def echo_round_trips(payloads: list[bytes], count: int) -> list[float]:
    """Round trips (ms) of a raw WebSocket echo of ``payloads`` (in turn), ``count`` of them after a warmup."""
    from websockets.sync.client import connect

    server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with connect(f"ws://127.0.0.1:{port}", max_size=None, compression=None) as ws:
            times = []
            for i in range(count + 10):
                started = time.perf_counter()
                ws.send(payloads[i % len(payloads)])
                ws.recv()
                if i >= 10:
                    times.append((time.perf_counter() - started) * 1e3)
            return times
    finally:
        server.terminate()
        server.wait()


def minor_faults(pid: int | None) -> int | None:
    """The minor page faults of process ``pid`` so far (None: not on this machine, or no pid)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7]) if pid else None
    except OSError:
        return None


def run_round_trips(
    url: str, domain: str | None, size: int, requests: int, warmup: int, server_pid: int | None = None
) -> dict:
    """Closed loop: one observation, wait for its chunk, repeat. Returns per-request measurements (and the
    started server's page faults a request: memory it gives back and takes again each time)."""
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(8)]
    # The same bytes as the robot's observation frames (the seq and timestamp differ, not the size).
    payloads = [packb({**observation_frame(0, {"image": image}, {}), "timestamp": 0.0}) for image in images]
    echo = echo_round_trips(payloads, requests // 2)
    with PolicyClient(url) as client:
        domain = domain or client.metadata["defaults"].get("domain_name") or sorted(client.metadata["domains"])[0]
        client.configure(domain_name=domain)
        for i in range(warmup):
            client.infer({"image": images[i % len(images)]}, timeout=60)
        round_trip, model, engine, server_total = [], [], [], []
        faults_before = minor_faults(server_pid)
        for i in range(requests):
            started = time.perf_counter()
            chunk = client.infer({"image": images[i % len(images)]}, timeout=60)
            round_trip.append((time.perf_counter() - started) * 1e3)
            model.append(chunk.timing["model_ms"])
            engine.append(chunk.timing["engine_ms"])
            server_total.append(chunk.timing["observation_age_ms"])
        faults_after = minor_faults(server_pid)
    echo += echo_round_trips(payloads, requests - requests // 2)
    faults = (
        (faults_after - faults_before) / requests if faults_before is not None and faults_after is not None else None
    )
    return {
        "domain": domain,
        "metadata": client.metadata,
        "round_trip_ms": round_trip,
        "model_ms": model,
        "engine_ms": engine,
        "server_ms": server_total,
        "overhead_ms": [r - m for r, m in zip(round_trip, model)],
        "outside_engine_ms": [r - e for r, e in zip(round_trip, engine)],
        "echo_ms": echo,
        "server_page_faults_per_request": faults,
    }


def report(result: dict, size: int) -> None:
    meta = result["metadata"]
    print(
        f"model {meta.get('model')} ({meta.get('variant')}), domain {result['domain']}, "
        f"{size}x{size} RGB, {len(result['round_trip_ms'])} sequential requests"
    )
    print(summarize("round trip (client)", result["round_trip_ms"]))
    print(summarize("model (server)", result["model_ms"]))
    print(summarize("engine call (server)", result["engine_ms"]))
    print(summarize("obs age at send", result["server_ms"]))
    print(summarize("overhead = rt - model", result["overhead_ms"]))
    print(summarize("rt - engine call", result["outside_engine_ms"]))
    print(summarize("raw WebSocket echo", result["echo_ms"]))
    p50_rt, p50_model = percentile(result["round_trip_ms"], 50), percentile(result["model_ms"], 50)
    print(
        f"serving overhead at p50: {p50_rt - p50_model:.2f} ms "
        f"({(p50_rt / p50_model - 1) * 100:.1f}% on top of the model)"
    )
    if result.get("server_page_faults_per_request") is not None:
        print(f"server page faults a request: {result['server_page_faults_per_request']:.1f} (its heap kept: ~0)")
    p50_overhead, p50_echo = percentile(result["overhead_ms"], 50), percentile(result["echo_ms"], 50)
    print(
        f"overhead p50 / echo p50: {p50_overhead:.2f} / {p50_echo:.2f} ms = {p50_overhead / p50_echo:.2f}x "
        "(a raw WebSocket echo of the same bytes)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="benchmark a running server instead of starting one")
    parser.add_argument("--model", help="checkpoint for the started server (default: --tiny distilled)")
    parser.add_argument("--tiny", default="distilled", help="tiny variant when no --model (default distilled)")
    parser.add_argument("--domain", default=None, help="embodiment (default: the model's default domain)")
    parser.add_argument("--size", type=int, default=224, help="image side in pixels (default 224)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--json", help="also write the raw measurements to this file")
    parser.add_argument("--against", metavar="REV", help="also run REV's own copy, side by side (see above)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations with --against (default 3)")
    args = parser.parse_args(argv)
    if args.against:
        passed = ["--requests", str(args.requests), "--size", str(args.size), "--warmup", str(args.warmup)]
        passed += ["--tiny", args.tiny] + (["--model", args.model] if args.model else [])
        passed += ["--torch-threads", str(args.torch_threads)] if args.torch_threads else []
        return side_by_side(args.against, args.rounds, passed)

    server = None
    url = args.url
    if url is None:
        server_args = ["--model", args.model] if args.model else ["--tiny", args.tiny]
        if args.torch_threads:
            server_args += ["--torch-threads", str(args.torch_threads)]
        server = ServerProcess(server_args)
        health = server.wait_ready()
        print(f"server ready: worker {health.get('worker')}")
        url = f"ws://127.0.0.1:{server.port}"
    try:
        pid = server.proc.pid if server is not None else None
        result = run_round_trips(url, args.domain, args.size, args.requests, args.warmup, pid)
    finally:
        if server is not None:
            server.stop()
    report(result, args.size)
    if args.json:
        Path(args.json).write_text(json.dumps({k: v for k, v in result.items() if k != "metadata"}))
    return 0


def side_by_side(rev: str, rounds: int, passed: list[str]) -> int:
    """This tree's and ``rev``'s own benchmark, alternating ``rounds`` times (see the module docstring)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="roundtrip-") as scratch:
        other = Path(scratch) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(other), rev],
            cwd=REPO_ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        trees = {"this tree": REPO_ROOT, rev: other}
        rows: dict[str, list[dict]] = {name: [] for name in trees}
        try:
            for round_ in range(1, rounds + 1):
                for name, root in trees.items():
                    out = Path(scratch) / f"{round_}.json"
                    script = root / "benchmarks" / "realtime_roundtrip.py"
                    done = subprocess.run(
                        [sys.executable, str(script), "--json", str(out), *passed],
                        cwd=root,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                    if done.returncode != 0:
                        raise RuntimeError(f"{name}'s benchmark failed:\n{done.stderr}")
                    result = json.loads(out.read_text())
                    faults = result.get("server_page_faults_per_request")
                    row = {
                        "faults": faults,
                        "overhead": percentile(result["overhead_ms"], 50),
                        "round_trip": percentile(result["round_trip_ms"], 50),
                        "model": percentile(result["model_ms"], 50),
                    }
                    rows[name].append(row)
                    print(
                        f"round {round_} {name:<12} overhead p50 {row['overhead']:6.2f} ms   round trip p50 "
                        f"{row['round_trip']:7.2f} ms   model p50 {row['model']:7.2f} ms"
                        + (f"   server page faults a request {faults:.1f}" if faults is not None else ""),
                        flush=True,
                    )
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(other)],
                cwd=REPO_ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
    medians = {name: float(np.median([row["overhead"] for row in found])) for name, found in rows.items()}
    mine, theirs = medians["this tree"], medians[rev]
    print(
        f"serving overhead, median of the rounds' p50: this tree {mine:.2f} ms, {rev} {theirs:.2f} ms: "
        f"{mine / theirs:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
