"""What encoding and resizing camera frames on the robot do to the actions, on a fixed seed.

The same observation goes through the real engine (the tiny distilled checkpoint that
``cosmos3_runtime.random_checkpoints`` builds, production loading path, tier 256, seed 0) as the robot would
send it in each form:

* ``raw``: the 480×640 uint8 frame as it is (the reference; ``raw, again`` checks the run is deterministic);
* ``png``, ``jpeg q90``, ``jpeg q75``, ``webp q75``: encoded on the robot (``robot_clients.camera_frames``),
  decoded by the server (``policy_server.foundation.camera_intake``);
* ``resized``: shrunk on the robot to the size the server conditions on
  (``robot_clients.camera_frames.send_size``: 240×320 at tier 256), raw; ``resized jpeg q90/q75``: then encoded.

For each it prints the bytes on the wire (the encoded frame, or the raw array), the difference in the
pixels the VAE encodes (mean absolute, in uint8 levels, canvas against the raw frame's canvas), and the
difference in the actions against ``raw``: max abs and mean abs, in the actions' raw units. Three
yardsticks in the same units: the mean absolute action; the difference that changing only the seed
makes (the model's own sampling spread); and the difference that the *next camera frame* makes (the arm
moving, 1/15 s later, same seed): how much the actions react to a real change of the image.

The checkpoint is random: its actions react to pixels the way a random network does (weakly: see the
third yardstick), so read the differences against the yardsticks, not as numbers for a trained policy.

Run: ``.venv/bin/python benchmarks/encoded_frames.py [--frames 4] [--model PATH_OR_HUB_ID]`` (``--model``: a
real checkpoint, on the GPU where there is one, gives the figure for a trained policy).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from policy_server.foundation.camera_intake import decode_image  # noqa: E402
from robot_clients.camera_frames import ImageEncoding, canvas_bins, encode_frame, resize_frame, send_size  # noqa: E402  # noqa: E402
from robot_clients.protocol import FrameLimits  # noqa: E402

DEFAULT_TIER = 256
LIMITS = FrameLimits(min_image_side=32, max_image_side=4096, max_clip_frames=65)
# (label, encoding or None for a raw array, resize to the served canvas first)
VARIANTS = [
    ("raw, again", None, False),
    ("png", ImageEncoding("png"), False),
    ("jpeg q90", ImageEncoding("jpeg", 90), False),
    ("jpeg q75", ImageEncoding("jpeg", 75), False),
    ("webp q75", ImageEncoding("webp", 75), False),
    ("resized", None, True),
    ("resized png", ImageEncoding("png"), True),
    ("resized jpeg q90", ImageEncoding("jpeg", 90), True),
    ("resized jpeg q75", ImageEncoding("jpeg", 75), True),
]


def camera_frames(count: int, height: int = 480, width: int = 640) -> tuple[str, list[np.ndarray]]:
    """``count`` consecutive camera frames at 15 Hz of the MuJoCo arm swinging (one action held), with a
    little sensor noise; a synthetic scene where MuJoCo cannot render."""
    rng = np.random.default_rng(0)
    try:
        os.environ.setdefault("MUJOCO_GL", "egl")
        from robot_clients.sim.mujoco_arm import ArmEnvConfig, MujocoArmEnv

        frames = []
        config = ArmEnvConfig(control_hz=15.0, image_height=height, image_width=width, wrist_camera=False)
        with MujocoArmEnv(config) as env:
            env.reset()
            swing = np.array([1.0, 0.6, -0.6, 1.0], np.float32)
            for _ in range(3):  # under way before the first frame
                env.apply_action({"actions": swing})
            for _ in range(count):
                env.apply_action({"actions": swing})
                frames.append(env.render("front"))
        source = "MuJoCo arm, front camera"
    except Exception as exc:  # noqa: BLE001 - no EGL here: a synthetic scene instead, said in the output
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        frames = [
            np.stack([128 + 100 * np.sin(x / (31 + i)), 128 + 100 * np.cos(y / 23), (x + y) % 256], -1)
            for i in range(count)
        ]
        source = f"synthetic scene (MuJoCo unavailable: {exc})"
    noisy = [np.clip(f.astype(np.float32) + rng.normal(0, 2.0, f.shape), 0, 255).astype(np.uint8) for f in frames]
    return source + ", sensor noise sigma 2 levels", noisy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=4, help="consecutive camera frames to average over")
    parser.add_argument("--model", default=None, help="a checkpoint (folder or Hub id); default: the tiny one")
    parser.add_argument("--tier", type=int, default=DEFAULT_TIER, help="resolution tier (default 256)")
    args = parser.parse_args()

    import torch

    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.frame_preprocessing import canvas_table
    from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint
    from cosmos3_runtime.requests import ActionRequest

    source = args.model or build_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="cosmos3-enc-")) / "tiny")
    engine = Cosmos3Engine.load(source)
    domain = engine.default_domain()
    scene_source, frames = camera_frames(args.frames)
    size = send_size(*frames[0].shape[:2], canvas_bins(canvas_table(), args.tier))

    def actions(image: np.ndarray, seed: int = 0) -> np.ndarray:
        return engine.predict_actions(
            ActionRequest(domain_name=domain, image=image, resolution_tier=args.tier, seed=seed)
        ).actions

    def canvas(image: np.ndarray) -> torch.Tensor:
        return engine.sampler.preprocess(image[None], args.tier, 1)[0]

    rows: dict[str, dict[str, list[float]]] = {}
    reference_abs, seed_max, seed_mean, pose_max, pose_mean, pose_pixels = [], [], [], [], [], []
    for index, frame in enumerate(frames):
        reference = actions(frame)
        next_frame = frames[(index + 1) % len(frames)]
        other_pose = actions(next_frame) - reference
        pose_max.append(float(np.abs(other_pose).max()))
        pose_mean.append(float(np.abs(other_pose).mean()))
        pose_pixels.append((canvas(next_frame) - canvas(frame)).abs().mean().item() * 127.5)
        reference_canvas = canvas(frame)
        reference_abs.append(float(np.abs(reference).mean()))
        other_seed = actions(frame, seed=1) - reference
        seed_max.append(float(np.abs(other_seed).max()))
        seed_mean.append(float(np.abs(other_seed).mean()))
        for label, encoding, resize in VARIANTS:
            sent = resize_frame(frame, size.height, size.width) if resize else frame
            if encoding is None:
                wire_bytes, received = sent.nbytes, sent
            else:
                data = encode_frame(sent, encoding)
                wire_bytes, received = len(data), decode_image(data, "image", LIMITS)
            difference = actions(received) - reference
            pixels = (canvas(received) - reference_canvas).abs().mean().item() * 127.5
            row = rows.setdefault(label, {"bytes": [], "pixels": [], "max": [], "mean": []})
            row["bytes"].append(wire_bytes)
            row["pixels"].append(pixels)
            row["max"].append(float(np.abs(difference).max()))
            row["mean"].append(float(np.abs(difference).mean()))

    print(
        f"frames: {len(frames)} × {frames[0].shape[0]}×{frames[0].shape[1]} ({scene_source}); tier {args.tier}, "
        f"seed 0, {engine.describe().variant} checkpoint {args.model or '(tiny, random)'}, domain {domain}; "
        f"resized = {size.height}×{size.width}"
        f" (exact: {size.exact})"
    )
    print(
        f"yardsticks: mean |action| {np.mean(reference_abs):.3g}; seed 1 instead of 0 (same frame): max abs "
        f"{np.mean(seed_max):.3g}, mean abs {np.mean(seed_mean):.3g}; the next frame instead (same seed; canvas Δ "
        f"{np.mean(pose_pixels):.3g} levels): max abs {np.mean(pose_max):.3g}, mean abs {np.mean(pose_mean):.3g}"
    )
    header = (
        f"{'form on the wire':<18} | {'bytes/frame':>11} {'x raw':>6} | {'canvas Δ':>8} | {'actions Δ max':>13} "
        f"{'Δ mean':>9} | {'Δ mean / next Δ':>15}"
    )
    print(header)
    print("-" * len(header))
    raw_bytes = frames[0].nbytes
    print(f"{'raw':<18} | {raw_bytes:>11,} {1.0:>6.3f} | {0.0:>8.3f} | {0.0:>13.3g} {0.0:>9.3g} | {0.0:>15.3g}")
    for label, _, _ in VARIANTS:
        row = rows[label]
        mean_bytes = float(np.mean(row["bytes"]))
        print(
            f"{label:<18} | {mean_bytes:>11,.0f} {mean_bytes / raw_bytes:>6.3f} | {np.mean(row['pixels']):>8.3f} | "
            f"{np.mean(row['max']):>13.3g} {np.mean(row['mean']):>9.3g} | "
            f"{np.mean(row['mean']) / np.mean(pose_mean):>15.3g}"
        )
    print(
        "canvas Δ: mean |pixel difference| of the VAE's input canvas, in uint8 levels; action columns: mean over "
        "the frames of each frame's max / mean |Δ| against raw"
    )


if __name__ == "__main__":
    main()
