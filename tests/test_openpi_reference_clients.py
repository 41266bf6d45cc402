"""The clients written for NVIDIA's cosmos-framework DROID server, unchanged, against this server's openpi path.

NVIDIA serves its Cosmos3 DROID policies with cosmos-framework's ``action_policy_server_robolab`` (openpi's
``WebsocketPolicyServer`` underneath). Its replies carry ``action``; its clients authenticate with
``Authorization: Api-Key <key>``. Against one tokened server on the tiny ``--variant base --droid``
checkpoint (NVIDIA's DROID profile: state-conditioned [32, 8] chunks, the gripper flipped both ways):

* the real openpi-client (``.venv-openpi``) with its ``api_key`` reads ``result["action"]``; a wrong key is
  refused at the handshake;
* a client written here the way strands-robots' ``Cosmos3Policy`` speaks (read from its public source,
  not copied): its own msgpack-numpy packer, ``Api-Key``, RoboArena's three DROID cameras,
  ``observation/joint_position`` (1, 7) and ``observation/gripper_position`` (1, 1), ``response["action"]``,
  a text frame taken as the server's error;
* ``--openpi-decode-video`` adds the predicted ``video`` (uint8 [T, H, W, 3]) and its ``decode_ms``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack
import numpy as np
import openpi_fixtures
import pytest
from openpi_fixtures import openpi_client_missing
from server_fixtures import ServerThread, tiny_engine_loader
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from policy_server.foundation.auth import TokenSet
from policy_server.openpi_settings import OpenpiSettings

KEY = "robolab-key_5d1e"
DROID_CHUNK = [32, 8]


@pytest.fixture(scope="module")
def droid_server():
    """cosmos3-serve --tiny base --droid --auth-token KEY, the openpi settings left at their defaults."""
    with ServerThread(tiny_engine_loader("base", droid=True), auth_tokens=TokenSet.load(KEY)) as running:
        yield running


def run_openpi_client(uri: str, *options: str) -> dict:
    return openpi_fixtures.run_openpi_client(uri, "droid", *options, horizon=32)


def test_openpi_client_with_an_api_key_reads_action_from_a_tokened_droid_server(droid_server):
    if (missing := openpi_client_missing()) is not None:
        pytest.skip(missing)
    out = run_openpi_client(f"ws://127.0.0.1:{droid_server.port}", "--reference", "--api-key", KEY)
    assert out["numpy"].startswith("1.")  # openpi's own environment
    metadata = out["metadata"]
    assert (metadata["domain_name"], metadata["action_horizon"], metadata["action_dim"]) == ("droid_lerobot", 32, 8)
    for reply in out["replies"]:
        assert reply["shape"] == DROID_CHUNK and reply["dtype"] == "float32" and reply["finite"]
        assert {"action", "actions", "server_timing"} <= set(reply["keys"]) and "video" not in reply["keys"]
        assert reply["same_as_actions"]

    refused = run_openpi_client(f"ws://127.0.0.1:{droid_server.port}", "--reference", "--api-key", KEY + "x")
    assert "InvalidStatus" in refused["refused"] and "401" in refused["refused"], refused


# -- a strands-robots-style client, written here from its public description -----------------------------


def pack_array(obj):
    """strands-robots' (and openpi's) msgpack-numpy: arrays as bytes-keyed maps, with str keys everywhere else."""
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def unpack_array(obj):
    if b"__ndarray__" in obj:
        return np.frombuffer(obj[b"data"], dtype=np.dtype(obj[b"dtype"])).reshape(tuple(obj[b"shape"])).copy()
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


class StrandsStyleClient:
    """The transport strands-robots' Cosmos3Policy uses: ``ws://host:port`` (path ``/``), ``Authorization:
    Api-Key``, the metadata frame read and dropped, a text reply raised as the server's error."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.packer = msgpack.Packer(default=pack_array)
        self.reply_bytes = 0  # the size of the last reply (not strands-robots': for the outbox test below)

    def infer(self, observation: dict) -> dict:
        self.ws.send(self.packer.pack(observation))
        reply = self.ws.recv(timeout=300)
        self.reply_bytes = len(reply)
        if isinstance(reply, str):
            raise RuntimeError(f"Error in inference server:\n{reply}")
        return msgpack.unpackb(reply, object_hook=unpack_array)


@contextmanager
def strands_style_client(port: int, api_key: str | None) -> Iterator[StrandsStyleClient]:
    headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
    with connect(
        f"ws://127.0.0.1:{port}", compression=None, max_size=None, additional_headers=headers, proxy=None
    ) as ws:
        msgpack.unpackb(ws.recv(timeout=60), object_hook=unpack_array)
        yield StrandsStyleClient(ws)


def strands_observation(rng: np.random.Generator) -> dict:
    """What Cosmos3Policy(embodiment="droid", action_space="joint_pos") sends: RoboArena's three cameras."""
    return {
        "prompt": "put the marker in the cup",
        "observation/wrist_image_left": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8),
        "observation/exterior_image_1_left": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8),
        "observation/exterior_image_2_left": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8),
        "observation/joint_position": rng.normal(size=(1, 7)).astype(np.float32),
        "observation/gripper_position": rng.uniform(size=(1, 1)).astype(np.float32),
    }


def test_a_strands_robots_style_client_gets_droid_chunks(droid_server):
    with pytest.raises(InvalidStatus) as refused:
        with strands_style_client(droid_server.port, api_key="not-the-key"):
            pass
    assert refused.value.response.status_code == 401

    with strands_style_client(droid_server.port, api_key=KEY) as client:
        rng = np.random.default_rng(3)
        response = client.infer(strands_observation(rng))
        action = np.asarray(response["action"])
        assert list(action.shape) == DROID_CHUNK and action.dtype == np.float32 and np.isfinite(action).all()
        assert np.array_equal(action, response["actions"])

        # A bad observation (one exterior camera missing a channel) is a text frame the client raises; the
        # connection goes on and the next observation is served.
        bad = strands_observation(rng)
        bad["observation/exterior_image_2_left"] = np.zeros((180, 320), np.uint8)
        with pytest.raises(RuntimeError, match="invalid_image.*exterior_image_2_left"):
            client.infer(bad)
        assert list(np.asarray(client.infer(strands_observation(rng))["action"]).shape) == DROID_CHUNK


def test_decode_video_answers_the_predicted_video_with_its_decode_time():
    """``--openpi-decode-video``: each reply also carries the model's predicted frames (horizon + 1 of them,
    uint8, at the conditioning canvas) and ``server_timing["decode_ms"]``. The session's outbox holds two
    such replies (the one on the wire and the newest), past its default 1 MiB budget: a client with two
    observations in flight is not closed for a full outbox while it reads the first."""
    settings = OpenpiSettings(requested={"seed": 5}, decode_video=True)
    with ServerThread(tiny_engine_loader("base", droid=True), openpi=settings) as server:
        with strands_style_client(server.port, api_key=None) as client:
            response = client.infer(strands_observation(np.random.default_rng(4)))
            budgets = server.run(lambda: [s.outbox.max_bytes for s in server.server.context.sessions.values()])
    assert client.reply_bytes > 2**20 and budgets and all(b >= 2 * client.reply_bytes for b in budgets), budgets
    video = response["video"]
    assert video.dtype == np.uint8 and video.ndim == 4 and video.shape[0] == 33 and video.shape[-1] == 3
    assert response["server_timing"]["decode_ms"] > 0.0
    assert list(response["action"].shape) == DROID_CHUNK


def test_the_decode_video_flag_reaches_the_openpi_settings():
    """``cosmos3-serve --openpi-decode-video`` (the reference's ``--decode-video``) is off unless given."""
    from policy_server.assembly.cli import _openpi_settings, build_parser

    on = _openpi_settings(build_parser().parse_args(["--tiny", "base", "--openpi-decode-video"]))
    off = _openpi_settings(build_parser().parse_args(["--tiny", "base"]))
    assert on is not None and on.decode_video and off is not None and not off.decode_video
