"""SGLang's action envelope: every recorded request of SGLang's own tests, each image form, each refusal.

The parser (:mod:`policy_server.sglang.actions`) turns the envelope into our flat request fields; our own
request builder (:func:`policy_server.http.requests.action_request`) then checks those against the real
tiny checkpoints' ``describe()``, exactly as the route will. Errors must name the client's field path.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

from sglang_fixtures import base, case, distilled, droid, load_cases, materialize, sglang_packb  # noqa: F401
from sidecar_fixtures import png_b64, png_bytes, rgb

from policy_server.engine.description import ModelDescription
from policy_server.http.codecs import Upload
from policy_server.http.errors import ApiError
from policy_server.http.requests import action_request
from policy_server.sglang.actions import (
    envelope_from_form,
    is_sglang_envelope,
    is_sglang_form,
    parse_action_envelope,
)
from robot_clients.wire_codec import unpackb

POLICY = {"action_mode": "policy", "domain_name": "droid_lerobot"}


def envelope(image=None, *, parameters=None, **inputs):
    observation = {} if image is None else {"image": image}
    return {"input": {"task": "pick up the block", "observation": observation, **inputs},
            "parameters": {**POLICY, **(parameters or {})}}


def parse(body, description, max_items=4, **options):
    return parse_action_envelope(body, description, max_items=max_items, **options)


def requests_of(body, description, max_items=4):
    """The engine requests an envelope becomes, as the route will build them."""
    call = parse(body, description, max_items)
    built = []
    for item in call.items:
        try:
            built.append(action_request(item.fields, description))
        except ApiError as exc:
            raise item.relabel(exc) from None
    return call, built


def refused(body, description, max_items=4):
    """The ApiError an envelope is refused with, parsed or built (its code, field and message)."""
    with pytest.raises(ApiError) as info:
        requests_of(body, description, max_items)
    return info.value


# -- SGLang's own test requests, replayed ----------------------------------------------------------------


def _decoded(recorded):
    """A recorded body as it reaches the parser: arrays travel as msgpack in SGLang's dialect, the rest as JSON."""
    body = materialize(recorded["body"])
    return unpackb(sglang_packb(body)) if "$ndarray" in str(recorded["body"]) else body


@pytest.mark.parametrize("name", [c["name"] for c in load_cases("action_requests")])
def test_every_recorded_sglang_request_is_an_envelope(name):
    assert is_sglang_envelope(_decoded(case(name)))


def test_sglang_policy_request_maps_every_parameter(base):
    recorded = case("policy_tensor_image")
    call = parse(_decoded(recorded), base, recorded["sglang_server"]["batching_max_size"])
    expects = recorded["sglang_expects"]
    (item,) = call.items
    assert call.request_id == "cosmos-action-1"
    assert item.fields["prompt"] == expects["prompt"]
    assert item.fields["action_mode"] == expects["action_mode"]
    assert item.fields["domain_name"] == expects["domain_name"]
    assert item.fields["action_horizon"] + 1 == expects["num_frames"]
    assert item.fields["num_steps"] == expects["num_inference_steps"]
    assert item.fields["seed"] == expects["seed"]
    assert item.fields["fps"] == 5.0 and item.fields["resolution_tier"] == 480  # 480×832 is tier 480's canvas
    assert item.fields["image"].shape[:2] == tuple(expects["image_size"])
    # SGLang's test image is 8×8: taken as it is (sides under 16 px are snapped up to 16 by the runtime).
    _, (request,) = requests_of(_decoded(recorded), base, 1)
    assert (request.domain_name, request.action_mode, request.action_horizon) == ("droid_lerobot", "policy", 16)
    assert (request.num_steps, request.seed, request.fps, request.resolution_tier) == (30, 7, 5.0, 480)
    assert request.prompt == "pick up the block"
    assert request.image.shape == (8, 8, 3)


def test_an_image_below_the_models_smallest_side_is_refused_naming_its_path(base):
    body = _decoded(case("policy_tensor_image"))
    body["input"]["observation"]["image"] = {"dtype": "uint8", "shape": [4, 4, 3], "values": rgb(4).tolist()}
    error = refused(body, base, 1)
    assert (error.code, error.field) == ("invalid_image", "input.observation.image")
    assert "between 8" in error.message


@pytest.mark.parametrize("name, max_items", [("batched_policy_tensor_prompts", 2), ("batched_policy_scalar_prompt", 2),
                                             ("single_item_batch", 1)])
def test_sglang_batch_requests_pair_one_prompt_with_each_image(distilled, name, max_items):
    recorded = case(name)
    call = parse(_decoded(recorded), distilled, max_items)
    expects = recorded["sglang_expects"]
    assert [item.fields["prompt"] for item in call.items] == expects["prompts"]
    assert len(call.items) == expects["images"]
    assert [item.input_index for item in call.items] == list(range(expects["images"]))
    assert all(item.candidate_index == 0 for item in call.items)
    for index, item in enumerate(call.items):
        assert item.fields["image"].shape == (8, 8, 3)
        if len(call.items) > 1:
            assert item.paths["image"] == f"input.input_reference[{index}]"


def test_sglang_batch_over_the_servers_limit_is_refused(distilled):
    recorded = case("batched_policy_over_server_limit")
    error = refused(_decoded(recorded), distilled, recorded["sglang_server"]["batching_max_size"])
    assert (error.code, error.field) == ("invalid_field", "input.input_reference")
    assert "at most 1" in error.message


def test_sglang_prompt_count_mismatch_is_refused(distilled):
    recorded = case("batched_policy_three_prompts")
    error = refused(_decoded(recorded), distilled, recorded["sglang_server"]["batching_max_size"])
    assert (error.code, error.field) == ("invalid_field", "input.prompt")
    assert recorded["sglang_expects"]["error_matches"] in error.message


def test_sglang_inverse_dynamics_with_a_server_path_is_refused(distilled):
    recorded = case("inverse_dynamics_video_path")
    call_error = refused(_decoded(recorded), distilled)
    assert (call_error.code, call_error.field) == ("invalid_image", "input.observation.video")
    assert "path or URL" in call_error.message


def test_sglang_inverse_dynamics_prompt_batch_is_refused(distilled):
    recorded = case("inverse_dynamics_prompt_batch")
    error = refused(_decoded(recorded), distilled)
    assert (error.code, error.field) == ("invalid_field", "input.prompt")
    assert recorded["sglang_expects"]["error_matches"] in error.message


def test_sglang_forward_dynamics_is_sent_to_videos(distilled):
    recorded = case("forward_dynamics_on_actions")
    error = refused(_decoded(recorded), distilled)
    assert (error.code, error.field) == ("unsupported_mode", "parameters.action_mode")
    assert recorded["sglang_expects"]["error_matches"] in error.message


def test_sglang_inverse_dynamics_runs_on_frames(distilled):
    body = _decoded(case("inverse_dynamics_video_path"))
    clip = np.stack([rgb(32, seed) for seed in range(5)])
    body["parameters"]["num_frames"] = 5
    body["input"]["observation"]["video"] = [png_b64(frame) for frame in clip]
    _, (request,) = requests_of(body, distilled)
    assert (request.action_mode, request.domain_name, request.action_horizon) == ("inverse_dynamics", "av", 4)
    np.testing.assert_array_equal(request.video, clip)


# -- image and video forms -------------------------------------------------------------------------------

IMAGE = rgb(32)


@pytest.mark.parametrize("form", [
    {"b64_json": png_b64(IMAGE)},
    {"base64": png_b64(IMAGE)},
    {"b64_json": "data:image/png;base64," + png_b64(IMAGE)},
    png_b64(IMAGE),
    {"values": IMAGE.tolist(), "dtype": "uint8", "shape": [32, 32, 3]},
    {"data": IMAGE.reshape(-1).tolist(), "dtype": "uint8", "shape": [32, 32, 3]},
    {"values": IMAGE.tolist()},
    IMAGE.tolist(),
    IMAGE,
    [IMAGE.tolist()],  # a batch of one
    png_bytes(IMAGE),  # msgpack bodies carry encoded bytes
], ids=["b64_json", "base64", "data_url", "b64_string", "values", "data_flat", "values_no_dtype", "nested_lists",
        "ndarray", "list_of_one", "bytes"])
def test_every_sglang_image_form_reaches_the_engine_as_the_same_pixels(distilled, form):
    _, (request,) = requests_of(envelope(form), distilled)
    np.testing.assert_array_equal(request.image, IMAGE)


def test_image_forms_travel_in_sglang_msgpack_bodies(distilled):
    body = envelope({"values": IMAGE.tobytes(), "dtype": "uint8", "shape": [32, 32, 3]},
                    parameters={"seed": np.int64(3)})
    _, (request,) = requests_of(unpackb(sglang_packb(body)), distilled)
    np.testing.assert_array_equal(request.image, IMAGE)
    assert request.seed == 3


@pytest.mark.parametrize("array, expected", [
    (IMAGE[:, :, 0], np.repeat(IMAGE[:, :, :1], 3, axis=2)),
    (IMAGE[:, :, :1], np.repeat(IMAGE[:, :, :1], 3, axis=2)),
    (np.concatenate([IMAGE, np.full((32, 32, 1), 255, np.uint8)], axis=2), IMAGE),
], ids=["gray", "one_channel", "rgba"])
def test_gray_and_rgba_arrays_become_rgb(distilled, array, expected):
    _, (request,) = requests_of(envelope(array), distilled)
    np.testing.assert_array_equal(request.image, expected)


def test_batches_in_every_form(distilled):
    images = [rgb(32, seed) for seed in range(3)]
    forms = [
        [{"b64_json": png_b64(image)} for image in images],
        np.stack(images),
        {"values": np.stack(images).tolist(), "dtype": "uint8", "shape": [3, 32, 32, 3]},
        [image.tolist() for image in images],
    ]
    for form in forms:
        call, built = requests_of(envelope(form), distilled)
        assert [item.input_index for item in call.items] == [0, 1, 2]
        for request, image in zip(built, images):
            np.testing.assert_array_equal(request.image, image)


def test_named_cameras_take_exactly_one(distilled):
    _, (request,) = requests_of(envelope(images={"front": {"b64_json": png_b64(IMAGE)}}), distilled)
    np.testing.assert_array_equal(request.image, IMAGE)
    error = refused(envelope(images={"front": png_b64(IMAGE), "wrist": png_b64(IMAGE)}), distilled)
    assert (error.code, error.field) == ("invalid_field", "input.images")


def test_the_observation_may_sit_in_input_as_sglang_allows(distilled):
    for name in ("image", "input_reference"):
        _, (request,) = requests_of(envelope(**{name: png_b64(IMAGE)}), distilled)
        np.testing.assert_array_equal(request.image, IMAGE)


@pytest.mark.parametrize("form", [
    [png_b64(frame) for frame in np.stack([IMAGE] * 5)],
    [{"b64_json": png_b64(IMAGE)}] * 5,
    np.stack([IMAGE] * 5),
    np.stack([IMAGE] * 5).tolist(),
    {"values": np.stack([IMAGE] * 5).tolist(), "dtype": "uint8", "shape": [5, 32, 32, 3]},
], ids=["b64_frames", "b64_json_frames", "ndarray", "nested_lists", "values"])
def test_every_video_form_reaches_inverse_dynamics(distilled, form):
    body = {"input": {"observation": {"video": form}},
            "parameters": {"action_mode": "inverse_dynamics", "domain_name": "av", "action_horizon": 4}}
    _, (request,) = requests_of(body, distilled)
    assert request.video.shape == (5, 32, 32, 3)


def test_a_video_upload_in_the_form_reaches_inverse_dynamics(distilled, tmp_path):
    from policy_server.videos.encoding import encode_mp4

    encode_mp4(np.stack([IMAGE] * 5), 5.0, tmp_path / "clip.mp4")
    upload = Upload((tmp_path / "clip.mp4").read_bytes(), "video/mp4")
    body = envelope_from_form([("task", "infer"), ("input_reference", upload), ("action_mode", "inverse_dynamics"),
                               ("domain_name", "av"), ("num_frames", "5")])
    assert "video" in body["input"]["observation"]
    _, (request,) = requests_of(body, distilled)
    assert request.video.shape == (5, 32, 32, 3)


@pytest.mark.parametrize("image, code, field", [
    ("observation.png", "invalid_image", "input.observation.image"),
    ("https://example.com/frame.png", "invalid_image", "input.observation.image"),
    ({"b64_json": "/tmp/frame.jpg"}, "invalid_image", "input.observation.image.b64_json"),
    ({"b64_json": png_b64(IMAGE), "detail": "high"}, "invalid_image", "input.observation.image"),
    ({"url": "https://example.com/x.png"}, "invalid_image", "input.observation.image"),
    ({"values": IMAGE.tolist(), "dtype": "float32"}, "invalid_image", "input.observation.image.dtype"),
    ({"values": [[[300, 0, 0]] * 32] * 32}, "invalid_image", "input.observation.image"),
    ({"values": IMAGE.tolist(), "shape": [16, 16, 3]}, "invalid_image", "input.observation.image.shape"),
    ({"values": IMAGE.tolist(), "data": IMAGE.tolist()}, "invalid_image", "input.observation.image"),
    ({"values": [[1, 2], [3]]}, "invalid_image", "input.observation.image"),
    (IMAGE.astype(np.float32), "invalid_image", "input.observation.image"),
    (rgb(4), "invalid_image", "input.observation.image"),
    ([], "invalid_image", "input.observation.image"),
    ([png_b64(IMAGE), "frame.png"], "invalid_image", "input.observation.image[1]"),
], ids=["path", "url", "b64_path", "b64_extra_key", "unknown_container", "float_dtype", "out_of_range",
        "shape_mismatch", "values_and_data", "ragged", "float_array", "too_small", "empty_batch", "path_in_batch"])
def test_bad_images_are_refused_naming_the_field(distilled, image, code, field):
    error = refused(envelope(image), distilled)
    assert (error.code, error.field) == (code, field), error.message


@pytest.mark.parametrize("video, field", [
    ("observation.mp4", "input.observation.video"),
    ({"b64_json": "AAAA"}, "input.observation.video"),
    (IMAGE, "input.observation.video"),
])
def test_videos_must_be_frames(distilled, video, field):
    body = {"input": {"observation": {"video": video}},
            "parameters": {"action_mode": "inverse_dynamics", "domain_name": "av", "action_horizon": 4}}
    error = refused(body, distilled)
    assert (error.code, error.field) == ("invalid_image", field)


def test_paths_and_urls_sglang_would_read_are_refused(distilled):
    for key in ("image_path", "video_path", "video_url"):
        error = refused({"input": {"observation": {key: "/etc/passwd"}}, "parameters": POLICY}, distilled)
        assert (error.code, error.field) == ("invalid_field", f"input.observation.{key}")
        assert "never reads its own files" in error.message


# -- the envelope's structure ----------------------------------------------------------------------------


@pytest.mark.parametrize("body, code, field", [
    ({"parameters": POLICY}, "missing_field", "input"),
    ({"input": [], "parameters": POLICY}, "invalid_field", "input"),
    ({"input": {"observation": {}}, "parameters": POLICY, "stream": True}, "invalid_field", "stream"),
    ({"input": {"observation": {}, "noise": [0.0]}, "parameters": POLICY}, "invalid_field", "input.noise"),
    ({"input": {"observation": {"image_masks": {}}}, "parameters": POLICY}, "invalid_field",
     "input.observation.image_masks"),
    ({"input": {}, "parameters": {**POLICY, "flow_shift": 3.0}}, "invalid_field", "parameters.flow_shift"),
    ({"input": {}, "parameters": POLICY, "runtime": {"stream": True}}, "invalid_field", "runtime.stream"),
    ({"input": {"observation": {}}, "parameters": POLICY}, "missing_field", "input.observation.image"),
    ({"input": {}, "parameters": {**POLICY, "action_mode": "inverse_dynamics"}}, "missing_field",
     "input.observation.video"),
], ids=["no_input", "input_not_object", "unknown_top", "unknown_input", "unknown_observation", "unknown_parameter",
        "unknown_runtime", "no_image", "no_video"])
def test_envelope_structure_is_checked(distilled, body, code, field):
    error = refused(body, distilled)
    assert (error.code, error.field) == (code, field), error.message


def test_both_image_fields_or_image_and_video_are_refused(distilled):
    body = envelope(png_b64(IMAGE))
    body["input"]["observation"]["input_reference"] = png_b64(IMAGE)
    assert refused(body, distilled).field == "input.observation.input_reference"
    body = envelope(png_b64(IMAGE), input_reference=png_b64(IMAGE))
    body["input"]["observation"].pop("image")
    body["input"]["observation"]["input_reference"] = png_b64(IMAGE)
    assert refused(body, distilled).field == "input.input_reference"
    body = envelope(png_b64(IMAGE))
    body["input"]["observation"]["video"] = [png_b64(IMAGE)] * 17
    assert refused(body, distilled).field == "input.observation.video"
    body = {"input": {"observation": {"image": png_b64(IMAGE)}},
            "parameters": {"action_mode": "inverse_dynamics", "domain_name": "av"}}
    assert refused(body, distilled).field == "input.observation.image"


def test_request_id_and_id(distilled):
    assert parse({**envelope(png_b64(IMAGE)), "id": 42}, distilled).request_id == "42"
    assert parse({**envelope(png_b64(IMAGE)), "request_id": "a", "id": "a"}, distilled).request_id == "a"
    assert refused({**envelope(png_b64(IMAGE)), "request_id": "a", "id": "b"}, distilled).field == "id"
    assert refused({**envelope(png_b64(IMAGE)), "request_id": "x" * 257}, distilled).field == "request_id"
    assert parse(envelope(png_b64(IMAGE)), distilled).request_id is None


def test_task_and_prompt(distilled):
    body = envelope(png_b64(IMAGE))
    body["input"] = {"prompt": "close the drawer", "observation": body["input"]["observation"]}
    assert parse(body, distilled).items[0].fields["prompt"] == "close the drawer"
    body["input"]["task"] = "open it"
    assert refused(body, distilled).field == "input.prompt"
    body["input"].pop("prompt")
    body["input"]["task"] = 3
    assert refused(body, distilled).field == "input.task"
    body["input"]["task"] = "x" * 5000
    error = refused(body, distilled)
    assert error.field == "input.task" and "2000" in error.message  # our own check, relabeled


def test_model_must_be_the_served_one(distilled):
    assert refused({**envelope(png_b64(IMAGE)), "model": "someone/else"}, distilled).field == "model"
    _, (request,) = requests_of({**envelope(png_b64(IMAGE)), "model": distilled.model}, distilled)
    assert request.domain_name == "droid_lerobot"


def test_state_is_honoured_or_refused_naming_its_path(distilled, droid):
    # A domain that takes no state refuses one, wherever SGLang puts it (it is never dropped with a warning).
    for body, path in ((envelope(png_b64(IMAGE), state=[0.1] * 8), "input.state"),
                       (envelope({"b64_json": png_b64(IMAGE)}), None)):
        if path is None:
            assert parse(body, distilled).unused == () and requests_of(body, distilled)[1][0].state is None
        else:
            error = refused(body, distilled)
            assert (error.code, error.field) == ("invalid_field", path) and "does not condition" in error.message
    # The DROID profile takes [8]: as numbers, or in SGLang's tensor form (values + shape).
    joints = [0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, 0.2]
    tensor = envelope(png_b64(IMAGE))
    tensor["input"]["observation"]["state"] = {"values": joints, "dtype": "float32", "shape": [1, 8]}
    for body in (envelope(png_b64(IMAGE), state=joints), tensor):
        _, (request,) = requests_of(body, droid)
        np.testing.assert_array_equal(request.state.reshape(-1), np.float32(joints))
    for state, code in ((joints[:7], "invalid_field"), (["a"] * 8, "invalid_field"), ([float("nan")] * 8, "invalid_field"),
                        (list(range(5000)), "invalid_field")):
        error = refused(envelope(png_b64(IMAGE), state=state), droid)
        assert (error.code, error.field) == (code, "input.state"), error.message
    error = refused(envelope(png_b64(IMAGE)), droid)
    assert (error.code, error.field) == ("missing_field", "input.observation.state"), error.message


# -- parameters ------------------------------------------------------------------------------------------


def settings(description, **parameters):
    """The engine request of a one-image envelope with these parameters."""
    _, (request,) = requests_of(envelope(png_b64(IMAGE), parameters=parameters), description)
    return request


def test_horizon_and_num_frames(distilled):
    assert settings(distilled, action_horizon=8).action_horizon == 8
    assert settings(distilled, num_frames=9).action_horizon == 8
    assert settings(distilled, action_horizon=8, num_frames=9).action_horizon == 8
    assert settings(distilled).action_horizon is None  # the domain's default, chosen by the engine
    error = refused(envelope(png_b64(IMAGE), parameters={"action_horizon": 8, "num_frames": 8}), distilled)
    assert (error.field, "must be action_horizon + 1 = 9" in error.message) == ("parameters.num_frames", True)
    error = refused(envelope(png_b64(IMAGE), parameters={"num_frames": 8}), distilled)  # horizon 7: not a multiple of 4
    assert (error.code, error.field) == ("invalid_field", "parameters.num_frames")
    assert refused(envelope(png_b64(IMAGE), parameters={"action_horizon": 16.5}), distilled).field == \
        "parameters.action_horizon"


@pytest.mark.parametrize("parameters, domain", [
    ({"domain_name": "droid_lerobot"}, "droid_lerobot"),
    ({"domain_name": None, "domain_id": 7, "raw_action_dim": 10}, "bridge_orig_lerobot"),
    ({"domain_name": None, "domain_id": 15, "raw_action_dim": 29}, "agibot_gear_gripper"),  # identical profiles
    ({"domain_name": "droid_lerobot", "domain_id": 8, "raw_action_dim": 10}, "droid_lerobot"),
    ({"domain_name": None, "domain_id": "6", "raw_action_dim": "10"}, "umi"),
])
def test_domains_by_name_or_by_id_and_width(distilled, parameters, domain):
    assert settings(distilled, **parameters).domain_name == domain


@pytest.mark.parametrize("parameters, code, field", [
    ({"domain_name": None}, "missing_field", "parameters.domain_name"),
    ({"domain_name": "spaceship"}, "unknown_domain", "parameters.domain_name"),
    ({"domain_name": None, "domain_id": 99, "raw_action_dim": 7}, "unknown_domain", "parameters.domain_id"),
    ({"domain_name": None, "domain_id": 7}, "missing_field", "parameters.raw_action_dim"),
    ({"domain_name": None, "domain_id": 7, "raw_action_dim": 9}, "invalid_field", "parameters.raw_action_dim"),
    ({"domain_name": None, "domain_id": 8, "raw_action_dim": 10}, "invalid_field", "parameters.domain_id"),
    ({"domain_id": 7}, "invalid_field", "parameters.domain_id"),
    ({"raw_action_dim": 9}, "invalid_field", "parameters.raw_action_dim"),
    ({"domain_name": None, "domain_id": True, "raw_action_dim": 10}, "invalid_field", "parameters.domain_id"),
], ids=["none", "unknown_name", "unknown_id", "id_without_width", "wrong_width", "ambiguous_id", "name_id_disagree",
        "name_width_disagree", "bool_id"])
def test_domains_that_would_give_the_wrong_actions_are_refused(distilled, parameters, code, field):
    error = refused(envelope(png_b64(IMAGE), parameters=parameters), distilled)
    assert (error.code, error.field) == (code, field), error.message


def test_normalization_must_be_the_profiles(distilled):
    assert settings(distilled, action_normalization="meanstd").domain_name == "droid_lerobot"
    assert settings(distilled, action_normalization="mean_std").domain_name == "droid_lerobot"
    for value, domain in (("quantile", "droid_lerobot"), ("zscore", "droid_lerobot"), ("quantile", "umi")):
        error = refused(envelope(png_b64(IMAGE), parameters={"action_normalization": value, "domain_name": domain}),
                        distilled)
        assert error.field == "parameters.action_normalization", error.message


def test_steps_guidance_and_seed(base, distilled):
    request = settings(base, num_inference_steps=12, guidance_scale=3.5, seed=11)
    assert (request.num_steps, request.guidance_scale, request.seed) == (12, 3.5, 11)
    assert settings(distilled, num_inference_steps=4, guidance_scale=1.0).num_steps == 4
    error = refused(envelope(png_b64(IMAGE), parameters={"num_inference_steps": 30}), distilled)
    assert error.field == "parameters.num_inference_steps"  # the distilled schedule, our check, relabeled
    assert refused(envelope(png_b64(IMAGE), parameters={"guidance_scale": 4.0}), distilled).field == \
        "parameters.guidance_scale"
    assert refused(envelope(png_b64(IMAGE), parameters={"seed": -1}), distilled).field == "parameters.seed"
    assert refused(envelope(png_b64(IMAGE), parameters={"num_inference_steps": "many"}), base).field == \
        "parameters.num_inference_steps"


def test_frame_rates(distilled):
    assert settings(distilled, fps=5).fps == 5.0
    assert settings(distilled, action_fps=10).fps == 10.0
    assert settings(distilled, fps=10, action_fps=10.0).fps == 10.0
    assert refused(envelope(png_b64(IMAGE), parameters={"fps": 5, "action_fps": 10}), distilled).field == \
        "parameters.action_fps"
    assert refused(envelope(png_b64(IMAGE), parameters={"fps": 0}), distilled).field == "parameters.fps"


def test_null_parameters_are_absent_ones(distilled):
    request = settings(distilled, action_mode=None, seed=None, fps=None, num_inference_steps=None)
    assert (request.action_mode, request.seed, request.fps) == ("policy", None, 24.0)
    assert settings(distilled, action_mode=" Policy ").action_mode == "policy"  # SGLang strips and lowercases
    error = refused(envelope(png_b64(IMAGE), parameters={"action_mode": "teleport"}), distilled)
    assert (error.code, error.field) == ("invalid_field", "parameters.action_mode")  # as our flat form answers


def test_view_point(distilled):
    assert settings(distilled, action_view_point="wrist_view").view_point == "wrist_view"
    assert refused(envelope(png_b64(IMAGE), parameters={"action_view_point": "satellite"}), distilled).field == \
        "parameters.action_view_point"


def test_height_and_width_name_a_tier(distilled):
    assert settings(distilled, height=480, width=832).resolution_tier == 480
    assert settings(distilled, height=256, width=256).resolution_tier == 256
    assert settings(distilled, height=720, width=1280).resolution_tier == 720
    error = refused(envelope(png_b64(IMAGE), parameters={"height": 500, "width": 500}), distilled)
    assert (error.code, error.field) == ("unsupported_tier", "parameters.height")
    error = refused(envelope(png_b64(IMAGE), parameters={"height": 480}), distilled)
    assert (error.code, error.field) == ("missing_field", "parameters.width")


def test_height_and_width_use_the_engines_canvases_when_described(distilled):
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _ACTION_RESOLUTION_BINS

    canvases = {t: [{"height": h, "width": w} for h, w in bins.values()] for t, bins in _ACTION_RESOLUTION_BINS.items()}
    described = ModelDescription.from_describe({**distilled.raw, "canvases": canvases})
    assert settings(described, height=640, width=640).resolution_tier == 480  # square canvas of tier 480
    assert settings(described, height=960, width=960).resolution_tier == 704  # both 704 and 720: the smaller
    assert settings(described, height=192, width=320).resolution_tier == 256
    error = refused(envelope(png_b64(IMAGE), parameters={"height": 480, "width": 480}), described)
    assert error.code == "unsupported_tier" and "832x480" in error.message


def test_guardrails_and_runtime_knobs(distilled):
    assert settings(distilled, use_guardrails=False).domain_name == "droid_lerobot"
    assert refused(envelope(png_b64(IMAGE), parameters={"use_guardrails": True}), distilled).field == \
        "parameters.use_guardrails"
    for runtime in ({"prefix_cache": "auto", "cuda_graph": "AUTO"}, {}):
        parse({**envelope(png_b64(IMAGE)), "runtime": runtime}, distilled)
    for name, value in (("prefix_cache", False), ("cuda_graph", True), ("response_format", "xml"),
                        ("output_format", "arrow"), ("return_timing", "sometimes")):
        error = refused({**envelope(png_b64(IMAGE)), "runtime": {name: value}}, distilled)
        assert error.field == f"runtime.{name}", error.message


def test_response_and_output_formats(distilled):
    call = parse(envelope(png_b64(IMAGE)), distilled)
    assert (call.response_format, call.output_format, call.return_timing) == ("envelope", "list", False)
    assert parse(envelope(png_b64(IMAGE)), distilled, msgpack_reply=True).output_format == "numpy"
    body = {**envelope(png_b64(IMAGE)), "runtime": {"response_format": "RAW", "output_format": "numpy",
                                                    "return_timing": True}}
    call = parse(body, distilled, msgpack_reply=True)
    assert (call.response_format, call.output_format, call.return_timing) == ("raw", "numpy", True)
    assert parse(body, distilled).output_format == "list"  # a JSON reply has no other arrays
    body = envelope(png_b64(IMAGE), parameters={"output_format": "list"})
    assert parse(body, distilled, msgpack_reply=True).output_format == "list"
    body["runtime"] = {"output_format": "numpy"}
    assert refused(body, distilled).field == "parameters.output_format"


def test_candidates_are_separate_requests_with_their_own_seeds(distilled):
    call, built = requests_of(envelope(png_b64(IMAGE), parameters={"candidate_count": 3, "seed": 7}), distilled)
    assert [(item.input_index, item.candidate_index) for item in call.items] == [(0, 0), (0, 1), (0, 2)]
    assert [request.seed for request in built] == [7, 8, 9]
    call, built = requests_of(envelope(png_b64(IMAGE), parameters={"candidate_count": 2, "return_candidates": True}),
                              distilled)
    assert [request.seed for request in built] == [None, None]  # each drawn by the engine
    assert len(parse(envelope(png_b64(IMAGE), parameters={"candidate_count": 1, "candidate_reducer": "none"}),
                     distilled).items) == 1


@pytest.mark.parametrize("parameters, image, max_items, field", [
    ({"candidate_count": 2}, [png_b64(IMAGE)] * 2, 4, "parameters.candidate_count"),
    ({"candidate_count": 5}, png_b64(IMAGE), 4, "parameters.candidate_count"),
    ({"candidate_count": 0}, png_b64(IMAGE), 4, "parameters.candidate_count"),
    ({"candidate_count": 2, "candidate_reducer": "mean"}, png_b64(IMAGE), 4, "parameters.candidate_reducer"),
    ({"candidate_count": 2, "return_candidates": False}, png_b64(IMAGE), 4, "parameters.return_candidates"),
    ({}, [png_b64(IMAGE)] * 5, 4, "input.observation.image"),
], ids=["with_batch", "over_limit", "zero", "mean_reducer", "reduced_only", "batch_over_limit"])
def test_candidate_requests_the_server_would_not_honour_are_refused(distilled, parameters, image, max_items, field):
    error = refused(envelope(image, parameters=parameters), distilled, max_items)
    assert (error.code, error.field) == ("invalid_field", field), error.message


# -- the multipart form ----------------------------------------------------------------------------------


def test_sglang_multipart_form_becomes_the_envelope(distilled):
    form = [("request_id", "form-1"), ("prompt", "pick up the block"),
            ("input_reference", Upload(png_bytes(IMAGE), "image/png")), ("action_mode", "policy"),
            ("domain_name", "droid_lerobot"), ("num_inference_steps", "4"), ("seed", "5"), ("fps", "5"),
            ("extra_params", '{"action_horizon": 8}'), ("output_format", "numpy")]
    body = envelope_from_form(form)
    assert is_sglang_envelope(body)
    call, (request,) = requests_of(body, distilled)
    assert call.request_id == "form-1" and parse(body, distilled, msgpack_reply=True).output_format == "numpy"
    assert (request.prompt, request.num_steps, request.seed, request.fps, request.action_horizon) == \
        ("pick up the block", 4, 5, 5.0, 8)
    np.testing.assert_array_equal(request.image, IMAGE)


def test_form_detection_tells_sglang_forms_from_ours():
    native = ("domain_name", "action_mode", "image", "video", "prompt", "seed", "num_steps")
    assert not is_sglang_form(["image", "prompt", "domain_name"], native)
    assert is_sglang_form(["input_reference", "prompt", "domain_name"], native)
    assert is_sglang_form(["image_reference"], native)


@pytest.mark.parametrize("form, field", [
    ([("prompt", "a"), ("prompt", "b")], "prompt"),
    ([("domain_name", Upload(b"x", "image/png"))], "domain_name"),
    ([("image_reference", Upload(png_bytes(IMAGE), "image/png")),
      ("video_reference", Upload(b"x", "video/mp4"))], "video_reference"),
    ([("reference_url", "https://example.com/x.png")], "reference_url"),
    ([("generator_device", "cuda")], "generator_device"),
    ([("seed", "1"), ("extra_body", '{"seed": 2}')], "extra_body.seed"),
    ([("extra_params", "[1, 2]")], "extra_params"),
])
def test_bad_forms_are_refused(form, field):
    with pytest.raises(ApiError) as info:
        envelope_from_form(form)
    assert info.value.field == field, info.value.message


def test_form_uploads_choose_image_or_video():
    image = Upload(png_bytes(IMAGE), "image/png")
    video = Upload(b"....", "video/mp4")
    assert envelope_from_form([("image_reference", image)])["input"]["observation"] == {"image": image}
    assert envelope_from_form([("input_reference", image)])["input"]["observation"] == {"input_reference": image}
    assert envelope_from_form([("input_reference", video)])["input"]["observation"] == {"video": video}
    assert envelope_from_form([("video_reference", video)])["input"]["observation"] == {"video": video}
    as_video = envelope_from_form([("input_reference", image), ("action_mode", "inverse_dynamics")])
    assert as_video["input"]["observation"] == {"video": image}
    assert envelope_from_form([("input_reference", base64.b64encode(b"x").decode())])["input"]["observation"] == \
        {"input_reference": "eA=="}
