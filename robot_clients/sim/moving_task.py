"""The moving-cube task on the MuJoCo arm: the reach task's cube slides across the table, and delay matters.

The arm, its camera, its action units and the goal (the hand :data:`~.reach_task.GOAL_HEIGHT` above the
cube's centre) are the reach task's (:mod:`robot_clients.sim.reach_task`). What changes:

- **The cube slides** along the table's ``y`` axis (across the front camera's view) at a constant speed
  drawn per episode, uniform in :data:`SPEED_RANGE`, in a random direction. Its path is drawn so that it
  stays in front of the arm: the point it passes mid-episode lies in :data:`MID_RADIUS` x
  :data:`MID_BEARING`. It is moved kinematically every physics step (a conveyor, not friction).
- **Success** is the hand within :data:`~.reach_task.SUCCESS_RADIUS` of the point above the cube where the
  cube *is*, read from MuJoCo's bodies (``data.xpos``), not from the drawn path, at every one of the
  episode's last :data:`HOLD_TICKS` ticks: the hand must stay on the cube, not pass over it at the right
  moment (a robot that holds while the model thinks would otherwise win or lose by the phase of its
  chunks against the episode's end).
- **The camera shows a short clip.** One frame shows where the cube is, not where it is going. The
  observation's ``image`` is two frames of the front camera side by side: the frame :data:`CLIP_STRIDE`
  ticks ago on the left, the current one on the right (``H x 2W``). The stride is part of what a policy was
  trained on: a policy trained on another one is evaluated and rolled out with that stride (the
  environment's ``clip_stride``). The cube was already sliding before the episode began, so the first
  observation's clip is real too. Nothing else tells the policy where the cube
  is or how fast it goes: the state is the arm's joints, as in the reach task.
- **Expert** (:class:`MovingCubeExpert`): knows the cube's path (privileged) and plans a chunk as a
  time-indexed trajectory: action ``i`` moves each joint at most :data:`~.reach_task.MAX_JOINT_STEP` toward
  the inverse kinematics of where the cube will be at tick ``i + 1``. Acting on it each tick is the
  demonstration; its chunks answered late (:class:`ExpertChunkPolicy`) measure what delay costs an agent
  that knows everything (``cosmos3-eval --task moving --ablations expert``).
- **Blind baseline** (:class:`BlindMovingExpert`): the same expert aimed at a cube resting at the middle of
  the region, which is what a policy that ignores the camera can do at best.

Why delay decides: a chunk planned on a picture ``L`` seconds old is a plan for the moment the picture was
taken. Executing it from its action ``L x 20`` on (what the chunker's modes do) keeps the hand on the cube;
holding still while the model thinks (``wait``), or executing it from its first action (a lock-step client),
leaves the hand ``speed x L`` behind a cube that kept moving.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..chunker import ChunkPolicy
from .mujoco_arm import ArmEnvConfig
from .reach_task import GOAL_HEIGHT, MAX_JOINT_STEP, SUCCESS_RADIUS, ReachOutcome, ReachTaskEnv

TASK = "follow the sliding blue cube"  # the prompt of the moving task's demonstrations and served policy
DOMAIN = "cosmos3_mujoco_arm_moving"  # the domain the moving-cube policy is trained and served as
SPEED_RANGE = (0.0, 0.12)  # metres per second, drawn uniformly per episode
MID_RADIUS = (0.38, 0.48)  # where the cube is mid-episode: distance from the arm's base axis
MID_BEARING = (-0.35, 0.35)  # and bearing (radians, 0 = +x)
# Ticks between the clip's two frames: 0.8 s at 20 Hz. The policy reads the cube's speed from the clip, and at
# 500 ms of delay it acts on that reading 0.6 to 1.2 s later; the stages before the shipped policy's last were
# trained on 8 ticks (0.4 s), half the displacement to read the same speed from (docs/training.md, stage 5).
CLIP_STRIDE = 16
EPISODE_STEPS = 40  # 2 s at 20 Hz
HOLD_TICKS = 10  # the hand must be on the cube at each of the episode's last 10 ticks (0.5 s)
CHUNK = 16  # actions per expert chunk (the served policy's horizon)
_TANH_LIMIT = 0.95


@dataclass(frozen=True)
class CubePath:
    """The cube's straight path: where it is at tick 0 of the episode and its velocity (m/s, in x, y)."""

    start: np.ndarray  # (2,) metres
    velocity: np.ndarray  # (2,) metres per second

    @property
    def speed(self) -> float:
        return float(np.linalg.norm(self.velocity))

    def at(self, seconds: float) -> np.ndarray:
        """Where the cube is ``seconds`` after the episode's tick 0 (negative: before it)."""
        position: np.ndarray = self.start + self.velocity * seconds
        return position


def draw_path(rng: np.random.Generator, episode_s: float) -> CubePath:
    """A path from ``rng``: the speed uniform in :data:`SPEED_RANGE`, the direction +y or -y, and the point
    passed mid-episode uniform in the region :data:`MID_RADIUS` x :data:`MID_BEARING`."""
    radius = rng.uniform(*MID_RADIUS)
    bearing = rng.uniform(*MID_BEARING)
    speed = rng.uniform(*SPEED_RANGE)
    direction = 1.0 if rng.random() < 0.5 else -1.0
    middle = np.array([radius * np.cos(bearing), radius * np.sin(bearing)])
    velocity = np.array([0.0, direction * speed])
    return CubePath(middle - velocity * episode_s / 2, velocity)


class MovingCubeTaskEnv(ReachTaskEnv):
    """:class:`~.reach_task.ReachTaskEnv` with a sliding cube and a two-frame camera clip.

    ``seed`` (the config's) seeds the paths; episode ``k`` after construction uses the ``k``-th draw. The
    observation's ``image`` is the clip (``H x 2W x 3``): the frame ``clip_stride`` ticks ago beside the
    current one; ``camera`` is the current frame alone (for videos); ``state`` is in action units.
    """

    def __init__(self, config: ArmEnvConfig | None = None, clip_stride: int = CLIP_STRIDE) -> None:
        if clip_stride < 1:
            raise ValueError(f"the clip's frames must be at least 1 tick apart, got {clip_stride}")
        config = config or ArmEnvConfig(image_height=128, image_width=128, wrist_camera=False)
        config = replace(config, episode_steps=config.episode_steps or EPISODE_STEPS)
        self.clip_stride = clip_stride
        self._path_rng = np.random.default_rng(config.seed)
        self.path = CubePath(np.zeros(2), np.zeros(2))
        self._frames: deque[np.ndarray] = deque(maxlen=clip_stride + 1)
        self._started = False
        super().__init__(config)
        mujoco = self._mujoco
        self._cube_body = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, "cube")
        self._cube_dof = self.model.jnt_dofadr[self._joint("cube")]
        self._started = True
        self.reset()

    @property
    def period(self) -> float:
        return 1.0 / self.config.control_hz

    def reset(self) -> None:
        if not getattr(self, "_started", False):  # the base class resets once while it is being built
            super().reset()
            return
        self.path = draw_path(self._path_rng, self.config.episode_steps * self.period)
        super().reset()  # the arm at the reach task's start pose, the cube placed (then moved below)
        self._frames.clear()
        self.distances: list[float] = []  # the hand's distance from the goal after each tick
        # The cube slid before the episode began: the clip's older frames are real frames of that.
        for tick in range(-self.clip_stride, 1):
            self._place_cube(tick * self.period)
            self._frames.append(self.render("front"))
        self.steps = 0

    def _place_cube(self, seconds: float) -> None:
        xy = self.path.at(seconds)
        adr = self._cube_qpos
        self.data.qpos[adr : adr + 2] = xy
        self.data.qpos[adr + 2] = 0.425
        self.data.qpos[adr + 3 : adr + 7] = (1.0, 0.0, 0.0, 0.0)
        dof = self._cube_dof
        self.data.qvel[dof : dof + 6] = 0.0
        self.data.qvel[dof : dof + 2] = self.path.velocity
        self._mujoco.mj_forward(self.model, self.data)

    def apply_action(self, action: dict[str, Any]) -> None:
        self.data.ctrl[:] = self.actuator_targets(action["actions"])
        mujoco, substeps = self._mujoco, self.substeps
        dt = self.model.opt.timestep
        t0 = self.steps * self.period
        for k in range(substeps):  # the conveyor: the cube follows its path at every physics step
            mujoco.mj_step(self.model, self.data)
            self._hold_cube_on_path(t0 + (k + 1) * dt)
        mujoco.mj_forward(self.model, self.data)
        self.steps += 1
        # Every tick's frame, whether or not anyone observes it: the clip's older frame is clip_stride ticks
        # back even for a client that observes once a chunk (the lock-step baseline).
        self._frames.append(self.render("front"))
        self.distances.append(float(np.linalg.norm(self.hand - self.goal)))

    def _hold_cube_on_path(self, seconds: float) -> None:
        adr, dof = self._cube_qpos, self._cube_dof
        self.data.qpos[adr : adr + 2] = self.path.at(seconds)
        self.data.qpos[adr + 2] = 0.425
        self.data.qpos[adr + 3 : adr + 7] = (1.0, 0.0, 0.0, 0.0)
        self.data.qvel[dof : dof + 6] = 0.0
        self.data.qvel[dof : dof + 2] = self.path.velocity

    def get_observation(self) -> dict[str, Any]:
        past, frame = self._frames[0], self._frames[-1]
        return {
            "image": np.concatenate([past, frame], axis=1),
            "camera": frame.copy(),
            "state": self.state_in_action_units(),
            "step": self.steps,
            # Privileged, for the scripted expert only: never forwarded to a server (the chunker sends
            # image, images, video and deadline_ms, and the state).
            "expert_view": self.expert_view(),
        }

    def expert_view(self) -> ExpertView:
        return ExpertView(self.joints(), self.path, self.steps * self.period)

    # -- the task --------------------------------------------------------------------------------------

    @property
    def cube(self) -> np.ndarray:
        """The cube's centre as MuJoCo has it now."""
        return np.array(self.data.xpos[self._cube_body])

    @property
    def goal(self) -> np.ndarray:
        cube = self.cube
        return np.array([cube[0], cube[1], cube[2] + GOAL_HEIGHT])

    def outcome(self) -> ReachOutcome:
        """Success if the hand stayed within the radius for the last :data:`HOLD_TICKS` ticks; the distance is
        the largest of those ticks' (an episode shorter than that is judged on the ticks it had)."""
        last = self.distances[-HOLD_TICKS:] or [float(np.linalg.norm(self.hand - self.goal))]
        distance = max(last)
        return ReachOutcome(distance <= SUCCESS_RADIUS, distance)


@dataclass(frozen=True)
class ExpertView:
    """What the privileged expert knows at an observation: the arm's joints, the cube's path, the time."""

    joints: np.ndarray
    path: CubePath
    seconds: float


class MovingCubeExpert:
    """Plans chunks on a private copy of the arm's kinematics (safe on another thread than the simulator's).

    :meth:`plan` is the chunk for an :class:`ExpertView`; :meth:`act` is its first action for the
    environment's current state (the demonstrations' per-tick expert).
    """

    def __init__(self, env: MovingCubeTaskEnv, horizon: int = CHUNK) -> None:
        import mujoco

        self._mujoco = mujoco
        self.env = env
        self.horizon = horizon
        self.model = env.model
        self.data = mujoco.MjData(env.model)
        self.period = env.period
        self._hand = env._hand
        self._home = env.home_ctrl[:3].copy()
        self._scale = np.asarray(env.config.action_scale, dtype=np.float64)
        joints = [env._joint(name) for name in ("base_yaw", "shoulder", "elbow")]
        self._qpos = [int(self.model.jnt_qposadr[j]) for j in joints]
        self._dofs = [int(self.model.jnt_dofadr[j]) for j in joints]
        self._low = np.maximum(self._home - _TANH_LIMIT * self._scale, self.model.jnt_range[joints, 0])
        self._high = np.minimum(self._home + _TANH_LIMIT * self._scale, self.model.jnt_range[joints, 1])
        self._cube_z = 0.425

    def aim(self, path: CubePath, seconds: float) -> np.ndarray:
        """The goal the expert steers to for time ``seconds``: above the cube then."""
        xy = path.at(seconds)
        return np.array([xy[0], xy[1], self._cube_z + GOAL_HEIGHT])

    def solve(self, target: np.ndarray, q: np.ndarray, iterations: int = 30) -> np.ndarray:
        """Joints that put the hand at ``target`` (damped least squares from ``q``, within the bridge's range)."""
        mujoco, data = self._mujoco, self.data
        jac = np.zeros((3, self.model.nv))
        q = q.copy()
        for _ in range(iterations):
            data.qpos[self._qpos] = q
            mujoco.mj_kinematics(self.model, data)
            mujoco.mj_comPos(self.model, data)
            error = target - data.xpos[self._hand]
            if np.linalg.norm(error) < 1e-4:
                break
            mujoco.mj_jacBody(self.model, data, jac, None, self._hand)
            j = jac[:, self._dofs]
            q = np.clip(q + j.T @ np.linalg.solve(j @ j.T + 1e-4 * np.eye(3), error), self._low, self._high)
        return q

    def to_action(self, joints: np.ndarray) -> np.ndarray:
        arm = np.clip((joints - self._home) / self._scale, -_TANH_LIMIT, _TANH_LIMIT)
        return np.array([*np.arctanh(arm), 0.0], dtype=np.float32)

    def to_joints(self, action: np.ndarray) -> np.ndarray:
        joints: np.ndarray = self._home + self._scale * np.tanh(np.asarray(action[:3], dtype=np.float64))
        return joints

    def plan(self, view: ExpertView, prefix: np.ndarray | None = None, horizon: int | None = None) -> np.ndarray:
        """A chunk for ``view``: action ``i`` for tick ``i`` after it. With ``prefix`` (real-time chunking) the
        chunk starts with it and is planned on from where it leaves the arm."""
        horizon = horizon or self.horizon
        actions: list[np.ndarray] = []
        q = view.joints.astype(np.float64)
        if prefix is not None and len(prefix):
            actions = [np.asarray(a, np.float32) for a in prefix[: horizon - 1]]
            q = self.to_joints(actions[-1])
        solution = q
        for i in range(len(actions), horizon):
            solution = self.solve(self.aim(view.path, view.seconds + (i + 1) * self.period), solution)
            q = q + np.clip(solution - q, -MAX_JOINT_STEP, MAX_JOINT_STEP)
            actions.append(self.to_action(q))
        return np.stack(actions)

    def act(self) -> np.ndarray:
        """This tick's action: the first of the chunk for the environment's current state."""
        action: np.ndarray = self.plan(self.env.expert_view(), horizon=1)[0]
        return action


class BlindMovingExpert(MovingCubeExpert):
    """The expert aimed at a cube resting at the middle of the region: the best a camera-blind policy does."""

    def aim(self, path: CubePath, seconds: float) -> np.ndarray:
        radius, bearing = np.mean(MID_RADIUS), np.mean(MID_BEARING)
        return np.array([radius * np.cos(bearing), radius * np.sin(bearing), self._cube_z + GOAL_HEIGHT])


class ExpertChunkPolicy:
    """The expert as a chunk policy (:class:`~robot_clients.chunker.ChunkPolicy`): each chunk is planned from
    the observation's privileged view, so a late chunk is a plan for a moment that has passed, as a model's
    would be. ``delay_s`` is added to each answer, as ``cosmos3-eval`` injects delay into the server's."""

    def __init__(self, expert: MovingCubeExpert, delay_s: float = 0.0) -> None:
        self.expert = expert
        self.delay_s = delay_s

    def infer_chunk(self, observation: Mapping[str, Any], prefix_actions: np.ndarray | None) -> np.ndarray:
        chunk: np.ndarray = self.expert.plan(observation["expert_view"], prefix_actions)
        if self.delay_s:
            time.sleep(self.delay_s)
        return chunk


@dataclass(frozen=True)
class StudentErrors:
    """How a perturbed demonstration's arm is driven: as a learned policy errs, not as the expert acts.

    The student executes the expert's chunk planned ``lag_ticks`` too early (a plan for where the cube was),
    with the cube's speed misjudged by ``speed_factor``, replanned every ``replan_every`` ticks and executed
    from its first action, with Gaussian noise of std ``action_noise`` (action units) on the arm's joints.
    """

    lag_ticks: int
    replan_every: int
    speed_factor: float
    action_noise: float


def draw_student(rng: np.random.Generator) -> StudentErrors:
    """Errors of the size the first trained policy showed: up to 0.6 s late, up to 60 % slow, jittery."""
    return StudentErrors(
        lag_ticks=int(rng.integers(0, 13)),
        replan_every=int(rng.integers(1, 9)),
        speed_factor=float(rng.uniform(0.4, 1.1)),
        action_noise=float(rng.uniform(0.0, 0.1)),
    )


def _student_view(view: ExpertView, errors: StudentErrors, period: float) -> ExpertView:
    """The view a student with ``errors`` plans on: the path's speed scaled about now, the clock late."""
    now = view.path.at(view.seconds)
    velocity = view.path.velocity * errors.speed_factor
    path = CubePath(now - velocity * view.seconds, velocity)
    return ExpertView(view.joints, path, view.seconds - errors.lag_ticks * period)


def run_labelled_episode(
    env: MovingCubeTaskEnv,
    expert: MovingCubeExpert,
    errors: StudentErrors | None = None,
    rng: np.random.Generator | None = None,
    student_prefixes: float = 0.0,
    max_prefix: int = 12,
) -> tuple[list[dict[str, Any]], ReachOutcome]:
    """One episode from a fresh reset, every tick labelled with the expert's whole chunk for that tick's
    state (``chunk``, H x D): DAgger's labels. With ``errors`` the arm is driven by a student that errs as
    :class:`StudentErrors` says (``rng`` draws its noise), so the labels show how to recover from states the
    expert alone never visits (the arm behind a fast cube, off to one side); without, the expert acts every
    tick and ``chunk`` starts with the action it takes.

    ``student_prefixes``: the share of a student's ticks labelled as ``rtc`` asks, with a prefix: the next
    ``d`` rows the student is about to execute (``d`` uniform in 1..``max_prefix``, within its chunk), and the
    expert's chunk that continues them (:meth:`MovingCubeExpert.plan` with that prefix: the prefix, then the
    expert's plan from where it leaves the arm). Every step's ``prefix_rows`` says how many leading rows of its
    ``chunk`` are such a prefix (0: none)."""
    env.reset()
    rng = rng or np.random.default_rng(0)
    steps = []
    student_chunk: np.ndarray | None = None
    since_plan = 0
    while not env.is_episode_complete():
        observation = env.get_observation()
        view = observation["expert_view"]
        chunk = expert.plan(view)
        prefix_rows = 0
        if errors is None:
            action = chunk[0]
        else:
            if student_chunk is None or since_plan >= min(errors.replan_every, len(student_chunk)):
                student_chunk, since_plan = expert.plan(_student_view(view, errors, env.period)), 0
            # The rows an rtc chunker would send now: from this tick's action on, leaving the label a row to plan.
            ahead = min(max_prefix, len(student_chunk) - since_plan, expert.horizon - 1)
            if student_prefixes and ahead > 0 and rng.random() < student_prefixes:
                prefix_rows = int(rng.integers(1, ahead + 1))
                chunk = expert.plan(view, student_chunk[since_plan : since_plan + prefix_rows])
            action = student_chunk[since_plan].copy()
            action[:3] += rng.normal(0.0, errors.action_noise, 3).astype(np.float32)
            since_plan += 1
        steps.append(
            {
                "image": observation["image"],
                "state": observation["state"],
                "action": action,
                "chunk": chunk,
                "prefix_rows": prefix_rows,
            }
        )
        env.apply_action({"actions": action})
    return steps, env.outcome()


def run_policy_labelled_episode(
    env: MovingCubeTaskEnv,
    expert: MovingCubeExpert,
    policy: ChunkPolicy,
    delay_ticks: int,
    rng: np.random.Generator,
    student_prefixes: float = 0.0,
    max_prefix: int = 12,
    execute_horizon: int = 8,
) -> tuple[list[dict[str, Any]], ReachOutcome]:
    """One episode from a fresh reset driven by a learned ``policy``'s chunks as ``rtc`` executes them at
    ``delay_ticks`` of latency, every tick labelled by the expert: DAgger on the states, and the prefixes,
    the policy itself produces.

    Time is the simulator's, not the wall clock's: a chunk asked at tick ``t`` takes over at tick
    ``t + d`` (``d`` = ``delay_ticks``, within ``max_prefix`` and the chunk's rows), executed from its row
    ``d``; until then the arm runs the ``d`` rows of the current chunk that were sent as the request's
    prefix, as the chunker does. The next request goes out when the new chunk has run
    ``execute_horizon - d - 2`` rows (at once for long delays), the chunker's threshold of latency plus two
    ticks. A request tick's label is the expert's chunk continuing exactly the prefix the policy was sent
    (``prefix_rows`` = ``d``); any other tick's is, for a share ``student_prefixes`` of them, the expert's
    chunk continuing the next 1 to ``max_prefix`` rows the arm is about to run, else the expert's chunk
    from the tick's state."""
    env.reset()
    steps = []
    observation = env.get_observation()
    chunk = np.asarray(policy.infer_chunk(observation, None), np.float32)  # the robot waits for its first chunk
    row, pending, next_request = 0, None, 0
    while not env.is_episode_complete():
        tick = env.steps
        observation = env.get_observation()
        if pending is not None and pending[0] == tick:  # the chunk asked d ticks ago takes over at its row d
            _, chunk, row = pending
            pending, next_request = None, tick + max(0, execute_horizon - row - 2)
        label_prefix = None
        if pending is None and tick >= next_request:
            d = max(0, min(delay_ticks, max_prefix, len(chunk) - row, expert.horizon - 1))
            label_prefix = chunk[row : row + d] if d else None
            answer = np.asarray(policy.infer_chunk(observation, label_prefix), np.float32)
            if d:
                pending = (tick + d, answer, d)
            else:  # no latency: it takes over now
                chunk, row, next_request = answer, 0, tick + max(0, execute_horizon - 2)
        ahead = min(max_prefix, len(chunk) - row, expert.horizon - 1)
        if label_prefix is None and student_prefixes and ahead > 0 and rng.random() < student_prefixes:
            label_prefix = chunk[row : row + int(rng.integers(1, ahead + 1))]
        label = expert.plan(observation["expert_view"], label_prefix)
        action = chunk[min(row, len(chunk) - 1)].copy()  # a chunk run out is held, as the chunker stalls
        steps.append(
            {
                "image": observation["image"],
                "state": observation["state"],
                "action": action,
                "chunk": label,
                "prefix_rows": 0 if label_prefix is None else len(label_prefix),
            }
        )
        env.apply_action({"actions": action})
        row += 1
    return steps, env.outcome()


def run_moving_expert(
    env: MovingCubeTaskEnv, expert: MovingCubeExpert
) -> tuple[list[dict[str, np.ndarray]], ReachOutcome]:
    """One episode of ``expert`` acting every tick, from a fresh reset: every step's observation (the clip,
    the state) and action, and the outcome."""
    env.reset()
    steps = []
    while not env.is_episode_complete():
        observation = env.get_observation()
        action = expert.act()
        steps.append({"image": observation["image"], "state": observation["state"], "action": action})
        env.apply_action({"actions": action})
    return steps, env.outcome()
