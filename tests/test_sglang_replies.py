"""SGLang's answers: the reply envelope (checked against what SGLang's own tests assert), the metadata keys,
and the lock-step WebSocket mode, plus one request run through the real tiny engine end to end."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from sglang_fixtures import chunk, distilled, load_cases, sglang_packb, sglang_unpackb  # noqa: F401
from sidecar_fixtures import png_b64, rgb

from cosmos3_runtime.description import TierCanvas
from policy_server.foundation.api_errors import ApiError
from policy_server.http.requests import action_request
from policy_server.metadata import public_model_name
from policy_server.sglang.actions import (
    ActionCall,
    ActionItem,
    build_reply,
    merge_metadata,
    parse_action_envelope,
    sglang_metadata,
)
from policy_server.sglang.lockstep_session import NATIVE, SGLANG, LockstepSession, connection_mode
from robot_clients.wire_codec import packb, unpackb


def _call(count: int, **options) -> ActionCall:
    items = tuple(ActionItem(input_index=i) for i in range(count))
    return ActionCall(options.pop("request_id", None), items, **options)


def _recorded_chunks(output: dict) -> list:
    kind, shape = next(iter(output["actions"].items()))
    actions = np.zeros(shape, np.float32) if kind == "zeros" else np.arange(np.prod(shape), dtype=np.float32)
    actions = actions.reshape(shape)
    batch = actions if actions.ndim == 3 else actions[None]
    return [
        chunk(
            a,
            domain_id=output.get("domain_id", 8),
            mode=output.get("action_mode", "policy"),
            num_steps=output.get("num_inference_steps", 4),
        )
        for a in batch
    ]


def _lookup(reply: dict, key: str):
    """``data[1].action.shape`` -> the value; ``len(data)`` -> its length."""
    if key.startswith("len(") and key.endswith(")"):
        return len(_lookup(reply, key[4:-1]))
    value = reply
    for part in key.split("."):
        name, _, index = part.partition("[")
        value = value[name]
        if index:
            value = value[int(index[:-1])]
    return value


@pytest.mark.parametrize(
    "recorded", [c for c in load_cases("action_replies") if c["name"] != "empty"], ids=lambda c: c["name"]
)
def test_reply_envelope_satisfies_sglangs_own_assertions(recorded):
    chunks = _recorded_chunks(recorded["output"])
    reply = build_reply(_call(len(chunks), request_id=recorded["output"]["request_id"]), chunks, model="m")
    for key, expected in recorded["sglang_expects"].items():
        assert _lookup(reply, key) == expected, key
    assert reply["id"] == recorded["output"]["request_id"]
    assert reply["object"] == "action.generation" and reply["model"] == "m" and isinstance(reply["created"], int)
    for index, item in enumerate(reply["data"]):
        assert (item["index"], item["input_index"], item["candidate_index"]) == (index, index, 0)
        assert {"type", "dtype", "shape", "values", "action_mode", "domain_id", "raw_action_dim"} <= set(item["action"])
        assert item["action"]["type"] == "continuous" and item["action"]["dtype"] == "float32"
    assert set(reply["usage"]) == {"batch_size", "action_horizon", "action_dim", "denoise_steps", "prefix_cache_hit"}
    json.dumps(reply)  # list values: plain JSON


def test_reply_refuses_an_empty_batch_as_sglang_does():
    (recorded,) = [c for c in load_cases("action_replies") if c["name"] == "empty"]
    assert recorded["output"]["actions"] == {"zeros": [0, 4, 3]}  # no output: no reply, there as here
    with pytest.raises(ValueError):
        build_reply(_call(0), [], model="m")
    with pytest.raises(ValueError):
        build_reply(_call(2), [chunk(np.zeros((4, 3)))], model="m")


def test_numpy_output_keeps_float32_arrays_that_sglang_clients_decode():
    actions = np.arange(12, dtype=np.float32).reshape(4, 3)
    reply = build_reply(_call(1, output_format="numpy"), [chunk(actions)], model="m", created=5)
    values = reply["data"][0]["action"]["values"]
    assert isinstance(values, np.ndarray) and values.dtype == np.float32
    decoded = sglang_unpackb(packb(reply))  # the way SGLang's client decodes it
    np.testing.assert_array_equal(decoded["data"][0]["action"]["values"], actions)
    assert decoded["created"] == 5 and decoded["id"].startswith("actgen_")


def test_raw_response_format():
    chunks = [chunk(np.full((4, 3), i), seed=i) for i in range(2)]
    raw = build_reply(_call(2, request_id="r", response_format="raw"), chunks, model="m")
    assert raw["request_id"] == "r" and raw["seeds"] == [0, 1]
    assert np.asarray(raw["actions"]).shape == (2, 4, 3)
    assert (raw["action_mode"], raw["domain_id"], raw["raw_action_dim"]) == ("policy", 8, 3)
    assert raw["parameters"] == {"num_inference_steps": 4}
    single = build_reply(_call(1, response_format="raw", output_format="numpy"), chunks[:1], model="m")
    assert single["actions"].shape == (4, 3)


def test_timings_warnings_and_prefix_cache():
    call = ActionCall(None, (ActionItem(),), return_timing=True, unused=("input.state",))
    reply = build_reply(
        call, [chunk(np.zeros((4, 3)))], model="m", prefix_cache_hit=True, timings={"queue_ms": 1.0, "model_ms": 2.0}
    )
    assert reply["timings"] == {"queue_ms": 1.0, "model_ms": 2.0}
    assert reply["usage"]["prefix_cache_hit"] is True
    assert reply["warnings"][0]["field"] == "input.state"
    plain = build_reply(_call(1), [chunk(np.zeros((4, 3)))], model="m", timings={"queue_ms": 1.0})
    assert "timings" not in plain and "warnings" not in plain and plain["usage"]["prefix_cache_hit"] is None


def test_an_sglang_request_runs_through_the_real_engine_end_to_end(tiny_engine, distilled):
    engine = tiny_engine("distilled")
    images = [rgb(32, seed) for seed in range(2)]
    body = {
        "request_id": "e2e",
        "input": {
            "task": ["pick", "place"],
            "observation": {"image": [{"b64_json": png_b64(image)} for image in images]},
        },
        "parameters": {"action_mode": "policy", "domain_id": 7, "raw_action_dim": 10, "num_frames": 9, "seed": 3},
    }
    call = parse_action_envelope(unpackb(sglang_packb(body)), distilled, max_items=4, msgpack_reply=True)
    chunks = engine.predict_actions_batch([action_request(item.fields, distilled) for item in call.items])
    reply = sglang_unpackb(packb(build_reply(call, chunks, model=distilled.model)))
    assert reply["id"] == "e2e" and reply["model"] == distilled.model
    assert [item["input_index"] for item in reply["data"]] == [0, 1]
    for item in reply["data"]:
        action = item["action"]
        assert action["shape"] == [8, 10] and action["values"].shape == (8, 10)
        assert np.isfinite(action["values"]).all()
        assert (action["domain_name"], action["domain_id"], action["raw_action_dim"]) == ("bridge_orig_lerobot", 7, 10)
        assert action["seed"] == 3
    assert reply["usage"] == {
        "batch_size": 2,
        "action_horizon": 8,
        "action_dim": 10,
        "denoise_steps": 4,
        "prefix_cache_hit": None,
    }


# -- metadata --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recorded", load_cases("action_metadata"), ids=lambda c: str(c["sglang_server"]))
def test_metadata_satisfies_sglangs_own_assertions(distilled, recorded):
    metadata = sglang_metadata(
        distilled,
        max_batch_size=recorded["sglang_server"]["batching_max_size"],
        openpi_websocket=False,
        default_fps=24.0,
    )
    for key, expected in recorded["sglang_expects"].items():
        assert _lookup(metadata, key) == expected, key


def test_metadata_comes_from_the_checkpoint(distilled, tiny_engine):
    metadata = sglang_metadata(distilled, max_batch_size=4, openpi_websocket=True, default_fps=10.0)
    assert metadata["object"] == "action.metadata" and metadata["model"] == public_model_name(distilled.model)
    assert metadata["output"]["padded_action_dim"] == distilled.action_dim
    assert metadata["output"]["action_horizon"] == distilled.defaults.action_horizon
    assert metadata["output"]["action_dim"] is None  # the domains differ in width
    assert metadata["defaults"]["num_inference_steps"] == distilled.defaults.num_steps == 4
    assert metadata["defaults"]["fps"] == 10.0 and metadata["capabilities"]["openpi_websocket"] is True
    assert metadata["capabilities"]["action_modes"] == ["policy", "inverse_dynamics"]
    assert metadata["input"]["state_dim"] is None
    tiers = distilled.resolution_tiers
    sizes = dict.fromkeys(
        (w, h) for t in tiers for h, w in ((c.height, c.width) for c in distilled.canvases[t])
    )  # once each
    assert metadata["input"]["supported_resolutions"] == [list(size) for size in sizes] != []
    base = sglang_metadata(
        tiny_engine("base").describe(),
        max_batch_size=1,
        openpi_websocket=False,
        default_fps=24.0,
    )
    assert base["defaults"]["num_inference_steps"] == 35 and base["capabilities"]["multiple_candidates"] is False
    domains = distilled.domains
    one_width = replace(distilled, domains={"umi": domains["umi"]})
    assert (
        sglang_metadata(one_width, max_batch_size=1, openpi_websocket=False, default_fps=24.0)["output"]["action_dim"]
        == 10
    )
    with_state = replace(distilled, domains={"droid": replace(domains["droid_lerobot"], state_dim=8)})
    assert (
        sglang_metadata(with_state, max_batch_size=1, openpi_websocket=False, default_fps=24.0)["input"]["state_dim"]
        == 8
    )


def test_metadata_lists_the_engines_canvases_when_described(distilled):
    bins = lambda *sizes: tuple(TierCanvas(h / w, h, w) for h, w in sizes)  # noqa: E731
    described = replace(
        distilled, resolution_tiers=(256,), canvases={256: bins((256, 256), (192, 320)), 480: bins((480, 832))}
    )
    metadata = sglang_metadata(described, max_batch_size=1, openpi_websocket=False, default_fps=24.0)
    assert metadata["input"]["supported_resolutions"] == [[256, 256], [320, 192]]  # [width, height], tier 256 only


def test_merged_metadata_keeps_every_key_of_ours(distilled):
    ours = {
        "type": "metadata",
        "object": "actions.metadata",
        "model": distilled.model,
        "defaults": distilled.as_json()["defaults"],
        "capabilities": {"realtime_websocket": True, "cancel": True},
    }
    merged = merge_metadata(
        ours, sglang_metadata(distilled, max_batch_size=4, openpi_websocket=False, default_fps=24.0)
    )
    assert merged["object"] == "action.metadata" and merged["type"] == "metadata"
    assert merged["defaults"]["num_steps"] == 4 and merged["defaults"]["num_inference_steps"] == 4
    assert merged["capabilities"]["cancel"] is True and merged["capabilities"]["max_batch_size"] == 4
    assert merged["policy_family"] == "cosmos3" and merged["output"]["padded_action_dim"] == 64
    for key, value in ours.items():
        if key != "object":
            assert (
                all(merged[key][k] == v for k, v in value.items()) if isinstance(value, dict) else merged[key] == value
            )


# -- the lock-step WebSocket mode ------------------------------------------------------------------------


def _frame(**parameters) -> dict:
    return {
        "input": {"task": "pick", "observation": {"image": rgb(32)}},
        "parameters": {"action_mode": "policy", "domain_name": "droid_lerobot", **parameters},
    }


def test_the_first_frame_chooses_the_protocol():
    assert connection_mode(_frame()) == SGLANG
    assert connection_mode({"type": "configure", "domain_name": "x"}) == NATIVE
    assert connection_mode({"type": "observation", "input": {}}) == NATIVE
    assert connection_mode({"seq": 0, "image": rgb(32)}) == NATIVE  # still `unknown_type` there, as before
    assert connection_mode([1, 2]) == NATIVE and connection_mode(None) == NATIVE


def test_lockstep_replies_carry_server_timing(distilled):
    session = LockstepSession(distilled, max_items=4, started_at=100.0)
    call = session.receive(_frame(), 100.5)  # the first frame, already decoded to choose the mode
    assert call.output_format == "numpy"  # SGLang's realtime default
    reply = sglang_unpackb(session.reply(call, [chunk(np.ones((16, 10)))], infer_ms=80.0, model="m"))
    assert reply["object"] == "action.generation" and reply["server_timing"] == {"infer_ms": 80.0}
    assert reply["data"][0]["action"]["values"].shape == (16, 10)
    session.sent(101.0)

    call = session.receive(sglang_packb(_frame(seed=1)), 101.2)  # then raw frames, in SGLang's dialect
    reply = unpackb(session.reply(call, [chunk(np.ones((16, 10)))], infer_ms=60.0, model="m"))
    assert reply["server_timing"] == {"infer_ms": 60.0, "prev_total_ms": pytest.approx(1000.0)}
    session.sent(101.5)

    error = unpackb(session.error(ApiError("invalid_field", "bad", "parameters.seed")))
    assert error == {"error": {"code": "invalid_field", "message": "bad", "field": "parameters.seed"}}
    session.sent(102.0)  # an error is no answered round: prev_total_ms stays the last answered one's
    call = session.receive(packb(_frame()), 102.1)
    reply = unpackb(session.reply(call, [chunk(np.ones((16, 10)))], infer_ms=1.0, model="m"))
    assert reply["server_timing"]["prev_total_ms"] == pytest.approx(500.0)


@pytest.mark.parametrize(
    "frame, code, field",
    [
        ('{"input": {}}', "bad_frame", None),
        (b"\xc1", "bad_frame", None),
        (packb([1, 2]), "bad_frame", None),
        (packb({"type": "observation", "seq": 1}), "invalid_field", "type"),
        (
            packb({"input": {"observation": {"image": "frame.png"}}, "parameters": {"domain_name": "umi"}}),
            "invalid_image",
            "input.observation.image",
        ),
    ],
    ids=["text", "not_msgpack", "not_a_map", "native_frame", "path"],
)
def test_lockstep_errors_are_typed_and_keep_the_connection(distilled, frame, code, field):
    session = LockstepSession(distilled, max_items=4, started_at=0.0)
    with pytest.raises(ApiError) as info:
        session.receive(frame, 1.0)
    body = unpackb(session.error(info.value))
    assert body["error"]["code"] == code and body["error"]["field"] == field
    assert "Traceback" not in body["error"]["message"]
    session.sent(1.1)
    assert session.receive(packb(_frame()), 1.2).items  # the same session serves the next frame
