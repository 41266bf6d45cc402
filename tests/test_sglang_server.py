"""SGLang's own Cosmos3 requests, replayed unchanged against a real server on the tiny checkpoint.

``tests/sglang_requests/`` records the request bodies of SGLang's Cosmos3 tests and docs; here each goes
over the wire, as JSON, as msgpack (SGLang's ``pack_msgpack`` dialect) and as SGLang's multipart form,
to ``POST /v1/actions/generations``, ``POST /v1/videos``, ``GET /v1/actions/metadata`` and the lock-step
mode of ``WS /v1/actions/realtime``, and its answer is read the way SGLang's clients read it. One server
serves the whole module.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sglang_fixtures import case, load_cases, materialize, sglang_packb, sglang_unpackb
from sidecar_fixtures import SidecarServer, actions, engine_loader, error_of, png_b64, png_bytes, rgb, wait_for_job

from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(180)

MSGPACK = "application/msgpack"
GENERATIONS = "/v1/actions/generations"
# The recorded requests this server runs (as SGLang does), and those it refuses by design, with the code.
RUNS = ("policy_tensor_image", "batched_policy_tensor_prompts", "batched_policy_scalar_prompt", "single_item_batch")
REFUSED = {
    "batched_policy_three_prompts": ("invalid_field", "input.prompt"),
    "inverse_dynamics_video_path": ("invalid_image", "input.observation.video"),
    "inverse_dynamics_prompt_batch": ("invalid_field", "input.prompt"),
    "forward_dynamics_on_actions": ("unsupported_mode", "parameters.action_mode"),
}
# The tiny checkpoint runs 4 steps (distilled); SGLang's recorded 30 would be refused by our schedule
# check, the same as for our own requests. Its 8×8 images run (snapped up to the model's smallest side).


def _runnable(body: dict) -> dict:
    parameters = {k: v for k, v in body.get("parameters", {}).items() if k != "num_inference_steps"}
    return {**body, "parameters": parameters}  # the distilled schedule is fixed


@pytest.fixture(scope="module")
def server():
    with SidecarServer(engine_loader()) as running:
        yield running


def _check_envelope(body: dict, items: int, *, request_id: str | None = None, numpy: bool = False) -> None:
    """What SGLang's clients read from an ``action.generation`` reply."""
    assert body["object"] == "action.generation"
    assert body["id"] == request_id if request_id else body["id"].startswith("actgen_")
    assert isinstance(body["created"], int) and body["model"]
    assert [d["index"] for d in body["data"]] == list(range(items))
    assert body["usage"]["batch_size"] == items
    for d in body["data"]:
        action = d["action"]
        assert action["type"] == "continuous" and action["dtype"] == "float32"
        values = action["values"]
        assert isinstance(values, np.ndarray) if numpy else isinstance(values, list)
        values = np.asarray(values, dtype=np.float32)
        assert list(values.shape) == action["shape"] == [body["usage"]["action_horizon"], body["usage"]["action_dim"]]
        assert action["raw_action_dim"] == body["usage"]["action_dim"] and np.isfinite(values).all()
        assert isinstance(action["domain_id"], int) and action["action_mode"] == "policy"


@pytest.mark.parametrize("name", RUNS)
def test_sglangs_recorded_requests_run_over_json_and_msgpack(server, name):
    recorded = case(name)
    body = _runnable(materialize(recorded["body"]))
    items = len(recorded["sglang_expects"].get("prompts", [None]))
    as_msgpack = server.client.post(GENERATIONS, content=sglang_packb(body), headers={"content-type": MSGPACK})
    assert as_msgpack.status_code == 200, as_msgpack.text
    assert as_msgpack.headers["content-type"] == MSGPACK
    reply = sglang_unpackb(as_msgpack.content)  # as SGLang's clients decode it
    _check_envelope(reply, items, request_id=body.get("request_id"), numpy=True)
    if "prompts" in recorded["sglang_expects"]:
        assert [d["input_index"] for d in reply["data"]] == list(range(items))
    if "$ndarray" not in json.dumps(recorded["body"]):  # JSON bodies: the recorded ones without arrays
        as_json = server.client.post(GENERATIONS, json=body)
        assert as_json.status_code == 200, as_json.text
        _check_envelope(as_json.json(), items, request_id=body.get("request_id"))


def test_the_tensor_policy_request_keeps_sglangs_parameters(server):
    body = _runnable(case("policy_tensor_image")["body"])
    reply = server.client.post(GENERATIONS, json=body).json()
    action = reply["data"][0]["action"]
    assert action["domain_name"] == "droid_lerobot" and action["seed"] == 7
    assert reply["usage"]["action_horizon"] == 16 and reply["usage"]["denoise_steps"] == 4
    again = server.client.post(GENERATIONS, json=body).json()  # same seed, same actions
    np.testing.assert_allclose(again["data"][0]["action"]["values"], action["values"], atol=1e-5)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_sglangs_recorded_refusals_are_typed_errors(server, name):
    body = materialize(case(name)["body"])
    response = server.client.post(GENERATIONS, content=sglang_packb(body), headers={"content-type": MSGPACK})
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert (error["code"], error["field"]) == REFUSED[name]


def test_the_batch_limit_is_the_servers(server):
    body = materialize(case("batched_policy_over_server_limit")["body"])
    body["input"]["input_reference"] = np.zeros((5, 8, 8, 3), np.uint8)  # the server runs batches of 4
    response = server.client.post(GENERATIONS, content=sglang_packb(body), headers={"content-type": MSGPACK})
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_field"


def test_raw_response_and_output_formats(server):
    body = _runnable(case("policy_tensor_image")["body"])
    body["runtime"] = {"response_format": "raw"}
    raw = server.client.post(GENERATIONS, json=body).json()
    assert raw["request_id"] == "cosmos-action-1" and raw["seeds"] == [7]
    assert np.asarray(raw["actions"]).shape == (16, raw["raw_action_dim"])
    body["runtime"] = {"output_format": "list", "return_timing": True}
    listed = server.client.post(GENERATIONS, content=packb(body), headers={"content-type": MSGPACK})
    reply = unpackb(listed.content)
    assert isinstance(reply["data"][0]["action"]["values"], list)
    assert reply["timings"]["total_ms"] >= reply["timings"]["model_ms"] > 0
    as_json = server.client.post(
        GENERATIONS, content=packb(body), headers={"content-type": MSGPACK, "accept": "application/json"}
    )
    assert as_json.headers["content-type"].startswith("application/json")
    _check_envelope(as_json.json(), 1, request_id="cosmos-action-1")


def test_candidates_are_items_with_their_own_seeds(server):
    body = {
        "request_id": 5,
        "input": {"task": "pick", "observation": {"image": {"b64_json": png_b64(rgb(32))}}},
        "parameters": {"domain_name": "droid_lerobot", "candidate_count": 2, "seed": 11},
    }
    reply = server.client.post(GENERATIONS, json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()["data"]
    assert [(d["candidate_index"], d["action"]["seed"]) for d in data] == [(0, 11), (1, 12)]
    assert not np.allclose(data[0]["action"]["values"], data[1]["action"]["values"])


def test_sglangs_multipart_action_form(server):
    form = {
        "request_id": "form-1",
        "prompt": "pick up the block",
        "domain_name": "droid_lerobot",
        "action_horizon": "8",
        "extra_params": json.dumps({"seed": 3}),
    }
    response = server.client.post(
        GENERATIONS, data=form, files={"image_reference": ("frame.png", png_bytes(rgb(32)), "image/png")}
    )
    assert response.status_code == 200, response.text
    reply = response.json()
    _check_envelope(reply, 1, request_id="form-1")
    assert reply["usage"]["action_horizon"] == 8 and reply["data"][0]["action"]["seed"] == 3


def test_errors_name_the_clients_field(server):
    body = _runnable(case("policy_tensor_image")["body"])
    body["parameters"]["num_inference_steps"] = 30  # the distilled schedule is fixed
    error = error_of(server.client.post(GENERATIONS, json=body))
    assert error["field"] == "parameters.num_inference_steps"
    body["parameters"].pop("num_inference_steps")
    body["parameters"]["flow_shift"] = 3.0
    error = error_of(server.client.post(GENERATIONS, json=body))
    assert (error["code"], error["field"]) == ("invalid_field", "parameters.flow_shift")


def test_our_flat_form_is_unchanged(server):
    response = server.client.post(
        GENERATIONS, json={"domain_name": "droid_lerobot", "image": png_b64(rgb(32)), "seed": 3, "num_steps": 4}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["num_steps"] == 4 and body["data"][0]["action"]["domain_name"] == "droid_lerobot"


def _lookup(body: dict, key: str):
    value = body
    for part in key.split("."):
        value = value[part]
    return value


def test_metadata_carries_sglangs_keys_from_the_checkpoint(server):
    meta = server.client.get("/v1/actions/metadata").json()
    recorded = next(c for c in load_cases("action_metadata") if c["sglang_server"]["batching_max_size"] == 4)
    for key, expected in recorded["sglang_expects"].items():
        if key != "capabilities.openpi_websocket":  # SGLang's test server has none; ours does by default
            assert _lookup(meta, key) == expected, key
    assert meta["object"] == "action.metadata" and meta["capabilities"]["openpi_websocket"] is True
    assert meta["output"]["action_type"] == "continuous" and meta["output"]["dtype"] == "float32"
    assert meta["defaults"]["num_inference_steps"] == meta["defaults"]["num_steps"] == 4
    # our own keys keep their values next to SGLang's
    assert meta["capabilities"]["action_generations"] is True and "policy" in meta["action_modes"]


# -- /v1/videos -------------------------------------------------------------------------------------------


def test_an_sglang_video_job_runs_and_its_object_has_sglangs_fields(server):
    body = {
        "prompt": "push the block",
        "input_reference": png_b64(rgb(64)),
        "action": actions(8),
        "domain_id": 7,
        "raw_action_dim": 10,
        "num_inference_steps": 4,
        "num_frames": 9,
        "fps": 12,
        "seconds": 0.75,
        "action_view_point": "ego_view",
        "extra_body": {"seed": 3},
    }
    response = server.client.post("/v1/videos", json=body)
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["status"] == "queued" and job["url"] is None and job["seed"] == 3 and job["num_steps"] == 4
    done = wait_for_job(server.client, job["id"])
    assert (done["status"], done["progress"], done["error"]) == ("completed", 100, None)
    content = server.client.get(done["url"])
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"


def test_sglangs_video_form_and_its_errors(server):
    form = {
        "prompt": "push",
        "action": json.dumps(actions(8)),
        "num_inference_steps": "4",
        "extra_params": json.dumps({"seed": 5, "action_normalization": "quantile"}),
        "size": "",
    }
    response = server.client.post(
        "/v1/videos", data=form, files={"input_reference": ("f.png", png_bytes(rgb(64)), "image/png")}
    )
    assert response.status_code == 200, response.text
    assert response.json()["seed"] == 5
    # our checks, named as the client wrote the field
    error = error_of(
        server.client.post(
            "/v1/videos",
            json={**form, "action": actions(8), "num_inference_steps": 30, "input_reference": png_b64(rgb(64))},
        )
    )
    assert (error["code"], error["field"]) == ("invalid_field", "num_inference_steps")
    # our own name still works, as an alias
    ours = server.client.post(
        "/v1/videos", json={"action": actions(8), "input_reference": png_b64(rgb(64)), "num_steps": 4}
    )
    assert ours.status_code == 200, ours.text


@pytest.mark.parametrize("recorded", load_cases("video_requests"), ids=lambda c: c["name"])
def test_sglangs_recorded_video_requests_are_refused_by_name(server, recorded):
    body = recorded["body"]
    if recorded["encoding"] == "multipart":
        response = server.client.post("/v1/videos", files={k: (None, v) for k, v in body.items()})  # text parts
    else:
        response = server.client.post("/v1/videos", json=body)
    error = error_of(response)
    assert response.status_code == 400 and error["field"] in body, error


# -- WS /v1/actions/realtime, SGLang's lock-step mode --------------------------------------------------------


def _lockstep(server):
    from websockets.sync.client import connect

    return connect(f"ws://127.0.0.1:{server.port}/v1/actions/realtime", max_size=2**24, open_timeout=30)


def test_sglangs_realtime_client_is_served_lock_step(server):
    with _lockstep(server) as ws:
        meta = sglang_unpackb(ws.recv(timeout=30))
        # one metadata frame for both protocols: ours, with SGLang's keys merged in
        assert meta["type"] == "metadata" and meta["object"] == "action.metadata"
        assert meta["policy_family"] == "cosmos3" and meta["capabilities"]["realtime_websocket"] is True
        assert meta["capabilities"]["max_batch_size"] == 4 and meta["capabilities"]["streaming"] is True
        for name in RUNS:
            body = _runnable(materialize(case(name)["body"]))
            ws.send(sglang_packb(body))
            reply = sglang_unpackb(ws.recv(timeout=60))
            _check_envelope(
                reply,
                len(case(name)["sglang_expects"].get("prompts", [None])),
                request_id=body.get("request_id"),
                numpy=True,
            )
            timing = reply["server_timing"]
            assert timing["infer_ms"] > 0
            assert ("prev_total_ms" in timing) == (name != RUNS[0])


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_lockstep_errors_are_typed_and_the_connection_stays_open(server, name):
    with _lockstep(server) as ws:
        ws.recv(timeout=30)
        ws.send(sglang_packb(_runnable(materialize(case("single_item_batch")["body"]))))  # chooses the mode
        assert "data" in sglang_unpackb(ws.recv(timeout=60))
        ws.send(sglang_packb(materialize(case(name)["body"])))
        error = sglang_unpackb(ws.recv(timeout=30))
        assert set(error) == {"error"} and (error["error"]["code"], error["error"]["field"]) == REFUSED[name]
        assert "Traceback" not in error["error"]["message"]
        ws.send(b"\xc1 not msgpack")
        assert sglang_unpackb(ws.recv(timeout=30))["error"]["code"] == "bad_frame"
        ws.send(packb({"type": "configure"}))  # protocol v1 needs its own connection
        assert sglang_unpackb(ws.recv(timeout=30))["error"]["field"] == "type"
        ws.send(sglang_packb(_runnable(materialize(case("single_item_batch")["body"]))))  # still served
        assert sglang_unpackb(ws.recv(timeout=60))["usage"]["batch_size"] == 1


def test_a_first_frame_with_type_keeps_our_protocol(server):
    with _lockstep(server) as ws:
        assert unpackb(ws.recv(timeout=30))["type"] == "metadata"
        ws.send(packb({"type": "observation", "seq": 1, "image": rgb(32), "domain_name": "droid_lerobot"}))
        assert unpackb(ws.recv(timeout=60))["type"] == "action_chunk"
        ws.send(packb({"input": {"task": "pick"}}))  # not the first frame: no type is not a mode switch
        assert unpackb(ws.recv(timeout=30))["type"] == "error"
