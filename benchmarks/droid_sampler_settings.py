"""NVIDIA's DROID serving settings against the variant's defaults, side by side on one tiny DROID checkpoint.

NVIDIA's RoboLab server runs its DROID policies at 4 UniPC steps, guidance 3.0 and shift 5.0 (the Edge recipe
adds guidance only in timesteps 960-1001); before the profile carried those settings, a DROID domain here ran
the base variant's 35 steps at guidance 6.0 on the scheduler's own shift. This prints the transformer
forwards and the chunk latency of each, the two requests alternated on one loaded engine, with medians
and the per-pair ratio.

    python benchmarks/droid_sampler_settings.py [--variant base|edge] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cosmos3_runtime.checkpoints import step_sigmas
from cosmos3_runtime.engine import Cosmos3Engine
from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint
from cosmos3_runtime.requests import ActionRequest

# What a tiny --droid checkpoint ran at before its profile carried NVIDIA's sampler settings (main at 468070b):
# the variant's 35 steps and guidance (6.0 base, 5.0 Edge) on the scheduler's own shift, with the profile's
# guidance interval (timesteps 960-1001, sigmas [0.96, 1.0]) on every variant.
VARIANT_DEFAULTS = {"base": {"num_steps": 35, "guidance_scale": 6.0}, "edge": {"num_steps": 35, "guidance_scale": 5.0}}
OLD_INTERVAL = (0.96, 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=sorted(VARIANT_DEFAULTS), default="base")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_tiny_checkpoint(Path(tmp) / "droid", args.variant, droid=True)
        engine = Cosmos3Engine.load(checkpoint)
        description = engine.describe()
        profile = description.domain_defaults["droid_lerobot"]
        shift = engine.sampler.loaded_shift
        rng = np.random.default_rng(0)
        image = rng.integers(0, 256, (540, 640, 3), dtype=np.uint8)
        state = np.zeros(8, np.float32)
        base = dict(domain_name="droid_lerobot", image=image, state=state, prompt="put the cube in the bowl")
        requests = {
            "nvidia": ActionRequest(**base),  # the profile's: NVIDIA's settings
            "variant": ActionRequest(
                **base, **VARIANT_DEFAULTS[args.variant], shift=shift, guidance_interval=OLD_INTERVAL
            ),
        }
        for request in requests.values():  # warm-up: allocations, first-call costs
            engine.predict_actions(request)
        times: dict[str, list[float]] = {name: [] for name in requests}
        forwards: dict[str, int] = {}
        for _ in range(args.runs):
            for name, request in requests.items():
                started = time.perf_counter()
                chunk = engine.predict_actions(request)
                times[name].append((time.perf_counter() - started) * 1e3)
                forwards[name] = chunk.transformer_forwards
                settings = chunk.settings

    print(
        f"tiny {args.variant} --droid checkpoint, {args.runs} chunks each, alternated; chunk {settings.action_horizon}"
    )
    sigmas = step_sigmas(engine.info, profile.num_steps, profile.shift)
    print(f"  the steps' sigmas at NVIDIA's settings: {[round(sigma, 4) for sigma in sigmas]}")
    interval = list(profile.guidance_interval) if profile.guidance_interval else None
    print(
        f"  nvidia  : {profile.num_steps} steps, guidance {profile.guidance_scale:g}, shift {profile.shift:g}, "
        f"interval {interval}: {forwards['nvidia']} forwards, "
        f"median {statistics.median(times['nvidia']):.0f} ms (min {min(times['nvidia']):.0f})"
    )
    old = VARIANT_DEFAULTS[args.variant]
    print(
        f"  variant : {old['num_steps']} steps, guidance {old['guidance_scale']:g}, shift {shift:g}, "
        f"interval {list(OLD_INTERVAL)}: "
        f"{forwards['variant']} forwards, median {statistics.median(times['variant']):.0f} ms "
        f"(min {min(times['variant']):.0f})"
    )
    ratios = [v / n for v, n in zip(times["variant"], times["nvidia"])]
    spread = f"pairs {min(ratios):.1f}-{max(ratios):.1f}x"
    print(f"  variant / nvidia latency: median {statistics.median(ratios):.1f}x ({spread})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
