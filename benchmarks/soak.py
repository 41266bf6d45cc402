"""Soak: many robot sessions streaming at a control rate against a real server, for a set time.

Starts ``cosmos3-serve --tiny <variant>`` as a subprocess on loopback (ephemeral ports, a temporary
data directory), then runs ``--sessions`` native-protocol sessions, each sending one observation every
``1/--hz`` seconds without waiting for the answer (how a streaming robot behaves; the server answers
the latest observation of each session and drops the superseded ones). Optionally one session is
openpi and a video job is submitted every ``--video-every-s`` seconds, so all lanes of the server run.

It stops by itself after ``--duration-s`` (or ``--max-requests`` observations) and reports, per window
of ``--window-s`` and in total: observations sent, chunks served, errors, dropped (by reason), p50/p99
round-trip latency (observation sent -> its chunk received), p50/p99 of the robots' wait in the
server's queue (``timing.queue_ms`` of each chunk), video jobs finished, and the server process's
resident memory; then the resident-memory drift from the end of the first window to the end. A JSON
summary goes to ``--json`` if given.

With ``--video-start-s T`` (and ``--video-every-s``) video jobs are submitted only from T seconds on,
so one run measures the robots without and with video jobs side by side: the report then has both
phases (round trip and queue wait p50/p99, and their difference: the wait video jobs add), and the
jobs submitted, completed and their submit-to-complete times. Choose T a multiple of ``--window-s``.
Robots streaming faster than the engine see their served observation's queue wait bounded by their send
period (a newer observation replaces a waiting one): for them the round trip is the measure of added wait.

    .venv/bin/python benchmarks/soak.py --sessions 8 --duration-s 240 --hz 10
    .venv/bin/python benchmarks/soak.py --sessions 16 --hz 10 --duration-s 600 --video-every-s 30 --video-start-s 120

Loopback only; nothing else is started or touched. The server is stopped with SIGTERM at the end
(and must exit 0: a clean drain is part of the soak).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from robot_clients.protocol import REALTIME_PATH  # noqa: E402
from robot_clients.wire_codec import packb, unpackb  # noqa: E402

DOMAIN = "bridge_orig_lerobot"
_LISTENING = re.compile(r"listening on wss?://[^:]+:(\d+)/")
_HTTP = re.compile(r"HTTP sidecar listening on https?://[^ ]+:(\d+) ")


@dataclass
class Window:
    start: float
    sent: int = 0
    served: int = 0
    errors: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)
    rss_mib: float | None = None
    videos_done: int = 0

    def summary(self, t0: float) -> dict:
        lat = np.asarray(self.latencies_ms) if self.latencies_ms else None
        return {
            "t_s": round(self.start - t0, 1),
            "sent": self.sent,
            "served": self.served,
            "errors": sum(self.errors.values()),
            "error_codes": dict(self.errors),
            "dropped": sum(self.dropped.values()),
            "dropped_reasons": dict(self.dropped),
            "p50_ms": round(float(np.percentile(lat, 50)), 1) if lat is not None else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 1) if lat is not None else None,
            "queue_p50_ms": _pct(self.queue_ms, 50),
            "queue_p99_ms": _pct(self.queue_ms, 99),
            "rss_mib": self.rss_mib,
            "videos_done": self.videos_done,
        }


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def _phase(windows: list[Window], seconds: float) -> dict:
    """Round trip and queue wait over a run of windows (a phase of the soak)."""
    lat = [x for w in windows for x in w.latencies_ms]
    queue = [x for w in windows for x in w.queue_ms]
    return {
        "windows": len(windows),
        "served_per_s": round(sum(w.served for w in windows) / max(seconds, 1e-9), 1),
        "p50_ms": _pct(lat, 50),
        "p99_ms": _pct(lat, 99),
        "queue_p50_ms": _pct(queue, 50),
        "queue_p99_ms": _pct(queue, 99),
    }


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.windows = [Window(self.t0)]
        self.stop = asyncio.Event()
        self.total_sent = 0
        self.disconnects = 0
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.http_port: int | None = None
        self.log: list[str] = []
        self.videos_submitted = 0
        self.video_job_s: list[float] = []  # submit -> seen completed, per completed job
        self.video_started_at: float | None = None

    @property
    def window(self) -> Window:
        return self.windows[-1]

    # -- the server ---------------------------------------------------------------------------------

    def start_server(self, data_dir: str) -> None:
        a = self.args
        cmd = [
            sys.executable,
            "-m",
            "policy_server.assembly.cli",
            "--tiny",
            a.variant,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--http-port",
            "0",
            "--data-dir",
            data_dir,
            "--log-level",
            "info",
            "--max-sessions",
            str(a.sessions + 4),
            *a.server_arg,
        ]
        self.proc = subprocess.Popen(
            cmd, cwd=a.server_repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.log.append(line)
                if (m := _HTTP.search(line)) and self.http_port is None:
                    self.http_port = int(m.group(1))
                if (m := _LISTENING.search(line)) and self.port is None:
                    self.port = int(m.group(1))
                if "ready: serving" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300):
            self.proc.kill()
            raise SystemExit("the server did not become ready:\n" + "".join(self.log[-30:]))

    def rss_mib(self) -> float:
        assert self.proc is not None
        return round(psutil.Process(self.proc.pid).memory_info().rss / 2**20, 1)

    # -- clients ------------------------------------------------------------------------------------

    async def native_session(self, index: int) -> None:
        url = f"ws://127.0.0.1:{self.port}{REALTIME_PATH}"
        rng = np.random.default_rng(index)
        image = rng.integers(0, 256, (self.args.image_side, self.args.image_side, 3), dtype=np.uint8)
        period = 1.0 / self.args.hz
        while not self.stop.is_set():
            try:
                async with connect(url, compression=None, max_size=None, proxy=None) as ws:
                    await ws.recv()
                    await ws.send(
                        packb(
                            {
                                "type": "configure",
                                "domain_name": DOMAIN,
                                "action_horizon": self.args.horizon,
                                "control_hz": self.args.hz,
                            }
                        )
                    )
                    await ws.recv()
                    sent_at: dict[int, float] = {}
                    reader = asyncio.create_task(self.read_native(ws, sent_at))
                    seq = 0
                    next_at = time.monotonic() + rng.uniform(0, period)
                    while not self.stop.is_set() and not reader.done():
                        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                        next_at += period
                        if self.args.max_requests and self.total_sent >= self.args.max_requests:
                            self.stop.set()
                            break
                        sent_at[seq] = time.monotonic()
                        await ws.send(packb({"type": "observation", "seq": seq, "image": image}))
                        self.window.sent += 1
                        self.total_sent += 1
                        seq += 1
                    reader.cancel()
            except (ConnectionClosed, OSError) as exc:
                if not self.stop.is_set():
                    self.disconnects += 1
                    print(f"session {index}: connection lost ({exc}); reconnecting", file=sys.stderr)
                    await asyncio.sleep(0.5)

    async def read_native(self, ws, sent_at: dict[int, float]) -> None:
        async for message in ws:
            frame = unpackb(message)
            kind, seq = frame.get("type"), frame.get("seq")
            started = sent_at.pop(seq, None) if seq is not None else None
            if kind == "action_chunk":
                self.window.served += 1
                if started is not None:
                    self.window.latencies_ms.append((time.monotonic() - started) * 1e3)
                self.window.queue_ms.append(frame["timing"]["queue_ms"])
            elif kind == "dropped":
                self.window.dropped[frame.get("reason")] += 1
            elif kind == "error":
                self.window.errors[frame.get("code")] += 1

    async def video_jobs(self) -> None:
        import base64
        import io

        import httpx
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(buffer, "PNG")
        body = {
            "domain_name": DOMAIN,
            "input_reference": base64.b64encode(buffer.getvalue()).decode(),
            "action": np.zeros((8, 10)).tolist(),
            "seed": 0,
        }
        try:  # the first phase runs without video jobs (--video-start-s)
            await asyncio.wait_for(self.stop.wait(), max(0.0, self.t0 + self.args.video_start_s - time.monotonic()))
            return
        except asyncio.TimeoutError:
            pass
        self.video_started_at = time.monotonic()
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.http_port}", trust_env=False, timeout=30
        ) as client:
            pending: dict[str, float] = {}  # job id -> when it was submitted
            next_submit = time.monotonic()
            while not self.stop.is_set():
                if time.monotonic() >= next_submit:
                    next_submit += self.args.video_every_s
                    response = await client.post("/v1/videos", json=body)
                    if response.status_code == 200:
                        pending[response.json()["id"]] = time.monotonic()
                        self.videos_submitted += 1
                    else:
                        self.window.errors[f"video_{response.status_code}"] += 1
                try:  # poll every second, so completion times are known to about a second
                    await asyncio.wait_for(self.stop.wait(), min(1.0, max(0.0, next_submit - time.monotonic())))
                except asyncio.TimeoutError:
                    pass
                for job, submitted in list(pending.items()):
                    status = (await client.get(f"/v1/videos/{job}")).json().get("status")
                    if status in ("completed", "failed"):
                        del pending[job]
                        self.window.videos_done += 1
                        if status == "failed":
                            self.window.errors["video_failed"] += 1
                        else:
                            self.video_job_s.append(time.monotonic() - submitted)

    async def windows_ticker(self) -> None:
        deadline = self.t0 + self.args.duration_s
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(self.stop.wait(), min(self.args.window_s, max(0.0, deadline - time.monotonic())))
            except asyncio.TimeoutError:
                pass
            self.window.rss_mib = self.rss_mib()
            self.print_window(self.window)
            if time.monotonic() >= deadline:
                self.stop.set()
                break
            self.windows.append(Window(time.monotonic()))

    def print_window(self, w: Window) -> None:
        s = w.summary(self.t0)
        print(
            f"t={s['t_s']:>6}s sent={s['sent']:>5} served={s['served']:>5} errors={s['errors']:>3} "
            f"dropped={s['dropped']:>5} p50={s['p50_ms']} ms p99={s['p99_ms']} ms "
            f"queue p50={s['queue_p50_ms']} p99={s['queue_p99_ms']} ms rss={s['rss_mib']} MiB "
            f"videos={s['videos_done']} {s['error_codes'] or ''}",
            flush=True,
        )

    async def run(self) -> dict:
        self.t0 = time.monotonic()  # the clock starts with the sessions, not with the model loading
        self.windows = [Window(self.t0)]
        tasks = [asyncio.create_task(self.native_session(i)) for i in range(self.args.sessions)]
        if self.args.video_every_s > 0:
            tasks.append(asyncio.create_task(self.video_jobs()))
        await self.windows_ticker()
        await asyncio.sleep(2.0)  # let the last answers arrive into the last window
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return self.report()

    def report(self) -> dict:
        windows = [w.summary(self.t0) for w in self.windows]
        lat = np.asarray([x for w in self.windows for x in w.latencies_ms]) if self.total_sent else np.asarray([])
        errors = Counter()
        dropped = Counter()
        for w in self.windows:
            errors.update(w.errors)
            dropped.update(w.dropped)
        rss = [w["rss_mib"] for w in windows if w["rss_mib"] is not None]
        phases = None
        if self.args.video_every_s > 0 and self.args.video_start_s > 0:
            split = self.t0 + self.args.video_start_s - 1e-3  # windows starting before it ran without videos
            before = [w for w in self.windows if w.start < split]
            after = [w for w in self.windows if w.start >= split]
            without = _phase(before, self.args.video_start_s)
            with_videos = _phase(after, time.monotonic() - self.t0 - self.args.video_start_s)
            added = {
                key: round(with_videos[key] - without[key], 1)
                if with_videos[key] is not None and without[key] is not None
                else None
                for key in ("queue_p50_ms", "queue_p99_ms", "p50_ms", "p99_ms")
            }
            phases = {"without_videos": without, "with_videos": with_videos, "added_wait_ms": added}
        return {
            "sessions": self.args.sessions,
            "hz": self.args.hz,
            "duration_s": round(time.monotonic() - self.t0, 1),
            "variant": self.args.variant,
            "image_side": self.args.image_side,
            "sent": sum(w["sent"] for w in windows),
            "served": sum(w["served"] for w in windows),
            "errors": sum(errors.values()),
            "error_codes": dict(errors),
            "dropped": sum(dropped.values()),
            "dropped_reasons": dict(dropped),
            # In flight when the soak stopped (sent in its last moments), not lost.
            "unanswered_at_stop": sum(w["sent"] for w in windows)
            - sum(w["served"] for w in windows)
            - sum(dropped.values())
            - sum(v for k, v in errors.items() if not k.startswith("video")),
            "videos_submitted": self.videos_submitted,
            "videos_done": sum(w["videos_done"] for w in windows),
            "video_job_s_p50": _pct(self.video_job_s, 50),
            "video_job_s_max": _pct(self.video_job_s, 100),
            "phases": phases,
            "disconnects": self.disconnects,
            "p50_ms": round(float(np.percentile(lat, 50)), 1) if lat.size else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 1) if lat.size else None,
            "rss_first_window_mib": rss[0] if rss else None,
            "rss_last_window_mib": rss[-1] if rss else None,
            "rss_drift_mib": round(rss[-1] - rss[0], 1) if len(rss) > 1 else None,
            "windows": windows,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--hz", type=float, default=10.0, help="observations per second per session")
    parser.add_argument("--duration-s", type=float, default=240.0)
    parser.add_argument("--max-requests", type=int, default=0, help="stop after this many observations (0: no cap)")
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--variant", default="distilled")
    parser.add_argument("--image-side", type=int, default=64)
    parser.add_argument("--horizon", type=int, default=8)
    parser.add_argument("--video-every-s", type=float, default=0.0, help="submit a video job this often (0: none)")
    parser.add_argument(
        "--video-start-s",
        type=float,
        default=0.0,
        help="submit video jobs only from this many seconds on (the time before is the baseline)",
    )
    parser.add_argument(
        "--server-repo",
        type=Path,
        default=REPO,
        help="checkout whose server to run (default: this one), e.g. /work/main for a before/after",
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra argument for cosmos3-serve, e.g. --server-arg=--video-step-interval-s=0.5",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = parser.parse_args(argv)

    soak = Soak(args)
    with tempfile.TemporaryDirectory(prefix="soak-") as data_dir:
        soak.start_server(data_dir)
        print(
            f"server ready on ports {soak.port}/{soak.http_port}, rss={soak.rss_mib()} MiB; "
            f"{args.sessions} sessions at {args.hz:g} Hz for {args.duration_s:g} s",
            flush=True,
        )
        try:
            report = asyncio.run(soak.run())
        finally:
            soak.proc.send_signal(signal.SIGTERM)
            try:
                exit_code = soak.proc.wait(60)
            except subprocess.TimeoutExpired:
                soak.proc.kill()
                exit_code = "killed"
    report["server_exit_code"] = exit_code
    summary = {k: v for k, v in report.items() if k != "windows"}
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
