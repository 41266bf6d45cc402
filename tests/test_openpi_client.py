"""openpi compatibility with the real ``openpi-client`` from PyPI, for the LIBERO, DROID and ALOHA key sets.

openpi-client pins numpy<2, so it lives in its own virtualenv (``make test`` builds ``.venv-openpi``)
and runs as a subprocess (tests/openpi_client_script.py) against a real server with the real tiny
model. Nothing of openpi is re-implemented here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import openpi_fixtures
import pytest
from openpi_fixtures import openpi_client_missing
from server_fixtures import tiny_engine_loader
from sidecar_fixtures import SidecarServer

from policy_server.openpi_settings import OpenpiSettings

HORIZON = 8
DOMAIN = "droid_lerobot"

if (missing := openpi_client_missing()) is not None:
    pytest.skip(missing, allow_module_level=True)


@pytest.fixture(scope="module")
def server():
    settings = OpenpiSettings(requested={"domain_name": DOMAIN, "action_horizon": HORIZON})
    with SidecarServer(tiny_engine_loader("distilled"), openpi=settings) as running:
        yield running


@pytest.fixture(scope="module")
def droid_server():
    """The tiny DROID-profile checkpoint (droid_lerobot: state-conditioned, [32, 8] chunks), a fixed seed."""
    with SidecarServer(
        tiny_engine_loader("distilled", droid=True), openpi=OpenpiSettings(requested={"seed": 0})
    ) as running:
        yield running


def run_openpi_client(uri: str, convention: str, *options: str, horizon: int = HORIZON) -> dict:
    return openpi_fixtures.run_openpi_client(uri, convention, *options, horizon=horizon)


@pytest.mark.parametrize("convention,path", [("libero", "/openpi"), ("droid", ""), ("aloha", "/openpi")])
def test_openpi_client_round_trips(server, convention, path):
    # This domain takes no state: the convention's state keys are left out (they would be refused).
    out = run_openpi_client(f"ws://127.0.0.1:{server.port}{path}", convention, "--no-state")
    assert out["numpy"].startswith("1.")  # really openpi's own environment

    metadata = out["metadata"]
    assert metadata["protocol"] == "openpi" and metadata["domain_name"] == DOMAIN
    assert metadata["action_horizon"] == HORIZON and metadata["action_dim"] == 10

    infer = out["infer"]
    assert infer["type"] == "ndarray" and infer["shape"] == [HORIZON, 10] and infer["dtype"] == "float32"
    assert infer["finite"] and "actions" in infer["keys"] and "server_timing" in infer["keys"]
    assert "infer_ms" in infer["server_timing"]

    # The bad observation came back as openpi's text error naming the camera; the connection survived.
    assert out["error"] is not None and "Error in inference server" in out["error"]
    assert "invalid_image" in out["error"] and "[0, 1]" in out["error"]

    # openpi's ActionChunkBroker stepped through chunks: one action per call, one round trip per chunk.
    broker = out["broker"]
    assert broker["step_shapes"] == [[10]] * (HORIZON + 2)
    assert broker["inner_calls"] == 2


def test_openpi_client_droid_state_conditions_the_actions(droid_server):
    """openpi's DROID key set against NVIDIA's DROID profile: [32, 8] chunks that follow the joints it sends."""
    out = run_openpi_client(f"ws://127.0.0.1:{droid_server.port}/openpi", "droid", "--state-probe", horizon=32)
    metadata = out["metadata"]
    assert (metadata["domain_name"], metadata["action_dim"], metadata["action_horizon"]) == ("droid_lerobot", 8, 32)
    assert (metadata["state_dim"], metadata["use_state"], metadata["history_length"]) == (8, True, 1)
    assert out["infer"]["shape"] == [32, 8] and out["infer"]["finite"]
    assert out["broker"] == {"step_shapes": [[8]] * 34, "inner_calls": 2}

    probe = out["state_probe"]
    assert probe["shape"] == [32, 8]
    assert probe["repeat_max_abs"] == 0.0  # same joints, same seed: the same chunk
    assert probe["moved_max_abs"] > 1e-4, probe  # other joints: another chunk
    error = probe["short_error"]
    assert "invalid_field" in error and "(field: observation/joint_position)" in error and "state_dim 8" in error


STATE_KEYS = [
    "observation/joint_position",
    "observation/gripper_position",
    "observation/state",
    "state",
    "observation/eef_pos",
    "observation/eef_quat",
]


def unused_state_count(server) -> float:
    """``cosmos3_unused_state_observations{protocol="openpi"}`` from the sidecar's ``/metrics`` (0 if absent)."""
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith('cosmos3_unused_state_observations_total{protocol="openpi"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("convention", ["libero", "droid", "aloha"])
def test_openpi_examples_with_state_against_a_stateless_domain(server, convention):
    """openpi's example observations, state and all, unchanged: served, and the state's non-use is visible."""
    before = unused_state_count(server)
    out = run_openpi_client(f"ws://127.0.0.1:{server.port}/openpi", convention, "--example")
    metadata = out["metadata"]
    assert metadata["domain_name"] == DOMAIN and metadata["state_dim"] is None
    assert metadata["unused_state_keys"] == STATE_KEYS
    assert out["replies"] == [{"shape": [HORIZON, 10], "finite": True}] * 3
    assert unused_state_count(server) == before + 3


@pytest.mark.parametrize("convention", ["libero", "droid", "aloha"])
def test_openpi_examples_against_a_state_conditioned_domain(droid_server, convention):
    """The same examples against NVIDIA's DROID profile (state_dim 8): LIBERO's 8-wide state and DROID's
    joints + gripper condition the chunk; ALOHA's 14-wide state does not fit and is refused, naming it."""
    before = unused_state_count(droid_server)
    out = run_openpi_client(f"ws://127.0.0.1:{droid_server.port}/openpi", convention, "--example", horizon=32)
    assert out["metadata"]["state_dim"] == 8 and out["metadata"]["unused_state_keys"] == []
    if convention == "aloha":
        for reply in out["replies"]:
            assert "invalid_field" in reply["error"] and "(field: state)" in reply["error"] and "[14]" in reply["error"]
    else:
        assert out["replies"] == [{"shape": [32, 8], "finite": True}] * 3
    assert unused_state_count(droid_server) == before
