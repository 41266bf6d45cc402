"""The midtrain action space through a real server on 127.0.0.1: openpi's keys as NVIDIA's reference server
reads them (``observation/eef_pos``, ``observation/eef_quat`` xyzw, ``observation/gripper_position``) and the
native protocol with the pose as its state; absolute poses of width 8 come back from both doors, the same."""

from __future__ import annotations

import numpy as np
import pytest
from server_fixtures import ServerThread, rgb_image
from websockets.sync.client import connect

from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint
from policy_server.openpi_settings import OpenpiSettings
from robot_clients.wire_codec import packb, unpackb

DOMAIN = "droid_lerobot"
IMAGE = rgb_image(seed=5)
PROMPT = "put the marker in the cup"
POSITION = np.array([0.45, -0.1, 0.32], np.float32)
QUATERNION = np.array([0.2, -0.3, 0.5, 0.787401], np.float32) / np.float32(1.0000002)  # xyzw, about unit
GRIPPER = np.array([0.25], np.float32)
# openpi's keys for one step; the camera is `observation/image`, the image the native session sends too.
OPENPI = {
    "observation/image": IMAGE,
    "observation/eef_pos": POSITION,
    "observation/eef_quat": QUATERNION,
    "observation/gripper_position": GRIPPER,
    "prompt": PROMPT,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "midtrain", "distilled", droid_midtrain=True)

    def load():
        from cosmos3_runtime.engine import Cosmos3Engine

        return Cosmos3Engine.load(path, device="cpu", dtype="float32")

    with ServerThread(load, openpi=OpenpiSettings(requested={"seed": 0, "resolution_tier": 256})) as running:
        yield running


def _openpi(server, *observations: dict) -> tuple[dict, list]:
    with connect(
        f"ws://127.0.0.1:{server.port}/openpi", compression=None, max_size=None, proxy=None, open_timeout=30
    ) as ws:
        metadata = unpackb(ws.recv(timeout=30))
        replies = []
        for obs in observations:
            ws.send(packb(obs))
            reply = ws.recv(timeout=120)
            replies.append(reply if isinstance(reply, str) else unpackb(reply))
        return metadata, replies


def _assert_poses(chunk: np.ndarray) -> None:
    assert chunk.shape == (32, 8) and chunk.dtype == np.float32 and np.isfinite(chunk).all()
    np.testing.assert_allclose(np.linalg.norm(chunk[:, 3:7], axis=1), 1.0, atol=1e-5)  # unit quaternions


def test_openpi_eef_keys_in_absolute_poses_out(server):
    moved = {**OPENPI, "observation/eef_pos": POSITION + 0.2}
    # [1, 3] / [1, 4] / [1] rows are one step too, as the reference reads them.
    rows = {**OPENPI, "observation/eef_pos": POSITION[None], "observation/eef_quat": QUATERNION[None]}
    metadata, (a, again, b, c) = _openpi(server, OPENPI, OPENPI, moved, rows)
    assert (metadata["domain_name"], metadata["action_dim"], metadata["state_dim"]) == (DOMAIN, 8, 8)
    _assert_poses(a["actions"])
    np.testing.assert_array_equal(a["actions"], again["actions"])  # a fixed seed: the same chunk
    assert np.abs(a["actions"] - b["actions"]).max() > 1e-3  # the pose conditions the chunk
    np.testing.assert_array_equal(a["actions"], c["actions"][:32])


def test_openpi_and_native_serve_the_same_chunk_for_the_same_pose(server):
    _, (reply,) = _openpi(server, OPENPI)
    state = np.concatenate([POSITION, QUATERNION, GRIPPER])
    with connect(server.url, compression=None, max_size=None, proxy=None, open_timeout=30) as ws:
        metadata = unpackb(ws.recv(timeout=30))
        assert metadata["domains"][DOMAIN]["action_space"] == "midtrain"
        assert metadata["domains"][DOMAIN]["raw_action_dim"] == 8
        ws.send(packb({"type": "configure", "domain_name": DOMAIN, "seed": 0, "resolution_tier": 256}))
        assert unpackb(ws.recv(timeout=30))["type"] == "session"
        ws.send(packb({"type": "observation", "seq": 0, "image": IMAGE, "prompt": PROMPT, "state": state}))
        chunk = unpackb(ws.recv(timeout=120))
        assert chunk["type"] == "action_chunk", chunk
        _assert_poses(chunk["actions"])
        np.testing.assert_array_equal(chunk["actions"], reply["actions"])
        ws.send(packb({"type": "observation", "seq": 1, "image": IMAGE, "state": np.zeros(8, np.float32)}))
        error = unpackb(ws.recv(timeout=120))
        assert (error["type"], error["code"], error["field"]) == ("error", "invalid_field", "state"), error
        assert "names no rotation" in error["message"]


@pytest.mark.parametrize(
    "change, code, field",
    [
        ({"observation/eef_quat": None}, "missing_field", "observation/eef_quat"),
        ({"observation/eef_quat": np.zeros(4, np.float32)}, "invalid_field", "observation/eef_quat"),
        ({"observation/eef_pos": np.zeros(4, np.float32)}, "invalid_field", "observation/eef_pos"),
        ({"observation/gripper_position": np.zeros(2, np.float32)}, "invalid_field", "observation/eef_quat"),
    ],
)
def test_openpi_bad_pose_keys_are_refused_by_name(server, change, code, field):
    obs = {key: value for key, value in {**OPENPI, **change}.items() if value is not None}
    _, (reply,) = _openpi(server, obs)
    assert isinstance(reply, str) and reply.startswith(f"{code}:") and f"(field: {field})" in reply, reply


def test_openpi_joint_keys_sent_along_are_not_used(server):
    """A client that sends every reading it has (joints too) gets the chunk of its pose, as from the reference."""
    _, (plain, along) = _openpi(server, OPENPI, {**OPENPI, "observation/joint_position": np.zeros(7, np.float32)})
    np.testing.assert_array_equal(plain["actions"], along["actions"])
