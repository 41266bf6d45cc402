"""Third-party simulators, unchanged, through the gymnasium bridge (robot_clients.sim.gym_bridge).

MetaWorld (metaworld 3.1.1, which pins mujoco 3.3.0) and Push-T (gym-pusht) each live in a virtualenv of
their own with the light robot_clients installed there (``make test`` builds ``.venv-metaworld`` and
``.venv-pusht``); the bridge runs in that virtualenv as a subprocess against a real server on the tiny
distilled checkpoint, through PolicyClient and the chunker, and prints its result. Random weights: the
success rate is whatever it is; that episodes run in closed loop, end, and report success and chunk
latency, is what is checked.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from server_fixtures import REPO_ROOT, ServerThread, tiny_engine_loader

pytestmark = pytest.mark.timeout(400)

VENVS = {"metaworld-reach": ".venv-metaworld", "pusht": ".venv-pusht"}


@pytest.fixture(scope="module")
def server():
    with ServerThread(tiny_engine_loader("distilled")) as running:
        yield running


def bridge_python(preset: str) -> Path:
    python = REPO_ROOT / VENVS[preset] / "bin" / "python"
    if not python.exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"{python} is missing: `make test` should have built it")
        pytest.skip(f"{python} is missing; `make test` builds it")
    return python


@pytest.mark.parametrize("preset", sorted(VENVS))
def test_a_third_party_simulator_runs_unchanged_in_closed_loop(server, preset):
    command = [
        str(bridge_python(preset)),
        "-m",
        "robot_clients.sim.gym_bridge",
        "--url",
        server.url,
        "--preset",
        preset,
        "--episodes",
        "2",
        "--max-steps",
        "12",
    ]
    env = {**os.environ, "NO_PROXY": "*", "PYTHONPATH": str(REPO_ROOT), "MUJOCO_GL": "egl"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=360, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    summary = out["summary"]
    assert (summary["environment"], summary["episodes"]) == (preset, 2)
    assert summary["domain"] == "bridge_orig_lerobot" and summary["send_state"] is False  # bridge takes no state
    assert summary["success_rate"] == sum(episode["success"] for episode in out["episodes"]) / 2
    assert summary["chunks"] >= 2 and 0 < summary["chunk_latency_p50_ms"] <= summary["chunk_latency_p99_ms"]
    for episode in out["episodes"]:
        assert isinstance(episode["success"], bool)
        assert 1 <= episode["steps"] <= 12 and (episode["steps"] == 12 or episode["success"])


def test_the_metaworld_presets_send_the_hand_and_gripper_never_the_goal():
    """MT1's 39-value observation ends with the goal (36-38): the presets send entries 0-3 (the hand's position
    and the gripper), so the goal reaches the policy through the camera only. Read from the state the bridge
    puts in the observation it sends, over three goal places per preset."""
    python = bridge_python("metaworld-reach")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MUJOCO_GL": "egl"}
    script = str(REPO_ROOT / "tests" / "metaworld_state_script.py")
    result = subprocess.run([str(python), script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report) == {"metaworld-reach", "metaworld-drawer-close"}
    for preset, episodes in report.items():
        goals = [episode["goal"] for episode in episodes]
        assert len({tuple(goal) for goal in goals}) == 3, (preset, goals)  # three goal places
        for episode in episodes:
            observation = episode["observation"]
            assert observation[36:39] == pytest.approx(episode["goal"])  # MT1 hands the goal over as state
            assert episode["sent"] == pytest.approx(observation[:4], abs=1e-6), preset  # float32 on the wire
        assert len({tuple(episode["sent"]) for episode in episodes}) == 1, preset  # nothing of the goal in it


def test_a_simulators_own_expert_is_recorded_as_a_lerobot_dataset(tmp_path):
    """``cosmos3-gym-demos``: MetaWorld's scripted drawer-close policy, run in its virtualenv, becomes a
    dataset ``cosmos3-train`` reads, whose state is the hand and gripper only (never the drawer)."""
    pytest.importorskip("pyarrow")
    from cosmos3_runtime.lerobot_dataset import read_dataset
    from policy_server.recording.demonstrations import collect_gym

    python = bridge_python("metaworld-reach")
    os.environ.setdefault("MUJOCO_GL", "egl")
    summary = collect_gym(tmp_path / "demos", "metaworld-drawer-close", str(python), episodes=1, seed=1000, fps=10)
    assert summary["episodes"] == 1 and summary["expert_success"] == 1.0
    data = read_dataset(tmp_path / "demos")
    (episode,) = data.episodes
    frames = len(episode.images)
    assert 20 < frames < 150 and data.fps == 10 and episode.task == "close the drawer"
    assert episode.images.shape[1:] == (128, 128, 3) and episode.images.dtype.name == "uint8"
    assert episode.state.shape == (frames, 4) and episode.actions.shape == (frames, 4)
    assert abs(episode.actions).max() <= 1.0 and episode.images.std() > 0
    hand_travel = abs(episode.state[-1, :3] - episode.state[0, :3]).max()
    assert hand_travel > 0.05  # the hand moved to the drawer and pushed it shut
