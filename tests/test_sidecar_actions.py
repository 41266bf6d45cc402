"""/v1/actions/generations and /v1/actions/metadata against a real server and the tiny model."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
from server_fixtures import DOMAIN
from sidecar_fixtures import ACTION_DIM, SidecarServer, engine_loader, error_of, png_b64, png_bytes, rgb

from policy_server.http.schemas import ActionArray, ActionUsage
from policy_server.videos.encoding import encode_mp4
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(120)

MSGPACK = "application/msgpack"


@pytest.fixture(scope="module")
def server():
    with SidecarServer(engine_loader()) as running:
        yield running


def _check_generation(body: dict, horizon: int = 16, mode: str = "policy") -> np.ndarray:
    assert body["object"] == "action.generation" and body["id"].startswith("actgen_")
    assert len(body["data"]) == 1
    action = body["data"][0]["action"]
    assert action["type"] == "continuous" and action["dtype"] == "float32"
    assert action["shape"] == [horizon, ACTION_DIM] and action["raw_action_dim"] == ACTION_DIM
    assert action["action_mode"] == mode and action["domain_name"] == DOMAIN and action["domain_id"] == 7
    usage = body["usage"]
    assert usage["num_steps"] == 4 and usage["batch_size"] >= 1
    assert 0 <= usage["queue_ms"] <= usage["total_ms"] and usage["model_ms"] > 0
    values = np.asarray(action["values"], dtype=np.float32)
    assert values.shape == (horizon, ACTION_DIM) and np.isfinite(values).all()
    return values


def test_json_base64_image_and_nested_lists_agree(server):
    image = rgb(64, seed=5)
    as_b64 = server.client.post(
        "/v1/actions/generations", json={"domain_name": DOMAIN, "image": png_b64(image), "seed": 3, "prompt": "pick"}
    )
    assert as_b64.status_code == 200, as_b64.text
    assert as_b64.headers["content-type"].startswith("application/json")
    first = _check_generation(as_b64.json())
    as_lists = server.client.post(
        "/v1/actions/generations", json={"domain_name": DOMAIN, "image": image.tolist(), "seed": 3, "prompt": "pick"}
    )
    assert as_lists.status_code == 200, as_lists.text
    np.testing.assert_allclose(_check_generation(as_lists.json()), first, atol=1e-5)  # same pixels, same seed


def test_the_answer_reports_each_field_of_its_schema_from_the_engines_chunk(server):
    response = server.client.post(
        "/v1/actions/generations", json={"domain_name": DOMAIN, "image": rgb(64, seed=5).tolist(), "seed": 11}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body["data"][0]["action"]) == set(ActionArray.model_fields)
    assert set(body["usage"]) == set(ActionUsage.model_fields)
    assert body["usage"]["seed"] == 11 and body["data"][0]["action"]["action_mode"] == "policy"


def test_msgpack_round_trip(server):
    image = rgb(64, seed=6)
    body = packb({"domain_name": DOMAIN, "image": image, "seed": 4, "action_horizon": 8})
    response = server.client.post("/v1/actions/generations", content=body, headers={"content-type": MSGPACK})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == MSGPACK
    decoded = unpackb(response.content)
    values = decoded["data"][0]["action"]["values"]
    assert isinstance(values, np.ndarray) and values.dtype == np.float32 and values.shape == (8, ACTION_DIM)
    _check_generation(decoded, horizon=8)
    # The same request asking for JSON gets the same actions as lists.
    as_json = server.client.post(
        "/v1/actions/generations", content=body, headers={"content-type": MSGPACK, "accept": "application/json"}
    )
    assert as_json.headers["content-type"].startswith("application/json")
    np.testing.assert_allclose(_check_generation(as_json.json(), horizon=8), values, atol=1e-6)
    # And a JSON request may ask for msgpack back.
    json_in = server.client.post(
        "/v1/actions/generations", json={"domain_name": DOMAIN, "image": png_b64(image)}, headers={"accept": MSGPACK}
    )
    assert json_in.headers["content-type"] == MSGPACK
    _check_generation(unpackb(json_in.content))


def test_multipart_image_and_video_uploads(server, tmp_path):
    image = server.client.post(
        "/v1/actions/generations",
        data={"domain_name": DOMAIN, "seed": "1"},
        files={"image": ("camera.jpg", png_bytes(rgb(64)), "image/png")},
    )
    assert image.status_code == 200, image.text
    _check_generation(image.json())

    clip = np.stack([rgb(64, seed=i) for i in range(9)])
    encoded = encode_mp4(clip, 8, tmp_path / "clip.mp4")
    video = server.client.post(
        "/v1/actions/generations",
        data={"domain_name": DOMAIN, "action_mode": "inverse_dynamics"},
        files={"video": ("clip.mp4", encoded.path.read_bytes(), "video/mp4")},
    )
    assert video.status_code == 200, video.text
    _check_generation(video.json(), horizon=8, mode="inverse_dynamics")

    frames = [png_b64(frame) for frame in clip]
    as_frames = server.client.post(
        "/v1/actions/generations", json={"domain_name": DOMAIN, "action_mode": "inverse_dynamics", "video": frames}
    )
    assert as_frames.status_code == 200, as_frames.text
    _check_generation(as_frames.json(), horizon=8, mode="inverse_dynamics")


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"action_mode": "forward_dynamics"}, "unsupported_mode", "action_mode"),
        ({"domain_name": "no_such_robot"}, "unknown_domain", "domain_name"),
        ({"image": None}, "missing_field", "image"),
        ({"image": None, "action_mode": "inverse_dynamics"}, "missing_field", "video"),
        ({"image": [[1, 2, 3]]}, "invalid_image", "image"),
        ({"image": [[[300, 0, 0]] * 40] * 40}, "invalid_image", "image"),
        ({"image": base64.b64encode(b"not an image").decode()}, "invalid_image", "image"),
        ({"action_horizon": 6}, "invalid_field", "action_horizon"),
        ({"num_steps": 2}, "invalid_field", "num_steps"),
        ({"resolution_tier": 1}, "unsupported_tier", "resolution_tier"),
        ({"prefix_actions": [[0.0] * (ACTION_DIM - 1)]}, "invalid_field", "prefix_actions"),
        ({"seed": "many"}, "invalid_field", "seed"),
        ({"unknown_knob": 1}, "invalid_field", "unknown_knob"),
    ],
)
def test_bad_action_requests_are_typed_400s(server, body, code, field):
    request = {"domain_name": DOMAIN, "image": png_b64(rgb(64)), **body}
    response = server.client.post("/v1/actions/generations", json=request)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert (error["code"], error["field"]) == (code, field), error


def test_forward_dynamics_on_actions_names_the_video_endpoint(server):
    response = server.client.post(
        "/v1/actions/generations", json={"domain_name": DOMAIN, "action_mode": "forward_dynamics"}
    )
    assert response.status_code == 400 and "/v1/videos" in error_of(response)["message"]


def test_wrong_upload_type_is_415(server):
    response = server.client.post(
        "/v1/actions/generations",
        data={"domain_name": DOMAIN},
        files={"video": ("clip.mp4", b"\x00" * 100, "text/plain")},
    )
    assert response.status_code == 415 and error_of(response) == {
        "code": "unsupported_media_type",
        "field": "video",
        "message": error_of(response)["message"],
    }
    garbage_video = server.client.post(
        "/v1/actions/generations",
        data={"domain_name": DOMAIN, "action_mode": "inverse_dynamics"},
        files={"video": ("clip.mp4", b"\x00" * 100, "video/mp4")},
    )
    assert garbage_video.status_code == 400 and error_of(garbage_video)["code"] == "invalid_image"


def test_metadata_is_read_from_the_engine(server):
    response = server.client.get("/v1/actions/metadata")
    assert response.status_code == 200
    meta = response.json()
    described = server.server.context.description.as_json()  # the engine's own describe(), as loaded
    assert meta["object"] == "action.metadata"  # SGLang's name (docs/sglang.md)
    # The checkpoint by its folder's name: where it lies on the server's disk is not a client's business.
    assert meta["model"] == Path(described["model"]).name and meta["variant"] == "distilled" and meta["is_distilled"]
    assert meta["modes"] == described["modes"]
    assert meta["action_modes"] == ["policy", "inverse_dynamics"] and meta["video_modes"] == ["forward_dynamics"]
    assert meta["endpoints"]["forward_dynamics"] == "POST /v1/videos"
    assert meta["endpoints"]["policy"] == "POST /v1/actions/generations"
    assert set(meta["domains"]) == set(described["domains"])
    for name, info in described["domains"].items():
        assert meta["domains"][name]["raw_action_dim"] == info["raw_action_dim"]
        assert meta["domains"][name]["domain_id"] == info["domain_id"]
    assert meta["action_horizon"] == described["action_horizon"]
    assert meta["resolution_tiers"] == described["resolution_tiers"]
    assert described["defaults"].items() <= meta["defaults"].items()  # SGLang's defaults keys are added
    assert meta["distilled_sigmas"] == described["distilled_sigmas"]
    assert meta["limits"]["max_body_bytes"] > 0
    assert meta["capabilities"]["video_jobs"] and meta["capabilities"]["action_generations"]
