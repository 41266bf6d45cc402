"""What recording costs: the caller's side of each call, and how many frames per second the writer keeps.

Two measurements, for 1 and 2 cameras of 480×640:

* **caller**: the time one ``SessionRecording.observation`` (and ``.chunk``) call takes on the calling
  thread (the event loop, once wired), measured call by call while the writer thread is busy encoding
  and writing. Side by side: the same calls on ``NO_RECORDING`` (the harness's own floor). The calls are
  made at the writer's pace or faster, so the queue fills and frames are dropped: the caller's cost must
  not grow with that.
* **writer**: frames per second from the first observation to the published dataset (flushes, MP4
  segments, Parquet, assembly and publication included), offered as fast as the queue takes them
  (``offer``: a call that finds the queue full waits 1 ms and retries, so every frame is recorded).
  Then a **real-time** run: a 30 Hz robot for ``--seconds``, and how many frames the recorder dropped.

A third table, **encoder**, times one 32-frame segment per setting: ``encode_mp4`` at the recorder's
quality (5, crf 25) and at the project's default for generated videos (8, crf 10), and libx264 presets
the recorder cannot choose today (``encode_mp4`` has no preset argument) at crf 25, through the same
imageio-ffmpeg writer: what such an argument would buy.

Frames are camera-like (smooth shading, moving shapes, sensor noise of a few levels), from a pool of 16
distinct frames per camera, so memory stays small. The writer runs at its production niceness (10).

    .venv/bin/python benchmarks/recording_writer.py                   # ~2 min on 2 busy cores
    .venv/bin/python benchmarks/recording_writer.py --frames 600 --seconds 20 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policy_server.recording import NO_RECORDING, Recorder, RecorderSettings  # noqa: E402

CONFIG = {"domain_name": "bridge_orig_lerobot", "action_horizon": 16, "raw_action_dim": 10, "prompt": "pick"}
MODEL = {"model": "benchmark"}
TIMING = {"queue_ms": 1.0, "model_ms": 30.0, "engine_ms": 32.0, "total_ms": 35.0, "observation_age_ms": 36.0}
POOL = 16


def camera_pool(height: int, width: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    frames = []
    for i in range(POOL):
        base = np.stack(
            [80 + 60 * np.sin((x + 7 * i) / 90), 90 + 50 * np.cos((y - 5 * i) / 70), 100 + 0.1 * (x + y)], axis=-1
        )
        cx, cy = 100 + 20 * i, 200 + 5 * i
        base[(x - cx) ** 2 + (y - cy) ** 2 < 40**2] = (220, 40, 40)
        base += rng.normal(0, 3, base.shape)
        frames.append(base.clip(0, 255).astype(np.uint8))
    return frames


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def caller_cost(recording, pools: dict[str, list[np.ndarray]], count: int) -> dict[str, float]:
    observe, answer = [], []
    actions = np.zeros((16, 10), np.float32)
    for seq in range(count):
        cameras = {name: pool[seq % POOL] for name, pool in pools.items()}
        started = time.perf_counter_ns()
        recording.observation(seq, cameras, None, received_at=time.monotonic())
        middle = time.perf_counter_ns()
        recording.chunk(seq, actions, TIMING, seed=seq)
        observe.append((middle - started) / 1e3)
        answer.append((time.perf_counter_ns() - middle) / 1e3)
        time.sleep(0.001)  # a robot's observations do not come back to back
    return {
        "observation_p50_us": statistics.median(observe),
        "observation_p99_us": percentile(observe, 99),
        "chunk_p50_us": statistics.median(answer),
        "chunk_p99_us": percentile(answer, 99),
    }


def run_caller(root: Path, pools, count: int) -> dict:
    recorder = Recorder(RecorderSettings(root=root / "caller"))
    recorder.start()
    recording = recorder.session("caller")
    recording.start_episode(CONFIG, MODEL)
    floor = caller_cost(NO_RECORDING, pools, count)
    measured = caller_cost(recording, pools, count)
    recording.end_episode("closed")
    recorder.close(timeout=600)
    stats = recorder.stats()
    return {
        "null": floor,
        "recording": measured,
        "dropped": stats["frames_dropped_queue_full"],
        "recorded": stats["frames_recorded"],
    }


def run_writer(root: Path, pools, count: int) -> dict:
    recorder = Recorder(RecorderSettings(root=root / "writer"))
    recorder.start()
    recording = recorder.session("writer")
    recording.start_episode(CONFIG, MODEL)
    actions = np.zeros((16, 10), np.float32)
    started = time.perf_counter()
    for seq in range(count):
        cameras = {name: pool[seq % POOL] for name, pool in pools.items()}
        while not recording.observation(seq, cameras, None):
            recording.frames_not_queued -= 1  # a retry, not a loss
            time.sleep(0.001)
        recording.chunk(seq, actions, TIMING, seed=seq)
    recording.end_episode("closed")
    assert recorder.sync(timeout=1200)
    elapsed = time.perf_counter() - started
    recorder.close()
    stats = recorder.stats()
    assert stats["frames_recorded"] == count, stats
    return {
        "frames": count,
        "seconds": elapsed,
        "frames_per_s": count / elapsed,
        "camera_frames_per_s": count * len(pools) / elapsed,
        "bytes": stats["bytes_written"],
    }


def run_realtime(root: Path, pools, seconds: float, hz: float = 30.0) -> dict:
    recorder = Recorder(RecorderSettings(root=root / "realtime"))
    recorder.start()
    recording = recorder.session("realtime")
    recording.start_episode({**CONFIG, "control_hz": hz}, MODEL)
    actions = np.zeros((16, 10), np.float32)
    start, seq, late = time.monotonic(), 0, 0
    while time.monotonic() - start < seconds:
        due = start + seq / hz
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        elif now - due > 1 / hz:
            late += 1
        recording.observation(seq, {name: pool[seq % POOL] for name, pool in pools.items()}, None)
        recording.chunk(seq, actions, TIMING, seed=seq)
        seq += 1
    recording.end_episode("closed")
    assert recorder.sync(timeout=1200)
    recorder.close()
    stats = recorder.stats()
    return {
        "offered": seq,
        "recorded": stats["frames_recorded"],
        "dropped": stats["frames_dropped_queue_full"],
        "late_offers": late,
    }


def run_encoder(root: Path, pool: list[np.ndarray], fps: int = 10) -> dict:
    import imageio_ffmpeg

    from policy_server.videos.encoding import encode_mp4

    frames = np.stack([pool[i % POOL] for i in range(32)])
    results = {}
    for quality in (5, 8):
        started = time.perf_counter()
        encoded = encode_mp4(frames, fps, root / f"q{quality}.mp4", quality=quality)
        results[f"encode_mp4 quality {quality}"] = (time.perf_counter() - started, encoded.num_bytes)
    for preset in ("medium", "veryfast", "ultrafast"):
        path = root / f"{preset}.mp4"
        writer = imageio_ffmpeg.write_frames(
            str(path),
            (frames.shape[2], frames.shape[1]),
            fps=fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            quality=None,
            macro_block_size=1,
            ffmpeg_log_level="error",
            output_params=["-crf", "25", "-preset", preset],
        )
        started = time.perf_counter()
        writer.send(None)
        for frame in frames:
            writer.send(frame)
        writer.close()
        results[f"crf 25 preset {preset}"] = (time.perf_counter() - started, path.stat().st_size)
    return {
        name: {"seconds": seconds, "frames_per_s": len(frames) / seconds, "bytes": size}
        for name, (seconds, size) in results.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=300, help="frames for the writer's throughput run")
    parser.add_argument("--calls", type=int, default=400, help="calls for the caller's cost run")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the 30 Hz real-time run")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="recording-bench-"))
    results = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "size": [args.height, args.width]}
    try:
        for cameras in (1, 2):
            pools = {f"cam{c}": camera_pool(args.height, args.width, c) for c in range(cameras)}
            results[f"{cameras}cam"] = {
                "caller": run_caller(root / f"{cameras}", pools, args.calls),
                "writer": run_writer(root / f"{cameras}", pools, args.frames),
                "realtime_30hz": run_realtime(root / f"{cameras}", pools, args.seconds),
            }
        results["encoder"] = run_encoder(root, camera_pool(args.height, args.width, 0))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["load_after"] = os.getloadavg()

    print(
        f"recording benchmark, {args.height}x{args.width} cameras; load {results['load_before'][0]:.2f} -> "
        f"{results['load_after'][0]:.2f} on {results['cpus']} cpus"
    )
    print(f"{'':6} {'call':12} {'null p50/p99 us':>18} {'recording p50/p99 us':>22} {'ratio p50':>10}")
    for cameras in (1, 2):
        caller = results[f"{cameras}cam"]["caller"]
        for call in ("observation", "chunk"):
            null, rec = caller["null"], caller["recording"]
            print(
                f"{cameras}cam   {call:12} {null[call + '_p50_us']:8.2f} / {null[call + '_p99_us']:7.2f} "
                f"{rec[call + '_p50_us']:11.2f} / {rec[call + '_p99_us']:8.2f} "
                f"{rec[call + '_p50_us'] / max(null[call + '_p50_us'], 1e-9):10.1f}"
            )
        print(f"{'':6} (calls 1 ms apart: {caller['recorded']} frames recorded, {caller['dropped']} dropped)")
    print(f"{'':6} {'writer frames/s':>16} {'camera frames/s':>16} {'MB written':>11} {'30 Hz: dropped/offered':>24}")
    for cameras in (1, 2):
        writer, realtime = results[f"{cameras}cam"]["writer"], results[f"{cameras}cam"]["realtime_30hz"]
        print(
            f"{cameras}cam   {writer['frames_per_s']:16.1f} {writer['camera_frames_per_s']:16.1f} "
            f"{writer['bytes'] / 1e6:11.1f} {realtime['dropped']:>12} / {realtime['offered']}"
        )
    print(f"{'encoder, one 32-frame segment':34} {'s':>6} {'frames/s':>9} {'KB':>8}")
    for name, row in results["encoder"].items():
        print(f"{name:34} {row['seconds']:6.2f} {row['frames_per_s']:9.1f} {row['bytes'] / 1e3:8.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
