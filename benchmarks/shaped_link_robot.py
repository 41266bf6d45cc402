"""The robot of ``benchmarks/shaped_link.py``: one row's camera loop, run inside the robot namespace.

``shaped_link.py`` starts it as ``python benchmarks/shaped_link_robot.py --client ... --url ...``; it
captures one or two 480×640 cameras at ``--hz`` for ``--seconds``, sends them the way ``--client`` says
(see ``shaped_link.py``), and prints one JSON line: what it sent, each chunk's latency and server time,
the bytes queued on its socket at every tick, how long sending held its loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CLIENTS = ("stream", "stream-unbounded", "stream-nowait", "lockstep")
IMAGE_FORMS = ("raw", "jpeg", "jpeg-resized")
CAMERA_NAMES = ("cam0", "cam1")
# The lock-step robot is an openpi client (LIBERO's keys) of the policy server's openpi endpoint.
OPENPI_CAMERAS = ("observation/image", "observation/wrist_image")
HEIGHT, WIDTH = 480, 640


@dataclass(frozen=True)
class Row:
    client: str  # one of CLIENTS
    cameras: int  # 1 or 2 cameras of 480×640
    images: str = "raw"  # "raw", "jpeg" or "jpeg-resized"
    quality: int = 90

    @property
    def label(self) -> str:
        images = self.images if self.images == "raw" else f"{self.images} q{self.quality}"
        return f"{self.client} {self.cameras}cam {images}"


def camera_frames(count: int, seed: int) -> list[np.ndarray]:
    """Camera-like 480×640 frames (smooth shapes, a moving disc, sensor noise): JPEG sizes like a real one."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    frames = []
    for i in range(count):
        rgb = np.stack([128 + 90 * np.sin(x / 41 + seed), 128 + 90 * np.cos(y / 29), (x * 0.3 + y * 0.2) % 256], -1)
        cx, cy = WIDTH * (0.3 + 0.4 * i / max(1, count - 1)), HEIGHT * 0.5
        rgb[(x - cx) ** 2 + (y - cy) ** 2 < 60**2] = (30, 80, 210)
        frames.append(np.clip(rgb + rng.normal(0, 3, rgb.shape), 0, 255).astype(np.uint8))
    return frames


class FrameSource:
    """What the robot puts in an observation for one tick: raw arrays, or encoded (and resized) bytes."""

    def __init__(self, row: Row, metadata: dict[str, Any]) -> None:
        self.row = row
        self.cameras = [camera_frames(4, seed) for seed in range(row.cameras)]
        self.encoding = None
        if row.images != "raw":
            from robot_clients.camera_frames import ImageEncoding

            size = None
            if row.images == "jpeg-resized":
                size = self._send_size(metadata)
            self.encoding = ImageEncoding("jpeg", row.quality, size)

    def _send_size(self, metadata: dict[str, Any]) -> tuple[int, int]:
        from robot_clients.camera_frames import canvas_bins, send_size

        canvases = metadata.get("canvases")
        if canvases is None:  # servers before encoded frames: the table the server would send
            from cosmos3_runtime.frame_preprocessing import canvas_table

            canvases = canvas_table()
        # The native hello carries the defaults; openpi's metadata the tier its sessions are served at.
        tier = metadata.get("resolution_tier") or (metadata.get("defaults") or {}).get("resolution_tier", 256)
        size = send_size(HEIGHT, WIDTH * self.row.cameras, canvas_bins(canvases, tier), side_by_side=self.row.cameras)
        return size.height, size.width // self.row.cameras

    def capture(self, tick: int) -> list[Any]:
        frames = [camera[tick % len(camera)] for camera in self.cameras]
        if self.encoding is None:
            return frames
        from robot_clients.camera_frames import encode_frame

        return [encode_frame(frame, self.encoding) for frame in frames]


async def stream_client(url: str, row: Row, reconnect: bool = False):
    """The native client as a robot configures it: its image option, its in-flight bound (``stream``; the
    other two rows turn it off: ``max_buffered_bytes=None``)."""
    from robot_clients import AsyncPolicyClient
    from robot_clients.camera_frames import ImageEncoding

    images = "raw" if row.images == "raw" else ImageEncoding("jpeg", row.quality)
    bound = {} if row.client == "stream" else {"max_buffered_bytes": None}
    # Reconnecting robots keep a short keepalive, so a dead link is noticed within a second or two.
    keepalive = {"reconnect": True, "ping_interval": 0.5, "ping_timeout": 1.0} if reconnect else {"reconnect": False}
    client = AsyncPolicyClient(
        url, connect_timeout=60, images=images, resize=row.images == "jpeg-resized", **keepalive, **bound
    )
    await client.connect()
    return client


async def run_stream(row: Row, url: str, hz: float, seconds: float, reconnect: bool = False) -> dict[str, Any]:
    wait = row.client != "stream-nowait"
    from robot_clients import ConnectionLost, ServerError

    client = await stream_client(url, row, reconnect)
    settings = {"domain_name": client.metadata["defaults"]["domain_name"]}
    if row.cameras > 1:
        settings["view_point"] = "concat_view"  # the cameras side by side, as the lock-step server composes them
    await client.configure(**settings)
    source = FrameSource(Row(row.client, row.cameras), client.metadata)  # raw: the client encodes and resizes
    records: list[dict[str, Any]] = []
    errors: list[str] = []

    async def receive() -> None:
        while True:
            try:
                chunk = await client.receive()
            except ServerError as exc:
                errors.append(f"{exc.code}: {exc}")
                continue
            records.append(
                {
                    "t": time.monotonic(),
                    "latency_ms": chunk.round_trip_ms,
                    "seq": chunk.seq,
                    "server_ms": chunk.timing.get("observation_age_ms"),
                    "domain": chunk.domain_name,
                }
            )

    receiver = asyncio.create_task(receive())
    if reconnect:
        print("started", flush=True)  # the parent times the outage from here
    queued, submit_ms, frame_bytes = [], [], []
    reconnected_at: list[float] = []
    sending: set[asyncio.Task] = set()
    started = time.monotonic()
    tick = 0
    while time.monotonic() - started < seconds:
        target = started + tick / hz
        if target > time.monotonic():
            await asyncio.sleep(target - time.monotonic())
        queued.append(client.buffered_bytes)
        captured = time.monotonic()
        frames = source.capture(tick)
        obs = {"image": frames[0]} if row.cameras == 1 else {"images": dict(zip(CAMERA_NAMES, frames))}
        obs["timestamp"] = captured
        if client.stats.reconnects > len(reconnected_at):
            reconnected_at.append(time.monotonic())
        if wait:
            try:
                await client.submit(obs)
            except ConnectionLost:
                errors.append("connection lost while sending")
            submit_ms.append((time.monotonic() - captured) * 1e3)
        else:
            task = asyncio.create_task(client.submit(obs))
            sending.add(task)
            task.add_done_callback(sending.discard)
            submit_ms.append((time.monotonic() - captured) * 1e3)
        tick = max(tick + 1, int((time.monotonic() - started) * hz))  # ticks that passed while blocked are gone
    # stream-nowait: the robot handed every tick's frame over (most still queued when the row ends).
    sent = client.stats.sent if wait else tick
    frame_bytes = [client.stats.bytes_sent / max(1, sent)] if row.client == "stream" else []
    deadline = time.monotonic() + (15 if wait else 5)
    while time.monotonic() < deadline:  # every observation gets its one terminal reply (or the row ends)
        stats = client.stats
        if not sending and stats.answered + sum(stats.dropped.values()) + stats.errors >= stats.sent:
            break
        await asyncio.sleep(0.05)
    receiver.cancel()
    for task in list(sending):
        task.cancel()
    await client.close()
    seqs = [r["seq"] for r in records]
    outage = {
        "reconnected_at_s": [round(t - started, 2) for t in reconnected_at],
        "reconnects": client.stats.reconnects,
        "stale_filtered": client.stats.stale,
        # A chunk handed to the robot for an older seq than one handed before: the client must make it 0.
        "older_than_delivered": sum(1 for a, b in zip(seqs, seqs[1:]) if b <= a),
        "answered_after_reconnect": sum(1 for r in records if reconnected_at and r["t"] > reconnected_at[0]),
        "configured_after_reconnect": bool(reconnected_at)
        and all(r["domain"] == settings["domain_name"] for r in records if r["t"] > reconnected_at[0]),
    }
    for record in records:
        del record["domain"]
    return {
        "seconds": seconds,
        "sent": sent,
        "records": records,
        "queued": queued,
        "submit_ms": submit_ms,
        "outage": outage,
        "frame_bytes": frame_bytes or [source_bytes(row, client.metadata)],
        "superseded": client.stats.dropped.get("superseded", 0) + client.stats.dropped.get("unsent", 0),
        "errors": len(errors),
        "error_sample": errors[:1],
    }


def source_bytes(row: Row, metadata: dict[str, Any]) -> float:
    """An observation's packed size as this row's client sends it (when the client did not count it)."""
    from robot_clients.wire_codec import packb

    frames = FrameSource(row, metadata).capture(0)
    obs = {"image": frames[0]} if row.cameras == 1 else {"images": dict(zip(CAMERA_NAMES, frames))}
    return float(len(packb({"type": "observation", "seq": 0, **obs})))


async def run_lockstep(row: Row, url: str, hz: float, seconds: float) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    from robot_clients.client import buffered_bytes
    from robot_clients.wire_codec import packb, unpackb

    records: list[dict[str, Any]] = []
    queued, frame_bytes, held_ms = [], [], []
    errors: list[str] = []
    async with connect(url, compression=None, max_size=64 * 2**20, proxy=None, open_timeout=60) as ws:
        metadata = unpackb(await ws.recv())
        source = FrameSource(row, metadata)
        started = time.monotonic()
        tick = sent = 0
        while time.monotonic() - started < seconds:
            target = started + tick / hz
            if target > time.monotonic():
                await asyncio.sleep(target - time.monotonic())
            queued.append(buffered_bytes(ws))
            captured = time.monotonic()
            obs = dict(zip(OPENPI_CAMERAS, source.capture(tick)))  # arrays, or the JPEG bytes in their place
            obs["prompt"] = ""
            message = packb(obs)
            if tick < 8:
                frame_bytes.append(len(message))
            await ws.send(message)
            sent += 1
            reply = await ws.recv()
            held_ms.append((time.monotonic() - captured) * 1e3)  # openpi's infer() holds the loop this long
            if isinstance(reply, str):  # the lock-step server answers errors as text, as openpi does
                errors.append(reply)
            else:
                reply = unpackb(reply)
                records.append(
                    {
                        "t": time.monotonic(),
                        "latency_ms": (time.monotonic() - captured) * 1e3,
                        "server_ms": reply["server_timing"]["total_ms"],
                    }
                )
            tick = max(tick + 1, int((time.monotonic() - started) * hz))
    return {
        "seconds": seconds,
        "sent": sent,
        "records": records,
        "queued": queued,
        "submit_ms": held_ms,
        "frame_bytes": frame_bytes,
        "superseded": 0,
        "errors": len(errors),
        "error_sample": errors[:1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", choices=CLIENTS, required=True)
    parser.add_argument("--cameras", type=int, required=True)
    parser.add_argument("--images", choices=IMAGE_FORMS, default="raw")
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--hz", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument(
        "--reconnect", action="store_true", help="stream rows: reconnect after an outage (keepalive 0.5 s, timeout 1 s)"
    )
    args = parser.parse_args(argv)
    row = Row(args.client, args.cameras, args.images, args.quality)
    if row.client == "lockstep":
        result = asyncio.run(run_lockstep(row, args.url, args.hz, args.seconds))
    else:
        result = asyncio.run(run_stream(row, args.url, args.hz, args.seconds, args.reconnect))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
