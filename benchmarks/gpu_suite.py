"""The GPU suite behind ``make bench-gpu``: Cosmos3 Edge at its real size on one CUDA GPU, in one command.

A GPU is lent to this project only now and then, for about 15 minutes, so everything is in one script
that finishes in under 8 minutes on an H200 and writes its figures (JSON and a markdown table):

1. builds a random-weight Edge checkpoint of the published shape with its weights drawn on the GPU
   (``cosmos3_runtime.random_checkpoints``; bf16, 8 GB), and a base-schedule twin sharing its weights;
2. loads both through the production path (bf16 on CUDA) and measures per-chunk p50/p99 of
   ``predict_actions_batch`` at two geometries, the 256 tier (224x224 camera, chunk 16) and DROID's
   (480 tier, 180x320 camera, chunk 32):
   - distilled 4-step versus base (35 steps, guidance 6);
   - batch 1, 2, 4, 8 (distilled);
   - prefix cache on and off (distilled);
   - ``torch.compile`` (regional, the decoder layers) on and off (distilled), if the time budget allows;
3. serving overhead through a real server: ``python -m policy_server.cli --model ...`` on this GPU and
   the real client, round trip minus the engine's own time;
4. the worker's host-prep overlap on and off (``benchmarks/host_prep_overlap.py``): four robots in closed
   loop with 480x640 camera frames against the real engine worker, batch 2: the engine's median idle gap
   between calls and chunks per second, side by side;
5. for every cell: the GPU's peak memory, the chunk's FLOPs from ``benchmarks/cost_model.py`` (with the
   token counts the sampler really packed), the achieved FLOP/s as a fraction of the H200's measured bf16
   peak, and the ratio of the measured p50 to the cost model's floor;
0. first, since it matters most (a 24 GB card): quantized weights. Edge and Nano at their published shapes
   (Nano's 30 GB drawn on the GPU too) loaded at bf16, fp8 and int8 (``--quantization``), each alone on the
   GPU: peak GPU memory while loading and serving, chunk latency at NVIDIA's DROID settings (4 steps,
   guidance 3, shift 5, 480 tier, 180x320 camera, chunk 32) and the actions' deviation from bf16 for the
   same observations and seeds (``benchmarks/quantized_weights.py``'s :func:`measure`).

``--smoke`` runs the same code on tiny checkpoints with a few repeats (CPU is fine): the test suite uses
it to prove the script runs end to end and writes its JSON and markdown. Run on a GPU machine:
``make bench-gpu`` (installs what the machine lacks, never torch), or
``python benchmarks/gpu_suite.py --out DIR``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS.parent))
sys.path.insert(0, str(BENCHMARKS))

import cost_model  # noqa: E402
import host_prep_overlap  # noqa: E402
import quantized_weights  # noqa: E402

Geometry = cost_model.Geometry
# The 256 tier with a 224x224 camera and chunk 16, and DROID's geometry (180x320 cameras, 480 tier, chunk 32).
GEOMETRIES = (cost_model.GEOMETRIES[0], cost_model.GEOMETRIES[2])


@dataclass
class Cell:
    """One measured configuration."""

    group: str
    schedule: str
    geometry: str
    batch: int = 1
    prefix_cache: bool = True
    compiled: bool = False
    repeats: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    chunks_per_s: float | None = None
    forwards: int | None = None
    tokens: dict = field(default_factory=dict)
    flops: float | None = None
    achieved_tflops: float | None = None
    fraction_of_peak: float | None = None
    floor_ms: float | None = None
    p50_over_floor: float | None = None
    peak_memory_gib: float | None = None
    note: str = ""


class Budget:
    """Seconds left of the run's budget; cells that would not fit are skipped and say so."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def percentile(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples), q))


def build_checkpoints(workdir: Path, smoke: bool, device: str, log) -> dict[str, Path]:
    """The distilled checkpoint, and a base twin that shares its weights (only the schedule differs)."""
    from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint

    started = time.perf_counter()
    if smoke:
        paths = {
            "distilled": build_tiny_checkpoint(workdir / "edge-distilled", "edge-distilled"),
            "base": build_tiny_checkpoint(workdir / "edge", "edge"),
        }
    else:
        from cosmos3_runtime.random_checkpoints import build_shaped_checkpoint

        distilled = build_shaped_checkpoint(workdir / "edge-distilled", "edge", "edge-distilled", device=device)
        base = build_tiny_checkpoint(workdir / "edge", "edge")
        for component in ("transformer", "vae"):
            shutil.rmtree(base / component)
            (base / component).symlink_to(distilled / component, target_is_directory=True)
        paths = {"distilled": distilled, "base": base}
    log(f"checkpoints built in {time.perf_counter() - started:.1f} s")
    return paths


def packed_tokens(engine, request) -> dict:
    """The token counts the sampler really packs for ``request`` (text by this checkpoint's tokenizer)."""
    from cosmos3_runtime.validation import job_for_actions

    job, _ = job_for_actions(request, engine.description)
    item = engine.sampler._prepare(job, time.perf_counter)
    full = item.passes["cond"].full
    return {"text": int(full["und_len"]), "vision": int(full["num_vision_tokens"]), "action": int(full["action_len"])}


def measure(
    engine,
    geometry: Geometry,
    *,
    batch: int,
    repeats: int,
    warmup: int,
    cell: Cell,
    device: str,
    peak_flops: float | None,
    num_steps: int | None = None,
) -> Cell:
    """p50/p99 of ``predict_actions_batch`` over ``repeats`` calls of ``batch`` distinct requests."""
    import torch

    from cosmos3_runtime.requests import ActionRequest

    rng = np.random.default_rng(0)
    domain = engine.default_domain()
    images = [rng.integers(0, 256, (geometry.height, geometry.width, 3), dtype=np.uint8) for _ in range(batch)]

    def requests(seed: int):
        return [
            ActionRequest(
                domain_name=domain,
                image=image,
                seed=seed + i,
                action_horizon=geometry.horizon,
                resolution_tier=geometry.tier,
                num_steps=num_steps,
            )
            for i, image in enumerate(images)
        ]

    for i in range(warmup):
        engine.predict_actions_batch(requests(1000 + i))
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    samples, forwards = [], None
    for i in range(repeats):
        started = time.perf_counter()
        results = engine.predict_actions_batch(requests(i * batch))
        samples.append((time.perf_counter() - started) * 1000.0)  # actions come back on the host: synchronized
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise failed[0]
        forwards = results[0].transformer_forwards
    cell.repeats, cell.forwards = repeats, forwards
    cell.p50_ms, cell.p99_ms = statistics.median(samples), percentile(samples, 99)
    cell.chunks_per_s = batch / (cell.p50_ms / 1000.0)
    if device == "cuda":
        cell.peak_memory_gib = torch.cuda.max_memory_allocated() / 2**30
    tokens = packed_tokens(engine, requests(0)[0])
    cell.tokens = tokens
    config = dict(engine.pipe.transformer.config)
    steps = len(engine.info.distilled_sigmas) if engine.info.is_distilled else forwards // 2
    cost = cost_model.chunk_cost(
        "edge",
        config,
        dict(engine.pipe.vae.config),
        geometry,
        steps=steps,
        guided_steps=forwards - steps,
        prefix_cache=cell.prefix_cache,
        text_tokens=tokens["text"],
        batch=batch,
    )
    cell.flops = cost.flops
    cell.achieved_tflops = cost.flops / (cell.p50_ms / 1000.0) / 1e12
    if peak_flops:  # the H200's: on another device these columns stay empty
        cell.fraction_of_peak = cost.flops / (cell.p50_ms / 1000.0) / peak_flops
        cell.floor_ms = cost.floor_ms  # a batch's floor: all its FLOPs, its weights read once per forward
        cell.p50_over_floor = cell.p50_ms / cell.floor_ms
    return cell


def serving_overhead(
    checkpoint: Path, geometry: Geometry, requests: int, device: str, log, warmup: bool = True
) -> dict:
    """Round trips through ``python -m policy_server.cli`` on this machine, minus the engine's own time."""
    from realtime_roundtrip import ServerProcess

    from robot_clients.client import PolicyClient

    started = time.perf_counter()
    server = ServerProcess(
        [
            "--model",
            str(checkpoint),
            "--device",
            device,
            "--max-batch",
            "1",
            "--no-openpi",
            *([] if warmup else ["--no-warmup"]),
        ]
    )
    try:
        server.wait_ready(timeout=600)
        ready_s = time.perf_counter() - started
        rng = np.random.default_rng(1)
        images = [rng.integers(0, 256, (geometry.height, geometry.width, 3), dtype=np.uint8) for _ in range(4)]
        round_trip, engine_ms = [], []
        with PolicyClient(f"ws://127.0.0.1:{server.port}") as client:
            client.configure(
                domain_name=client.metadata["defaults"]["domain_name"],
                action_horizon=geometry.horizon,
                resolution_tier=geometry.tier,
            )
            unmeasured = min(3, requests)  # the first requests pay one-time costs
            for i in range(requests + unmeasured):
                sent = time.perf_counter()
                chunk = client.infer({"image": images[i % len(images)]}, timeout=120)
                if i >= unmeasured:
                    round_trip.append((time.perf_counter() - sent) * 1000.0)
                    engine_ms.append(chunk.timing["engine_ms"])
    finally:
        server.stop()
    over = [r - e for r, e in zip(round_trip, engine_ms)]
    figures = {
        "geometry": geometry.name,
        "requests": requests,
        "server_ready_s": ready_s,
        "round_trip_p50_ms": statistics.median(round_trip),
        "round_trip_p99_ms": percentile(round_trip, 99),
        "engine_p50_ms": statistics.median(engine_ms),
        "overhead_p50_ms": statistics.median(over),
        "overhead_p99_ms": percentile(over, 99),
    }
    figures["overhead_share_p50"] = figures["overhead_p50_ms"] / figures["round_trip_p50_ms"]
    log(
        f"serving: rt p50 {figures['round_trip_p50_ms']:.1f} ms, engine p50 {figures['engine_p50_ms']:.1f} ms, "
        f"overhead p50 {figures['overhead_p50_ms']:.2f} ms"
    )
    return figures


# NVIDIA's DROID settings (its RoboLab server's defaults) and DROID's geometry.
DROID_SAMPLER = {"num_steps": 4, "guidance_scale": 3.0, "shift": 5.0}
DROID_GEOMETRY = {"height": 180, "width": 320, "action_horizon": 32, "resolution_tier": 480}


def quantized_cells(checkpoints: dict[str, Path], device: str, smoke: bool, budget: Budget, log) -> list[dict]:
    """Each checkpoint at full precision, fp8 and int8, one engine on the device at a time (see item 0)."""
    import gc

    import torch

    rows = []
    sampler = {"num_steps": 2} if smoke else DROID_SAMPLER
    geometry = {"height": 64, "width": 96, "action_horizon": 16, "resolution_tier": 256} if smoke else DROID_GEOMETRY
    for shape, path in checkpoints.items():
        reference = None
        for quantization in (None, "fp8", "int8"):
            row: dict = {"shape": shape, "quantization": quantization or ("bf16" if device == "cuda" else "fp32")}
            if budget.left() < 60 and not smoke:
                row["note"] = "skipped: time budget"
            else:
                try:
                    figures = quantized_weights.measure(
                        path,
                        quantization,
                        requests=2 if smoke else 5,
                        sampler=sampler,
                        geometry=geometry,
                        device=device,
                        warmup=0 if smoke else 2,
                    )
                    actions = figures.pop("actions")
                    if reference is None and quantization is None:
                        reference = actions
                    if reference is not None:
                        figures.update(quantized_weights.compare(reference, actions))
                    row.update({k: v for k, v in figures.items() if k not in ("chunk_ms", "quantization")})
                except Exception as exc:  # fp8 refused on a GPU without it, a load that does not fit: say so
                    row["note"] = f"{type(exc).__name__}: {exc}"[:240]
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
            rows.append(row)
            log(f"quantized {shape} {row['quantization']}: {row.get('chunk_p50_ms')} ms {row.get('note', '')}")
    return rows


def quantized_table(rows: list[dict]) -> str:
    lines = [
        "| shape | weights | peak GPU GiB (load) | peak GPU GiB (serving) | chunk p50 ms | forwards | "
        "relative error vs full precision | max abs diff | load s | note |",
        "| " + " | ".join(["---"] * 10) + " |",
    ]

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['quantization']} | {fmt(r.get('gpu_peak_load_gib'), '.1f')} | "
            f"{fmt(r.get('gpu_peak_gib'), '.1f')} | {fmt(r.get('chunk_p50_ms'), '.1f')} | "
            f"{fmt(r.get('forwards'), 'd')} | {fmt(r.get('relative_error'), '.3%')} | "
            f"{fmt(r.get('max_abs_difference'), '.4f')} | {fmt(r.get('load_s'), '.1f')} | {r.get('note', '')} |"
        )
    return "\n".join(lines)


def markdown(report: dict) -> str:
    env = report["environment"]
    loaded = env.get("memory_allocated_after_load_gib")
    lines = [
        f"GPU suite: {env['device_name']}, torch {env['torch']}, {env['dtype']}, "
        f"{'SMOKE (tiny checkpoints)' if report['smoke'] else 'Edge shape (3.37 B, random weights)'}, "
        f"{report['started']}; total {report['total_s']:.0f} s"
        + (f"; {loaded:.1f} GiB allocated once both engines loaded" if loaded else ""),
        "",
        "| group | schedule | geometry | batch | prefix cache | compile | n | p50 ms | p99 ms | chunks/s | "
        "forwards | tokens t+v+a | TFLOP/chunk | achieved TFLOP/s | of peak | floor ms | p50/floor | "
        "peak GiB | note |",
        "| " + " | ".join(["---"] * 19) + " |",
    ]

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    for c in report["cells"]:
        t = c["tokens"]
        tokens = f"{t['text']}+{t['vision']}+{t['action']}" if t else "-"
        lines.append(
            f"| {c['group']} | {c['schedule']} | {c['geometry']} | {c['batch']} "
            f"| {'on' if c['prefix_cache'] else 'off'} | {'on' if c['compiled'] else 'off'} | {c['repeats']} | "
            f"{fmt(c['p50_ms'], '.1f')} | "
            f"{fmt(c['p99_ms'], '.1f')} | {fmt(c['chunks_per_s'], '.1f')} | {fmt(c['forwards'], 'd')} | {tokens} | "
            f"{fmt(c['flops'] and c['flops'] / 1e12, '.2f')} | {fmt(c['achieved_tflops'], '.1f')} | "
            f"{fmt(c['fraction_of_peak'], '.1%')} | {fmt(c['floor_ms'], '.2f')} | {fmt(c['p50_over_floor'], '.1f')} | "
            f"{fmt(c['peak_memory_gib'], '.1f')} | {c['note']} |"
        )
    quantized = report.get("quantized")
    if quantized:
        lines += [
            "",
            "Quantized weights (one engine on the device at a time; NVIDIA's DROID settings: 4 steps, guidance 3, "
            "shift 5, 480 tier, 180x320, chunk 32):",
            "",
            quantized_table(quantized),
        ]
    overlap = report.get("host_prep_overlap")
    if overlap:
        lines += [
            "",
            f"Host-prep overlap ({overlap['robots']} robots in closed loop, 480x640 frames, 256 tier, "
            f"batch {overlap['max_batch']}, {overlap['rounds']} rounds of {overlap['observations']} "
            f"observations each):",
            "",
            host_prep_overlap.table(overlap),
        ]
    serving = report.get("serving")
    if serving:
        lines += [
            "",
            f"Serving through a real server ({serving['geometry']}, {serving['requests']} sequential "
            f"requests): round trip p50 {serving['round_trip_p50_ms']:.1f} ms (p99 "
            f"{serving['round_trip_p99_ms']:.1f}), engine p50 {serving['engine_p50_ms']:.1f} ms, overhead "
            f"p50 {serving['overhead_p50_ms']:.2f} ms (p99 {serving['overhead_p99_ms']:.2f}), "
            f"{serving['overhead_share_p50']:.1%} of the round trip; server ready in "
            f"{serving['server_ready_s']:.0f} s.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench-gpu-results"), help="folder for JSON and markdown")
    parser.add_argument("--smoke", action="store_true", help="tiny checkpoints, few repeats (CPU is fine)")
    parser.add_argument("--workdir", type=Path, default=None, help="where checkpoints are built (default: a temp dir)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="cells that would start past this many seconds are skipped (default 540)",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile cells")
    args = parser.parse_args(argv)

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.smoke:
        print("gpu_suite: no CUDA device here; run with --smoke to check the script on CPU", file=sys.stderr)
        return 2
    budget = Budget(args.budget_s)
    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f} s] {message}", flush=True)

    from cosmos3_runtime.engine import Cosmos3Engine

    peak = cost_model.H200_BF16_FLOPS if device == "cuda" else None
    environment = {
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "dtype": "bfloat16" if device == "cuda" else "float32",
        "python": platform.python_version(),
        "peak_bf16_flops_used": peak,
    }
    report = {
        "smoke": args.smoke,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "environment": environment,
        "cells": [],
        "serving": None,
    }
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cosmos3-gpu-suite-"))
    # The smoke run proves the script end to end in seconds: one or two calls per cell, a 3-step base.
    repeats = {"distilled": 1, "base": 1, "batch": 1} if args.smoke else {"distilled": 30, "base": 8, "batch": 15}
    warmup = 0 if args.smoke else 3
    batches = (2,) if args.smoke else (2, 4, 8)
    swept = GEOMETRIES[:1] if args.smoke else GEOMETRIES  # geometries of the batch and prefix cache sweeps
    base_steps = 3 if args.smoke else None  # None: the checkpoint's default, 35

    def write() -> None:
        report["total_s"] = time.perf_counter() - began
        (args.out / "gpu_suite.json").write_text(json.dumps(report, indent=2))
        (args.out / "gpu_suite.md").write_text(markdown(report))

    try:
        paths = build_checkpoints(workdir, args.smoke, device, log)
        # First: quantized weights (item 0), each checkpoint alone on the device before the suite loads its own.
        if args.smoke:
            quantized_paths = {"edge": paths["base"]}
        else:
            from cosmos3_runtime.random_checkpoints import build_shaped_checkpoint

            started = time.perf_counter()
            nano = build_shaped_checkpoint(workdir / "nano", "nano", "base", device=device)
            log(f"nano checkpoint built in {time.perf_counter() - started:.1f} s")
            quantized_paths = {"edge": paths["base"], "nano": nano}
        report["quantized"] = quantized_cells(quantized_paths, device, args.smoke, budget, log)
        write()
        if not args.smoke:
            shutil.rmtree(workdir / "nano", ignore_errors=True)
        engines = {}
        for name, path in paths.items():
            started = time.perf_counter()
            engines[name] = Cosmos3Engine.load(path)
            log(f"loaded {name} ({engines[name].dtype}) in {time.perf_counter() - started:.1f} s")
        environment["load_dtype"] = str(engines["distilled"].dtype).replace("torch.", "")
        if device == "cuda":  # both engines' weights (the base twin's are a second copy of the same shape)
            environment["memory_allocated_after_load_gib"] = torch.cuda.memory_allocated() / 2**30

        def run_cell(
            cell: Cell, engine, geometry: Geometry, reps: int, batch: int = 1, num_steps: int | None = None
        ) -> None:
            if budget.left() < 10:
                cell.note = "skipped: time budget"
            else:
                try:
                    measure(
                        engine,
                        geometry,
                        batch=batch,
                        repeats=reps,
                        warmup=warmup,
                        cell=cell,
                        device=device,
                        peak_flops=peak,
                        num_steps=num_steps,
                    )
                except Exception as exc:  # record and go on: the other cells still count
                    cell.note = f"failed: {type(exc).__name__}: {exc}"[:200]
            report["cells"].append(asdict(cell))
            log(f"{cell.group} {cell.schedule} {cell.geometry} batch {batch}: p50 {cell.p50_ms} ms {cell.note}")
            write()

        for geometry in GEOMETRIES:
            run_cell(
                Cell("schedule", "distilled, 4 steps", geometry.name),
                engines["distilled"],
                geometry,
                repeats["distilled"],
            )
            run_cell(
                Cell("schedule", f"base, {base_steps or 35} steps, guidance 6", geometry.name),
                engines["base"],
                geometry,
                repeats["base"],
                num_steps=base_steps,
            )
        for geometry in swept:
            for batch in batches:
                run_cell(
                    Cell("batch", "distilled, 4 steps", geometry.name, batch=batch),
                    engines["distilled"],
                    geometry,
                    repeats["batch"],
                    batch=batch,
                )
        cache = engines["distilled"].sampler.prefix_cache
        engines["distilled"].sampler.prefix_cache = None
        for geometry in swept:
            run_cell(
                Cell("prefix cache", "distilled, 4 steps", geometry.name, prefix_cache=False),
                engines["distilled"],
                geometry,
                repeats["distilled"],
            )
        engines["distilled"].sampler.prefix_cache = cache

        if args.smoke or budget.left() > 150:
            report["serving"] = serving_overhead(
                paths["distilled"], GEOMETRIES[0], 3 if args.smoke else 50, device, log, warmup=not args.smoke
            )
            write()
        else:
            report["serving_note"] = "skipped: time budget"

        if args.smoke or budget.left() > 150:
            import asyncio

            engine = engines["distilled"]
            robots, batch = (2, 1) if args.smoke else (4, 2)
            requests = host_prep_overlap.camera_requests(engine, robots, 480, 640, 256, None)
            report["host_prep_overlap"] = asyncio.run(
                host_prep_overlap.compare(
                    engine,
                    requests,
                    max_batch=batch,
                    observations=2 if args.smoke else 20,
                    rounds=1 if args.smoke else 2,
                    log=log,
                )
            )
            write()
        else:
            report["host_prep_overlap_note"] = "skipped: time budget"

        if args.smoke or args.no_compile:
            report["cells"].append(
                asdict(
                    Cell("compile", "distilled, 4 steps", "-", compiled=True, note="skipped: --smoke or --no-compile")
                )
            )
        elif budget.left() < 120:
            report["cells"].append(
                asdict(Cell("compile", "distilled, 4 steps", "-", compiled=True, note="skipped: time budget"))
            )
        else:
            del engines["base"]
            compiled = Cosmos3Engine.load(paths["distilled"], compile=True)
            for geometry in GEOMETRIES:
                started = time.perf_counter()
                run_cell(
                    Cell("compile", "distilled, 4 steps", geometry.name, compiled=True),
                    compiled,
                    geometry,
                    repeats["distilled"],
                )
                report["cells"][-1]["note"] += f" (with compilation: {time.perf_counter() - started:.0f} s)"
        write()
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    log(f"wrote {args.out / 'gpu_suite.json'} and {args.out / 'gpu_suite.md'}")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
