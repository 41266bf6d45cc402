"""The reach task: the scripted expert succeeds, the camera-blind baseline does not, and the state a policy
sees never carries the goal (it is the same at every reset, wherever the cube is); ``cosmos3-eval``'s result
files name their run."""

from __future__ import annotations

import os
from pathlib import Path

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


def test_cosmos3_evals_results_name_their_seed_checkpoint_commit_and_command(tmp_path):
    import json
    import shutil
    import subprocess

    from cosmos3_runtime.served_weights import checkpoint_sha256
    from robot_clients.sim.reach_eval import main

    checkpoint = shutil.copytree(Path(__file__).parent.parent / "assets" / "reach_policy", tmp_path / "ckpt")
    # A profile whose default chunk is not the 16 a session would otherwise be given: asked for no --horizon,
    # the evaluation takes the served domain's.
    profiles = checkpoint / "policy_profiles.json"
    profiles.write_text(profiles.read_text().replace('"default_horizon": 16', '"default_horizon": 8'))
    argv = ["--model", str(checkpoint), "--modes", "wait", "--episodes", "1", "--seed", "77", "--quantization", "int8"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    run = document["provenance"]
    assert run["seed"] == 77 and document["cells"][0]["episodes"] == 1
    assert run["command"] == ["cosmos3-eval", *argv, "--out", str(tmp_path / "out")]
    assert run["checkpoint"] == str(checkpoint) and run["horizon"] == 8

    # The weights as the server stated them: the quantization it was started with and the checkpoint's
    # SHA-256, the same digest every door of the server states (cosmos3_runtime.served_weights).
    assert run["quantization"] == "int8"
    assert run["checkpoint_sha256"] == checkpoint_sha256(checkpoint)
    weights = next(p for p in checkpoint.rglob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert checkpoint_sha256(checkpoint) != run["checkpoint_sha256"]
    data[-1] ^= 1
    weights.unlink()
    weights.with_name("renamed.safetensors").write_bytes(bytes(data))
    assert checkpoint_sha256(checkpoint) != run["checkpoint_sha256"]

    # The commit of the checkout that ran, where there is one.
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    if head.returncode == 0:
        assert run["git_commit"] == head.stdout.strip() and isinstance(run["git_dirty"], bool)
    else:
        assert run["git_commit"] is None and run["git_dirty"] is None
