"""Where in its chunk a moving-cube policy errs: each row's error against the expert's plan, through the server.

Starts ``cosmos3-serve --model CKPT``, runs the moving task's expert on held-out paths (the expert acts, so
the states are the same whatever the policy answers), and every ``--every`` ticks asks the server for a chunk
of the served domain's ``default_horizon`` on that tick's observation, without a prefix. Each row is compared
with the expert's plan for the same tick: the mean absolute difference over the arm's joints, in action
units. Prints one line of per-row errors, their signed mean (a lag shows as a sign), and how far each side's
first row lies from the measured state (the expert's: one joint step).

Which rows matter depends on the delay: at 0 ms a chunk is executed from about its row 2 to its row 9; at
500 ms from its row 12 on (docs/training.md, "32-row chunks").

    python benchmarks/moving_chunk_rows.py --model assets/moving_policy
"""

from __future__ import annotations

import argparse
import os

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="assets/moving_policy")
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--seed", type=int, default=200_000, help="paths (held out: demonstrations use 1000-6000)")
    parser.add_argument("--every", type=int, default=4, help="ask every this many ticks")
    parser.add_argument("--samples", type=int, default=1, help="chunks asked per observation, each its own seed")
    args = parser.parse_args()

    from robot_clients.sim.moving_task import MovingCubeExpert, MovingCubeTaskEnv
    from robot_clients.sim.mujoco_arm import ArmEnvConfig
    from robot_clients.sim.reach_eval import TASKS, served_client
    from robot_clients.sim.reach_task import ReachChunkPolicy

    errors, signed, first_rows, mean_errors = [], [], [], []
    with served_client(args.model, TASKS["moving"]) as (client, horizon):
        policy = ReachChunkPolicy(client, delay_s=0.0, ablation="none", seed=0)
        config = ArmEnvConfig(image_height=128, image_width=128, wrist_camera=False, seed=args.seed, episode_steps=40)
        env = MovingCubeTaskEnv(config)
        with env:
            expert = MovingCubeExpert(env, horizon)
            for _ in range(args.episodes):
                env.reset()
                tick = 0
                while not env.is_episode_complete():
                    observation = env.get_observation()
                    plan = expert.plan(observation["expert_view"])
                    if tick % args.every == 0:
                        chunks = [
                            policy.infer_chunk({**observation, "seed": sample}, None) for sample in range(args.samples)
                        ]
                        for chunk in chunks:
                            difference = chunk[:, :3] - plan[:, :3]
                            errors.append(np.abs(difference).mean(axis=1))
                            signed.append(difference.mean(axis=1))
                        mean_chunk = np.mean(chunks, axis=0)
                        mean_errors.append(np.abs(mean_chunk[:, :3] - plan[:, :3]).mean(axis=1))
                        chunk = chunks[0]
                        state = np.asarray(observation["state"][:3])
                        first_rows.append((np.abs(chunk[0, :3] - state).mean(), np.abs(plan[0, :3] - state).mean()))
                    env.apply_action({"actions": plan[0]})
                    tick += 1
    print(f"{args.model}: {len(errors)} chunks of {horizon} rows, {args.episodes} episodes of seed {args.seed}")
    print("error per row:", " ".join(f"{x:.3f}" for x in np.mean(errors, axis=0)))
    single, averaged = np.mean(errors, axis=0), np.mean(mean_errors, axis=0)
    if args.samples > 1:
        print(f"error per row of the mean of {args.samples}:", " ".join(f"{x:.3f}" for x in averaged))
    print(f"rows 2-9 (run at 0 ms): {single[2:10].mean():.4f}; rows 12-23 (at 500 ms): {single[12:24].mean():.4f}")
    if args.samples > 1:
        near, far = averaged[2:10].mean(), averaged[12:24].mean()
        print(f"  the mean of {args.samples}: rows 2-9 {near:.4f}; rows 12-23 {far:.4f}")
    print("signed mean per row:", " ".join(f"{x:+.3f}" for x in np.mean(signed, axis=0)))
    policy_first, expert_first = np.mean(first_rows, axis=0)
    print(f"first row from the measured state: policy {policy_first:.3f}, expert {expert_first:.3f}")


if __name__ == "__main__":
    main()
