"""A robot's round trip while one HTTP client keeps 16 action generations in flight (issue 18, item 8).

Starts ``python -m policy_server.assembly.cli --tiny distilled`` as a subprocess on loopback (ephemeral ports),
then, in one run, side by side:

1. **unloaded**: one robot in closed loop over the WebSocket (send an observation, wait for its chunk,
   send the next) for ``--seconds``;
2. **attacked**: the same robot while an attacker process keeps ``--in-flight`` (16) requests to
   ``POST /v1/actions/generations`` outstanding at all times (each answered request is sent again at
   once; a 429 is retried after its ``Retry-After``, or at once with ``--no-backoff``).

Reported: the robot's round trip p50 / p99 (ms) in each phase and their ratios (the issue's target:
attacked p99 within 2x of unloaded), the chunks per second each side got, and the attacker's 429s.
``--server-repo`` runs another checkout's server (e.g. ``/work/main``) for a before/after comparison.

    .venv/bin/python benchmarks/attack_http_fairness.py --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from lockstep_robot import lockstep_chunks  # noqa: E402

from robot_clients.protocol import REALTIME_PATH  # noqa: E402

DOMAIN = "bridge_orig_lerobot"
_LISTENING = re.compile(r"listening on wss?://[^:]+:(\d+)/")
_HTTP = re.compile(r"HTTP sidecar listening on https?://[^ ]+:(\d+) ")


def start_server(repo: Path, data_dir: str, extra: list[str]) -> tuple[subprocess.Popen, int, int, list[str]]:
    cmd = [
        sys.executable,
        "-m",
        "policy_server.assembly.cli",
        "--tiny",
        "distilled",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--http-port",
        "0",
        "--log-level",
        "info",
        "--data-dir",
        data_dir,
        *extra,
    ]
    proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ports: dict[str, int] = {}
    log: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            log.append(line)
            if (m := _HTTP.search(line)) and "http" not in ports:
                ports["http"] = int(m.group(1))
            if (m := _LISTENING.search(line)) and "ws" not in ports:
                ports["ws"] = int(m.group(1))
            if "ready: serving" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(300):
        proc.kill()
        raise SystemExit("the server did not become ready:\n" + "".join(log[-30:]))
    return proc, ports["ws"], ports["http"], log


def _png_b64(image: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def attacker(http_port: int, in_flight: int, image_side: int, horizon: int, backoff: bool, stop, counts) -> None:
    """In its own process: keep ``in_flight`` requests outstanding until ``stop`` is set."""
    import httpx

    image = np.random.default_rng(7).integers(0, 256, (image_side, image_side, 3), dtype=np.uint8)
    body = {"domain_name": DOMAIN, "image": _png_b64(image), "action_horizon": horizon}

    async def one(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            try:
                response = await client.post("/v1/actions/generations", json=body)
            except httpx.HTTPError:
                counts["errors"] += 1
                continue
            if response.status_code == 200:
                counts["ok"] += 1
            elif response.status_code == 429:
                counts["refused"] += 1
                if backoff:
                    await asyncio.sleep(float(response.headers.get("retry-after", "1")))
            else:
                counts["errors"] += 1

    async def main() -> None:
        limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{http_port}", trust_env=False, timeout=300, limits=limits
        ) as client:
            await asyncio.gather(*(one(client) for _ in range(in_flight)))

    asyncio.run(main())


def robot_loop(ws_port: int, seconds: float, image: np.ndarray, horizon: int) -> dict[str, list[float]]:
    """Closed loop for ``seconds``; per chunk (ms): the round trip, and the server's queue and engine time."""
    chunks = lockstep_chunks(
        f"ws://127.0.0.1:{ws_port}{REALTIME_PATH}",
        image,
        seconds,
        {"domain_name": DOMAIN, "action_horizon": horizon},
        warmup=3,
        timeout=300,
    )
    return {
        "round_trip": [round_trip for round_trip, _ in chunks],
        "queue": [timing["queue_ms"] for _, timing in chunks],
        "engine": [timing["engine_ms"] for _, timing in chunks],
    }


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--in-flight", type=int, default=16, help="requests the attacker keeps outstanding")
    parser.add_argument("--image-side", type=int, default=224, help="camera frame side (robot and attacker)")
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument(
        "--no-backoff",
        dest="backoff",
        action="store_false",
        help="retry a 429 at once instead of after its Retry-After",
    )
    parser.add_argument(
        "--server-repo", type=Path, default=REPO, help="checkout whose server to run (default: this one)"
    )
    parser.add_argument("--server-arg", action="append", default=[], help="extra argument for the server (repeatable)")
    args = parser.parse_args()

    image = np.random.default_rng(0).integers(0, 256, (args.image_side, args.image_side, 3), dtype=np.uint8)
    data_dir = tempfile.TemporaryDirectory(prefix="attack-http-fairness-")
    proc, ws_port, http_port, _ = start_server(args.server_repo, data_dir.name, args.server_arg)
    try:
        alone = robot_loop(ws_port, args.seconds, image, args.horizon)
        manager = multiprocessing.Manager()
        counts = manager.dict(ok=0, refused=0, errors=0)
        stop = manager.Event()
        attack = multiprocessing.Process(
            target=attacker, args=(http_port, args.in_flight, args.image_side, args.horizon, args.backoff, stop, counts)
        )
        attack.start()
        time.sleep(2.0)  # the attack is under way
        ok_before = counts["ok"]
        started = time.monotonic()
        attacked = robot_loop(ws_port, args.seconds, image, args.horizon)
        elapsed = time.monotonic() - started
        ok_during = counts["ok"] - ok_before
        stop.set()
        attack.join(120)
        refused, errors = counts["refused"], counts["errors"]
    finally:
        proc.terminate()
        proc.wait(60)
        data_dir.cleanup()

    load = os.getloadavg()
    print(
        f"server: {args.server_repo}; tiny distilled, {args.image_side}px frames, horizon {args.horizon}; "
        f"attacker: {args.in_flight} requests in flight ({'honours' if args.backoff else 'ignores'} Retry-After); "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for name, phase, seconds in (("alone", alone, args.seconds), ("attacked", attacked, elapsed)):
        rt, queue, engine = phase["round_trip"], phase["queue"], phase["engine"]
        print(
            f"robot {name:9s} n={len(rt):4d}  round trip p50 {pct(rt, 50):7.1f}  p99 {pct(rt, 99):7.1f} ms  "
            f"{len(rt) / seconds:5.1f} chunks/s | server queue p50 {pct(queue, 50):6.1f} p99 {pct(queue, 99):6.1f} "
            f"| engine p50 {pct(engine, 50):6.1f} p99 {pct(engine, 99):6.1f} ms"
        )
    print(
        f"attacker:        {ok_during / elapsed:5.1f} chunks/s while the robot ran; {refused} refused (429), "
        f"{errors} other errors"
    )
    a, b = alone["round_trip"], attacked["round_trip"]
    print(
        f"ratio attacked/alone: p50 {pct(b, 50) / pct(a, 50):.2f}x  p99 {pct(b, 99) / pct(a, 99):.2f}x  "
        f"(target: p99 within 2x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
