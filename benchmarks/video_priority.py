"""How long a robot stalls while the HTTP sidecar runs forward_dynamics video jobs.

One robot runs a closed loop over the WebSocket (send an observation, wait for its chunk, send the
next), first alone, then while video jobs are submitted back to back to ``/v1/videos``. Reported: the
robot's round trip (p50 / p90 / p99 / max, ms), the queue time the server measured for its
observations, and the engine time of one video job. Priority is per job: a waiting observation always
goes before the next video job, but a running job is never interrupted, so the worst stall is about
one video job's engine time plus one chunk.

Run (real tiny model, CPU)::

    .venv/bin/python benchmarks/video_priority.py --seconds 10 --video-actions 32 --video-size 64
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

import policy_server  # noqa: F401  (first: sets OMP_WAIT_POLICY=PASSIVE before torch loads)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from lockstep_robot import lockstep_chunks  # noqa: E402
from server_fixtures import DOMAIN, ServerThread, tiny_engine_loader  # noqa: E402

from policy_server.sidecar_settings import SidecarSettings  # noqa: E402


def _png_b64(image: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _percentiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return (
        f"n={len(values):4d}  p50 {pick(0.5):7.1f}  p90 {pick(0.9):7.1f}  p99 {pick(0.99):7.1f}  "
        f"max {ordered[-1]:7.1f} ms"
    )


def robot_loop(url: str, seconds: float, image: np.ndarray) -> tuple[list[float], list[float]]:
    """Closed loop for ``seconds``; returns (round trips, server-side queue times) in ms."""
    chunks = lockstep_chunks(url, image, seconds, {"domain_name": DOMAIN})
    return [round_trip for round_trip, _ in chunks], [timing["queue_ms"] for _, timing in chunks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--video-actions", type=int, default=32, help="actions per video job (T)")
    parser.add_argument("--video-size", type=int, default=64, help="first frame side, pixels")
    parser.add_argument("--image-size", type=int, default=224, help="robot camera side, pixels")
    args = parser.parse_args()

    image = np.random.default_rng(0).integers(0, 256, (args.image_size, args.image_size, 3), dtype=np.uint8)
    first_frame = np.random.default_rng(1).integers(0, 256, (args.video_size, args.video_size, 3), dtype=np.uint8)
    video_body = {
        "action": np.zeros((args.video_actions, 10)).tolist(),
        "input_reference": _png_b64(first_frame),
        "domain_name": DOMAIN,
        "seed": 0,
    }
    with (
        tempfile.TemporaryDirectory() as data_dir,
        ServerThread(tiny_engine_loader("distilled"), http=SidecarSettings(data_dir=Path(data_dir), port=0)) as server,
    ):
        http = httpx.Client(base_url=f"http://127.0.0.1:{server.sidecar.port}", trust_env=False, timeout=60)
        # Warm the video path: the first rollout pays one-time costs.
        for _ in range(2):
            job_id = http.post("/v1/videos", json=video_body).json()["id"]
            while http.get(f"/v1/videos/{job_id}").json()["status"] not in ("completed", "failed"):
                time.sleep(0.02)
        alone = robot_loop(server.url, args.seconds, image)

        stop = threading.Event()
        submitted: list[str] = []

        def submit_jobs() -> None:  # keep two jobs waiting at all times
            while not stop.is_set():
                counts = http.get("/metrics").text
                waiting = sum(
                    float(line.split()[-1])
                    for line in counts.splitlines()
                    if line.startswith('cosmos3_video_jobs{status="queued"}')
                )
                if waiting < 2:
                    submitted.append(http.post("/v1/videos", json=video_body).json()["id"])
                time.sleep(0.05)

        submitter = threading.Thread(target=submit_jobs, daemon=True)
        submitter.start()
        time.sleep(0.5)
        busy = robot_loop(server.url, args.seconds, image)
        stop.set()
        submitter.join()
        jobs = [http.get(f"/v1/videos/{job_id}").json() for job_id in submitted]
        finished = [job for job in jobs if job["status"] == "completed"]
        metrics = http.get("/metrics").text
        samples = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line and not line.startswith("#"))
        model_sum = float(samples['cosmos3_request_model_seconds_sum{kind="video"}'])
        model_count = float(samples['cosmos3_request_model_seconds_count{kind="video"}'])
        http.close()  # the data directory goes away with the server

    print(
        f"video job: T={args.video_actions} actions, {args.video_size}px first frame; "
        f"engine time per job (mean of {int(model_count)}): {model_sum / max(model_count, 1) * 1e3:.0f} ms; "
        f"{len(finished)} jobs completed during the busy phase"
    )
    print(f"robot round trip, alone:           {_percentiles(alone[0])}")
    print(f"robot round trip, with video jobs: {_percentiles(busy[0])}")
    print(f"server queue time, alone:          {_percentiles(alone[1])}")
    print(f"server queue time, with video:     {_percentiles(busy[1])}")


if __name__ == "__main__":
    main()
