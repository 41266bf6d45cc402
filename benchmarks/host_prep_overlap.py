"""The worker's host-prep overlap, on and off side by side: the engine's idle gap between calls, and throughput.

Robots in closed loop (each sends its next camera frame when its chunk arrives) feed the real engine
worker and queue; more robots than ``--max-batch``, so an observation is always waiting while a batch
runs. With ``--overlap-host-prep off`` the worker prepares each batch's host inputs (validation, the
frame resized and normalised into the canvas) on the engine thread, between two calls; with ``on`` a
host-prep thread prepares them during the call before. Runs alternate on/off ``--rounds`` times in one
process on one loaded engine, and the script prints per mode:

- the median idle gap (from one engine call's end to the next's start, while an observation waited),
- the median host preparation of one observation (the chunks' ``timing.preprocess_ms``),
- how many observations were prepared during an earlier call (overlapped) and on the engine thread,
- chunks per second, and the on/off ratios.

Run: ``.venv/bin/python benchmarks/host_prep_overlap.py [--robots 3 --max-batch 1 --observations 20]``;
the GPU suite (``benchmarks/gpu_suite.py``) runs :func:`compare` on the Edge shape.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: the engine worker's setting

import argparse  # noqa: E402
import asyncio  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _Robot:
    """Sends its next observation when its chunk arrives, ``observations`` times."""

    request_kind = "realtime"

    def __init__(self, name: str, queue, request, observations: int, finished) -> None:
        self.name, self.queue, self.request, self.left, self.finished = name, queue, request, observations, finished
        self.outcomes: list = []

    def send(self) -> None:
        from policy_server.engine.request_queue import PendingObservation

        self.left -= 1
        self.queue.put(
            PendingObservation(
                session_id=self.name, seq=self.left, request=self.request, owner=self, received_at=time.monotonic()
            )
        )

    def on_result(self, item, outcome) -> None:
        if outcome.error is not None:
            raise RuntimeError(f"{self.name}: {outcome.error}")
        self.outcomes.append(outcome)
        if self.left:
            self.send()
        else:
            self.finished(self)

    def on_dropped(self, item, reason) -> None:
        raise RuntimeError(f"{self.name} seq {item.seq} dropped: {reason}")


async def run_once(engine, requests: list, *, overlap: bool, max_batch: int, observations: int) -> dict:
    """One closed-loop run of ``len(requests)`` robots against a fresh worker; its figures."""
    from policy_server.engine.request_queue import RequestQueue
    from policy_server.engine.worker import BatchPolicy, EngineWorker

    loop = asyncio.get_running_loop()
    queue, done, finished = RequestQueue(), asyncio.Event(), set()
    worker = EngineWorker(
        lambda: engine, queue, loop, warmup=False, batching=BatchPolicy(max_batch=max_batch, overlap_host_prep=overlap)
    )
    worker.start()
    await worker.wait_ready()

    def robot_finished(robot) -> None:
        finished.add(robot.name)
        if len(finished) == len(robots):
            done.set()

    robots = [_Robot(f"robot-{i}", queue, request, observations, robot_finished) for i, request in enumerate(requests)]
    started = time.perf_counter()
    for robot in robots:
        robot.send()
    await done.wait()
    elapsed = time.perf_counter() - started
    queue.close()
    await loop.run_in_executor(None, worker.stop, 60)
    outcomes = [o for robot in robots for o in robot.outcomes]
    counters = worker.counters
    return {
        "gaps_ms": [g * 1e3 for g in worker.idle_gaps.samples],
        "prep_ms": [o.chunk.timing.preprocess_ms for o in outcomes],
        "overlapped": counters.overlapped_preps,
        "inline": counters.inline_preps,
        "chunks_per_s": len(outcomes) / elapsed,
    }


async def compare(engine, requests: list, *, max_batch: int, observations: int, rounds: int, log=print) -> dict:
    """Alternate on/off runs; per mode the median gap and prep (ms), the prep counts, median chunks/s."""
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for index in range(rounds):
        for mode in ("on", "off") if index % 2 == 0 else ("off", "on"):
            runs[mode].append(
                await run_once(engine, requests, overlap=mode == "on", max_batch=max_batch, observations=observations)
            )
            log(
                f"round {index + 1} {mode}: median gap {statistics.median(runs[mode][-1]['gaps_ms']):.2f} ms, "
                f"{runs[mode][-1]['chunks_per_s']:.2f} chunks/s"
            )
    figures = {}
    for mode, results in runs.items():
        figures[mode] = {
            "median_gap_ms": statistics.median(g for r in results for g in r["gaps_ms"]),
            "median_prep_ms": statistics.median(p for r in results for p in r["prep_ms"]),
            "overlapped_preps": sum(r["overlapped"] for r in results),
            "inline_preps": sum(r["inline"] for r in results),
            "chunks_per_s": statistics.median(r["chunks_per_s"] for r in results),
        }
    figures["throughput_on_over_off"] = figures["on"]["chunks_per_s"] / figures["off"]["chunks_per_s"]
    figures["robots"], figures["max_batch"], figures["observations"], figures["rounds"] = (
        len(requests),
        max_batch,
        observations,
        rounds,
    )
    return figures


def camera_requests(engine, robots: int, height: int, width: int, tier: int | None, horizon: int | None) -> list:
    from cosmos3_runtime.requests import ActionRequest

    rng = np.random.default_rng(0)
    domain = engine.default_domain()
    return [
        ActionRequest(
            domain_name=domain,
            image=rng.integers(0, 256, (height, width, 3), dtype=np.uint8),
            seed=i,
            resolution_tier=tier,
            action_horizon=horizon,
        )
        for i in range(robots)
    ]


def table(figures: dict) -> str:
    lines = [
        "| overlap | median gap ms | median prep ms | overlapped / inline preps | chunks/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for mode in ("on", "off"):
        f = figures[mode]
        lines.append(
            f"| {mode} | {f['median_gap_ms']:.2f} | {f['median_prep_ms']:.2f} | "
            f"{f['overlapped_preps']} / {f['inline_preps']} | {f['chunks_per_s']:.2f} |"
        )
    lines.append(
        f"\nthroughput on/off {figures['throughput_on_over_off']:.3f}; gap off/on "
        f"{figures['off']['median_gap_ms'] / max(figures['on']['median_gap_ms'], 1e-9):.1f}x"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint folder (default: a tiny distilled one, built)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--robots", type=int, default=3)
    parser.add_argument("--max-batch", type=int, default=1)
    parser.add_argument("--observations", type=int, default=20, help="per robot and run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--tier", type=int, default=256)
    parser.add_argument("--horizon", type=int, default=None)
    args = parser.parse_args(argv)

    import tempfile

    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint

    with tempfile.TemporaryDirectory(prefix="host-prep-") as workdir:
        model = args.model or build_tiny_checkpoint(Path(workdir) / "tiny", "distilled")
        engine = Cosmos3Engine.load(model, device=args.device)
        requests = camera_requests(engine, args.robots, args.height, args.width, args.tier, args.horizon)
        engine.predict_actions_batch(requests[:1])  # one-time costs out of the way
        print(
            f"load: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs; {args.robots} robots, "
            f"--max-batch {args.max_batch}, {args.height}x{args.width} frames, tier {args.tier}"
        )
        figures = asyncio.run(
            compare(engine, requests, max_batch=args.max_batch, observations=args.observations, rounds=args.rounds)
        )
    print(table(figures))
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
