"""Which way a moving-cube policy misses: the hand's offset from the goal along the cube's path, across it, in height.

Starts ``cosmos3-serve --model CKPT`` and runs held-out episodes of the moving task as ``cosmos3-eval`` runs a
cell (``rtc`` at 20 Hz, ``--delay`` ms injected after each chunk). Every tick the hand's offset from the goal
is split into three parts: along the cube's direction of travel (+: ahead of the cube), across it on the
table, and in height. Prints, for each missed episode, the cube's speed and those parts averaged over the
episode's judged ticks (the last :data:`~robot_clients.sim.moving_task.HOLD_TICKS`), then the mean size of
each part over the misses and over every episode. A miss along the path, with either sign, is a misread speed
carried forward; one across it or in height is not.

    python benchmarks/moving_miss_direction.py --model assets/moving_policy --delay 500
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="assets/moving_policy")
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=200_000, help="paths (held out: demonstrations use 1000-11000)")
    parser.add_argument("--delay", type=int, default=500, help="injected delay, ms")
    parser.add_argument("--clip-stride", type=int, default=None, help="as the policy was trained (cosmos3-eval's)")
    args = parser.parse_args()

    from robot_clients.chunker import ActionChunker
    from robot_clients.control_loop import ChunkingAgent, ControlLoop
    from robot_clients.sim.moving_task import CLIP_STRIDE, HOLD_TICKS, MovingCubeTaskEnv
    from robot_clients.sim.mujoco_arm import ArmEnvConfig
    from robot_clients.sim.reach_eval import TASKS, chunker_config, served_client
    from robot_clients.sim.reach_task import ReachChunkPolicy

    class OffsetRecordingEnv(MovingCubeTaskEnv):
        """The moving task, keeping the hand's offset from the goal after every tick."""

        offsets: list[np.ndarray]

        def reset(self) -> None:
            self.offsets = []
            super().reset()

        def apply_action(self, action: dict[str, Any]) -> None:
            super().apply_action(action)
            self.offsets.append(self.hand - self.goal)

    stride = CLIP_STRIDE if args.clip_stride is None else args.clip_stride
    rows = []  # (speed, along, across, height, success) per episode
    with served_client(args.model, TASKS["moving"]) as (client, horizon):
        config = ArmEnvConfig(image_height=128, image_width=128, wrist_camera=False, seed=args.seed, episode_steps=40)
        env = OffsetRecordingEnv(config, clip_stride=stride)
        with env:
            for episode in range(args.episodes):
                policy = ReachChunkPolicy(client, delay_s=args.delay / 1e3, ablation="none", seed=episode)
                with ActionChunker(policy, chunker_config("rtc", 20.0, 8)) as chunker:
                    ControlLoop(env, ChunkingAgent(chunker), control_hz=20.0).run_episode()  # resets env
                velocity = env.path.velocity
                heading = velocity / max(float(np.linalg.norm(velocity)), 1e-9)
                judged = np.array(env.offsets[-HOLD_TICKS:])
                along = judged[:, :2] @ heading
                across = np.linalg.norm(judged[:, :2] - along[:, None] * heading, axis=1)
                rows.append((env.path.speed, along.mean(), across.mean(), judged[:, 2].mean(), env.outcome().success))
    table = np.array(rows, dtype=float)
    missed = table[table[:, 4] == 0]
    print(f"{args.model}: rtc at {args.delay} ms, clip stride {stride}, {args.episodes} episodes of seed {args.seed}")
    print(f"held {int(table[:, 4].sum())}/{args.episodes}; the misses (cm/s, then cm over the judged ticks):")
    for speed, along, across, height, _ in missed:
        parts = f"along {along * 100:+5.1f}  across {across * 100:4.1f}  height {height * 100:+5.1f}"
        print(f"  speed {speed * 100:5.1f}  {parts}")
    for name, part in (("misses", missed), ("every episode", table)):
        if len(part):
            sizes = np.abs(part[:, 1:4]).mean(axis=0) * 100
            print(f"mean size, {name}: along {sizes[0]:.2f} cm, across {sizes[1]:.2f} cm, height {sizes[2]:.2f} cm")


if __name__ == "__main__":
    main()
