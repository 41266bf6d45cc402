"""Which torch thread count and OpenMP wait policy should the engine worker use on this machine?

For each combination of ``--torch-threads`` (1, or every core) and ``OMP_WAIT_POLICY`` (PASSIVE, ACTIVE)
this starts ``cosmos3-serve --tiny distilled`` and measures, with a closed-loop client sending 224×224
frames:

1. ``alone``: nothing else running;
2. ``busy core``: another process spinning on one core (a robot stack, a simulator, a second model);
3. ``streaming``: a second robot streaming frames at 30 Hz while ``/healthz`` is probed at 20 Hz, so
   the event loop has real work (decoding frames, answering, superseding) during every inference.

It prints the round trip and the engine's model time (p50/p99) and, for the streaming case, how long
``/healthz`` took while inferences ran (the event loop's responsiveness).

    .venv/bin/python benchmarks/worker_threads.py [--requests 40]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realtime_roundtrip import ServerProcess, percentile, run_round_trips  # noqa: E402

from robot_clients import PolicyClient  # noqa: E402


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


class BusyCore:
    """A process that keeps one core busy for the duration of a ``with`` block."""

    def __enter__(self):
        self.proc = multiprocessing.Process(target=_spin, args=(time.monotonic() + 3600,), daemon=True)
        self.proc.start()
        return self

    def __exit__(self, *exc_info):
        self.proc.terminate()
        self.proc.join()


class StreamingNeighbour:
    """A second robot streaming 224×224 frames at ``hz`` and a /healthz prober at 20 Hz."""

    def __init__(self, url: str, health_url: str, domain: str, hz: float = 30.0) -> None:
        self.url, self.health_url, self.domain, self.hz = url, health_url, domain, hz
        self.health_ms: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._stream), threading.Thread(target=self._probe)]

    def _stream(self) -> None:
        image = np.random.default_rng(1).integers(0, 256, (224, 224, 3), dtype=np.uint8)
        with PolicyClient(self.url) as client:
            client.configure(domain_name=self.domain)
            while not self._stop.is_set():
                client.submit({"image": image})
                time.sleep(1.0 / self.hz)

    def _probe(self) -> None:
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self._stop.is_set():
            started = time.perf_counter()
            with opener.open(self.health_url, timeout=5) as response:
                response.read()
            self.health_ms.append((time.perf_counter() - started) * 1e3)
            time.sleep(0.05)

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        for thread in self._threads:
            thread.join()


def measure(threads: int, policy: str, requests: int) -> list[tuple[str, dict, list[float] | None]]:
    server = ServerProcess(["--tiny", "distilled", "--torch-threads", str(threads)], env={"OMP_WAIT_POLICY": policy})
    health = server.wait_ready()
    assert health["worker"]["omp_wait_policy"] == policy, health
    url = f"ws://127.0.0.1:{server.port}"
    rows = []
    try:
        rows.append(("alone", run_round_trips(url, None, 224, requests, 5), None))
        with BusyCore():
            rows.append(("busy core", run_round_trips(url, None, 224, requests, 3), None))
        domain = rows[0][1]["domain"]
        with StreamingNeighbour(url, f"http://127.0.0.1:{server.port}/healthz", domain) as neighbour:
            result = run_round_trips(url, domain, 224, requests, 3)
        rows.append(("streaming", result, neighbour.health_ms))
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores available; tiny distilled checkpoint, 224x224 RGB, closed loop")
    header = (
        f"{'threads':>7} {'wait':>8} {'scenario':>10} | {'rt p50':>8} {'rt p99':>8} | "
        f"{'model p50':>9} {'model p99':>9} | {'healthz p50':>11} {'p99':>7}"
    )
    print(header)
    print("-" * len(header))
    for threads in sorted({cores, 1}, reverse=True):
        for policy in ("PASSIVE", "ACTIVE"):
            for scenario, result, health in measure(threads, policy, args.requests):
                rt, model = result["round_trip_ms"], result["model_ms"]
                health_text = (
                    f"{percentile(health, 50):11.1f} {percentile(health, 99):7.1f}" if health else f"{'':>11} {'':>7}"
                )
                print(
                    f"{threads:>7} {policy:>8} {scenario:>10} | {percentile(rt, 50):8.1f} {percentile(rt, 99):8.1f} | "
                    f"{percentile(model, 50):9.1f} {percentile(model, 99):9.1f} | {health_text}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
