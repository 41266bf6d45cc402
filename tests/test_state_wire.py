"""The robot's state on the wire: native ``observation.state``, the openpi conventions' state keys, HTTP's
and SGLang's ``state``, all checked against the domain's profile (``state_dim``, ``history_length``).

The parsers and the profile checks run in process against the description of the tiny DROID-profile
checkpoint (``cosmos3-tiny --droid``: droid_lerobot conditions on an 8-wide state, one row, gripper index
7 flipped; [32, 8] chunks at 15 fps). One live server (WebSocket, openpi endpoint, HTTP sidecar) on the
same checkpoint then shows, per protocol, that the chunks follow the joint state under a fixed seed, and
that a wrong or missing state gets its typed error while the session goes on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from server_fixtures import rgb_image, tiny_engine_loader
from sidecar_fixtures import SidecarServer, error_of, png_b64, png_bytes
from websockets.sync.client import connect

from cosmos3_runtime.description import ModelDescription
from policy_server.api_errors import ApiError
from policy_server.http.requests import action_request
from policy_server.openpi_settings import CameraMapping, OpenpiSettings
from policy_server.session_config import SessionConfig, observation_request
from policy_server.sessions.openpi_observation import parse_openpi_observation
from robot_clients import PolicyClient, ServerError
from robot_clients.chunker import ActionChunker, ChunkerConfig, ChunkRecord, RemoteChunkPolicy
from robot_clients.client_frames import ObservationFrame, parse_client_frame
from robot_clients.protocol import ErrorCode, FrameLimits, ProtocolError
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(300)

DROID, OTHER = "droid_lerobot", "bridge_orig_lerobot"  # OTHER's profile takes no state
LIMITS = FrameLimits(min_image_side=8, max_image_side=4096, max_clip_frames=65)
IMAGE = rgb_image(64, seed=1)
JOINTS = np.array([0.1, -0.4, 0.2, -1.9, 0.05, 1.6, 0.7], np.float32)  # a Franka's 7 joints, radians
STATE = np.append(JOINTS, np.float32(0.25))  # [joints..., gripper]: what droid_lerobot conditions on
MOVED = np.append(JOINTS + 0.5, np.float32(0.25))


@pytest.fixture(scope="module")
def droid(tiny_engine) -> ModelDescription:
    return tiny_engine("distilled", droid=True).describe()


def refused(fn, *args, **kwargs):
    with pytest.raises((ProtocolError, ApiError)) as info:
        fn(*args, **kwargs)
    return info.value


# -- the native observation's `state` ------------------------------------------------------------------


def observation(**fields) -> dict:
    return {"type": "observation", "seq": 3, "image": IMAGE, **fields}


@pytest.mark.parametrize(
    "value, shape",
    [
        ([0.5] * 8, (8,)),
        (np.zeros((1, 8), np.float64), (1, 8)),
        (np.arange(8, dtype=np.int32), (8,)),
        ([[0.5] * 8, [0.1] * 8], (2, 8)),
    ],
)
def test_state_is_parsed_to_float32_rows(value, shape):
    frame = parse_client_frame(observation(state=value), LIMITS)
    assert frame.state.dtype == np.float32 and frame.state.shape == shape


@pytest.mark.parametrize(
    "value",
    [
        "joints",
        ["a"] * 8,
        [[1.0, 2.0], [3.0]],
        np.zeros((1, 1, 8)),
        np.zeros(0, np.float32),
        np.full(8, np.nan),
        np.full(8, 1e39),
        np.zeros(5000, np.float32),
        np.array(["x"] * 8),
        {"joints": [0.0] * 7},
    ],
)
def test_a_malformed_state_is_invalid_field(value):
    error = refused(parse_client_frame, observation(state=value), LIMITS)
    assert (error.code, error.field, error.seq) == (ErrorCode.INVALID_FIELD, "state", 3), error.message


def test_the_state_is_checked_against_the_domains_profile(droid):
    def request(state, domain=DROID, seq=5):
        frame = ObservationFrame(seq=seq, image=IMAGE, state=state, overrides={"domain_name": domain})
        return observation_request(None, frame, droid)

    np.testing.assert_array_equal(request(STATE).state, STATE)
    assert request(STATE[None]).state.shape == (1, 8)  # history_length 1: one row, either way
    for state, domain, code, words in (
        (None, DROID, ErrorCode.MISSING_FIELD, "conditions on the robot's state"),
        (STATE[:7], DROID, ErrorCode.INVALID_FIELD, "state_dim 8"),
        (np.stack([STATE, STATE]), DROID, ErrorCode.INVALID_FIELD, "history_length 1"),
        (STATE, OTHER, ErrorCode.INVALID_FIELD, "does not condition on the robot's state"),
    ):
        error = refused(request, state, domain)
        assert (error.code, error.field, error.seq) == (code, "state", 5) and words in error.message, error.message
    assert request(None, OTHER).state is None


def test_unset_settings_take_the_domains_own_defaults(droid):
    resolved = SessionConfig(domain_name=DROID).resolved(droid)
    assert {k: resolved[k] for k in ("fps", "resolution_tier", "action_horizon", "view_point")} == {
        "fps": 15.0,
        "resolution_tier": 480,
        "action_horizon": 32,
        "view_point": "concat_view",
    }
    assert (resolved["state_dim"], resolved["use_state"], resolved["history_length"]) == (8, True, 1)
    other = SessionConfig(domain_name=OTHER).resolved(droid)
    assert (other["fps"], other["resolution_tier"], other["state_dim"]) == (24.0, 256, None)
    frame = ObservationFrame(seq=0, image=IMAGE, state=STATE, overrides={"domain_name": DROID})
    assert observation_request(None, frame, droid).fps == 15.0
    assert observation_request(SessionConfig(domain_name=DROID, fps=10.0), frame, droid).fps == 10.0


# -- openpi's state keys -------------------------------------------------------------------------------


def droid_observation(**changes) -> dict:
    obs = {
        "observation/exterior_image_1_left": IMAGE,
        "observation/wrist_image_left": IMAGE,
        "observation/joint_position": JOINTS.astype(np.float64),
        "observation/gripper_position": np.array([0.25]),
        "prompt": "put the marker in the cup",
    }
    obs.update(changes)
    return {key: value for key, value in obs.items() if value is not None}


def openpi(obs: dict, description: ModelDescription, domain: str = DROID, strict_state: bool = False):
    return parse_openpi_observation(
        obs, CameraMapping(), "concat_view", LIMITS, domain=description.domain(domain), strict_state=strict_state
    )


def test_droids_joints_and_gripper_become_one_state_row(droid):
    # As the robot reports it: the engine flips the gripper (the profile's index 7), both ways.
    np.testing.assert_array_equal(openpi(droid_observation(), droid).state, STATE)
    np.testing.assert_array_equal(
        openpi(droid_observation(**{"observation/gripper_position": 0.25}), droid).state, STATE
    )
    rows = openpi(
        droid_observation(
            **{"observation/joint_position": JOINTS[None], "observation/gripper_position": np.array([[0.25]])}
        ),
        droid,
    )
    np.testing.assert_array_equal(rows.state, STATE[None])


@pytest.mark.parametrize(
    "changes, code, key",
    [
        ({"observation/joint_position": JOINTS[:6]}, ErrorCode.INVALID_FIELD, "observation/joint_position"),
        ({"observation/joint_position": np.full(7, np.nan)}, ErrorCode.INVALID_FIELD, "observation/joint_position"),
        (
            {"observation/joint_position": np.zeros((2, 7)), "observation/gripper_position": np.zeros(2)},
            ErrorCode.INVALID_FIELD,
            "observation/joint_position",
        ),  # two rows; the profile takes one
        ({"observation/gripper_position": np.zeros(2)}, ErrorCode.INVALID_FIELD, "observation/gripper_position"),
        ({"observation/gripper_position": None}, ErrorCode.MISSING_FIELD, "observation/gripper_position"),
        (
            {"observation/joint_position": None, "observation/gripper_position": None},
            ErrorCode.MISSING_FIELD,
            "observation/joint_position",
        ),
        ({"observation/state": np.zeros(8)}, ErrorCode.INVALID_FIELD, "observation/state"),  # two conventions' states
    ],
)
def test_a_wrong_droid_state_names_its_openpi_key(droid, changes, code, key):
    error = refused(openpi, droid_observation(**changes), droid)
    assert (error.code, error.field) == (code, key), error.message


def test_libero_and_aloha_states_are_honoured_or_refused(droid):
    libero = {"observation/image": IMAGE, "observation/wrist_image": IMAGE, "observation/state": STATE}
    np.testing.assert_array_equal(openpi(libero, droid).state, STATE)
    # A domain without state: refused under --openpi-strict-state, else accepted and named as unused.
    error = refused(openpi, libero, droid, OTHER, strict_state=True)
    assert (error.code, error.field) == (ErrorCode.INVALID_FIELD, "observation/state")
    unused = openpi(libero, droid, OTHER)
    assert unused.state is None and unused.unused_state == ("observation/state",)
    droid_unused = openpi(droid_observation(), droid, OTHER)
    assert droid_unused.state is None
    assert droid_unused.unused_state == ("observation/joint_position", "observation/gripper_position")
    # A malformed state stays a typed error, used or not.
    error = refused(openpi, {**libero, "observation/state": np.full(8, np.nan)}, droid, OTHER)
    assert (error.code, error.field) == (ErrorCode.INVALID_FIELD, "observation/state")
    aloha = {"images": {"cam_high": IMAGE}, "state": np.zeros(14, np.float32)}
    error = refused(openpi, aloha, droid)
    assert (error.code, error.field) == (ErrorCode.INVALID_FIELD, "state") and "[14]" in error.message


# -- HTTP's `state` ------------------------------------------------------------------------------------------


def test_http_state_is_a_list_or_an_array_checked_like_the_websockets(droid):
    body = {"domain_name": DROID, "image": IMAGE}
    np.testing.assert_array_equal(action_request({**body, "state": STATE.tolist()}, droid).state, STATE)
    assert action_request({**body, "state": [STATE.tolist()]}, droid).state.shape == (1, 8)
    np.testing.assert_array_equal(action_request({**body, "state": STATE}, droid).state, STATE)
    for state, domain, code in (
        (STATE[:7].tolist(), DROID, "invalid_field"),
        (None, DROID, "missing_field"),
        ("joints", DROID, "invalid_field"),
        ([float("inf")] * 8, DROID, "invalid_field"),
        (STATE.tolist(), OTHER, "invalid_field"),
    ):
        error = refused(action_request, {**body, "domain_name": domain, "state": state}, droid)
        assert (error.code, error.field) == (code, "state"), error.message


# -- one live server: the native protocol, openpi and HTTP ----------------------------------------------------


@pytest.fixture(scope="module")
def server():
    with SidecarServer(
        tiny_engine_loader("distilled", droid=True), openpi=OpenpiSettings(requested={"seed": 0})
    ) as running:
        yield running


def test_a_native_droid_session_follows_the_joint_state(server):
    with PolicyClient(server.url) as client:
        domains = client.metadata["domains"]
        assert {k: domains[DROID][k] for k in ("raw_action_dim", "state_dim", "use_state", "history_length")} == {
            "raw_action_dim": 8,
            "state_dim": 8,
            "use_state": True,
            "history_length": 1,
        }
        assert domains[OTHER]["state_dim"] is None
        client.configure(domain_name=DROID, seed=0)
        first = client.infer(IMAGE, state=STATE, timeout=120)
        moved = client.infer(IMAGE, state=MOVED.tolist(), timeout=120)  # a list travels as float32
        again = client.infer({"image": IMAGE, "state": STATE}, timeout=120)
    assert first.actions.shape == (32, 8) and (first.fps, first.resolution_tier) == (15.0, 480)
    np.testing.assert_array_equal(again.actions, first.actions)  # same state, same seed: the same chunk
    assert np.abs(moved.actions - first.actions).max() > 1e-4


def test_a_wrong_or_missing_state_is_a_typed_error_and_the_session_goes_on(server):
    with PolicyClient(server.url) as client:
        client.configure(domain_name=DROID, seed=0)
        for state, code in (
            (None, "missing_field"),
            (STATE[:7], "invalid_field"),
            (np.full(8, np.nan), "invalid_field"),
            (np.stack([STATE, STATE]), "invalid_field"),
        ):
            with pytest.raises(ServerError) as info:
                client.infer(IMAGE, state=state, timeout=60)
            assert (info.value.code, info.value.field) == (code, "state"), info.value
        with pytest.raises(ServerError) as info:
            client.infer(IMAGE, state=STATE, domain_name=OTHER, timeout=60)
        assert (info.value.code, info.value.field) == ("invalid_field", "state")
        assert client.infer(IMAGE, state=STATE, timeout=120).actions.shape == (32, 8)


def test_an_openpi_droid_session_follows_the_joint_state(server):
    with connect(
        f"ws://127.0.0.1:{server.port}/openpi", compression=None, max_size=None, proxy=None, open_timeout=30
    ) as ws:
        metadata = unpackb(ws.recv(timeout=30))
        assert (metadata["domain_name"], metadata["action_dim"], metadata["state_dim"]) == (DROID, 8, 8)

        def infer(obs: dict):
            ws.send(packb(obs))
            return ws.recv(timeout=120)

        first = unpackb(infer(droid_observation()))["actions"]
        reply = infer(droid_observation(**{"observation/joint_position": None}))
        assert reply.startswith("missing_field:") and "(field: observation/joint_position)" in reply, reply
        reply = infer(droid_observation(**{"observation/joint_position": JOINTS[:6]}))
        assert reply.startswith("invalid_field:") and "(field: observation/joint_position)" in reply, reply
        moved = unpackb(infer(droid_observation(**{"observation/joint_position": JOINTS + 0.5})))["actions"]
    assert first.shape == moved.shape == (32, 8)
    assert np.abs(moved - first).max() > 1e-4


def test_http_takes_the_state_and_advertises_it(server):
    domains = server.client.get("/v1/actions/metadata").json()["domains"]
    assert (domains[DROID]["state_dim"], domains[DROID]["use_state"], domains[DROID]["history_length"]) == (8, True, 1)
    assert domains[OTHER]["state_dim"] is None

    def post(**fields):
        return server.client.post(
            "/v1/actions/generations", json={"domain_name": DROID, "image": png_b64(IMAGE), "seed": 0, **fields}
        )

    first, moved = (post(state=state.tolist()) for state in (STATE, MOVED))
    assert first.status_code == moved.status_code == 200, first.text
    a, b = (np.asarray(r.json()["data"][0]["action"]["values"], np.float32) for r in (first, moved))
    assert a.shape == (32, 8) and np.abs(a - b).max() > 1e-4
    form = server.client.post(
        "/v1/actions/generations",
        files={"image": ("i.png", png_bytes(IMAGE), "image/png")},
        data={"domain_name": DROID, "seed": "0", "state": json.dumps(STATE.tolist())},
    )
    assert form.status_code == 200, form.text  # a form's `state` is JSON text
    np.testing.assert_array_equal(np.asarray(form.json()["data"][0]["action"]["values"], np.float32), a)
    for fields, code in (({"state": STATE[:7].tolist()}, "invalid_field"), ({}, "missing_field")):
        response = post(**fields)
        assert response.status_code == 400 and (error_of(response)["code"], error_of(response)["field"]) == (
            code,
            "state",
        ), response.text
    assert post(state=STATE.tolist()).json()["data"][0]["action"]["shape"] == [32, 8]  # and it goes on


# -- the chunker through RemoteChunkPolicy -------------------------------------------------------------------


def test_the_chunker_drives_a_state_conditioned_domain_with_named_cameras(server):
    """RemoteChunkPolicy forwards the observation's state, its named cameras and its own settings: under a
    fixed seed the chunks the chunker executes follow the state and the chosen camera, and a state reported
    for a domain that takes none stays on the robot."""
    wrist = rgb_image(64, seed=7)
    records: list[ChunkRecord] = []

    def first_chunk(chunker: ActionChunker, observation: dict) -> np.ndarray:
        chunker.reset()
        records.clear()
        chunker.next_action(observation)  # waits for the episode's first chunk
        assert len(records) == 1
        return records[0].actions

    with PolicyClient(server.url) as client:
        assert "wrist_view" in client.metadata["view_points"]
        client.configure(domain_name=DROID, seed=0)
        config = ChunkerConfig(strategy="open_loop", control_hz=15.0, startup_timeout_s=120.0)
        with ActionChunker(RemoteChunkPolicy(client, timeout=120.0), config, on_chunk=records.append) as chunker:
            cameras = {"exterior": IMAGE, "wrist": wrist}
            first = first_chunk(chunker, {"images": cameras, "state": STATE, "step": 0})
            again = first_chunk(chunker, {"images": cameras, "state": STATE.tolist()})
            moved = first_chunk(chunker, {"images": cameras, "state": MOVED})
            # The same state through the wrist camera, chosen by the observation's own view_point.
            wrist_view = first_chunk(chunker, {"images": cameras, "state": STATE, "view_point": "wrist_view"})
            wrist_alone = first_chunk(chunker, {"image": wrist, "state": STATE, "view_point": "wrist_view"})
            # OTHER conditions on no state: the state stays on the robot, and the chunk still comes.
            other = first_chunk(chunker, {"image": IMAGE, "state": STATE, "domain_name": OTHER})
            stats = chunker.stats
    assert first.shape == (32, 8) and stats.errors == 0 and stats.dropped == 0
    np.testing.assert_array_equal(again, first)  # same state, same camera, same seed: the same chunk
    assert np.abs(moved - first).max() > 1e-4
    np.testing.assert_array_equal(wrist_view, wrist_alone)
    assert np.abs(wrist_view - first).max() > 1e-4
    assert other.ndim == 2 and len(other) >= 1
