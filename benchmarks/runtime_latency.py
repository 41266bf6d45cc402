"""Runtime latency on tiny checkpoints, measured side by side in one run.

Prints, as medians over interleaved repetitions (this machine is noisy; compare ratios, not absolutes):

1. tiny checkpoint build time and size;
2. ``predict_actions`` for a distilled versus a base tiny checkpoint at the same horizon and tier;
3. the conditioning encode of a policy request: first frame only (what the runtime does) versus the
   (horizon + 1)-frame padded clip diffusers' pipeline encodes, and the resulting per-chunk saving;
4. action only (``policy``) versus also decoding the video (``forward_dynamics``);
5. with and without the text prefix cache (distilled, and base with guidance);
6. batching: 1, 2, 4 and 8 requests through ``predict_actions_batch`` versus one by one.

Run: ``.venv/bin/python benchmarks/runtime_latency.py [--repeats 15] [--horizon 16] [--tier 256]``;
``--encode-only`` runs the distilled chunk and section 3 only (well under a minute).
"""

from __future__ import annotations

import os

# Before torch is imported: spinning OpenMP threads slow every call ~10x when anything else runs.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--tier", type=int, default=256)
    parser.add_argument("--base-steps", type=int, default=35)
    parser.add_argument("--base-guidance", type=float, default=6.0)
    parser.add_argument("--encode-only", action="store_true", help="the distilled chunk and the encode only")
    args = parser.parse_args()

    import torch

    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint
    from cosmos3_runtime.requests import ActionRequest

    workdir = Path(tempfile.mkdtemp(prefix="cosmos3-bench-"))
    build_s, sizes = [], []
    for i in range(3):
        started = time.perf_counter()
        path = build_tiny_checkpoint(workdir / f"build-{i}", "distilled")
        build_s.append(time.perf_counter() - started)
        sizes.append(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"tiny checkpoint build: median {_median_ms(build_s):.0f} ms (first, with imports: {build_s[0]:.2f} s), "
        f"size {sizes[0] / 1e6:.2f} MB"
    )

    distilled = Cosmos3Engine.load(build_tiny_checkpoint(workdir / "distilled", "distilled"))
    base = Cosmos3Engine.load(build_tiny_checkpoint(workdir / "base", "base"))
    image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    common = dict(
        domain_name="bridge_orig_lerobot",
        image=image,
        action_horizon=args.horizon,
        resolution_tier=args.tier,
        prompt="pick up the red cube",
    )
    requests = {
        "distilled": (distilled, ActionRequest(seed=0, **common)),
        "base": (base, ActionRequest(seed=0, num_steps=args.base_steps, guidance_scale=args.base_guidance, **common)),
    }
    if args.encode_only:
        del requests["base"]
    for engine, request in requests.values():  # warm-up
        engine.predict_actions(request)

    samples = {name: [] for name in requests}
    forwards = {}
    for _ in range(args.repeats):
        for name, (engine, request) in requests.items():
            started = time.perf_counter()
            chunk = engine.predict_actions(request)
            samples[name].append(time.perf_counter() - started)
            forwards[name] = (chunk.num_steps, chunk.transformer_forwards)

    print(
        f"\npredict_actions, policy, horizon {args.horizon}, tier {args.tier}, 224x224 image, "
        f"{args.repeats} interleaved runs"
    )
    print(f"{'checkpoint':<12}{'steps':>6}{'forwards':>10}{'median ms':>12}{'p90 ms':>10}")
    for name, values in samples.items():
        steps, fwd = forwards[name]
        p90 = np.percentile(values, 90) * 1000.0
        print(f"{name:<12}{steps:>6}{fwd:>10}{_median_ms(values):>12.1f}{p90:>10.1f}")
    if "base" in samples:
        print(f"ratio base / distilled: {_median_ms(samples['base']) / _median_ms(samples['distilled']):.2f}x")

    sampler = distilled.sampler
    full_clip, full_size, _, _ = sampler.preprocess(image[None], args.tier, args.horizon + 1)
    one_frame, one_size, _, _ = sampler.preprocess(image[None], args.tier, 1)
    encode = {"first frame only": [], f"full {args.horizon + 1}-frame clip": []}
    with torch.no_grad():
        for _ in range(max(5, args.repeats // 2)):
            for name, (clip, size) in zip(encode, [(one_frame, one_size), (full_clip, full_size)]):
                started = time.perf_counter()
                sampler.encode(clip, size)
                encode[name].append(time.perf_counter() - started)
    (one_name, one_vals), (full_name, full_vals) = encode.items()
    print(
        f"\nconditioning encode at tier {args.tier}: {one_name} {_median_ms(one_vals):.1f} ms, "
        f"{full_name} {_median_ms(full_vals):.1f} ms, ratio {_median_ms(full_vals) / _median_ms(one_vals):.1f}x; "
        f"saving per distilled chunk {_median_ms(full_vals) - _median_ms(one_vals):.1f} ms "
        f"(chunk median {_median_ms(samples['distilled']):.1f} ms with the saving)"
    )

    if not args.encode_only:
        more_tables(workdir, args.repeats, args.horizon, args.tier)


def _interleaved(cases: dict, repeats: int) -> dict[str, list[float]]:
    """Run each callable in turn, ``repeats`` rounds, after one warm-up round; seconds per call."""
    for fn in cases.values():
        fn()
    samples = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
    return samples


def more_tables(workdir: Path, repeats: int, horizon: int, tier: int) -> None:
    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.requests import ActionRequest, VideoRequest

    image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    distilled = Cosmos3Engine.load(workdir / "distilled")
    actions = np.zeros((horizon, 10), np.float32)
    samples = _interleaved(
        {
            "policy (actions only)": lambda: distilled.predict_actions(
                ActionRequest(
                    domain_name="bridge_orig_lerobot", image=image, action_horizon=horizon, resolution_tier=tier, seed=0
                )
            ),
            "forward_dynamics (decodes video)": lambda: distilled.rollout_video(
                VideoRequest(
                    domain_name="bridge_orig_lerobot", image=image, actions=actions, resolution_tier=tier, seed=0
                )
            ),
        },
        repeats,
    )
    print(f"\naction only vs decoding the video (distilled, horizon {horizon}, tier {tier})")
    for name, values in samples.items():
        print(f"  {name:<34}{_median_ms(values):>10.1f} ms")
    (a, av), (v, vv) = samples.items()
    print(f"  ratio video / actions: {_median_ms(vv) / _median_ms(av):.2f}x")

    print(f"\ntext prefix cache (horizon {horizon}, tier {tier}, same prompt every tick)")
    print(f"  {'checkpoint':<22}{'uncached ms':>12}{'cached ms':>11}{'speedup':>9}")
    for variant, extra in (("distilled", {}), ("base", dict(num_steps=8, guidance_scale=4.0))):
        off = Cosmos3Engine.load(workdir / variant, prefix_cache_mb=0)
        on = Cosmos3Engine.load(workdir / variant, prefix_cache_mb=64)
        request = ActionRequest(
            domain_name="bridge_orig_lerobot",
            image=image,
            action_horizon=horizon,
            resolution_tier=tier,
            seed=0,
            prompt="pick up the red cube and put it in the bowl",
            **extra,
        )
        samples = _interleaved(
            {"off": lambda: off.predict_actions(request), "on": lambda: on.predict_actions(request)}, repeats
        )
        label = variant + (" (8 steps, CFG)" if extra else "")
        print(
            f"  {label:<22}{_median_ms(samples['off']):>12.1f}{_median_ms(samples['on']):>11.1f}"
            f"{_median_ms(samples['off']) / _median_ms(samples['on']):>8.2f}x"
        )

    print(f"\nbatching (distilled, horizon {horizon}, tier {tier}, distinct images and seeds)")
    print(f"  {'requests':>8}{'one by one ms':>15}{'batched ms':>12}{'throughput gain':>17}")
    rng = np.random.default_rng(1)
    for n in (1, 2, 4, 8):
        requests = [
            ActionRequest(
                domain_name="bridge_orig_lerobot",
                action_horizon=horizon,
                resolution_tier=tier,
                image=rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
                seed=i,
            )
            for i in range(n)
        ]
        samples = _interleaved(
            {
                "serial": lambda: [distilled.predict_actions(r) for r in requests],
                "batched": lambda: distilled.predict_actions_batch(requests),
            },
            max(3, repeats // 3),
        )
        serial, batched = _median_ms(samples["serial"]), _median_ms(samples["batched"])
        print(f"  {n:>8}{serial:>15.1f}{batched:>12.1f}{serial / batched:>16.2f}x")


if __name__ == "__main__":
    main()
