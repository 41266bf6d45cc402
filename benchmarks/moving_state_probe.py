"""Does a moving-cube policy read its state? The same clip asked with the measured state and with it moved.

Loads a checkpoint in-process (no server), runs the moving task's expert on held-out paths, and at two
ticks of each episode asks the policy three times for the same observation: with the measured state and
seed 0, with seed 1 (the sampler's own spread, for scale) and with the state moved by ``--shift`` in every
arm joint (action units). A policy that plans from its state moves its chunk's first rows by about the
shift; one that reads the arm's pose from the camera instead (the camera shows the arm) hardly moves it.
Prints one line per probe and the medians (docs/robot_side.md, "Acting before being asked").

    python benchmarks/moving_state_probe.py --model assets/moving_policy
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="assets/moving_policy")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=4242, help="paths (held out: demonstrations use 1000)")
    parser.add_argument("--shift", type=float, default=0.3, help="added to each arm joint of the state")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.requests import ActionRequest
    from robot_clients.sim.moving_task import DOMAIN, TASK, MovingCubeExpert, MovingCubeTaskEnv
    from robot_clients.sim.mujoco_arm import ArmEnvConfig

    torch.set_num_threads(args.threads)
    engine = Cosmos3Engine.load(Path(args.model), device="cpu")
    config = ArmEnvConfig(image_height=128, image_width=128, wrist_camera=False, seed=args.seed, episode_steps=40)
    shift = np.array([args.shift] * 3 + [0.0], np.float32)
    spreads, moves, first_rows = [], [], []
    env = MovingCubeTaskEnv(config)
    with env:
        expert = MovingCubeExpert(env)
        for _ in range(args.episodes):
            env.reset()
            for tick in range(40):
                observation = env.get_observation()
                if tick in (12, 25):
                    state = observation["state"].astype(np.float32)

                    def ask(s: np.ndarray, seed: int = 0) -> np.ndarray:
                        request = ActionRequest(
                            domain_name=DOMAIN,
                            prompt=TASK,
                            image=observation["image"],
                            state=s,
                            action_horizon=16,
                            seed=seed,
                        )
                        return np.asarray(engine.predict_actions(request).actions)

                    base = ask(state)
                    spread = float(np.abs(ask(state, seed=1) - base)[:, :3].mean())
                    moved = ask(state + shift) - base
                    spreads.append(spread)
                    moves.append(float(np.abs(moved[:, :3]).mean()))
                    first_rows.append(float(moved[0, :3].mean()))
                    print(
                        f"tick {tick:2d}: seed spread {spread:.3f}, chunk moved {moves[-1]:.3f} "
                        f"(first row {first_rows[-1]:+.3f}) for a state moved {args.shift:+.2f}",
                        flush=True,
                    )
                env.apply_action({"actions": expert.act()})
    print(
        f"median over {len(moves)} probes: seed spread {np.median(spreads):.3f}, chunk moved {np.median(moves):.3f}, "
        f"first row {np.median(first_rows):+.3f} (a policy that plans from its state: about {args.shift:+.2f})"
    )


if __name__ == "__main__":
    main()
