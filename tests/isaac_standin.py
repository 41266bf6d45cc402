"""A stand-in for an Isaac Lab vectorized environment (Isaac Lab needs an NVIDIA GPU and Omniverse).

It keeps Isaac Lab's interface where the adapter touches it: ``num_envs``, ``action_space.shape``,
``reset() -> (obs, extras)``, ``step(actions) -> (obs, reward, terminated, truncated, extras)`` with torch
tensors (environment index first), observation groups (``obs["policy"]["rgb"]``: N x H x W x 4 RGBA
uint8, like a TiledCamera's output) and automatic reset of the environments whose episode ended. The
dynamics are simple and real: each robot's joints move toward the commanded targets, and its camera
image is drawn from its joint state, so different robots see different images.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch


class StandInVecEnv:
    def __init__(
        self, num_envs: int, action_dim: int = 4, image_size: int = 64, episode_lengths: list[int] | None = None
    ) -> None:
        self.num_envs = num_envs
        self.action_space = SimpleNamespace(shape=(num_envs, action_dim))
        self.image_size = image_size
        self.episode_lengths = torch.tensor(episode_lengths or [10_000] * num_envs)
        self.joint_pos = torch.zeros(num_envs, action_dim)
        self.episode_step = torch.zeros(num_envs, dtype=torch.long)
        self.actions_seen: list[torch.Tensor] = []
        self.resets_done = 0

    def _obs(self) -> dict:
        n, size = self.num_envs, self.image_size
        rgba = torch.zeros(n, size, size, 4, dtype=torch.uint8)
        level = ((torch.tanh(self.joint_pos[:, :3]) + 1.0) * 127.5).to(torch.uint8)  # N x 3
        rgba[..., :3] = level[:, None, None, :]
        rgba[:, : size // 2, :, 0] = (torch.arange(n) * 40 % 256).to(torch.uint8)[:, None, None]  # who's who
        rgba[..., 3] = 255
        return {"policy": {"joint_pos": self.joint_pos.clone(), "rgb": rgba}}

    def reset(self):
        self.joint_pos.zero_()
        self.episode_step.zero_()
        return self._obs(), {}

    def step(self, actions: torch.Tensor):
        assert isinstance(actions, torch.Tensor) and actions.shape == self.action_space.shape
        self.actions_seen.append(actions.clone())
        self.joint_pos += 0.5 * (actions - self.joint_pos)
        self.episode_step += 1
        truncated = self.episode_step >= self.episode_lengths
        terminated = torch.zeros(self.num_envs, dtype=torch.bool)
        if truncated.any():  # Isaac Lab resets finished environments inside step()
            self.joint_pos[truncated] = 0.0
            self.episode_step[truncated] = 0
            self.resets_done += int(truncated.sum())
        reward = -self.joint_pos.abs().sum(dim=1)
        return self._obs(), reward, terminated, truncated, {}
