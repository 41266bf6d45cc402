"""Quantized weights against full precision: the same observations and seeds through each, side by side.

For each ``--quantizations`` entry (``none`` first: the reference), a child process loads the checkpoint
through ``Cosmos3Engine.load`` (the production path, diffusers' torchao config), answers ``--requests``
policy observations (camera frames drawn from ``--seed``, each request its own seed), and reports its
actions, its chunk times, its load time and its peak resident memory (``VmHWM``). Each load is a process of
its own, so each peak is its own. The parent prints, per quantization:

- the actions' relative error against full precision, ``||a - a_ref|| / ||a_ref||`` over every chunk, and
  the largest element difference;
- chunk p50 and its ratio to full precision (on this CPU int8 weight-only is slower, not faster: its point
  is memory);
- load time and peak RSS.

``--shape edge`` builds a random-weight Edge checkpoint of the published size first (bf16, 8 GB on disk);
full precision on this CPU then needs about 16 GiB. Run:
``python benchmarks/quantized_weights.py --shape edge --quantizations none,int8 --requests 3`` or
``python benchmarks/quantized_weights.py --checkpoint assets/reach_policy``. ``gpu_suite.py`` uses
:func:`measure` in process, on a GPU, for bf16, fp8 and int8.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS.parent))


def requests_for(engine, count: int, seed: int, size: int, sampler: dict, geometry: dict | None = None) -> list:
    """``count`` policy requests on the engine's default domain: random frames of ``size``, seeds ``seed + i``."""
    from cosmos3_runtime.requests import ActionRequest

    rng = np.random.default_rng(seed)
    height, width = (geometry or {}).get("height", size), (geometry or {}).get("width", size)
    extra = {k: v for k, v in (geometry or {}).items() if k in ("action_horizon", "resolution_tier")}
    domain = engine.default_domain()
    profile = engine.description.domain(domain)
    rows = None
    if profile is not None and profile.state_dim is not None:  # a state-conditioned domain: a small random state
        rows = (profile.history_length, profile.state_dim) if profile.history_length else (profile.state_dim,)
    batch = []
    for i in range(count):
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        state = {"state": rng.normal(0.0, 0.1, rows).astype(np.float32)} if rows is not None else {}
        batch.append(ActionRequest(domain_name=domain, image=image, seed=seed + i, **extra, **state, **sampler))
    return batch


def measure(
    checkpoint: Path,
    quantization: str | None,
    *,
    requests: int,
    seed: int = 0,
    size: int = 224,
    sampler: dict | None = None,
    geometry: dict | None = None,
    device: str | None = None,
    warmup: int = 0,
) -> dict:
    """Load ``checkpoint`` with ``quantization`` and answer the requests; the actions and the figures."""
    import torch

    from cosmos3_runtime.engine import Cosmos3Engine

    cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    engine = Cosmos3Engine.load(checkpoint, device=device, quantization=quantization, prefix_cache_mb=0)
    load_s = time.perf_counter() - started
    figures: dict = {"quantization": quantization or "none", "load_s": load_s}
    if cuda:
        figures["gpu_memory_after_load_gib"] = torch.cuda.memory_allocated() / 2**30
        figures["gpu_peak_load_gib"] = torch.cuda.max_memory_allocated() / 2**30
    batch = requests_for(engine, requests, seed, size, sampler or {}, geometry)
    for request in batch[:warmup]:
        engine.predict_actions(request)
    actions, times = [], []
    for request in batch:
        began = time.perf_counter()
        result = engine.predict_actions(request)
        times.append((time.perf_counter() - began) * 1000.0)
        actions.append(result.actions)
    figures.update(
        chunk_p50_ms=statistics.median(times),
        chunk_ms=times,
        forwards=result.transformer_forwards,
        weights=engine.describe().as_json()["weights"],
    )
    if cuda:
        figures["gpu_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del engine
    figures["actions"] = np.stack(actions)
    return figures


def compare(reference: np.ndarray, other: np.ndarray) -> dict:
    """Relative error (norm of the difference over the reference's) and the largest element difference."""
    difference = other.astype(np.float64) - reference.astype(np.float64)
    return {
        "relative_error": float(np.linalg.norm(difference) / np.linalg.norm(reference)),
        "max_abs_difference": float(np.abs(difference).max()),
    }


def _peak_rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _child(args: argparse.Namespace) -> int:
    figures = measure(
        args.checkpoint,
        None if args.child == "none" else args.child,
        requests=args.requests,
        seed=args.seed,
        size=args.image_size,
        sampler=_sampler(args),
        device="cpu",
    )
    np.save(args.actions_out, figures.pop("actions"))
    figures["peak_rss_gib"] = _peak_rss_gib()
    print(json.dumps(figures))
    return 0


def _sampler(args: argparse.Namespace) -> dict:
    return {
        key: value
        for key, value in (("num_steps", args.num_steps), ("guidance_scale", args.guidance_scale))
        if value is not None
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--shape", choices=("edge",), default=None, help="build this published shape if missing")
    parser.add_argument("--quantizations", default="none,int8", help="comma-separated, none first")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-steps", type=int, default=None)
    parser.add_argument("--guidance-scale", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--actions-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return _child(args)
    if args.checkpoint is None:
        if args.shape is None:
            parser.error("give --checkpoint, or --shape edge to build one")
        args.checkpoint = Path(f"/tmp/cosmos3-{args.shape}-distilled")
    if not (args.checkpoint / "model_index.json").is_file():
        if args.shape is None:
            parser.error(f"{args.checkpoint} is not a checkpoint folder")
        from cosmos3_runtime.random_checkpoints import build_shaped_checkpoint

        build_shaped_checkpoint(args.checkpoint, args.shape)
    quantizations = args.quantizations.split(",")
    if quantizations[0] != "none":
        parser.error("--quantizations starts with none: the reference")
    results, reference = [], None
    with tempfile.TemporaryDirectory() as scratch:
        for quantization in quantizations:
            out = Path(scratch) / f"{quantization}.npy"
            command = [sys.executable, __file__, "--checkpoint", str(args.checkpoint), "--child", quantization]
            command += ["--actions-out", str(out), "--requests", str(args.requests), "--seed", str(args.seed)]
            command += ["--image-size", str(args.image_size)]
            for flag, value in (("--num-steps", args.num_steps), ("--guidance-scale", args.guidance_scale)):
                if value is not None:
                    command += [flag, str(value)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            actions = np.load(out)
            if reference is None:
                reference = actions
            figures.update(compare(reference, actions))
            results.append(figures)
    base = results[0]["chunk_p50_ms"]
    print(f"{args.checkpoint.name}: {args.requests} requests, seeds {args.seed}..{args.seed + args.requests - 1}")
    print("quantization | relative error | max abs diff | chunk p50 ms | vs none | load s | peak RSS GiB")
    for r in results:
        print(
            f"{r['quantization']:>12} | {r['relative_error']:14.4%} | {r['max_abs_difference']:12.5f} | "
            f"{r['chunk_p50_ms']:12.1f} | {r['chunk_p50_ms'] / base:6.2f}x | {r['load_s']:6.1f} | "
            f"{r['peak_rss_gib']:12.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
