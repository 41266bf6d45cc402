"""Frame preprocessing before and after, side by side: diffusers' float path versus the runtime's uint8 path.

"before" is what the runtime did until issue 13: the uint8 frames converted to float32 in [0, 1] with
numpy, then ``Cosmos3OmniPipeline._prepare_action_video_conditioning`` (tensor conversion, snap to a
multiple of 16, [-1, 1], bin, bicubic antialiased resize, pad). "after" is
:func:`cosmos3_runtime.frame_preprocessing.prepare_frames`. Both run interleaved in one process, one
torch thread (the server's engine worker runs one on this 2-core machine), on the same frames.

Two views:

1. the preprocessing call alone, per frame geometry (median of ``--repeats`` interleaved calls);
2. ``preprocess_ms`` as the engine reports it in a policy chunk's timing (validation included), with the
   engine's preprocessing switched between the two paths on alternate requests.

Run: ``.venv/bin/python benchmarks/preprocess.py [--repeats 60]``
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

CASES = [  # (label, frames, height, width, tier, frames the clip is padded to)
    ("480x640 camera, tier 256", 1, 480, 640, 256, 1),
    ("480x640 camera, tier 480", 1, 480, 640, 480, 1),
    ("224x224 camera, tier 256", 1, 224, 224, 256, 1),
    ("180x320 (DROID), tier 480", 1, 180, 320, 480, 1),
    ("17-frame 256x256 clip, tier 256", 17, 256, 256, 256, 17),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--chunks", type=int, default=30, help="policy requests per path in part 2")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.frame_preprocessing import prepare_frames
    from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint
    from cosmos3_runtime.requests import ActionRequest

    engine = Cosmos3Engine.load(build_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="cosmos3-pre-")) / "tiny"))
    pipe, cpu = engine.pipe, torch.device("cpu")

    def before(frames, tier, num_frames):
        return pipe._prepare_action_video_conditioning(
            frames.astype(np.float32) / 255.0, tier, num_frames, device=cpu, dtype=torch.float32
        )

    def after(frames, tier, num_frames):
        return prepare_frames(frames, tier, num_frames, cpu)

    rng = np.random.default_rng(0)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread; load average "
        f"{os.getloadavg()[0]:.2f}; {args.repeats} interleaved calls per cell"
    )
    print(f"{'frames':<34} {'before ms':>10} {'after ms':>10} {'speedup':>8} {'max diff (uint8 levels)':>24}")
    for label, t, h, w, tier, num_frames in CASES:
        frames = rng.integers(0, 256, (t, h, w, 3), dtype=np.uint8)
        samples = {"before": [], "after": []}
        for i in range(args.repeats + 2):
            for name, fn in (("before", before), ("after", after))[:: 1 if i % 2 else -1]:
                started = time.perf_counter()
                fn(frames, tier, num_frames)
                if i >= 2:  # the first two rounds warm allocators and imports
                    samples[name].append(time.perf_counter() - started)
        diff = (after(frames, tier, num_frames)[0] - before(frames, tier, num_frames)[0]).abs().max().item() * 127.5
        b, a = (statistics.median(samples[k]) * 1000 for k in ("before", "after"))
        print(f"{label:<34} {b:>10.2f} {a:>10.2f} {b / a:>7.1f}x {diff:>24.5f}")

    # Part 2: the engine's own preprocess_ms, alternating the path it uses.
    frame = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    domain = engine.default_domain()
    engine.predict_actions(ActionRequest(domain_name=domain, image=frame, seed=0))
    reported = {"before": [], "after": []}
    sampler = engine.sampler
    for i in range(args.chunks * 2):
        name = ("before", "after")[i % 2]
        sampler.preprocess = before if name == "before" else after
        chunk = engine.predict_actions(ActionRequest(domain_name=domain, image=frame, seed=i))
        reported[name].append(chunk.timing.preprocess_ms)
    del sampler.preprocess
    b, a = (statistics.median(reported[k]) for k in ("before", "after"))
    print(
        f"\nengine preprocess_ms, policy chunk, 480x640 frame at tier {engine.spec.default_tier}, "
        f"{args.chunks} chunks per path: before {b:.2f} ms, after {a:.2f} ms, speedup {b / a:.1f}x "
        f"(p90 before {np.percentile(reported['before'], 90):.2f}, after {np.percentile(reported['after'], 90):.2f})"
    )


if __name__ == "__main__":
    main()
