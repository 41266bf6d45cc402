"""The Isaac Lab adapter with several environments at once, against a real server and the tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from isaac_standin import StandInVecEnv
from server_fixtures import DOMAIN, ServerThread, tiny_engine_loader

from robot_clients.chunker import ChunkerConfig
from robot_clients.control_loop import ControlLoop
from robot_clients.isaac_adapter import IsaacVecEnvironment, build_agent, camera_frames, connect_sessions

NUM_ENVS = 3


def test_camera_frames_accept_isaac_layouts():
    rgba = torch.zeros(2, 8, 8, 4, dtype=torch.uint8)
    rgba[..., 3] = 255
    assert camera_frames(rgba, "rgb").shape == (2, 8, 8, 3)
    floats = torch.full((2, 8, 8, 3), 0.5)
    assert int(camera_frames(floats, "rgb")[0, 0, 0, 0]) == 128
    with pytest.raises(ValueError, match="N x H x W x 3"):
        camera_frames(torch.zeros(8, 8, 3), "rgb")


def test_one_session_per_environment_in_lockstep():
    hz = 10.0
    sim = StandInVecEnv(NUM_ENVS, action_dim=4, image_size=64, episode_lengths=[1000, 12, 1000])
    env = IsaacVecEnvironment(sim, image_key="policy/rgb", to_env_actions=torch.from_numpy)
    with ServerThread(tiny_engine_loader("distilled")) as server:
        clients = connect_sessions(server.url, NUM_ENVS, {"domain_name": DOMAIN, "action_horizon": 8, "seed": 0})
        try:
            agent = build_agent(clients, ChunkerConfig(strategy="rtc", control_hz=hz), env.action_dim)
            report = ControlLoop(env, agent, control_hz=hz, max_episode_steps=30).run_episode()
            sessions = server.run(lambda: len(server.server.context.sessions))
            stats = agent.stats()
            for chunker in agent.chunkers:
                chunker.close()
        finally:
            for client in clients:
                client.close()

    assert sessions == NUM_ENVS  # one server session per environment
    assert report.steps == 30 and len(sim.actions_seen) == 30
    assert all(isinstance(a, torch.Tensor) and a.shape == (NUM_ENVS, 4) for a in sim.actions_seen)
    # Every robot was served its own chunks, and none was starved by the others.
    for robot in stats:
        assert robot.chunks >= 3 and robot.errors == 0
    # Environment 1 ended its 12-step episode twice; its chunker restarted each time, the others did not.
    assert sim.resets_done == 2 and agent.resets == 2
    # Different robots see different images, so the model gave them different actions.
    last = sim.actions_seen[-1].numpy()
    assert not np.allclose(last[0], last[2])
