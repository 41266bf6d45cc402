"""The reach task: the scripted expert succeeds, the camera-blind baseline does not, and the state a policy
sees never carries the goal (it is the same at every reset, wherever the cube is)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; mujoco reads it when first imported
pytest.importorskip("mujoco", reason="the `sim` extra (mujoco) is not installed")

from robot_clients.sim.mujoco_arm import ArmEnvConfig  # noqa: E402
from robot_clients.sim.reach_eval import wilson  # noqa: E402
from robot_clients.sim.reach_task import BlindReachExpert, ReachExpert, ReachTaskEnv, run_expert  # noqa: E402


@pytest.fixture()
def env():
    with ReachTaskEnv(ArmEnvConfig(image_height=64, image_width=64, wrist_camera=False, seed=11)) as made:
        yield made


def test_the_expert_reaches_every_cube_and_the_blind_baseline_misses(env):
    expert = [run_expert(env, ReachExpert(env))[1] for _ in range(8)]
    blind = [run_expert(env, BlindReachExpert(env))[1] for _ in range(8)]
    assert all(o.success for o in expert), expert
    # A cube near the region's centre is within reach of the blind aim now and then (1 in 100 measured).
    assert sum(o.success for o in blind) <= 3, blind
    assert np.median([o.distance for o in blind]) > 0.05


def test_only_the_camera_shows_the_goal(env):
    observations = []
    for _ in range(4):
        env.reset()
        observations.append((env.cube_xy.copy(), env.get_observation()))
    cubes = np.array([c for c, _ in observations])
    assert np.ptp(cubes, axis=0).max() > 0.02  # the cube moves between episodes
    states = np.array([o["state"] for _, o in observations])
    assert np.ptp(states, axis=0).max() == 0.0  # the state does not
    images = np.array([o["image"] for _, o in observations]).astype(int)
    assert np.abs(images[0] - images[1]).max() > 0  # the camera does


def test_the_wilson_interval():
    low, high = wilson(26, 50)
    assert low == pytest.approx(0.385, abs=1e-3) and high == pytest.approx(0.652, abs=1e-3)
    assert wilson(0, 20)[0] == 0.0 and wilson(20, 20)[1] == 1.0
