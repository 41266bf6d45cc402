"""End-effector pose algebra for the ``midtrain`` action space, in cosmos-framework's conventions.

A pose is a position ``[x, y, z]`` and a unit quaternion ``[qx, qy, qz, qw]`` (xyzw, SciPy's order);
as a matrix it is the 4x4 homogeneous transform ``[[R, p], [0, 1]]``. The model's rows are 10 wide:
``[translation(3), rot6d(6), gripper(1)]``, where rot6d is the rotation matrix's first two columns,
first column first: ``[R00, R10, R20, R01, R11, R21]``. History and action rows are relative poses in the
``backward_framewise`` convention: step ``i`` is ``T_i^-1 @ T_(i+1)``, the next pose in the frame of the
one before (its translation rotated into that frame). docs/runtime.md writes the algebra out.

The robot-side rows (``state``, ``prefix_actions``, the chunk returned) are ``[x, y, z, qx, qy, qz, qw,
gripper]``. Pure numpy; float64 inside, float32 out.
"""

from __future__ import annotations

import numpy as np

POSE_WIDTH = 8  # [x, y, z, qx, qy, qz, qw, gripper]: the robot's rows
MODEL_WIDTH = 10  # [translation(3), rot6d(6), gripper(1)]: the model's rows
MIN_QUATERNION_NORM = 1e-6  # below this a quaternion names no rotation; SciPy refuses zero


def quat_to_matrix(quat_xyzw: np.ndarray) -> np.ndarray:
    """Unit-normalized ``[..., 4]`` xyzw quaternions -> ``[..., 3, 3]`` rotation matrices.

    Raises ``ValueError`` for a quaternion shorter than :data:`MIN_QUATERNION_NORM`.
    """
    q = np.asarray(quat_xyzw, dtype=np.float64)
    norm = np.linalg.norm(q, axis=-1, keepdims=True)
    if np.any(norm < MIN_QUATERNION_NORM):
        raise ValueError(f"a quaternion has norm below {MIN_QUATERNION_NORM:g}: it names no rotation")
    x, y, z, w = np.moveaxis(q / norm, -1, 0)
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], axis=-1),
            np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], axis=-1),
            np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], axis=-1),
        ],
        axis=-2,
    )


def matrix_to_quat(matrix: np.ndarray) -> np.ndarray:
    """``[..., 3, 3]`` rotation matrices -> ``[..., 4]`` unit xyzw quaternions.

    Markley's method, as SciPy's ``Rotation.from_matrix(...).as_quat()`` computes it, so the sign is
    the one the reference server returns: the component of largest magnitude is positive (``q`` and
    ``-q`` are the same rotation).
    """
    m = np.asarray(matrix, dtype=np.float64)
    shape = m.shape[:-2]
    m = m.reshape(-1, 3, 3)
    trace = np.trace(m, axis1=1, axis2=2)
    decision = np.concatenate([np.diagonal(m, axis1=1, axis2=2), trace[:, None]], axis=1)  # m00, m11, m22, tr
    choice = np.argmax(decision, axis=1)
    quat = np.empty((m.shape[0], 4))
    for index in range(m.shape[0]):
        r, c = m[index], int(choice[index])
        if c == 3:
            quat[index] = [r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1], 1 + trace[index]]
        else:
            i, j, k = c, (c + 1) % 3, (c + 2) % 3
            quat[index, i] = 1 - trace[index] + 2 * r[i, i]
            quat[index, j] = r[j, i] + r[i, j]
            quat[index, k] = r[k, i] + r[i, k]
            quat[index, 3] = r[k, j] - r[j, k]
    quat /= np.linalg.norm(quat, axis=1, keepdims=True)
    return quat.reshape(*shape, 4)


def matrix_to_rot6d(matrix: np.ndarray) -> np.ndarray:
    """``[..., 3, 3]`` -> ``[..., 6]``: the first column, then the second (``[R00, R10, R20, R01, R11, R21]``)."""
    m = np.asarray(matrix, dtype=np.float64)
    return np.concatenate([m[..., :, 0], m[..., :, 1]], axis=-1)


def rot6d_to_matrix(rot6d: np.ndarray) -> np.ndarray:
    """``[..., 6]`` -> ``[..., 3, 3]`` rotations, as cosmos-framework decodes a predicted rot6d.

    The two columns as given and their cross product make a matrix, which is projected onto SO(3) by
    SVD (``U @ Vt``, a reflection turned back into a rotation): not Gram-Schmidt, which keeps the first
    column's direction; the projection spreads a model's error over both columns.
    """
    r = np.asarray(rot6d, dtype=np.float64)
    first, second = r[..., :3], r[..., 3:6]
    raw = np.stack([first, second, np.cross(first, second)], axis=-1)  # the three as columns
    u, _, vt = np.linalg.svd(raw)
    rotation = u @ vt
    reflected = np.linalg.det(rotation) < 0
    if np.any(reflected):
        u = u.copy()
        u[reflected, :, -1] *= -1
        rotation[reflected] = u[reflected] @ vt[reflected]
    result: np.ndarray = rotation
    return result


def pose_matrices(position: np.ndarray, quat_xyzw: np.ndarray) -> np.ndarray:
    """``[T, 3]`` positions and ``[T, 4]`` xyzw quaternions -> ``[T, 4, 4]`` homogeneous poses."""
    position = np.asarray(position, dtype=np.float64)
    poses = np.zeros((*position.shape[:-1], 4, 4))
    poses[..., :3, :3] = quat_to_matrix(quat_xyzw)
    poses[..., :3, 3] = position
    poses[..., 3, 3] = 1.0
    return poses


def backward_framewise(poses: np.ndarray) -> np.ndarray:
    """``[T, 4, 4]`` absolute poses -> ``[T - 1, 9]`` relative rows ``[translation, rot6d]``.

    Row ``i`` is ``T_i^-1 @ T_(i+1)``: rotation ``R_i^T R_(i+1)``, translation ``R_i^T (p_(i+1) - p_i)``.
    """
    poses = np.asarray(poses, dtype=np.float64)
    before, after = poses[:-1], poses[1:]
    rotation_t = np.swapaxes(before[:, :3, :3], -1, -2)
    translation = np.einsum("tij,tj->ti", rotation_t, after[:, :3, 3] - before[:, :3, 3])
    return np.concatenate([translation, matrix_to_rot6d(rotation_t @ after[:, :3, :3])], axis=-1)


def compose_backward_framewise(relative: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """``[T, 9]`` relative rows composed onto the ``[4, 4]`` origin -> ``[T, 4, 4]`` absolute poses.

    :func:`backward_framewise` inverted: ``T_(i+1) = T_i @ delta_i``, from ``T_0 = origin``; the origin
    itself is not returned. Each delta's rotation goes through :func:`rot6d_to_matrix`.
    """
    relative = np.asarray(relative, dtype=np.float64)
    deltas = np.zeros((relative.shape[0], 4, 4))
    deltas[:, :3, :3] = rot6d_to_matrix(relative[:, 3:9])
    deltas[:, :3, 3] = relative[:, :3]
    deltas[:, 3, 3] = 1.0
    current = np.asarray(origin, dtype=np.float64)
    poses = np.empty_like(deltas)
    for index, delta in enumerate(deltas):
        current = current @ delta
        poses[index] = current
    return poses


# The midtrain action space: the robot's [x, y, z, qx, qy, qz, qw, gripper] rows <-> the model's rows.


def midtrain_state_rows(state: np.ndarray) -> np.ndarray:
    """``[H, 8]`` absolute poses (oldest first) -> ``[H, 10]`` model rows, the gripper as sent.

    The first ``H - 1`` rows are the ``backward_framewise`` steps between consecutive poses, each with the
    gripper of the pose it reaches; the last is the current pose itself, ``[position, rot6d, gripper]``.
    """
    state = np.asarray(state, dtype=np.float64)
    current = np.concatenate([state[-1, :3], matrix_to_rot6d(quat_to_matrix(state[-1, 3:7])), state[-1, 7:8]])
    history = np.concatenate([backward_framewise(pose_matrices(state[:, :3], state[:, 3:7])), state[1:, 7:8]], axis=1)
    return np.concatenate([history, current[None]], axis=0).astype(np.float32)


def midtrain_relative_rows(actions: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """``[K, 8]`` absolute poses after the ``[8]`` origin pose -> ``[K, 10]`` relative model rows.

    The inverse of :func:`midtrain_absolute_actions` (real-time chunking's prefix takes this way in).
    """
    actions, origin = np.asarray(actions, dtype=np.float64), np.asarray(origin, dtype=np.float64)
    chain = np.concatenate([origin[None, :7], actions[:, :7]], axis=0)
    relative = backward_framewise(pose_matrices(chain[:, :3], chain[:, 3:7]))
    return np.concatenate([relative, actions[:, 7:8]], axis=1).astype(np.float32)


def midtrain_absolute_actions(rows: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """``[T, 10]`` relative model rows (in robot units) composed from the ``[8]`` origin pose -> ``[T, 8]``
    absolute ``[x, y, z, qx, qy, qz, qw, gripper]`` rows."""
    rows, origin = np.asarray(rows, dtype=np.float64), np.asarray(origin, dtype=np.float64)
    poses = compose_backward_framewise(rows[:, :9], pose_matrices(origin[None, :3], origin[None, 3:7])[0])
    return np.concatenate([poses[:, :3, 3], matrix_to_quat(poses[:, :3, :3]), rows[:, 9:10]], axis=1).astype(np.float32)
