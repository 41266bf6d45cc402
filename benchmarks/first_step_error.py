"""The reach policy's first-step error: how well it reads the cube's place from the camera alone.

On held-out episodes of the reach task (``--seed``; ``make reach-policy`` trains on seed 1000), the arm at
its start pose, so the state is the same in every episode and only the camera shows the goal: the policy's
first chunk (``Cosmos3Engine.predict_actions``, in this process) against the scripted expert's first 16
actions, as a mean absolute error in action units, divided by the error of the mean chunk (the best a
policy that ignores the camera can do with one chunk for every place). Also with an all-black image.

Run it (prints one JSON object; docs/training.md quotes it)::

    .venv/bin/python benchmarks/first_step_error.py --model assets/reach_policy --episodes 16 --seed 424242

``tests/test_reach_policy.py`` runs :func:`first_step_errors` on 8 episodes of the same seed, against a bound
of 0.3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; mujoco reads it when first imported

from cosmos3_runtime.engine import Cosmos3Engine  # noqa: E402
from cosmos3_runtime.requests import ActionRequest  # noqa: E402
from robot_clients.sim.mujoco_arm import ArmEnvConfig  # noqa: E402
from robot_clients.sim.reach_task import DOMAIN, TASK, ReachExpert, ReachTaskEnv, run_expert  # noqa: E402


def first_step_errors(model: str | Path, episodes: int, seed: int) -> dict[str, float]:
    """The policy's first chunk against the expert's first 16 actions on ``episodes`` held-out cube places
    (``seed``), with the camera and with a black image, and the error of the mean chunk, in action units."""
    engine = Cosmos3Engine.load(model, device="cpu", prefix_cache_mb=0)
    env = ReachTaskEnv(ArmEnvConfig(image_height=128, image_width=128, wrist_camera=False, seed=seed))
    real, black, expected = [], [], []
    with env:
        for _ in range(episodes):
            steps, _ = run_expert(env, ReachExpert(env))
            first = steps[0]
            expected.append(np.array([s["action"] for s in steps[:16]]))
            for image, out in ((first["image"], real), (np.zeros_like(first["image"]), black)):
                request = ActionRequest(domain_name=DOMAIN, image=image, state=first["state"], prompt=TASK, seed=0)
                out.append(engine.predict_actions(request).actions)
    truth = np.array(expected)
    return {
        "first_step_error": float(np.abs(np.array(real) - truth).mean()),
        "mean_chunk_error": float(np.abs(truth.mean(0, keepdims=True) - truth).mean()),
        "black_image_error": float(np.abs(np.array(black) - truth).mean()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO_ROOT / "assets" / "reach_policy"))
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--seed", type=int, default=424_242, help="seed of the cube places (held out)")
    args = parser.parse_args()

    started = time.monotonic()
    errors = first_step_errors(args.model, args.episodes, args.seed)
    real, mean, black = errors["first_step_error"], errors["mean_chunk_error"], errors["black_image_error"]
    result = {
        "model": args.model,
        "episodes": args.episodes,
        "seed": args.seed,
        "first_step_error": round(real, 4),
        "mean_chunk_error": round(mean, 4),
        "ratio": round(real / mean, 3),
        "black_image_error": round(black, 4),
        "black_image_ratio": round(black / mean, 3),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
