"""The MuJoCo arm as a vla-eval benchmark: ``robot_clients.sim.vla_eval_arm:MujocoArmBenchmark``.

vla-eval (PyPI ``vla-eval``) scores a model server by running benchmarks written on its public
``vla_eval.benchmarks.base.StepBenchmark``. This one is this project's arm scene (:mod:`.mujoco_arm`):
one task, *reach the blue cube*, on a CPU, with no Docker and nothing to download. vla-eval's orchestrator
imports it by that string from a config such as::

    server: {url: "ws://127.0.0.1:8000/v1/vla-eval", timeout: 120}
    render: cpu
    benchmarks:
      - benchmark: "robot_clients.sim.vla_eval_arm:MujocoArmBenchmark"
        mode: sync            # or live (real time: hz, paced)
        episodes_per_task: 3
        params: {image_size: 96, seed: 0}

Observations are vla-eval's convention: ``{"images": {"front": ..., "wrist": ...}, "states": [4],
"task_description": str}``. Actions: ``{"actions": (D,)}`` with D >= 4 (the arm reads the first four as
normalized joint and gripper targets, see :mod:`.mujoco_arm`), or a chunk ``(H, D)``, executed row by row
within one benchmark step. Success: the hand within ``success_distance`` metres of the cube; the episode
also reports the closest it came (``min_distance``). The actuators are position servos, so a stale
real-time tick holds the last action (vla-eval's ``repeat_last_hold``).

Runs in vla-eval's own environment (``make`` builds ``.venv-vlaeval`` with vla-eval, mujoco and this
package): vla-eval is imported by this module only.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np
from vla_eval.benchmarks.base import StepBenchmark, StepResult, repeat_last_hold

from .mujoco_arm import ArmEnvConfig, MujocoArmEnv

TASK = {"name": "reach_cube", "suite": "mujoco_arm", "task_description": "reach the blue cube"}


class MujocoArmBenchmark(StepBenchmark):  # type: ignore[misc]  # vla-eval ships no type information
    """See the module docstring."""

    render_backends: ClassVar[frozenset[str]] = frozenset({"cpu", "gpu"})

    @classmethod
    def configure_render(cls, mode: str) -> dict[str, str]:
        # MuJoCo's EGL back end renders on Mesa's software rasterizer on a CPU, or on a GPU's driver.
        os.environ.setdefault("MUJOCO_GL", "egl")
        return {"MUJOCO_GL": os.environ["MUJOCO_GL"]}

    def __init__(
        self,
        image_size: int = 96,
        control_hz: float = 20.0,
        max_steps: int = 40,
        success_distance: float = 0.08,
        send_wrist_image: bool = True,
        send_state: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.config = ArmEnvConfig(
            control_hz=control_hz,
            image_height=image_size,
            image_width=image_size,
            wrist_camera=send_wrist_image,
            seed=seed,
        )
        self.max_steps = max_steps
        self.success_distance = success_distance
        self.send_state = send_state
        self._env: MujocoArmEnv | None = None
        self._min_distance = float("inf")

    def get_tasks(self) -> list[dict[str, Any]]:
        return [dict(TASK)]

    def get_metadata(self) -> dict[str, Any]:
        return {"max_steps": self.max_steps, "control_hz": self.config.control_hz}

    def get_metric_keys(self) -> dict[str, str]:
        return {"success": "mean", "min_distance": "mean"}

    def get_hold_action(self, last_action: dict[str, Any] | None) -> dict[str, Any]:
        return repeat_last_hold(last_action, MujocoArmEnv.ACTION_DIM)  # type: ignore[no-any-return]

    def _distance(self) -> float:
        assert self._env is not None
        env = self._env
        hand = env.data.body("hand").xpos
        cube = env.data.body("cube").xpos
        return float(np.linalg.norm(np.asarray(hand) - np.asarray(cube)))

    def reset(self, task: dict[str, Any]) -> dict[str, Any]:
        if self._env is None:  # built on first use, on the thread that renders (its GL context)
            self._env = MujocoArmEnv(self.config)
        self._env.reset()
        self._min_distance = self._distance()
        return self._env.get_observation()

    def step(self, action: dict[str, Any]) -> StepResult:
        assert self._env is not None
        actions = np.asarray(action.get("actions", action.get("action")), dtype=np.float32)
        for row in actions.reshape(-1, actions.shape[-1]) if actions.ndim == 2 else [actions]:
            self._env.apply_action({"actions": row})
            self._min_distance = min(self._min_distance, self._distance())
        success = self._min_distance < self.success_distance
        info = {"success": success, "distance": self._distance()}
        return StepResult(obs=self._env.get_observation(), reward=-info["distance"], done=success, info=info)

    def make_obs(self, raw_obs: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
        images = {"front": raw_obs["image"]}
        if "wrist_image" in raw_obs:
            images["wrist"] = raw_obs["wrist_image"]
        obs: dict[str, Any] = {"images": images, "task_description": task["task_description"]}
        if self.send_state:
            obs["states"] = raw_obs["state"]
        return obs

    def get_step_result(self, step_result: StepResult) -> dict[str, Any]:
        return {"success": bool(step_result.info.get("success", False)), "min_distance": self._min_distance}

    def cleanup(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
