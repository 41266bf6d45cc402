"""The reach task on the MuJoCo arm: a cube placed at random, visible only in the camera, and a scripted expert.

A policy that solves this task must read the cube's place from the front camera: the observation's state
is the arm's own joints (sent in the policy's action units, see :meth:`ReachTaskEnv.state_in_action_units`)
and nothing else, so a policy that ignores the image can only guess. The cube is placed uniformly in a
ring sector in front of the arm, from the episode's seed.

- **Start**: the arm raised (:data:`START_JOINTS`), clear of the placement region, so the first frame shows
  the cube whole.
- **Goal**: the hand (the gripper's palm) held :data:`GOAL_HEIGHT` above the cube's centre.
- **Success**: the hand within :data:`SUCCESS_RADIUS` of the goal at the end of the episode.
- **Expert** (:class:`ReachExpert`): knows the cube's place (it is scripted), solves the arm's inverse
  kinematics once per episode and moves each joint toward the solution at a bounded speed, from the
  arm's *current* state each tick, so it is a feedback policy whose chunks a learner can imitate.
- **Blind baseline** (:class:`BlindReachExpert`): the same expert aimed at the mean goal, which is what
  a policy that ignores the camera can do at best.

Actions are the arm bridge's normalised targets (:class:`~robot_clients.sim.mujoco_arm.MujocoArmEnv`):
joint ``i`` goes to ``home[i] + scale[i] * tanh(a[i])``; the gripper stays open (``a[3] = 0``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..chunker import RemoteChunkPolicy
from .mujoco_arm import ArmEnvConfig, MujocoArmEnv

if TYPE_CHECKING:
    from ..client import PolicyClient

TASK = "reach the blue cube"  # the prompt the demonstrations carry and the served policy is asked with
DOMAIN = "cosmos3_mujoco_arm"  # the domain cosmos3-train names the policy trained on the reach demonstrations
GOAL_HEIGHT = 0.10  # metres above the cube's centre: the palm over the cube, fingers just above its top
SUCCESS_RADIUS = 0.03  # metres
# Where the cube is placed: distance from the arm's base axis and bearing (radians, 0 = +x).
CUBE_RADIUS = (0.36, 0.50)
CUBE_BEARING = (-0.6, 0.6)
# How far a normalised action of 1 moves each arm joint: wider than the bridge's default, so the whole
# placement region is within reach.
REACH_ACTION_SCALE = (1.2, 0.8, 1.0)
# Where every episode starts: the arm raised above the bridge's home pose. At home the hand hangs over
# the middle of the placement region and, seen from the front camera, hid the cube in part of the first
# frames (of 200 cube places, a tenth showed fewer than 15 of its ~100 pixels, some none); from here the
# cube is always in full view (at least ~75 pixels at 128 px), and the reach takes 7 ticks (median).
START_JOINTS = (0.0, -0.5, 0.8)
EPISODE_STEPS = 40  # 2 s at 20 Hz
MAX_JOINT_STEP = 0.06  # radians per control tick the expert moves a joint toward its target
_TANH_LIMIT = 0.95  # the expert's targets stay inside the bridge's tanh range


@dataclass(frozen=True)
class ReachOutcome:
    """How one episode ended."""

    success: bool
    distance: float  # metres from the hand to the goal at the end


class ReachTaskEnv(MujocoArmEnv):
    """:class:`MujocoArmEnv` with the reach task: a random cube on every reset, a goal and a success signal.

    ``seed`` (the config's) seeds the cube's places; episode ``k`` after construction uses the ``k``-th
    draw, so a seed names a fixed list of episodes. The observation's ``state`` is in action units.
    """

    def __init__(self, config: ArmEnvConfig | None = None) -> None:
        config = config or ArmEnvConfig(image_height=128, image_width=128, wrist_camera=False)
        config = replace(
            config,
            cube_jitter=0.0,
            action_scale=REACH_ACTION_SCALE,
            episode_steps=config.episode_steps or EPISODE_STEPS,
        )
        self._cube_rng = np.random.default_rng(config.seed)
        self.cube_xy = np.zeros(2)
        super().__init__(config)
        mujoco = self._mujoco
        self._hand = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, "hand")
        self._scale = np.asarray(self.config.action_scale, dtype=np.float64)

    def reset(self) -> None:
        radius = self._cube_rng.uniform(*CUBE_RADIUS)
        bearing = self._cube_rng.uniform(*CUBE_BEARING)
        self.cube_xy = np.array([radius * np.cos(bearing), radius * np.sin(bearing)])
        mujoco = self._mujoco
        mujoco.mj_resetDataKeyframe(self.model, self.data, self._home_key)
        self.data.qpos[self._cube_qpos : self._cube_qpos + 2] = self.cube_xy
        for adr, value in zip(self._arm_qpos, START_JOINTS):
            self.data.qpos[adr] = value
        self.data.ctrl[:3] = START_JOINTS  # held there until the first action
        mujoco.mj_forward(self.model, self.data)
        self.steps = 0

    def get_observation(self) -> dict[str, Any]:
        observation = super().get_observation()
        observation["state"] = self.state_in_action_units()
        return observation

    # -- the task --------------------------------------------------------------------------------------

    @property
    def goal(self) -> np.ndarray:
        cube = self.data.qpos[self._cube_qpos : self._cube_qpos + 3]
        return np.array([cube[0], cube[1], cube[2] + GOAL_HEIGHT])

    @property
    def hand(self) -> np.ndarray:
        return np.array(self.data.xpos[self._hand])

    def outcome(self) -> ReachOutcome:
        distance = float(np.linalg.norm(self.hand - self.goal))
        return ReachOutcome(distance <= SUCCESS_RADIUS, distance)

    # -- units -----------------------------------------------------------------------------------------

    def joints(self) -> np.ndarray:
        return np.array([self.data.qpos[adr] for adr in self._arm_qpos])

    def state_in_action_units(self) -> np.ndarray:
        """The arm's joints and gripper as the action that would hold them: the bridge's map inverted."""
        arm = np.clip((self.joints() - self.home_ctrl[:3]) / self._scale, -0.999, 0.999)
        gripper = np.clip((self.data.qpos[self._gripper_qpos] - 0.02) / 0.02, -0.999, 0.999)
        state: np.ndarray = np.arctanh(np.array([*arm, gripper])).astype(np.float32)
        return state

    def joints_to_action(self, joints: np.ndarray) -> np.ndarray:
        arm = np.clip((joints - self.home_ctrl[:3]) / self._scale, -_TANH_LIMIT, _TANH_LIMIT)
        return np.array([*np.arctanh(arm), 0.0], dtype=np.float32)

    def solve_reach(self, target: np.ndarray, iterations: int = 60) -> np.ndarray:
        """Arm joints that put the hand at ``target`` (damped least squares, within the bridge's range)."""
        mujoco = self._mujoco
        saved = self.data.qpos.copy()
        joints = [self._joint(name) for name in ("base_yaw", "shoulder", "elbow")]
        low = np.maximum(self.home_ctrl[:3] - _TANH_LIMIT * self._scale, self.model.jnt_range[joints, 0])
        high = np.minimum(self.home_ctrl[:3] + _TANH_LIMIT * self._scale, self.model.jnt_range[joints, 1])
        jac = np.zeros((3, self.model.nv))
        dofs = [self.model.jnt_dofadr[j] for j in joints]
        q = self.joints()
        for _ in range(iterations):
            for adr, value in zip(self._arm_qpos, q):
                self.data.qpos[adr] = value
            mujoco.mj_kinematics(self.model, self.data)
            mujoco.mj_comPos(self.model, self.data)
            error = target - self.data.xpos[self._hand]
            if np.linalg.norm(error) < 1e-4:
                break
            mujoco.mj_jacBody(self.model, self.data, jac, None, self._hand)
            j = jac[:, dofs]
            q = np.clip(q + j.T @ np.linalg.solve(j @ j.T + 1e-4 * np.eye(3), error), low, high)
        self.data.qpos[:] = saved
        mujoco.mj_forward(self.model, self.data)
        return q


class ReachExpert:
    """The scripted expert: each tick, every joint moves up to :data:`MAX_JOINT_STEP` toward the reach
    solution, from where the arm is now. ``act`` needs the environment (it is privileged: it knows the cube)."""

    def __init__(self, env: ReachTaskEnv) -> None:
        self.env = env
        self.target: np.ndarray | None = None

    def aim(self) -> np.ndarray:
        return self.env.goal

    def reset(self) -> None:
        self.target = self.env.solve_reach(self.aim())

    def act(self) -> np.ndarray:
        if self.target is None:
            self.reset()
        assert self.target is not None
        joints = self.env.joints()
        step = np.clip(self.target - joints, -MAX_JOINT_STEP, MAX_JOINT_STEP)
        return self.env.joints_to_action(joints + step)


class BlindReachExpert(ReachExpert):
    """The expert aimed at the centre of the cube's placement region: the best a camera-blind policy does."""

    def aim(self) -> np.ndarray:
        radius, bearing = np.mean(CUBE_RADIUS), np.mean(CUBE_BEARING)
        cube_z = self.env.goal[2] - GOAL_HEIGHT
        return np.array([radius * np.cos(bearing), radius * np.sin(bearing), cube_z + GOAL_HEIGHT])


def run_expert(env: ReachTaskEnv, expert: ReachExpert) -> tuple[list[dict[str, np.ndarray]], ReachOutcome]:
    """One episode of ``expert`` from a fresh reset: every step's observation and action, and the outcome."""
    env.reset()
    expert.reset()
    steps = []
    while not env.is_episode_complete():
        observation = env.get_observation()
        action = expert.act()
        steps.append({"image": observation["image"], "state": observation["state"], "action": action})
        env.apply_action({"actions": action})
    return steps, env.outcome()


class ReachChunkPolicy(RemoteChunkPolicy):
    """The server's chunks for the reach task, with an injected delay and the ablations applied on the
    robot side before the observation goes out (what is forwarded is :class:`RemoteChunkPolicy`'s)."""

    def __init__(self, client: PolicyClient, *, delay_s: float, ablation: str, seed: int, timeout: float = 5.0) -> None:
        super().__init__(client, timeout=timeout)
        self.delay_s = delay_s
        self.ablation = ablation
        self._rng = np.random.default_rng(seed)

    def infer_chunk(self, observation: Mapping[str, Any], prefix_actions: np.ndarray | None) -> np.ndarray:
        observation = dict(observation)
        if self.ablation == "black":
            observation["image"] = np.zeros_like(observation["image"])
        elif self.ablation == "shuffled_state":
            state = np.asarray(observation["state"], np.float32)
            observation["state"] = state[self._rng.permutation(state.shape[0])]
        actions = super().infer_chunk(observation, prefix_actions)
        if self.delay_s:
            time.sleep(self.delay_s)
        return actions
