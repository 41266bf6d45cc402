"""Isaac Lab adapter: a vectorized simulator becomes one policy-server session per environment.

Isaac Lab steps N environments in lockstep: ``reset() -> (obs, extras)`` and
``step(actions) -> (obs, reward, terminated, truncated, extras)``, where ``obs`` is a dict of groups
(``obs["policy"]["rgb"]``, ...) of batched tensors with the environment index first, and an environment
whose episode ends is reset by the simulator itself. The policy server serves one robot per session
(latest observation wins per session, sessions take fair turns), so each environment gets its own
session and its own :class:`~robot_clients.chunker.ActionChunker`: inference for the N robots
overlaps, and each robot's chunks are timed and merged for that robot alone.

* :class:`IsaacVecEnvironment` wraps the simulator as a control-loop
  :class:`~robot_clients.control_loop.Environment` whose observation is the list of per-environment
  observations (``{"image": H×W×3 uint8}`` each, from ``image_key``) plus which environments the last step
  reset.
* :class:`VectorizedChunkingAgent` holds one chunker per environment; an environment that was reset
  starts a fresh plan (its old chunk belongs to a finished episode).
* :func:`connect_sessions` opens one :class:`PolicyClient` per environment.

Tensors are read through ``.cpu().numpy()`` when they have it, so this module needs no torch; actions
go back as an N × A float32 numpy array, through ``to_env_actions`` when the simulator wants something
else (``lambda a: torch.from_numpy(a).to(env.device)`` for Isaac on a GPU).

Isaac Lab itself needs an NVIDIA GPU and Omniverse, which this project's CI machines do not have: the
adapter is tested against a stand-in vectorized environment with Isaac Lab's API (tests/isaac_standin.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .chunker import ActionChunker, ChunkerConfig, ChunkerStats, RemoteChunkPolicy
from .client import PolicyClient
from .control_loop import Agent, Environment


def as_numpy(value: Any) -> np.ndarray:
    """A numpy view of a numpy array or a torch tensor (on any device), without importing torch."""
    if hasattr(value, "detach"):
        value = value.detach()
    if hasattr(value, "cpu"):
        value = value.cpu().numpy()
    return np.asarray(value)


def lookup_path(obs: Mapping[str, Any], path: str) -> Any:
    node: Any = obs
    for part in path.split("/"):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(f"the observation has no {path!r} (missing {part!r})")
        node = node[part]
    return node


def camera_frames(batch: Any, key: str) -> np.ndarray:
    """N × H × W × 3 uint8 from an Isaac camera output: RGB or RGBA, uint8 or floats in [0, 1]."""
    frames = as_numpy(batch)
    if frames.ndim != 4 or frames.shape[-1] not in (3, 4):
        raise ValueError(f"{key!r} must be N x H x W x 3 (or 4, RGBA), got shape {list(frames.shape)}")
    frames = frames[..., :3]
    if frames.dtype != np.uint8:
        frames = np.clip(np.round(frames.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(frames)


class IsaacVecEnvironment(Environment):
    """An Isaac Lab style vectorized environment as one control-loop Environment of N robots."""

    def __init__(
        self,
        env: Any,
        *,
        image_key: str = "policy/rgb",
        action_dim: int | None = None,
        to_env_actions: Callable[[np.ndarray], Any] | None = None,
    ) -> None:
        self.env = env
        self.num_envs = int(env.num_envs)
        self.image_key = image_key
        self.action_dim = action_dim or _action_dim(env)
        self.to_env_actions = to_env_actions or (lambda actions: actions)
        self._obs: Any = None
        self._just_reset = np.ones(self.num_envs, dtype=bool)
        self.steps = 0
        self.episodes_ended = 0

    def reset(self) -> None:
        self._obs, _ = self.env.reset()
        self._just_reset = np.ones(self.num_envs, dtype=bool)
        self.steps = 0

    def is_episode_complete(self) -> bool:
        return False  # the simulator resets finished environments itself; the loop decides when to stop

    def get_observation(self) -> dict[str, Any]:
        frames = camera_frames(lookup_path(self._obs, self.image_key), self.image_key)
        envs = [{"image": frames[i].copy(), "env_index": i} for i in range(self.num_envs)]
        return {"envs": envs, "just_reset": self._just_reset.copy()}

    def apply_action(self, action: dict[str, Any]) -> None:
        actions = np.asarray(action["actions"], dtype=np.float32)
        if actions.shape != (self.num_envs, self.action_dim):
            raise ValueError(f"expected actions of shape {[self.num_envs, self.action_dim]}, got {list(actions.shape)}")
        self._obs, _reward, terminated, truncated, _extras = self.env.step(self.to_env_actions(actions))
        self._just_reset = as_numpy(terminated).astype(bool) | as_numpy(truncated).astype(bool)
        self.episodes_ended += int(self._just_reset.sum())
        self.steps += 1


def _action_dim(env: Any) -> int:
    space = getattr(env, "action_space", None)
    shape = getattr(space, "shape", None)
    if not shape:
        raise ValueError("cannot tell the environment's action width: pass action_dim")
    return int(shape[-1])


@dataclass
class VectorizedChunkingAgent(Agent):
    """One :class:`ActionChunker` per environment; actions stacked N × ``action_dim``.

    The model's action width may differ from the simulator's: the first ``action_dim`` entries are used
    (zero-padded if the model's are fewer). ``chunkers[i]`` drives environment ``i``.
    """

    chunkers: Sequence[ActionChunker]
    action_dim: int
    resets: int = 0
    _started: bool = field(default=False, repr=False)

    def get_action(self, observation: dict[str, Any]) -> dict[str, Any]:
        envs, just_reset = observation["envs"], observation["just_reset"]
        if len(envs) != len(self.chunkers):
            raise ValueError(f"{len(envs)} environments but {len(self.chunkers)} chunkers")
        for i, chunker in enumerate(self.chunkers):
            if just_reset[i] and self._started:
                chunker.reset()  # its plan belonged to the episode that just ended
                self.resets += 1
            chunker.prime(envs[i])  # every robot without a plan asks now, so their first chunks overlap
        self._started = True
        actions = np.zeros((len(envs), self.action_dim), dtype=np.float32)
        for i, chunker in enumerate(self.chunkers):
            action = chunker.next_action(envs[i])
            width = min(self.action_dim, action.shape[0])
            actions[i, :width] = action[:width]
        return {"actions": actions}

    def reset(self) -> None:
        for chunker in self.chunkers:
            chunker.reset(clear_stats=True)
        self._started = False

    def stats(self) -> list[ChunkerStats]:
        return [chunker.stats for chunker in self.chunkers]


def connect_sessions(url: str, num_envs: int, settings: Mapping[str, Any], **client_options: Any) -> list[PolicyClient]:
    """One connected, configured :class:`PolicyClient` per environment (``settings``: configure fields)."""
    clients: list[PolicyClient] = []
    try:
        for _ in range(num_envs):
            client = PolicyClient(url, **client_options)
            clients.append(client)
            client.connect()
            client.configure(**settings)
    except BaseException:
        for client in clients:
            client.close()
        raise
    return clients


def build_agent(
    clients: Sequence[PolicyClient], config: ChunkerConfig, action_dim: int, *, timeout: float = 5.0
) -> VectorizedChunkingAgent:
    """A :class:`VectorizedChunkingAgent` with one chunker per client (close the chunkers when done)."""
    chunkers = [ActionChunker(RemoteChunkPolicy(client, timeout=timeout), config) for client in clients]
    return VectorizedChunkingAgent(chunkers, action_dim)
