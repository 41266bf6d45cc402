"""What a moving-cube policy makes of its own rtc prefix: the rows after it, against the expert's, through the server.

Starts ``cosmos3-serve --model CKPT`` and lets the policy drive the arm on held-out paths as ``rtc`` runs its
chunks at ``--delay`` ticks of latency, in the simulator's time
(:func:`robot_clients.sim.moving_task.run_policy_labelled_episode`): each request sends the ``d`` rows the arm
will run while the model thinks, and the answer takes over at its row ``d``. For every request it prints, over
the rows that then run (``d`` to ``d + --rows``), the mean absolute difference over the arm's joints, in
action units:

- **with the prefix**: the answer against the expert's chunk continuing the same prefix (the correction a
  request is labelled with);
- **without**: the same observation asked again with no prefix, against the expert's plan from the
  observation's state;
- **the prefix's own error**: the rows sent, against the expert's plan from the same state.

A policy that copies its prefix's drift shows a larger error with the prefix than without, growing with the
prefix's own. Also prints how many episodes end with the hand on the cube (the task's success).

    python benchmarks/moving_prefix_rows.py --model assets/moving_policy
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="assets/moving_policy")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=200_000, help="paths (held out: demonstrations use 1000-8000)")
    parser.add_argument("--delay", type=int, default=12, help="ticks of latency (12: about rtc's at 500 ms)")
    parser.add_argument("--rows", type=int, default=12, help="rows compared after the prefix (those that run)")
    args = parser.parse_args()

    from robot_clients.sim.moving_task import (
        MovingCubeExpert,
        MovingCubeTaskEnv,
        run_policy_labelled_episode,
    )
    from robot_clients.sim.mujoco_arm import ArmEnvConfig
    from robot_clients.sim.reach_eval import TASKS, served_client
    from robot_clients.sim.reach_task import ReachChunkPolicy

    with_prefix, without, prefix_error, successes = [], [], [], 0
    with served_client(args.model, TASKS["moving"]) as (client, horizon):
        served = ReachChunkPolicy(client, delay_s=0.0, ablation="none", seed=0)
        config = ArmEnvConfig(image_height=128, image_width=128, wrist_camera=False, seed=args.seed, episode_steps=40)
        env = MovingCubeTaskEnv(config)
        with env:
            expert = MovingCubeExpert(env, horizon)
            asked: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

            class Recorded:
                """The served policy, each prefixed request asked again without its prefix."""

                def infer_chunk(self, observation: Mapping[str, Any], prefix: np.ndarray | None) -> np.ndarray:
                    answer: np.ndarray = served.infer_chunk(observation, prefix)
                    if prefix is not None:
                        free = served.infer_chunk(observation, None)
                        asked.append((answer, free, expert.plan(observation["expert_view"])))
                    return answer

            for _ in range(args.episodes):
                asked.clear()
                steps, outcome = run_policy_labelled_episode(
                    env, expert, Recorded(), args.delay, np.random.default_rng(0), max_prefix=args.delay
                )
                successes += outcome.success
                labelled = [step for step in steps if step["prefix_rows"]]
                for step, (answer, free, plan) in zip(labelled, asked, strict=True):
                    d = int(step["prefix_rows"])
                    run = slice(d, d + args.rows)
                    with_prefix.append(np.abs(answer[run, :3] - step["chunk"][run, :3]).mean())
                    without.append(np.abs(free[run, :3] - plan[run, :3]).mean())
                    prefix_error.append(np.abs(answer[:d, :3] - plan[:d, :3]).mean())
    with_prefix_a, without_a, prefix_a = np.array(with_prefix), np.array(without), np.array(prefix_error)
    print(
        f"{args.model}: {len(with_prefix_a)} prefixed requests, {args.episodes} episodes of seed {args.seed}, "
        f"{args.delay} ticks of latency; rows {args.delay} to {args.delay + args.rows - 1} of each answer"
    )
    print(
        f"with the prefix, off the expert's correction: {with_prefix_a.mean():.3f} "
        f"(median {np.median(with_prefix_a):.3f})"
    )
    print(f"without a prefix, off the expert's plan:     {without_a.mean():.3f} (median {np.median(without_a):.3f})")
    worst = prefix_a >= np.quantile(prefix_a, 0.75)
    print(
        f"the quarter of requests whose prefix erred most (prefix off by {prefix_a[worst].mean():.3f}): "
        f"with the prefix {with_prefix_a[worst].mean():.3f}, without {without_a[worst].mean():.3f}"
    )
    print(f"episodes on the cube at the end: {successes}/{args.episodes}")


if __name__ == "__main__":
    main()
