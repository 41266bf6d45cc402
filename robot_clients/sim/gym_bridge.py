"""Any gymnasium environment, unchanged, driven by the policy server through PolicyClient and the chunker.

An environment no one here wrote (MetaWorld, Push-T, ...) is run as it ships: ``gymnasium.make`` builds
it, and a small :class:`GymMapping` says how it meets the policy:

* ``cameras``: where the picture comes from: ``render`` (``env.render()``, an ``rgb_array`` environment)
  or keys of a dict observation (``pixels``); several are composed side by side;
* ``state``: keys of the observation concatenated into the robot's state (``obs`` for an array
  observation); sent only to a domain that conditions on state;
* ``action``: how a row of the policy's chunk becomes the environment's action: its first
  ``action_space`` entries, squashed (``tanh``) into the action space's bounds, or clipped to them;
* ``success``: the ``info`` key that is truthy once the task is done (the episode then ends);
* ``expert``: the simulator's own scripted policy (``module:Class`` with ``get_action(observation)``),
  which :func:`run_expert_episodes` records as demonstrations (``--expert-demos``);
* ``env_seed_kwarg``: the ``gymnasium.make`` keyword that seeds the environment's set of task variations
  (MetaWorld's ``seed``), so that demonstrations and evaluation can use disjoint sets;
* ``render_shadows``: off turns the scene's shadow-casting lights off before the first frame. The task,
  its physics and the camera are untouched; shadows only cost time on a software rasterizer (a MetaWorld
  frame takes 10x longer with them on a CPU).

:class:`GymEnvironment` wraps the environment as a :class:`~robot_clients.control_loop.Environment`;
:func:`run_episodes` runs it in closed loop (:class:`~robot_clients.control_loop.ControlLoop`, a
:class:`~robot_clients.chunker.ActionChunker` over a connected :class:`PolicyClient`) and returns the
success rate and the chunk latency. :data:`PRESETS` holds the mappings of the environments this project
checks (``docs/third_party_sims.md``). From a shell, in the simulator's own virtualenv::

    python -m robot_clients.sim.gym_bridge --url ws://HOST:8000/v1/actions/realtime --preset metaworld-reach

gymnasium (and the simulator) are imported when an environment is built, so importing this module costs
nothing but numpy.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..chunker import ActionChunker, ChunkerConfig, RemoteChunkPolicy
from ..control_loop import ChunkingAgent, ControlLoop, Environment

RENDER = "render"
ARRAY_OBSERVATION = "obs"
ACTION_TRANSFORMS = ("tanh", "clip")


@dataclass(frozen=True)
class GymMapping:
    """How one gymnasium environment meets the policy (see the module docstring)."""

    env_id: str
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    module: str | None = None  # imported first: where the environment registers itself with gymnasium
    cameras: tuple[str, ...] = (RENDER,)
    state: tuple[str, ...] = ()
    action: str = "tanh"
    success: str = "success"
    prompt: str = ""
    max_steps: int = 100
    state_indices: tuple[int, ...] = ()  # entries of the concatenated state that are the robot's (empty: all)
    expert: str | None = None
    env_seed_kwarg: str | None = None
    render_shadows: bool = True

    def __post_init__(self) -> None:
        if self.action not in ACTION_TRANSFORMS:
            raise ValueError(f"action transform {self.action!r}; expected one of {', '.join(ACTION_TRANSFORMS)}")
        if not self.cameras:
            raise ValueError("a mapping needs at least one camera")


PRESETS: dict[str, GymMapping] = {
    # MetaWorld 3 (Farama): Sawyer arm tasks; 39-D array observation, 4-D action in [-1, 1], info["success"].
    # The observation is the hand's position and the gripper (0-3), the objects' poses (4-17), the same a
    # step earlier (18-35) and, in MT1, the goal (36-38). Every preset sends entries 0-3 only: the goal and
    # the objects are seen in the camera, never handed to the policy as state.
    "metaworld-reach": GymMapping(
        env_id="Meta-World/MT1",
        env_kwargs={"env_name": "reach-v3", "render_mode": "rgb_array", "width": 128, "height": 128},
        module="metaworld",
        state=(ARRAY_OBSERVATION,),
        state_indices=(0, 1, 2, 3),
        success="success",
        prompt="reach the goal",
    ),
    # MetaWorld drawer-close: the drawer's place (x within 0.2 m) is seen in the camera only.
    "metaworld-drawer-close": GymMapping(
        env_id="Meta-World/MT1",
        env_kwargs={"env_name": "drawer-close-v3", "render_mode": "rgb_array", "width": 128, "height": 128},
        module="metaworld",
        state=(ARRAY_OBSERVATION,),
        state_indices=(0, 1, 2, 3),
        action="clip",
        success="success",
        prompt="close the drawer",
        max_steps=150,
        expert="metaworld.policies:SawyerDrawerCloseV3Policy",
        env_seed_kwarg="seed",
        render_shadows=False,
    ),
    # Push-T (LeRobot's gym-pusht): 96x96 pixels and the agent's 2-D position, a 2-D target in [0, 512].
    "pusht": GymMapping(
        env_id="gym_pusht/PushT-v0",
        env_kwargs={"obs_type": "pixels_agent_pos", "render_mode": "rgb_array"},
        module="gym_pusht",
        cameras=("pixels",),
        state=("agent_pos",),
        success="is_success",
        prompt="push the T onto the target",
    ),
}


def _side_by_side(frames: list[np.ndarray]) -> np.ndarray:
    height = frames[0].shape[0]
    resized = []
    for frame in frames:  # nearest neighbour to the first one's height
        if frame.shape[0] != height:
            rows = np.arange(height) * frame.shape[0] // height
            width = max(1, round(frame.shape[1] * height / frame.shape[0]))
            frame = frame[rows][:, np.arange(width) * frame.shape[1] // width]
        resized.append(frame)
    return np.ascontiguousarray(np.concatenate(resized, axis=1))


class GymEnvironment(Environment):
    """A gymnasium environment as a control-loop :class:`Environment`, through a :class:`GymMapping`."""

    def __init__(self, env: Any, mapping: GymMapping, seed: int = 0, black_image: bool = False) -> None:
        self.env = env
        self.mapping = mapping
        self.seed = seed
        self.black_image = black_image  # an ablation: the policy is sent all-black frames
        space = env.action_space
        self.low = np.asarray(space.low, dtype=np.float64)
        self.high = np.asarray(space.high, dtype=np.float64)
        self.action_dim = int(np.prod(space.shape))
        self._observation: Any = None
        self.done = False
        self.success = False
        self.steps = 0
        self.episodes = 0

    @classmethod
    def make(cls, mapping: GymMapping, seed: int = 0, black_image: bool = False) -> GymEnvironment:
        """``gymnasium.make`` the mapping's environment, unchanged."""
        import gymnasium  # lazily: only a bridge needs it

        if mapping.module is not None:
            importlib.import_module(mapping.module)
        kwargs = dict(mapping.env_kwargs)
        if mapping.env_seed_kwarg is not None:
            kwargs[mapping.env_seed_kwarg] = seed
        env = gymnasium.make(mapping.env_id, **kwargs)
        if not mapping.render_shadows:
            env.unwrapped.model.light_castshadow[:] = 0
        return cls(env, mapping, seed, black_image)

    def reset(self) -> None:
        self._observation, _ = self.env.reset(seed=self.seed + self.episodes)
        self.episodes += 1
        self.done = self.success = False
        self.steps = 0

    def is_episode_complete(self) -> bool:
        return self.done or self.steps >= self.mapping.max_steps

    def _camera(self, name: str) -> np.ndarray:
        frame = self.env.render() if name == RENDER else self._observation[name]
        frame = np.asarray(frame)
        if frame.dtype != np.uint8:  # a float picture in [0, 1]
            frame = np.clip(np.round(frame * 255.0), 0, 255).astype(np.uint8)
        return frame

    def state(self) -> np.ndarray:
        parts = [
            np.asarray(self._observation if key == ARRAY_OBSERVATION else self._observation[key], np.float32).ravel()
            for key in self.mapping.state
        ]
        state = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        return state[list(self.mapping.state_indices)] if self.mapping.state_indices else state

    @property
    def raw_observation(self) -> Any:
        """The environment's own last observation, as a scripted expert of its simulator reads it."""
        return self._observation

    def get_observation(self) -> dict[str, Any]:
        frames = [self._camera(name) for name in self.mapping.cameras]
        image = frames[0] if len(frames) == 1 else _side_by_side(frames)
        observation: dict[str, Any] = {"image": np.zeros_like(image) if self.black_image else image}
        if self.mapping.prompt:
            observation["prompt"] = self.mapping.prompt
        if self.mapping.state:
            observation["state"] = self.state()
        return observation

    def env_action(self, row: np.ndarray) -> np.ndarray:
        """The environment's action for one row of a chunk (the mapping's transform)."""
        values = np.asarray(row, dtype=np.float64).ravel()
        if values.shape[0] < self.action_dim:
            raise ValueError(
                f"the policy's actions have {values.shape[0]} values; this environment takes {self.action_dim}"
            )
        values = values[: self.action_dim]
        if self.mapping.action == "tanh":
            values = self.low + (np.tanh(values) + 1.0) * 0.5 * (self.high - self.low)
        shape: tuple[int, ...] = tuple(self.env.action_space.shape)
        return np.clip(values, self.low, self.high).astype(np.float32).reshape(shape)

    def apply_action(self, action: dict[str, Any]) -> None:
        self._observation, _, terminated, truncated, info = self.env.step(self.env_action(action["actions"]))
        self.steps += 1
        self.success = self.success or bool(info.get(self.mapping.success, False))
        self.done = bool(terminated or truncated or self.success)

    def close(self) -> None:
        self.env.close()


@dataclass
class BridgeResult:
    """Episodes of one environment: success, and the chunks' round-trip latency."""

    environment: str
    episodes: list[dict[str, Any]]
    chunk_latencies_ms: list[float]

    def summary(self) -> dict[str, Any]:
        latencies = np.asarray(self.chunk_latencies_ms)
        successes = [episode["success"] for episode in self.episodes]
        return {
            "environment": self.environment,
            "episodes": len(self.episodes),
            "success_rate": float(np.mean(successes)) if successes else 0.0,
            "chunks": int(latencies.size),
            "chunk_latency_p50_ms": float(np.quantile(latencies, 0.5)) if latencies.size else None,
            "chunk_latency_p99_ms": float(np.quantile(latencies, 0.99)) if latencies.size else None,
            "steps_mean": float(np.mean([episode["steps"] for episode in self.episodes])) if self.episodes else 0.0,
            "achieved_hz_mean": float(np.mean([episode["achieved_hz"] for episode in self.episodes]))
            if self.episodes
            else 0.0,
        }


def run_episodes(
    environment: GymEnvironment,
    client: Any,
    episodes: int,
    *,
    name: str = "",
    control_hz: float = 10.0,
    chunker: ChunkerConfig | None = None,
) -> BridgeResult:
    """``episodes`` closed-loop episodes through a connected, configured :class:`PolicyClient` ``client``
    (the environment's state goes to the server only where its domain conditions on state)."""
    config = chunker or ChunkerConfig(control_hz=control_hz)
    results: list[dict[str, Any]] = []
    latencies: list[float] = []
    with ActionChunker(RemoteChunkPolicy(client, timeout=30.0), config) as action_chunker:
        loop = ControlLoop(
            environment,
            ChunkingAgent(action_chunker),
            control_hz=control_hz,
            max_episode_steps=environment.mapping.max_steps,
        )
        for _ in range(episodes):
            report = loop.run_episode()
            latencies.extend(s * 1e3 for s in action_chunker.stats.latencies_s)
            results.append(
                {"success": environment.success, "steps": environment.steps, "achieved_hz": report.achieved_hz}
            )
    return BridgeResult(name or environment.mapping.env_id, results, latencies)


def run_expert_episodes(environment: GymEnvironment, episodes: int) -> list[dict[str, Any]]:
    """``episodes`` episodes of the mapping's scripted expert, as demonstrations: per episode the camera
    frames, the robot state and the actions (as the environment took them), and whether it succeeded."""
    if environment.mapping.expert is None:
        raise ValueError(f"{environment.mapping.env_id} has no scripted expert in its mapping")
    module, _, name = environment.mapping.expert.partition(":")
    expert = getattr(importlib.import_module(module), name)()
    recorded: list[dict[str, Any]] = []
    for _ in range(episodes):
        environment.reset()
        images, states, actions = [], [], []
        while not environment.is_episode_complete():
            observation = environment.get_observation()
            action = environment.env_action(np.asarray(expert.get_action(environment.raw_observation)))
            images.append(observation["image"])
            states.append(observation.get("state", np.zeros(0, np.float32)))
            actions.append(action.ravel())
            environment.apply_action({"actions": action.ravel()})
        recorded.append(
            {
                "images": np.asarray(images),
                "state": np.asarray(states, np.float32),
                "actions": np.asarray(actions, np.float32),
                "success": environment.success,
            }
        )
    return recorded


def save_demonstrations(path: str, episodes: list[dict[str, Any]], mapping: GymMapping) -> None:
    """The episodes in one ``.npz`` (``images_K``, ``state_K``, ``actions_K``, ``success``, ``prompt``), the
    hand-over to the server side's LeRobot writer, which runs in another virtualenv; :func:`load_demonstrations`
    reads it back."""
    arrays: dict[str, np.ndarray] = {
        "success": np.asarray([e["success"] for e in episodes]),
        "prompt": np.asarray(mapping.prompt),
    }
    for k, episode in enumerate(episodes):
        for key in ("images", "state", "actions"):
            arrays[f"{key}_{k}"] = episode[key]
    with open(path, "wb") as out:
        np.savez(out, allow_pickle=False, **arrays)


def load_demonstrations(path: str) -> tuple[list[dict[str, Any]], str]:
    """What :func:`save_demonstrations` wrote: the episodes (as :func:`run_expert_episodes` returns them)
    and the prompt."""
    with np.load(path, allow_pickle=False) as arrays:
        episodes = [
            {
                "images": arrays[f"images_{k}"],
                "state": arrays[f"state_{k}"],
                "actions": arrays[f"actions_{k}"],
                "success": bool(success),
            }
            for k, success in enumerate(arrays["success"])
        ]
        return episodes, str(arrays["prompt"])


def main(argv: list[str] | None = None) -> int:
    from ..client import PolicyClient

    parser = argparse.ArgumentParser(description="run a gymnasium environment, unchanged, on the policy server")
    parser.add_argument("--url", default=None, help="ws://HOST:PORT/v1/actions/realtime")
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=None, help="steps per episode (default: the preset's)")
    parser.add_argument("--control-hz", type=float, default=10.0)
    parser.add_argument("--domain", default=None, help="the policy's embodiment (default: the model's default)")
    parser.add_argument("--horizon", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk-steps", type=int, default=None, help="actions executed per chunk")
    parser.add_argument("--black-image", action="store_true", help="ablation: send all-black camera frames")
    parser.add_argument(
        "--expert-demos", default=None, help="no server: record the preset's scripted expert into this .npz"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")  # headless MuJoCo rendering (MetaWorld)
    mapping = PRESETS[args.preset]
    if args.max_steps is not None:
        mapping = GymMapping(**{**mapping.__dict__, "max_steps": args.max_steps})
    environment = GymEnvironment.make(mapping, seed=args.seed, black_image=args.black_image)
    if args.expert_demos is not None:
        try:
            started = time.monotonic()
            episodes = run_expert_episodes(environment, args.episodes)
        finally:
            environment.close()
        save_demonstrations(args.expert_demos, episodes, mapping)
        successes = sum(e["success"] for e in episodes)
        frames = sum(len(e["actions"]) for e in episodes)
        print(
            json.dumps(
                {
                    "episodes": len(episodes),
                    "frames": frames,
                    "expert_success": successes / len(episodes),
                    "seconds": round(time.monotonic() - started, 1),
                }
            )
        )
        return 0
    if args.url is None:
        parser.error("--url is required (or --expert-demos, which needs no server)")
    started = time.monotonic()
    try:
        with PolicyClient(args.url, connect_timeout=120.0) as client:
            domain = args.domain or client.metadata["defaults"]["domain_name"]
            client.configure(domain_name=domain, action_horizon=args.horizon, prompt=mapping.prompt, seed=args.seed)
            send_state = bool(mapping.state) and client.metadata["domains"][domain].get("state_dim") is not None
            chunker = ChunkerConfig(control_hz=args.control_hz, execute_horizon=args.chunk_steps)
            result = run_episodes(
                environment, client, args.episodes, name=args.preset, control_hz=args.control_hz, chunker=chunker
            )
    finally:
        environment.close()
    summary = result.summary() | {"domain": domain, "send_state": send_state, "black_image": args.black_image}
    summary["wall_s"] = time.monotonic() - started
    json.dump({"summary": summary, "episodes": result.episodes}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
