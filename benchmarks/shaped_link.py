"""Robots on a real network: 480×640 cameras at 15 Hz over a 20 Mbit/s, 10 ms, 0.5 %-loss link.

Runs as root. Builds a shaped link between a ``server`` and a ``robot`` network namespace
(:mod:`netns_link`: netem where the kernel has it, a packet relay otherwise), starts in the server
namespace the policy server (``python -m policy_server.assembly.cli --tiny distilled``, its openpi endpoint composing
LIBERO's two cameras side by side), and for each row runs a robot process (``shaped_link_robot.py``) in the
robot namespace that captures one or two cameras at ``--hz`` for ``--seconds``:

* ``stream``: :class:`robot_clients.AsyncPolicyClient` on the native protocol as it ships: every tick the
  robot captures and calls ``submit``, which returns at once; the client keeps at most one observation
  waiting to be sent (a newer one replaces it) and writes it once the socket holds less than
  ``max_buffered_bytes`` of earlier ones; chunks are read as they come;
* ``stream-unbounded``: the same client with the bound off (``max_buffered_bytes=None``): ``submit`` writes
  every frame and waits while the socket's buffer is full, and the robot's loop with it;
* ``stream-nowait``: the bound off and the robot's loop never waits for the link: each tick's ``submit``
  runs as its own task (a robot that must not block its control loop). Nothing bounds what is in flight,
  so frames queue behind each other on the robot; one camera by default (the queue holds every frame not
  yet sent: ~280 MB after 20 s of raw frames), and the row stops 5 s after the last tick whatever is
  still queued;
* ``lockstep``: openpi's client loop against the server's openpi endpoint (``/openpi``, LIBERO's keys):
  capture, send, wait for the actions, then the next tick (a tick that has passed meanwhile is skipped,
  as a blocking ``infer`` does). Its encoded rows put the JPEG bytes under the camera keys by hand, as an
  openpi client would (``docs/openpi.md``).

Images (``--images``): ``raw`` arrays; ``jpeg`` (quality ``--quality``); ``jpeg-resized``, shrunk on the
robot to the served canvas first (the native client's ``images=`` and ``resize=True`` options; the
lock-step robot with :mod:`robot_clients.camera_frames` and :mod:`robot_clients.camera_frames`).

Per row it prints:

* ``sent/s``, ``answered/s``: observations the robot got onto the wire, chunks it got back;
* ``bytes/frame``: the observation frame as packed on the wire (msgpack, all cameras);
* ``latency``: capture to chunk in the robot's hand (p50, p99);
* ``age@server``: how old the observation was when it reached the server: latency minus the server's
  own time for it (arrival to reply sent: ``timing.observation_age_ms``; openpi's ``server_timing.total_ms``)
  minus the reply's trip down (taken as the link's one-way delay: the downlink carries only replies and
  acknowledgements). It includes encoding and resizing on the robot. Shown over the whole run (p50,
  p99) and as the median of the first and of the last third of the run: if it grows, frames are queueing
  on the way;
* ``wire``: the floor of that age: one frame's time on the link (its bytes, with TCP/IP and Ethernet
  headers, at the link's rate, plus the one-way delay). Age above it is time spent encoding or waiting
  behind earlier frames;
* ``queued@robot``: bytes written by the robot and not yet acknowledged by the server (the client's
  ``buffered_bytes``: the socket's send queue plus the transport's buffer), sampled every tick (p50, max);
* ``superseded``: observations replaced by a newer one before they ran: on the server (latest wins) or,
  for ``stream``, on the robot before they were sent.

``--outage AT,FOR``: one more row, ``stream`` with two cameras and resized JPEG, whose link is cut ``AT``
seconds into the row for ``FOR`` seconds; the robot (keepalive 0.5 s, timeout 1 s) reconnects, re-sends
its configuration, and the row counts reconnects and chunks older than one already delivered (must be 0).

Run::

    sudo .venv/bin/python benchmarks/shaped_link.py                      # every row, 20 s each
    sudo .venv/bin/python benchmarks/shaped_link.py --seconds 30 --cameras 2 --images raw,jpeg-resized
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(BENCHMARKS))

from netns_link import LinkShape, ShapedLink  # noqa: E402
from shaped_link_robot import CLIENTS, IMAGE_FORMS, Row  # noqa: E402

NATIVE_PORT = 8000


# -- the servers (in the server namespace) and the rows ---------------------------------------------------------

HEALTH_POLL = r"""
import json, sys, time, urllib.request
url, timeout = sys.argv[1], float(sys.argv[2])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    try:
        with opener.open(url, timeout=2) as response:
            if json.loads(response.read()).get("status") == "ready":
                sys.exit(0)
    except (OSError, ValueError):
        pass
    time.sleep(0.5)
sys.exit(1)
"""


class NamespacedServer:
    """A server process in the link's server namespace; its log goes to a file, shown if it fails."""

    def __init__(self, link: ShapedLink, name: str, argv: list[str], port: int, logdir: Path) -> None:
        self.link, self.name, self.port = link, name, port
        self.log_path = logdir / f"{name}.log"
        self._log = self.log_path.open("w")
        self.proc = link.popen("server", argv, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=self._log)

    def wait_ready(self, timeout: float = 300.0) -> None:
        url = f"http://{self.link.server_ip}:{self.port}/healthz"
        poll = self.link.run(
            "server", [sys.executable, "-c", HEALTH_POLL, url, str(timeout)], check=False, timeout=timeout + 10
        )
        if poll.returncode != 0 or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} did not become ready:\n{self.log_path.read_text()[-3000:]}")


def start_servers(link: ShapedLink, clients: set[str], logdir: Path) -> dict[str, NamespacedServer]:
    """The policy server: native robots on its realtime path, the lock-step (openpi) robot on ``/openpi``,
    whose sessions compose LIBERO's two cameras side by side (one camera: the first alone)."""
    server = NamespacedServer(
        link,
        "policy_server",
        [
            sys.executable,
            "-m",
            "policy_server.assembly.cli",
            "--tiny",
            "distilled",
            "--host",
            link.server_ip,
            "--port",
            str(NATIVE_PORT),
            "--no-http",
            "--log-level",
            "warning",
            "--openpi-view-point",
            "concat_view",
        ],
        NATIVE_PORT,
        logdir,
    )
    server.wait_ready()
    return {"policy_server": server}


def run_row(
    link: ShapedLink, row: Row, hz: float, seconds: float, outage: tuple[float, float] | None = None
) -> dict[str, Any]:
    """One robot process in the robot namespace; its measurements as a dict. ``outage`` (at, for): the link
    is cut ``at`` seconds into the row for ``for`` seconds (the robot reconnects)."""
    url = f"ws://{link.server_ip}:{NATIVE_PORT}/" + ("openpi" if row.client == "lockstep" else "")
    argv = [
        sys.executable,
        str(BENCHMARKS / "shaped_link_robot.py"),
        "--client",
        row.client,
        "--cameras",
        str(row.cameras),
        "--images",
        row.images,
        "--quality",
        str(row.quality),
        "--hz",
        str(hz),
        "--seconds",
        str(seconds),
        "--url",
        url,
    ] + (["--reconnect"] if outage else [])
    robot = link.popen("robot", argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if outage is not None:
            robot.stdout.readline()  # "started": connected and configured, its loop begins
            time.sleep(outage[0])
            link.cut()
            time.sleep(outage[1])
            link.restore()
        stdout, stderr = robot.communicate(timeout=seconds + 120)
    finally:
        if robot.poll() is None:
            robot.kill()
            robot.wait()
    if robot.returncode != 0:
        raise RuntimeError(f"the robot for {row.label} failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


# Ethernet frame bytes per TCP payload byte at a 1500-byte MTU (1448 payload bytes with timestamps).
WIRE_OVERHEAD = 1514 / 1448


@dataclass
class RowSummary:
    label: str
    sent_hz: float
    answered_hz: float
    bytes_per_frame: float
    wire_ms: float
    latency_p50: float
    latency_p99: float
    age_p50: float
    age_p99: float
    age_first: float
    age_last: float
    queued_p50_kb: float
    queued_max_kb: float
    submit_p50: float
    superseded: int
    errors: int
    error_sample: list[str]


def summarize(row: Row, result: dict[str, Any], shape: LinkShape) -> RowSummary:
    records = result["records"]
    latency = np.array([r["latency_ms"] for r in records], dtype=np.float64)
    age = np.array([r["latency_ms"] - r["server_ms"] - shape.delay_ms for r in records], dtype=np.float64)

    def pct(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) if values.size else float("nan")

    third = max(1, len(age) // 3)
    queued = np.array(result["queued"], dtype=np.float64) / 1024
    frame_bytes = float(np.mean(result["frame_bytes"])) if result["frame_bytes"] else float("nan")
    return RowSummary(
        label=row.label,
        sent_hz=result["sent"] / result["seconds"],
        answered_hz=len(records) / result["seconds"],
        bytes_per_frame=frame_bytes,
        wire_ms=frame_bytes * WIRE_OVERHEAD * 8 / (shape.rate_mbit * 1e3) + shape.delay_ms,
        latency_p50=pct(latency, 50),
        latency_p99=pct(latency, 99),
        age_p50=pct(age, 50),
        age_p99=pct(age, 99),
        age_first=pct(age[:third], 50),
        age_last=pct(age[-third:], 50),
        queued_p50_kb=pct(queued, 50),
        queued_max_kb=float(queued.max()) if queued.size else float("nan"),
        submit_p50=pct(np.array(result["submit_ms"], dtype=np.float64), 50),
        superseded=result["superseded"],
        errors=result["errors"],
        error_sample=result["error_sample"],
    )


def print_table(summaries: list[RowSummary]) -> None:
    header = (
        f"{'row':<26} | {'sent/s':>6} {'answ/s':>6} | {'bytes/frame':>11} | {'latency p50':>11} {'p99':>6} | "
        f"{'wire':>5} | {'age@server p50':>14} {'p99':>6} {'1st 3rd':>7} {'last':>6} | "
        f"{'queued KB p50':>13} {'max':>6} | {'loop held':>9} | {'superseded':>10} {'errors':>6}"
    )
    print(header)
    print("-" * len(header))
    for s in summaries:
        print(
            f"{s.label:<26} | {s.sent_hz:>6.1f} {s.answered_hz:>6.1f} | {s.bytes_per_frame:>11,.0f} | "
            f"{s.latency_p50:>11.0f} {s.latency_p99:>6.0f} | {s.wire_ms:>5.0f} | "
            f"{s.age_p50:>14.0f} {s.age_p99:>6.0f} {s.age_first:>7.0f} {s.age_last:>6.0f} | "
            f"{s.queued_p50_kb:>13.0f} {s.queued_max_kb:>6.0f} | "
            f"{s.submit_p50:>9.0f} | {s.superseded:>10} {s.errors:>6}"
        )
        if s.error_sample:
            print(f"    first error: {s.error_sample[0][:160]}")
    print(
        "times in ms. wire: one frame's time on the link (the floor of its age); age@server = latency - server time "
        "- one-way delay, p50, p99, and the p50 of the first and last third of the run; queued: bytes sent and "
        "not yet acknowledged, on the robot, at each tick; loop held: p50 of how long sending (lockstep: sending and "
        "waiting for the actions) kept the robot's loop from its next tick"
    )


OUTAGE_ROW = Row("stream", 2, "jpeg-resized")


def measure(
    rows: list[Row],
    shape: LinkShape,
    hz: float,
    seconds: float,
    backend: str = "auto",
    outage: tuple[float, float] | None = None,
) -> tuple[str, list[RowSummary], Any]:
    """Every row over one shaped link (the server started once), then the outage row if ``outage``.
    Returns the link backend, the summaries, and (summary, counts) of the outage row or None."""
    with tempfile.TemporaryDirectory(prefix="shaped-link-") as logdir, ShapedLink(shape, backend=backend) as link:
        start_servers(link, {row.client for row in rows}, Path(logdir))
        summaries = [summarize(row, run_row(link, row, hz, seconds), shape) for row in rows]
        outage_row = None
        if outage is not None:
            result = run_row(link, OUTAGE_ROW, hz, max(seconds, outage[0] + outage[1] + 8), outage)
            outage_row = (summarize(OUTAGE_ROW, result, shape), result["outage"])
        return link.backend or "", summaries, outage_row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per row (default 20)")
    parser.add_argument("--hz", type=float, default=15.0, help="camera rate (default 15)")
    parser.add_argument("--cameras", default="1,2", help="camera counts to run (default 1,2)")
    parser.add_argument(
        "--images", default=",".join(IMAGE_FORMS), help=f"comma-separated, of {', '.join(IMAGE_FORMS)} (default: all)"
    )
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality of the encoded rows")
    parser.add_argument("--clients", default=",".join(CLIENTS), help=f"of {', '.join(CLIENTS)} (default: all)")
    parser.add_argument(
        "--nowait-max-cameras",
        type=int,
        default=1,
        help="stream-nowait rows only up to this many cameras (its queue is all in memory)",
    )
    parser.add_argument(
        "--unbounded-images",
        default="raw",
        help="stream-unbounded and stream-nowait rows only for these image forms (default raw)",
    )
    parser.add_argument("--outage", default="4,2", help="AT,FOR seconds of the outage row ('' for none)")
    parser.add_argument("--backend", default="auto", choices=("auto", "netem", "relay"))
    parser.add_argument("--rate-mbit", type=float, default=LinkShape.rate_mbit)
    parser.add_argument("--delay-ms", type=float, default=LinkShape.delay_ms)
    parser.add_argument("--loss", type=float, default=LinkShape.loss)
    args = parser.parse_args(argv)

    rows = [
        Row(client, int(cameras), images, args.quality)
        for client in args.clients.split(",")
        for cameras in args.cameras.split(",")
        for images in args.images.split(",")
        if (client != "stream-nowait" or int(cameras) <= args.nowait_max_cameras)
        and (client in ("stream", "lockstep") or images in args.unbounded_images.split(","))
    ]
    shape = LinkShape(args.rate_mbit, args.delay_ms, args.loss)
    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    outage = tuple(float(x) for x in args.outage.split(",")) if args.outage else None
    backend, summaries, outage_row = measure(rows, shape, args.hz, args.seconds, args.backend, outage)
    print(
        f"{started}; link {asdict(shape)} via {backend}; {args.hz:g} Hz, {args.seconds:g} s per row; "
        f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    print_table(summaries)
    if outage_row is not None:
        summary, counts = outage_row
        print(f"outage: link cut {outage[0]:g} s into the row for {outage[1]:g} s:")
        print_table([summary])
        print(f"    {json.dumps(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
