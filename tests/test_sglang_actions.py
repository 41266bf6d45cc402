"""SGLang's action envelope: every recorded request of SGLang's own tests, each image form, each refusal.

The parser (:mod:`policy_server.sglang.actions`) turns the envelope into our flat request fields; our own
request builder (:func:`policy_server.http.requests.action_request`) then checks those against the real
tiny checkpoints' ``describe()``, exactly as the route will. Errors must name the client's field path.
"""

from __future__ import annotations

import numpy as np
import pytest
from sglang_envelopes import IMAGE, POLICY, envelope, parse, refused, requests_of
from sglang_fixtures import base, case, distilled, droid, load_cases, materialize, sglang_packb  # noqa: F401
from sidecar_fixtures import png_b64, png_bytes, rgb

from policy_server.foundation.api_errors import ApiError
from policy_server.http.codecs import Upload
from policy_server.sglang.actions import envelope_from_form, is_sglang_envelope
from robot_clients.wire_codec import unpackb

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


@pytest.mark.parametrize(
    "name, max_items",
    [("batched_policy_tensor_prompts", 2), ("batched_policy_scalar_prompt", 2), ("single_item_batch", 1)],
)
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


@pytest.mark.parametrize(
    "form",
    [
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
    ],
    ids=[
        "b64_json",
        "base64",
        "data_url",
        "b64_string",
        "values",
        "data_flat",
        "values_no_dtype",
        "nested_lists",
        "ndarray",
        "list_of_one",
        "bytes",
    ],
)
def test_every_sglang_image_form_reaches_the_engine_as_the_same_pixels(distilled, form):
    _, (request,) = requests_of(envelope(form), distilled)
    np.testing.assert_array_equal(request.image, IMAGE)


def test_image_forms_travel_in_sglang_msgpack_bodies(distilled):
    body = envelope(
        {"values": IMAGE.tobytes(), "dtype": "uint8", "shape": [32, 32, 3]}, parameters={"seed": np.int64(3)}
    )
    _, (request,) = requests_of(unpackb(sglang_packb(body)), distilled)
    np.testing.assert_array_equal(request.image, IMAGE)
    assert request.seed == 3


@pytest.mark.parametrize(
    "array, expected",
    [
        (IMAGE[:, :, 0], np.repeat(IMAGE[:, :, :1], 3, axis=2)),
        (IMAGE[:, :, :1], np.repeat(IMAGE[:, :, :1], 3, axis=2)),
        (np.concatenate([IMAGE, np.full((32, 32, 1), 255, np.uint8)], axis=2), IMAGE),
    ],
    ids=["gray", "one_channel", "rgba"],
)
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


@pytest.mark.parametrize(
    "form",
    [
        [png_b64(frame) for frame in np.stack([IMAGE] * 5)],
        [{"b64_json": png_b64(IMAGE)}] * 5,
        np.stack([IMAGE] * 5),
        np.stack([IMAGE] * 5).tolist(),
        {"values": np.stack([IMAGE] * 5).tolist(), "dtype": "uint8", "shape": [5, 32, 32, 3]},
    ],
    ids=["b64_frames", "b64_json_frames", "ndarray", "nested_lists", "values"],
)
def test_every_video_form_reaches_inverse_dynamics(distilled, form):
    body = {
        "input": {"observation": {"video": form}},
        "parameters": {"action_mode": "inverse_dynamics", "domain_name": "av", "action_horizon": 4},
    }
    _, (request,) = requests_of(body, distilled)
    assert request.video.shape == (5, 32, 32, 3)


def test_a_video_upload_in_the_form_reaches_inverse_dynamics(distilled, tmp_path):
    from policy_server.videos.encoding import encode_mp4

    encode_mp4(np.stack([IMAGE] * 5), 5.0, tmp_path / "clip.mp4")
    upload = Upload((tmp_path / "clip.mp4").read_bytes(), "video/mp4")
    body = envelope_from_form(
        [
            ("task", "infer"),
            ("input_reference", upload),
            ("action_mode", "inverse_dynamics"),
            ("domain_name", "av"),
            ("num_frames", "5"),
        ]
    )
    assert "video" in body["input"]["observation"]
    _, (request,) = requests_of(body, distilled)
    assert request.video.shape == (5, 32, 32, 3)


@pytest.mark.parametrize(
    "image, code, field",
    [
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
    ],
    ids=[
        "path",
        "url",
        "b64_path",
        "b64_extra_key",
        "unknown_container",
        "float_dtype",
        "out_of_range",
        "shape_mismatch",
        "values_and_data",
        "ragged",
        "float_array",
        "too_small",
        "empty_batch",
        "path_in_batch",
    ],
)
def test_bad_images_are_refused_naming_the_field(distilled, image, code, field):
    error = refused(envelope(image), distilled)
    assert (error.code, error.field) == (code, field), error.message


@pytest.mark.parametrize(
    "video, field",
    [
        ("observation.mp4", "input.observation.video"),
        ({"b64_json": "AAAA"}, "input.observation.video"),
        (IMAGE, "input.observation.video"),
    ],
)
def test_videos_must_be_frames(distilled, video, field):
    body = {
        "input": {"observation": {"video": video}},
        "parameters": {"action_mode": "inverse_dynamics", "domain_name": "av", "action_horizon": 4},
    }
    error = refused(body, distilled)
    assert (error.code, error.field) == ("invalid_image", field)


def test_paths_and_urls_sglang_would_read_are_refused(distilled):
    for key in ("image_path", "video_path", "video_url"):
        error = refused({"input": {"observation": {key: "/etc/passwd"}}, "parameters": POLICY}, distilled)
        assert (error.code, error.field) == ("invalid_field", f"input.observation.{key}")
        assert "never reads its own files" in error.message


# -- the envelope's structure ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, code, field",
    [
        ({"parameters": POLICY}, "missing_field", "input"),
        ({"input": [], "parameters": POLICY}, "invalid_field", "input"),
        ({"input": {"observation": {}}, "parameters": POLICY, "stream": True}, "invalid_field", "stream"),
        ({"input": {"observation": {}, "noise": [0.0]}, "parameters": POLICY}, "invalid_field", "input.noise"),
        (
            {"input": {"observation": {"image_masks": {}}}, "parameters": POLICY},
            "invalid_field",
            "input.observation.image_masks",
        ),
        ({"input": {}, "parameters": {**POLICY, "flow_shift": 3.0}}, "invalid_field", "parameters.flow_shift"),
        ({"input": {}, "parameters": POLICY, "runtime": {"stream": True}}, "invalid_field", "runtime.stream"),
        ({"input": {"observation": {}}, "parameters": POLICY}, "missing_field", "input.observation.image"),
        (
            {"input": {}, "parameters": {**POLICY, "action_mode": "inverse_dynamics"}},
            "missing_field",
            "input.observation.video",
        ),
    ],
    ids=[
        "no_input",
        "input_not_object",
        "unknown_top",
        "unknown_input",
        "unknown_observation",
        "unknown_parameter",
        "unknown_runtime",
        "no_image",
        "no_video",
    ],
)
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
    body = {
        "input": {"observation": {"image": png_b64(IMAGE)}},
        "parameters": {"action_mode": "inverse_dynamics", "domain_name": "av"},
    }
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
    for body, path in (
        (envelope(png_b64(IMAGE), state=[0.1] * 8), "input.state"),
        (envelope({"b64_json": png_b64(IMAGE)}), None),
    ):
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
    for state, code in (
        (joints[:7], "invalid_field"),
        (["a"] * 8, "invalid_field"),
        ([float("nan")] * 8, "invalid_field"),
        (list(range(5000)), "invalid_field"),
    ):
        error = refused(envelope(png_b64(IMAGE), state=state), droid)
        assert (error.code, error.field) == (code, "input.state"), error.message
    error = refused(envelope(png_b64(IMAGE)), droid)
    assert (error.code, error.field) == ("missing_field", "input.observation.state"), error.message


@pytest.mark.parametrize("name", ["num_inference_steps", "extra_params"])
def test_deep_json_in_a_form_field_is_refused_before_it_is_parsed(distilled, name):
    """A form field's JSON nested 12,000 deep made Python's parser raise RecursionError (issue 36.3)."""
    deep = "[" * 12_000 + "]" * 12_000
    with pytest.raises(ApiError) as info:
        refused(envelope_from_form([("task", "reach"), (name, deep)]), distilled)
    assert info.value.field == name
    assert "deep" in info.value.message, info.value.message
