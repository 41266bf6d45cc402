"""What recording costs a robot's round trip: p50/p99 with recording on versus off, in one run.

Starts ``cosmos3-serve --tiny distilled --record-dir DIR --record-opt-in`` in a subprocess on 127.0.0.1
and runs closed-loop sessions one after another, alternating: a session that opts in (``configure``
``record: true``) and one that does not, same seed, same camera frames (a 480×640 camera, the size the
writer benchmark found the writer saturated at, plus a 224×224 second camera). The recorder's writer
thread and its ffmpeg run on the same two cores as the engine, so this measures the whole cost: the
session's O(1) calls and the writer competing for the CPU. It prints p50/p99 of the round trip for each
mode, their ratio, and the recorder's counters (frames recorded and dropped).

    .venv/bin/python benchmarks/recording_overhead.py                        # 4 pairs of 15 s sessions
    .venv/bin/python benchmarks/recording_overhead.py --pairs 6 --seconds 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import websockets.sync.client as ws_client

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realtime_roundtrip import ServerProcess, get_health, percentile  # noqa: E402

from robot_clients import protocol  # noqa: E402
from robot_clients.wire_codec import packb, unpackb  # noqa: E402

DOMAIN = "bridge_orig_lerobot"


def cameras(seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq)
    front = np.full((480, 640, 3), 90, np.uint8)
    front[:, (7 * seq) % 600 : (7 * seq) % 600 + 40] = 255  # something that moves, like a robot's arm
    front += rng.integers(0, 12, front.shape, dtype=np.uint8)  # camera noise
    wrist = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    return {"front": front, "wrist": wrist}


def session(url: str, record: bool, seconds: float, warmup: int) -> list[float]:
    """One closed-loop session: observation, wait for its chunk, the next. Round trips in ms."""
    trips = []
    with ws_client.connect(url, compression=None, proxy=None, max_size=2**24) as ws:
        unpackb(ws.recv())
        ws.send(packb(protocol.configure_frame({"domain_name": DOMAIN, "seed": 0, "control_hz": 10, "record": record})))
        reply = unpackb(ws.recv())
        assert reply.get("recording") is record, reply
        end, seq = None, 0
        while end is None or time.monotonic() < end:
            seq += 1
            frames = cameras(seq)
            sent = time.monotonic()
            ws.send(packb(protocol.observation_frame(seq, {"images": frames}, {})))
            reply = unpackb(ws.recv(timeout=120))
            if seq > warmup and reply["type"] == protocol.ACTION_CHUNK:
                trips.append((time.monotonic() - sent) * 1e3)
            if seq == warmup:
                end = time.monotonic() + seconds
    return trips


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4, help="on/off session pairs (default 4)")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per session (default 15)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured observations per session (default 3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="recording-overhead-") as directory:
        server = ServerProcess(["--tiny", "distilled", "--record-dir", str(Path(directory) / "rec"), "--record-opt-in"])
        try:
            server.wait_ready()
            url = f"ws://127.0.0.1:{server.port}{protocol.REALTIME_PATH}"
            trips: dict[bool, list[float]] = {True: [], False: []}
            for pair in range(args.pairs):
                for record in (True, False) if pair % 2 == 0 else (False, True):  # neither always goes first
                    trips[record] += session(url, record, args.seconds, args.warmup)
            health = get_health(f"http://127.0.0.1:{server.port}/healthz")
        finally:
            server.stop()
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (2-core machine shared with other jobs)")
    for record in (False, True):
        values = trips[record]
        print(
            f"recording {'on ' if record else 'off'}: {len(values):4d} round trips"
            f"   p50 {percentile(values, 50):7.1f} ms   p99 {percentile(values, 99):7.1f} ms"
        )
    for q in (50, 99):
        print(f"p{q} ratio on/off: {percentile(trips[True], q) / percentile(trips[False], q):.2f}")
    print(f"recorder: {health.get('recording')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
