"""Cosmos3 at a published size on this CPU: load, memory and one policy chunk through a real server.

Builds (or reuses) a random-weight checkpoint of a published shape (``--shape edge``: 3.37 B parameters;
``--shape nano``: 15.2 B; bf16 on disk, ``cosmos3_runtime.random_checkpoints``), starts
``python -m policy_server.assembly.cli --model PATH [--quantization int8]`` as its own process (fp32 on CPU:
Edge about 16 GB resident with the VAE; Nano only with ``--quantization int8``), sends one policy observation
with the real client (``robot_clients.PolicyClient``; ``--num-steps`` and ``--guidance-scale`` configure a
base checkpoint's sampler, e.g. one step for Nano's figure) and records:

- load time (process start to ``/healthz`` ready, and the engine's own load time from its log);
- the server's peak resident memory (``VmHWM``) and its memory once loaded;
- the chunk: round trip, the server's timing breakdown, steps (one transformer forward each);
- the VAE encode of the same frame at the same tier, timed in this process with the checkpoint's VAE
  after the server has exited, and so the share of the chunk that is VAE encode versus transformer.

Memory: it refuses to start the server unless ``--min-available-gib`` (default 17) is available, since
the machine is shared. Run: ``.venv/bin/python benchmarks/real_size_cpu.py [--checkpoint DIR] [--delete]``
(``--json FILE`` also writes the figures).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS.parent))
sys.path.insert(0, str(BENCHMARKS))

from realtime_roundtrip import ServerProcess  # noqa: E402


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def process_memory_gib(pid: int) -> dict[str, float]:
    """Peak (VmHWM) and current (VmRSS) resident memory of a process, in GiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(rest.split()[0]) / 2**20
    return values


def run(
    checkpoint: Path,
    *,
    size: int = 224,
    timeout_s: float = 1800.0,
    min_available_gib: float = 17.0,
    quantization: str = "none",
    sampler: dict | None = None,
    dtype: str | None = None,
    log=print,
) -> dict:
    """Serve one chunk of ``checkpoint`` through a real server; returns the figures (see the module doc)."""
    from robot_clients.client import PolicyClient

    free = available_gib()
    if free < min_available_gib:
        raise RuntimeError(f"only {free:.1f} GiB available, {min_available_gib} needed: try again later")
    from cosmos3_runtime.checkpoints import inspect_checkpoint

    info = inspect_checkpoint(checkpoint)
    figures: dict = {
        "checkpoint": str(checkpoint),
        "variant": info.variant,
        "parameters": info.parameters,
        "bytes_on_disk": info.parameter_bytes,
        "available_gib_before": round(free, 1),
        "quantization": quantization,
        "load_average_before": os.getloadavg()[0],
    }
    started = time.perf_counter()
    server = ServerProcess(
        [
            *("--model", str(checkpoint), "--no-warmup", "--engine-timeout-s", "0", "--max-batch", "1", "--no-openpi"),
            *("--quantization", quantization),
            *(("--dtype", dtype) if dtype else ()),
        ]
    )
    try:
        health = server.wait_ready(timeout=timeout_s)
        figures["ready_s"] = time.perf_counter() - started
        loaded = [line for line in server.log if " loaded " in line and " in " in line]
        if loaded:
            figures["engine_load_s"] = float(loaded[-1].rsplit(" in ", 1)[1].split()[0])
        figures["memory_after_load_gib"] = process_memory_gib(server.proc.pid)
        figures["worker"] = health.get("worker")
        log(
            f"ready in {figures['ready_s']:.1f} s (engine load {figures.get('engine_load_s', float('nan')):.1f} s), "
            f"RSS {figures['memory_after_load_gib']}"
        )
        image = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
        with PolicyClient(f"ws://127.0.0.1:{server.port}") as client:
            domain = client.metadata["defaults"]["domain_name"]
            client.configure(domain_name=domain, resolution_tier=256, **(sampler or {}))
            sent = time.perf_counter()
            chunk = client.infer({"image": image}, timeout=timeout_s)
            figures["round_trip_s"] = time.perf_counter() - sent
        figures.update(
            domain=domain,
            num_steps=chunk.num_steps,
            actions_shape=list(chunk.actions.shape),
            actions_finite=bool(np.isfinite(chunk.actions).all()),
            timing_ms={k: v for k, v in chunk.timing.items() if v is not None},
        )
        figures["memory_after_chunk_gib"] = process_memory_gib(server.proc.pid)  # VmHWM: the peak since start
        figures["weights"] = client.metadata.get("weights")
        log(
            f"chunk: {chunk.actions.shape} in {figures['round_trip_s']:.1f} s, {chunk.num_steps} steps, "
            f"timing {figures['timing_ms']}"
        )
    finally:
        figures["server_exit_code"] = server.stop()
    figures["encode"] = time_vae_encode(checkpoint, size)
    model_ms = figures["timing_ms"]["model_ms"]
    encode_ms = figures["encode"]["median_ms"]
    figures["transformer_ms"] = model_ms - encode_ms
    figures["per_forward_s"] = figures["transformer_ms"] / 1000.0 / max(1, figures["num_steps"])
    figures["encode_share"] = encode_ms / model_ms
    figures["load_average_after"] = os.getloadavg()[0]
    return figures


def time_vae_encode(checkpoint: Path, size: int, repeats: int = 3) -> dict:
    """The conditioning encode of a policy chunk, with the checkpoint's VAE in fp32 on this CPU, one thread
    (as the server's engine worker here)."""
    import torch
    from diffusers import AutoencoderKLWan

    from cosmos3_runtime.frame_preprocessing import prepare_frames

    torch.set_num_threads(1)
    vae = AutoencoderKLWan.from_pretrained(checkpoint, subfolder="vae", torch_dtype=torch.float32).eval()
    image = np.random.default_rng(0).integers(0, 256, (1, size, size, 3), dtype=np.uint8)
    vision, *_ = prepare_frames(image, 256, 1, torch.device("cpu"))
    samples = []
    with torch.no_grad():
        for _ in range(repeats):
            started = time.perf_counter()
            vae.encode(vision)
            samples.append((time.perf_counter() - started) * 1000.0)
    return {"median_ms": statistics.median(samples), "samples_ms": samples, "canvas": list(vision.shape[-2:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=("edge", "nano"), default="edge", help="the published shape to build")
    parser.add_argument("--variant", default=None, help="the variant to build (default: the shape's distilled one)")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="a checkpoint folder of --shape; built there (random weights) if missing "
        "(default /tmp/cosmos3-SHAPE-VARIANT)",
    )
    parser.add_argument("--quantization", default="none", help="cosmos3-serve --quantization: none, int8")
    parser.add_argument("--num-steps", type=int, default=None, help="configure num_steps (a base checkpoint)")
    parser.add_argument("--dtype", default=None, help="cosmos3-serve --dtype (default: the device's, fp32 on CPU)")
    parser.add_argument("--guidance-scale", type=float, default=None, help="configure guidance_scale")
    parser.add_argument("--size", type=int, default=224, help="camera frame side (square), default 224")
    parser.add_argument("--min-available-gib", type=float, default=17.0)
    parser.add_argument("--delete", action="store_true", help="delete the checkpoint afterwards (8 GB)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from cosmos3_runtime.random_checkpoints import PUBLISHED_SHAPES, build_shaped_checkpoint, resolve_variant

    variant = resolve_variant(PUBLISHED_SHAPES[args.shape], args.variant)
    args.checkpoint = args.checkpoint or Path(f"/tmp/cosmos3-{args.shape}-{variant}")
    if not (args.checkpoint / "model_index.json").is_file():
        started = time.perf_counter()
        build_shaped_checkpoint(args.checkpoint, args.shape, variant)
        print(f"built the {args.shape} checkpoint in {time.perf_counter() - started:.0f} s")
    sampler = {
        key: value
        for key, value in (("num_steps", args.num_steps), ("guidance_scale", args.guidance_scale))
        if value is not None
    }
    try:
        figures = run(
            args.checkpoint,
            size=args.size,
            min_available_gib=args.min_available_gib,
            quantization=args.quantization,
            sampler=sampler,
            dtype=args.dtype,
        )
    finally:
        if args.delete:
            shutil.rmtree(args.checkpoint, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
