"""The midtrain pose algebra (cosmos3_runtime.poses) against one written here from the math with SciPy's
``Rotation``: quaternions xyzw, rot6d as the matrix's first two columns, backward_framewise steps
``T_i^-1 @ T_(i+1)``, and the round trip absolute -> relative -> absolute."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import polar
from scipy.spatial.transform import Rotation

from cosmos3_runtime import poses

RNG_SEED = 20260801


def _random_poses(count: int, seed: int = RNG_SEED) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(-1.0, 1.0, (count, 3)), Rotation.random(count, random_state=seed).as_quat()


def _hard_rotations() -> Rotation:
    """Identity, half turns about each axis and a random one, and rotations a hair short of a half turn."""
    axes = np.concatenate([np.eye(3), Rotation.random(4, random_state=7).apply([1.0, 0.0, 0.0])])
    half_turns = Rotation.from_rotvec(np.pi * axes)
    near = Rotation.from_rotvec((np.pi - 1e-6) * axes)
    return Rotation.concatenate([Rotation.identity(), half_turns, near, Rotation.from_rotvec([0.0, 0.0, 1e-7])])


def _scipy_relative(position: np.ndarray, quat: np.ndarray) -> np.ndarray:
    """backward_framewise written from the definition: rotation R_i^-1 R_(i+1), translation R_i^-1 (p_(i+1) - p_i)."""
    rotations = Rotation.from_quat(quat)
    rows = []
    for i in range(len(position) - 1):
        inverse = rotations[i].inv()
        delta = (inverse * rotations[i + 1]).as_matrix()
        rows.append(np.concatenate([inverse.apply(position[i + 1] - position[i]), delta[:, 0], delta[:, 1]]))
    return np.array(rows)


def _same_rotation(quat_a: np.ndarray, quat_b: np.ndarray) -> np.ndarray:
    """The angle (radians) between rotations given as quaternions: 0 for q and -q alike."""
    magnitude: np.ndarray = (Rotation.from_quat(quat_a).inv() * Rotation.from_quat(quat_b)).magnitude()
    return magnitude


def test_quaternion_to_matrix_is_scipys_and_normalizes_like_it():
    _, quat = _random_poses(64)
    quat = np.concatenate([quat, _hard_rotations().as_quat()])
    scaled = quat * np.linspace(0.3, 3.0, len(quat))[:, None]  # SciPy normalizes, so does the reference
    np.testing.assert_allclose(poses.quat_to_matrix(scaled), Rotation.from_quat(quat).as_matrix(), atol=1e-12)


def test_matrix_to_quaternion_is_scipys_sign_included():
    _, quat = _random_poses(64)
    matrices = np.concatenate([Rotation.from_quat(quat).as_matrix(), _hard_rotations().as_matrix()])
    expected = Rotation.from_matrix(matrices).as_quat()  # the reference server's own call
    np.testing.assert_allclose(poses.matrix_to_quat(matrices), expected, atol=1e-12)
    assert np.allclose(poses.matrix_to_quat(np.eye(3)), [0.0, 0.0, 0.0, 1.0])


def test_rot6d_is_the_first_two_columns_first_column_first():
    _, quat = _random_poses(32)
    matrices = np.concatenate([Rotation.from_quat(quat).as_matrix(), _hard_rotations().as_matrix()])
    rot6d = poses.matrix_to_rot6d(matrices)
    np.testing.assert_allclose(rot6d[:, :3], matrices[:, :, 0], atol=1e-15)
    np.testing.assert_allclose(rot6d[:, 3:], matrices[:, :, 1], atol=1e-15)
    np.testing.assert_allclose(poses.rot6d_to_matrix(rot6d), matrices, atol=1e-12)
    np.testing.assert_allclose(poses.matrix_to_rot6d(np.eye(3)), [1.0, 0.0, 0.0, 0.0, 1.0, 0.0])


def test_a_predicted_rot6d_is_projected_to_the_nearest_rotation():
    """A model's rot6d is not orthonormal: the decoded rotation is the polar factor of [a, b, a x b]."""
    rng = np.random.default_rng(RNG_SEED)
    noisy = poses.matrix_to_rot6d(Rotation.random(16, random_state=3).as_matrix()) + rng.normal(0, 0.2, (16, 6))
    decoded = poses.rot6d_to_matrix(noisy)
    for row, matrix in zip(noisy, decoded):
        a, b = row[:3], row[3:]
        nearest, _ = polar(np.stack([a, b, np.cross(a, b)], axis=1))
        np.testing.assert_allclose(matrix, nearest, atol=1e-9)
        np.testing.assert_allclose(matrix @ matrix.T, np.eye(3), atol=1e-9)
        assert np.linalg.det(matrix) == pytest.approx(1.0)


def test_backward_framewise_is_each_step_in_the_frame_of_the_pose_before():
    position, quat = _random_poses(20)
    hard = _hard_rotations().as_quat()
    position = np.concatenate([position, np.random.default_rng(1).uniform(-1, 1, (len(hard), 3))])
    quat = np.concatenate([quat, hard])
    relative = poses.backward_framewise(poses.pose_matrices(position, quat))
    np.testing.assert_allclose(relative, _scipy_relative(position, quat), atol=1e-9)


def test_abs_to_rel_to_abs_round_trip_within_1e_5():
    position, quat = _random_poses(33)
    quat = np.concatenate([quat[:25], _hard_rotations().as_quat()[:8]])
    gripper = np.random.default_rng(2).uniform(0, 1, (33, 1))
    trajectory = np.concatenate([position, quat, gripper], axis=1).astype(np.float32)
    origin, chunk = trajectory[0], trajectory[1:]

    model_rows = poses.midtrain_relative_rows(chunk, origin)
    assert model_rows.shape == (32, 10) and model_rows.dtype == np.float32
    back = poses.midtrain_absolute_actions(model_rows, origin)
    assert back.shape == (32, 8) and back.dtype == np.float32
    np.testing.assert_allclose(back[:, :3], chunk[:, :3], atol=1e-5)
    assert _same_rotation(back[:, 3:7], chunk[:, 3:7]).max() < 1e-5
    np.testing.assert_allclose(np.linalg.norm(back[:, 3:7], axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(back[:, 7], chunk[:, 7])


def test_absolute_actions_compose_each_step_onto_the_pose_before():
    """The reference's decoding, written from the math: T_(i+1) = T_i @ delta_i from the current pose."""
    rng = np.random.default_rng(RNG_SEED + 1)
    origin = np.concatenate([rng.uniform(-1, 1, 3), Rotation.random(random_state=5).as_quat(), [0.5]])
    steps = Rotation.from_rotvec(rng.normal(0, 0.3, (16, 3)))
    rows = np.concatenate(
        [
            rng.normal(0, 0.05, (16, 3)),
            steps.as_matrix()[:, :, 0],
            steps.as_matrix()[:, :, 1],
            rng.uniform(0, 1, (16, 1)),
        ],
        axis=1,
    )
    actions = poses.midtrain_absolute_actions(rows, origin)
    rotation, position = Rotation.from_quat(origin[3:7]), origin[:3]
    for row, action, step in zip(rows, actions, steps):
        position = position + rotation.apply(row[:3])
        rotation = rotation * step
        np.testing.assert_allclose(action[:3], position, atol=1e-5)
        # The sign is the one SciPy's from_matrix gives, as the reference reads the quaternion off the matrix.
        np.testing.assert_allclose(action[3:7], Rotation.from_matrix(rotation.as_matrix()).as_quat(), atol=1e-5)
        assert action[7] == np.float32(row[9])


def test_state_rows_are_history_steps_then_the_current_pose():
    position, quat = _random_poses(4)
    gripper = np.array([[0.1], [0.2], [0.3], [0.4]])
    rows = poses.midtrain_state_rows(np.concatenate([position, quat, gripper], axis=1))
    assert rows.shape == (4, 10)
    np.testing.assert_allclose(rows[:3, :9], _scipy_relative(position, quat), atol=1e-6)
    np.testing.assert_allclose(rows[:3, 9], [0.2, 0.3, 0.4], atol=1e-7)  # each step's gripper: where it arrives
    current = Rotation.from_quat(quat[-1]).as_matrix()
    np.testing.assert_allclose(rows[3], [*position[-1], *current[:, 0], *current[:, 1], 0.4], atol=1e-6)
    identity = poses.midtrain_state_rows(np.array([[0, 0, 0, 0, 0, 0, 1, 1.0]]))
    np.testing.assert_allclose(identity, [[0, 0, 0, 1, 0, 0, 0, 1, 0, 1]], atol=1e-7)


def test_a_zero_quaternion_is_refused():
    with pytest.raises(ValueError, match="names no rotation"):
        poses.quat_to_matrix(np.zeros(4))
