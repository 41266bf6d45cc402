"""``MujocoArmEnv``: a small simulated arm, a cube and two cameras, as a control-loop Environment.

The scene (``assets/arm_reach.xml``) is a three-joint arm with a parallel gripper on a table, a cube
in front of it, a fixed third-person camera (``front``) and a wrist camera. Rendering is offscreen:
MuJoCo's EGL back end on Mesa's software rasterizer works on a CPU-only machine with no display (the
Makefile installs the Mesa EGL packages when they are missing). ``MUJOCO_GL`` defaults to ``egl``
here; set it to ``osmesa`` before importing this module to use OSMesa instead.

Observation (fresh arrays every call)::

    {"image": front camera, H x W x 3 uint8,     # what the policy server sees
     "wrist_image": wrist camera, H x W x 3 uint8 (unless ArmEnvConfig.wrist_camera is off),
     "state": [base_yaw, shoulder, elbow, gripper opening] float32,
     "step": control steps since reset}

Action: ``{"actions": a}`` with ``a`` of width >= 4; the first four entries drive the actuators,
anything after them is ignored. A policy's actions live in its own units, which this toy arm does not
share, so the bridge reads them as normalized targets around the home pose: joint ``i`` goes to
``home[i] + scale[i] * tanh(a[i])`` and the gripper to ``0.02 + 0.02 * tanh(a[3])`` metres of finger
opening. The actuators are position servos: holding an action holds the pose. Each action is applied
for one control period (``1 / control_hz``), stepping the physics at its own 2 ms timestep.

mujoco is imported when an environment is built, so importing this module costs nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..control_loop import Environment

# mujoco picks its GL back end when it is first imported: say EGL (headless) before anyone imports it.
os.environ.setdefault("MUJOCO_GL", "egl")

ASSET_PATH = Path(__file__).resolve().parent / "assets" / "arm_reach.xml"
CAMERAS = ("front", "wrist")
ARM_JOINTS = ("base_yaw", "shoulder", "elbow")
GRIPPER_JOINT = "finger_left"


@dataclass(frozen=True)
class ArmEnvConfig:
    """Settings of :class:`MujocoArmEnv`.

    Args:
        control_hz: how often an action is applied; each one lasts ``1 / control_hz`` of simulated time.
        image_height, image_width: camera resolution.
        episode_steps: end the episode after this many actions (0: never; the control loop decides).
        action_scale: how far (radians) a normalized action of 1 moves each arm joint from home.
        wrist_camera: render the wrist camera into every observation (``wrist_image``); off saves a render
            per tick when the policy does not use it.
        cube_jitter: the cube's start is moved by up to this many metres in x and y on every reset.
        seed: seed of the cube's start positions.
    """

    control_hz: float = 20.0
    image_height: int = 224
    image_width: int = 224
    episode_steps: int = 0
    action_scale: tuple[float, float, float] = (1.2, 0.5, 0.6)
    wrist_camera: bool = True
    cube_jitter: float = 0.05
    seed: int | None = 0


class MujocoArmEnv(Environment):
    """The arm scene as an :class:`~robot_clients.control_loop.Environment`. Not thread-safe: one thread
    (the one that built it, since the offscreen GL context belongs to it) calls every method."""

    ACTION_DIM = 4

    def __init__(self, config: ArmEnvConfig | None = None, model_path: str | Path = ASSET_PATH) -> None:
        self.config = config or ArmEnvConfig()
        if not self.config.control_hz > 0:
            raise ValueError(f"control_hz must be > 0, got {self.config.control_hz}")
        import mujoco  # lazily: only the simulator needs it

        self._mujoco = mujoco
        self.model = mujoco.MjModel.from_xml_path(str(model_path))
        self.data = mujoco.MjData(self.model)
        self.substeps = max(1, round(1.0 / (self.config.control_hz * self.model.opt.timestep)))
        try:
            self._renderer = mujoco.Renderer(self.model, self.config.image_height, self.config.image_width)
        except Exception as exc:  # noqa: BLE001 - name the likely cause; mujoco's message does not
            raise RuntimeError(
                f"offscreen rendering failed with MUJOCO_GL={os.environ.get('MUJOCO_GL')}: {exc}. On a machine "
                "without a display install Mesa's EGL (apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri; "
                "`make install` does this) or set MUJOCO_GL=osmesa with libosmesa6"
            ) from exc
        self._home_key = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_KEY, "home")
        self._arm_qpos = [self.model.jnt_qposadr[self._joint(name)] for name in ARM_JOINTS]
        self._gripper_qpos = self.model.jnt_qposadr[self._joint(GRIPPER_JOINT)]
        self._cube_qpos = self.model.jnt_qposadr[self._joint("cube")]
        self.home_ctrl = np.array(self.model.key_ctrl[self._home_key], dtype=np.float64)
        self._ctrl_low = self.model.actuator_ctrlrange[:, 0].copy()
        self._ctrl_high = self.model.actuator_ctrlrange[:, 1].copy()
        self._rng = np.random.default_rng(self.config.seed)
        self.steps = 0
        self.reset()

    def _joint(self, name: str) -> int:
        index = self._mujoco.mj_name2id(self.model, self._mujoco.mjtObj.mjOBJ_JOINT, name)
        if index < 0:
            raise ValueError(f"the arm model has no joint named {name!r}")
        return int(index)

    # -- Environment -----------------------------------------------------------------------------------

    def reset(self) -> None:
        mujoco = self._mujoco
        mujoco.mj_resetDataKeyframe(self.model, self.data, self._home_key)
        jitter = self._rng.uniform(-self.config.cube_jitter, self.config.cube_jitter, size=2)
        self.data.qpos[self._cube_qpos : self._cube_qpos + 2] += jitter
        mujoco.mj_forward(self.model, self.data)
        self.steps = 0

    def is_episode_complete(self) -> bool:
        return bool(self.config.episode_steps) and self.steps >= self.config.episode_steps

    def get_observation(self) -> dict[str, Any]:
        observation = {"image": self.render("front"), "state": self.state(), "step": self.steps}
        if self.config.wrist_camera:
            observation["wrist_image"] = self.render("wrist")
        return observation

    def apply_action(self, action: dict[str, Any]) -> None:
        self.data.ctrl[:] = self.actuator_targets(action["actions"])
        self._mujoco.mj_step(self.model, self.data, nstep=self.substeps)
        self.steps += 1

    # -- the bridge's pieces ---------------------------------------------------------------------------

    def actuator_targets(self, action: np.ndarray) -> np.ndarray:
        """The actuator commands an action maps to (see the module docstring)."""
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape[0] < self.ACTION_DIM:
            raise ValueError(f"the arm needs actions of width >= {self.ACTION_DIM}, got {action.shape[0]}")
        if not np.isfinite(action[: self.ACTION_DIM]).all():
            raise ValueError("the action contains NaN or infinity")
        squashed = np.tanh(action[: self.ACTION_DIM])
        targets = self.home_ctrl.copy()
        targets[:3] += np.asarray(self.config.action_scale) * squashed[:3]
        targets[3] = 0.02 + 0.02 * squashed[3]
        clipped: np.ndarray = np.clip(targets, self._ctrl_low, self._ctrl_high)
        return clipped

    def render(self, camera: str = "front") -> np.ndarray:
        if camera not in CAMERAS:
            raise ValueError(f"unknown camera {camera!r}; the arm scene has {', '.join(CAMERAS)}")
        self._renderer.update_scene(self.data, camera)
        frame: np.ndarray = self._renderer.render()  # a new array every call
        return frame

    def state(self) -> np.ndarray:
        joints = [self.data.qpos[adr] for adr in self._arm_qpos]
        state: np.ndarray = np.array([*joints, 2.0 * self.data.qpos[self._gripper_qpos]], dtype=np.float32)
        return state

    @property
    def sim_time(self) -> float:
        return float(self.data.time)

    def close(self) -> None:
        self._renderer.close()

    def __enter__(self) -> MujocoArmEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
