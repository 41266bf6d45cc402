"""Reads the state the gymnasium bridge sends for each MetaWorld preset, in MetaWorld's own virtualenv.

MetaWorld needs its own mujoco, so ``tests/test_gym_bridge.py`` runs this with ``.venv-metaworld/bin/python``
and reads one JSON object from its stdout: per preset and per episode, the state the bridge puts in the
observation it sends (:meth:`GymEnvironment.get_observation`), the environment's own 39-value
observation, and the goal the environment placed (``_target_pos``).
"""

from __future__ import annotations

import json

import numpy as np

from robot_clients.sim.gym_bridge import PRESETS, GymEnvironment


def main() -> None:
    report: dict[str, list[dict[str, list[float]]]] = {}
    for name, mapping in PRESETS.items():
        if mapping.module != "metaworld":
            continue
        env = GymEnvironment.make(mapping, seed=1000)
        report[name] = []
        # Three episodes with three different goal places. MetaWorld picks each episode's task from its 50 with
        # a generator its reset does not seed, so two episodes may share one: such a repeat is skipped.
        for _ in range(12):
            env.reset()
            goal = np.asarray(env.env.unwrapped._target_pos, dtype=np.float64).tolist()
            if any(episode["goal"] == goal for episode in report[name]):
                continue
            report[name].append(
                {
                    "sent": env.get_observation()["state"].tolist(),
                    "observation": np.asarray(env.raw_observation, dtype=np.float64).tolist(),
                    "goal": goal,
                }
            )
            if len(report[name]) == 3:
                break
        env.env.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
