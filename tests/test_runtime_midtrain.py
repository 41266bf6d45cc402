"""The midtrain action space in the engine: end-effector poses in, the model's rows built as NVIDIA's reference
server builds them, and the chunk composed back into absolute poses; checked against SciPy's ``Rotation``."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from scipy.linalg import polar
from scipy.spatial.transform import Rotation

from cosmos3_runtime.engine import Cosmos3Engine
from cosmos3_runtime.errors import CheckpointError, InvalidFieldError, InvalidRequestError, UnsupportedModeError
from cosmos3_runtime.profiles import load_profiles
from cosmos3_runtime.random_checkpoints import TINY_DROID_MIDTRAIN_PROFILE
from cosmos3_runtime.requests import ActionRequest, VideoRequest
from cosmos3_runtime.validation import job_for_actions

DOMAIN = "droid_lerobot"
# A pose [x, y, z, qx, qy, qz, qw] turned 130 degrees about a tilted axis, and a closed gripper.
ROTATION = Rotation.from_rotvec(np.deg2rad(130) * np.array([0.3, -0.5, 0.8]) / np.linalg.norm([0.3, -0.5, 0.8]))
POSE = np.array([0.45, -0.1, 0.32, *ROTATION.as_quat(), 1.0], np.float32)


@pytest.fixture(scope="module")
def midtrain_engine(tiny_checkpoint):
    """The tiny distilled checkpoint, DROID profile in the midtrain space (``cosmos3-tiny --droid-midtrain``)."""
    return Cosmos3Engine.load(tiny_checkpoint("distilled", droid_midtrain=True))


def _request(image: np.ndarray, state: np.ndarray, **extra) -> ActionRequest:
    settings = dict(seed=3, resolution_tier=256, prompt="put the marker in the cup")
    return ActionRequest(domain_name=DOMAIN, image=image, state=state, **{**settings, **extra})


def _composed_by_scipy(rows: np.ndarray, pose: np.ndarray) -> np.ndarray:
    """The reference's decoding from the math: each rot6d made a rotation (the polar factor of [a, b, a x b]),
    each step T_(i+1) = T_i @ delta_i from the current pose, the quaternion read off the matrix."""
    position, rotation = pose[:3].astype(np.float64), Rotation.from_quat(pose[3:7]).as_matrix()
    out = []
    for row in rows.astype(np.float64):
        a, b = row[3:6], row[6:9]
        step, _ = polar(np.stack([a, b, np.cross(a, b)], axis=1))
        position, rotation = position + rotation @ row[:3], rotation @ step
        out.append([*position, *Rotation.from_matrix(rotation).as_quat(), row[9]])
    return np.array(out)


def test_the_midtrain_profile_says_what_the_robot_sends_and_gets(midtrain_engine):
    domain = midtrain_engine.describe().as_json()["domains"][DOMAIN]
    assert (domain["action_space"], domain["raw_action_dim"], domain["state_dim"], domain["history_length"]) == (
        "midtrain",
        8,
        8,
        1,
    )
    profile = midtrain_engine.spec.profiles[DOMAIN]
    assert profile.model_action_dim == 10 and profile.gripper_flip_index == 9


def test_the_state_row_is_position_rot6d_and_the_flipped_gripper(midtrain_engine, camera_image):
    job, _ = job_for_actions(_request(camera_image, POSE), midtrain_engine.description)
    matrix = ROTATION.as_matrix()
    expected = [*POSE[:3], *matrix[:, 0], *matrix[:, 1], 0.0]  # a closed gripper (1) is 0 to the model
    np.testing.assert_allclose(job.state_rows, [expected], atol=1e-6)
    assert job.raw_action_dim == 10


def test_history_rows_are_the_steps_between_the_poses_sent(tiny_checkpoint, tmp_path, camera_image):
    """history_length 3: two backward_framewise steps (each with the gripper it arrives at), then the pose."""
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"domains": {DOMAIN: {**TINY_DROID_MIDTRAIN_PROFILE, "history_length": 3}}}))
    engine = Cosmos3Engine.load(tiny_checkpoint("distilled", droid_midtrain=True), profiles_path=path)
    rotations = Rotation.from_rotvec([[0.1, 0.2, -0.3], [2.9, 0.1, 0.4], [0.0, -3.1, 0.05]])
    positions = np.array([[0.4, 0.0, 0.3], [0.42, -0.05, 0.31], [0.5, -0.1, 0.2]])
    grippers = np.array([[0.0], [0.5], [1.0]])
    state = np.concatenate([positions, rotations.as_quat(), grippers], axis=1).astype(np.float32)
    job, _ = job_for_actions(_request(camera_image, state), engine.description)
    assert job.state_rows.shape == (3, 10)
    for i in range(2):
        inverse = rotations[i].inv()
        step = (inverse * rotations[i + 1]).as_matrix()
        translation = inverse.apply(positions[i + 1] - positions[i])
        expected = [*translation, *step[:, 0], *step[:, 1], 1.0 - grippers[i + 1, 0]]
        np.testing.assert_allclose(job.state_rows[i], expected, atol=1e-5)
    current = rotations[2].as_matrix()
    np.testing.assert_allclose(job.state_rows[2], [*positions[2], *current[:, 0], *current[:, 1], 0.0], atol=1e-6)
    chunk = engine.predict_actions(_request(camera_image, state)).actions
    assert chunk.shape == (32, 8) and np.allclose(np.linalg.norm(chunk[:, 3:7], axis=1), 1.0, atol=1e-5)


def test_the_chunk_is_the_models_rows_composed_from_the_current_pose(midtrain_engine, camera_image):
    request = _request(camera_image, POSE)
    job, _ = job_for_actions(request, midtrain_engine.description)
    model = midtrain_engine.sampler.run(job, time.perf_counter).actions  # relative rows, gripper flipped
    chunk = midtrain_engine.predict_actions(request).actions
    assert chunk.shape == (32, 8) and chunk.dtype == np.float32
    rows = model.astype(np.float64).copy()
    rows[:, 9] = 1.0 - rows[:, 9]  # no normalization; the gripper back in the robot's convention
    expected = _composed_by_scipy(rows, POSE)
    np.testing.assert_allclose(chunk[:, :3], expected[:, :3], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(chunk[:, 3:7], expected[:, 3:7], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(chunk[:, 3:7], axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(chunk[:, 7], rows[:, 9], atol=1e-6)


def test_q_and_minus_q_are_one_pose_and_the_pose_conditions_the_chunk(midtrain_engine, camera_image):
    a = midtrain_engine.predict_actions(_request(camera_image, POSE)).actions
    flipped = POSE.copy()
    flipped[3:7] *= -2.0  # the same rotation, negated and not unit: normalized as SciPy does
    np.testing.assert_allclose(midtrain_engine.predict_actions(_request(camera_image, flipped)).actions, a, atol=1e-5)
    moved = POSE.copy()
    moved[:3] += 0.2
    assert np.abs(midtrain_engine.predict_actions(_request(camera_image, moved)).actions - a).max() > 1e-3


def test_a_prefix_of_absolute_poses_enters_as_steps_from_the_current_pose(midtrain_engine, camera_image):
    first = midtrain_engine.predict_actions(_request(camera_image, POSE)).actions
    prefix = first[:4]
    request = _request(camera_image, POSE, prefix_actions=prefix)
    job, _ = job_for_actions(request, midtrain_engine.description)
    chain = Rotation.from_quat(np.concatenate([POSE[None, 3:7], prefix[:, 3:7]]))
    positions = np.concatenate([POSE[None, :3], prefix[:, :3]])
    for i in range(4):
        step = (chain[i].inv() * chain[i + 1]).as_matrix()
        np.testing.assert_allclose(
            job.clean_actions[i, :3], chain[i].inv().apply(positions[i + 1] - positions[i]), atol=1e-4
        )
        np.testing.assert_allclose(job.clean_actions[i, 3:9], [*step[:, 0], *step[:, 1]], atol=1e-5)
        assert job.clean_actions[i, 9] == pytest.approx(1.0 - prefix[i, 7], abs=1e-6)
    again = midtrain_engine.predict_actions(request).actions
    np.testing.assert_array_equal(again[:4], prefix)  # handed back exactly as sent


def test_bad_poses_get_typed_errors(midtrain_engine, camera_image):
    zero = POSE.copy()
    zero[3:7] = 0.0
    with pytest.raises(InvalidFieldError, match="names no rotation") as err:
        midtrain_engine.predict_actions(_request(camera_image, zero))
    assert err.value.field == "state"
    with pytest.raises(InvalidRequestError, match="names no rotation") as err:
        midtrain_engine.predict_actions(_request(camera_image, POSE, prefix_actions=zero[None]))
    assert err.value.field == "prefix_actions"
    with pytest.raises(InvalidFieldError, match="state_dim 8"):
        midtrain_engine.predict_actions(_request(camera_image, np.zeros(10, np.float32)))
    with pytest.raises(UnsupportedModeError, match="forward_dynamics") as err:
        midtrain_engine.rollout_video(
            VideoRequest(domain_name=DOMAIN, image=camera_image, actions=np.tile(POSE, (4, 1)))
        )
    assert err.value.field == "action_mode"


@pytest.mark.parametrize(
    "change, match",
    [
        ({"action_space": "cartesian"}, "action_space must be one of joint_pos, midtrain"),
        ({"raw_action_dim": 8}, "raw_action_dim must be 10"),
        ({"use_state": False, "history_length": 0}, "needs use_state"),
        ({"state_dim": 10}, "state_dim 10 differs"),
    ],
)
def test_a_midtrain_profile_that_cannot_work_is_refused(tiny_checkpoint, tmp_path, change, match):
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"domains": {DOMAIN: {**TINY_DROID_MIDTRAIN_PROFILE, **change}}}))
    with pytest.raises(CheckpointError, match=match):
        load_profiles(tiny_checkpoint("distilled"), action_dim=64, num_domains=32, override_file=path)


def test_cosmos3_tiny_droid_midtrain_and_inspect_show_the_action_space(tmp_path, capsys):
    from cosmos3_runtime.cli import inspect_main, tiny_main

    assert tiny_main([str(tmp_path / "midtrain"), "--droid-midtrain"]) == 0
    shipped = json.loads((tmp_path / "midtrain" / "policy_profiles.json").read_text())["domains"][DOMAIN]
    assert (shipped["action_space"], shipped["raw_action_dim"], shipped["gripper_flip_index"]) == ("midtrain", 10, 9)
    capsys.readouterr()
    assert inspect_main([str(tmp_path / "midtrain")]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith(DOMAIN))
    for needle in ("width  8", "space midtrain (model rows 10 wide)", "state 1 x 8", "gripper flipped at 9"):
        assert needle in line, needle
    assert inspect_main([str(tmp_path / "midtrain"), "--json"]) == 0
    domain = json.loads(capsys.readouterr().out)["domains"][DOMAIN]
    assert (domain["action_space"], domain["raw_action_dim"], domain["state_dim"]) == ("midtrain", 8, 8)
