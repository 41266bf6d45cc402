"""The MuJoCo arm: offscreen rendering, actuators that follow actions, and a few seconds of closed loop
against a real server with the real tiny model."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; mujoco reads it when first imported
pytest.importorskip("mujoco", reason="the `sim` extra (mujoco) is not installed")

from server_fixtures import DOMAIN, ServerThread, tiny_engine_loader  # noqa: E402

from robot_clients.chunker import (  # noqa: E402
    ActionChunker,
    ChunkerConfig,
    RemoteChunkPolicy,  # noqa: E402
)
from robot_clients.client import PolicyClient  # noqa: E402
from robot_clients.control_loop import ChunkingAgent, ControlLoop, Subscriber  # noqa: E402
from robot_clients.sim.mujoco_arm import ArmEnvConfig, MujocoArmEnv  # noqa: E402
from robot_clients.sim.rollout_video import RolloutRecorder  # noqa: E402


@pytest.fixture
def env():
    with MujocoArmEnv(ArmEnvConfig(control_hz=20.0, image_height=96, image_width=128)) as arm:
        yield arm


def test_observation_is_rendered_offscreen_and_the_arm_follows_actions(env):
    first = env.get_observation()
    assert first["image"].shape == (96, 128, 3) and first["image"].dtype == np.uint8
    assert first["wrist_image"].shape == (96, 128, 3)
    assert first["image"].std() > 10  # a scene, not a blank buffer
    assert first["state"].shape == (4,) and first["step"] == 0

    action = np.array([0.8, 0.5, -0.5, 1.0, 9.0, 9.0], dtype=np.float32)  # extra dims are ignored
    targets = env.actuator_targets(action)
    for _ in range(30):  # 1.5 s of simulated time with the same target
        env.apply_action({"actions": action})
    state = env.state()
    np.testing.assert_allclose(state[:3], targets[:3], atol=0.05)
    assert abs(env.sim_time - 1.5) < 1e-6
    moved = env.get_observation()
    assert np.abs(moved["image"].astype(int) - first["image"].astype(int)).mean() > 1.0  # the camera saw it

    with pytest.raises(ValueError, match="width >= 4"):
        env.actuator_targets(np.zeros(2))
    env.reset()
    assert env.steps == 0 and np.allclose(env.state()[:3], env.home_ctrl[:3], atol=1e-6)


class JointTracker(Subscriber):
    """A control-loop subscriber: each tick, the arm's joints (MuJoCo's qpos) before and after the action, and
    the joint targets that action sent them to."""

    def __init__(self, env: MujocoArmEnv) -> None:
        self.env = env
        self.before: list[np.ndarray] = []
        self.after: list[np.ndarray] = []
        self.targets: list[np.ndarray] = []

    def on_episode_start(self) -> None:
        pass

    def on_step(self, observation, action) -> None:
        self.before.append(np.asarray(observation["state"][:3], dtype=np.float64))
        self.after.append(self.env.state()[:3].astype(np.float64))
        self.targets.append(self.env.actuator_targets(action["actions"])[:3])

    def on_episode_end(self) -> None:
        pass


def test_closed_loop_against_the_server(env, tmp_path):
    recorder = RolloutRecorder()
    tracker = JointTracker(env)
    # Warmed up: a loop that must not stall, so the first chunk may not pay the cold-start costs. 10 Hz: 8
    # executed steps give a chunk 800 ms, a margin that holds with the other core busy (400 ms at 20 Hz did not).
    with ServerThread(tiny_engine_loader("distilled"), warmup=True) as server, PolicyClient(server.url) as client:
        client.configure(domain_name=DOMAIN, action_horizon=16, seed=0)
        config = ChunkerConfig(strategy="rtc", control_hz=10.0, execute_horizon=8)
        with ActionChunker(RemoteChunkPolicy(client), config, on_chunk=recorder.on_chunk) as chunker:
            loop = ControlLoop(env, ChunkingAgent(chunker), [recorder, tracker], control_hz=10.0, max_episode_s=6.0)
            report = loop.run_episode()

    assert report.steps >= 55 and env.steps == report.steps  # ~60 ticks of 6 s at 10 Hz, plus the first
    assert 7.5 <= report.achieved_hz <= 10.5
    chunks = report.chunker
    assert chunks["chunks"] >= 4 and chunks["errors"] == 0 and chunks["stalls"] == 0
    assert chunks["chunk_latency_p50_ms"] > 0
    # The arm went where the model's actions sent it, read from the simulator's joints: on the ticks where a
    # joint was sent more than 0.02 rad away, it ended the tick nearer its target than it started.
    before, after, targets = (np.array(x) for x in (tracker.before, tracker.after, tracker.targets))
    sent_away = np.abs(targets - before) > 0.02
    nearer = np.abs(targets - after) < np.abs(targets - before)
    assert sent_away.sum() >= 10 and nearer[sent_away].mean() >= 0.9, (sent_away.sum(), nearer[sent_away].mean())
    # And, held for 2 s of simulated time, the model's last action brings the joints to its targets.
    for _ in range(20):
        env.apply_action({"actions": recorder.actions[-1]})
    np.testing.assert_allclose(env.state()[:3], targets[-1], atol=0.05)
    assert len(recorder.frames) == report.steps and len(recorder.chunks) == chunks["chunks"]

    video = recorder.write_video(tmp_path / "rollout.mp4", fps=10.0, panel_height=96)
    assert video.stat().st_size > 10_000
