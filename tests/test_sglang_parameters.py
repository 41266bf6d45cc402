"""SGLang's action envelope: its parameters (horizon, domain, steps, frame rates, tiers, candidates, ...) and
the multipart form, each mapped onto our request fields or refused naming the client's field.

As in ``test_sglang_actions.py``: the envelope is parsed, then checked by our own request builder against
the real tiny checkpoints' ``describe()``, exactly as the route will.
"""

from __future__ import annotations

import base64
from dataclasses import replace

import numpy as np
import pytest
from sglang_envelopes import IMAGE, envelope, parse, refused, requests_of, settings
from sglang_fixtures import base, distilled  # noqa: F401
from sidecar_fixtures import png_b64, png_bytes

from cosmos3_runtime.description import canvas_bins
from policy_server.foundation.api_errors import ApiError
from policy_server.http.codecs import Upload
from policy_server.sglang.actions import envelope_from_form, is_sglang_envelope, is_sglang_form

# -- parameters ------------------------------------------------------------------------------------------


def test_horizon_and_num_frames(distilled):
    assert settings(distilled, action_horizon=8).action_horizon == 8
    assert settings(distilled, num_frames=9).action_horizon == 8
    assert settings(distilled, action_horizon=8, num_frames=9).action_horizon == 8
    assert settings(distilled).action_horizon is None  # the domain's default, chosen by the engine
    error = refused(envelope(png_b64(IMAGE), parameters={"action_horizon": 8, "num_frames": 8}), distilled)
    assert (error.field, "must be action_horizon + 1 = 9" in error.message) == ("parameters.num_frames", True)
    error = refused(envelope(png_b64(IMAGE), parameters={"num_frames": 8}), distilled)  # horizon 7: not a multiple of 4
    assert (error.code, error.field) == ("invalid_field", "parameters.num_frames")
    assert (
        refused(envelope(png_b64(IMAGE), parameters={"action_horizon": 16.5}), distilled).field
        == "parameters.action_horizon"
    )


@pytest.mark.parametrize(
    "parameters, domain",
    [
        ({"domain_name": "droid_lerobot"}, "droid_lerobot"),
        ({"domain_name": None, "domain_id": 7, "raw_action_dim": 10}, "bridge_orig_lerobot"),
        ({"domain_name": None, "domain_id": 15, "raw_action_dim": 29}, "agibot_gear_gripper"),  # identical profiles
        ({"domain_name": "droid_lerobot", "domain_id": 8, "raw_action_dim": 10}, "droid_lerobot"),
        ({"domain_name": None, "domain_id": "6", "raw_action_dim": "10"}, "umi"),
    ],
)
def test_domains_by_name_or_by_id_and_width(distilled, parameters, domain):
    assert settings(distilled, **parameters).domain_name == domain


@pytest.mark.parametrize(
    "parameters, code, field",
    [
        ({"domain_name": None}, "missing_field", "parameters.domain_name"),
        ({"domain_name": "spaceship"}, "unknown_domain", "parameters.domain_name"),
        ({"domain_name": None, "domain_id": 99, "raw_action_dim": 7}, "unknown_domain", "parameters.domain_id"),
        ({"domain_name": None, "domain_id": 7}, "missing_field", "parameters.raw_action_dim"),
        ({"domain_name": None, "domain_id": 7, "raw_action_dim": 9}, "invalid_field", "parameters.raw_action_dim"),
        ({"domain_name": None, "domain_id": 8, "raw_action_dim": 10}, "invalid_field", "parameters.domain_id"),
        ({"domain_id": 7}, "invalid_field", "parameters.domain_id"),
        ({"raw_action_dim": 9}, "invalid_field", "parameters.raw_action_dim"),
        ({"domain_name": None, "domain_id": True, "raw_action_dim": 10}, "invalid_field", "parameters.domain_id"),
    ],
    ids=[
        "none",
        "unknown_name",
        "unknown_id",
        "id_without_width",
        "wrong_width",
        "ambiguous_id",
        "name_id_disagree",
        "name_width_disagree",
        "bool_id",
    ],
)
def test_domains_that_would_give_the_wrong_actions_are_refused(distilled, parameters, code, field):
    error = refused(envelope(png_b64(IMAGE), parameters=parameters), distilled)
    assert (error.code, error.field) == (code, field), error.message


def test_normalization_must_be_the_profiles(distilled):
    assert settings(distilled, action_normalization="meanstd").domain_name == "droid_lerobot"
    assert settings(distilled, action_normalization="mean_std").domain_name == "droid_lerobot"
    for value, domain in (("quantile", "droid_lerobot"), ("zscore", "droid_lerobot"), ("quantile", "umi")):
        error = refused(
            envelope(png_b64(IMAGE), parameters={"action_normalization": value, "domain_name": domain}), distilled
        )
        assert error.field == "parameters.action_normalization", error.message


def test_steps_guidance_and_seed(base, distilled):
    request = settings(base, num_inference_steps=12, guidance_scale=3.5, seed=11)
    assert (request.num_steps, request.guidance_scale, request.seed) == (12, 3.5, 11)
    assert settings(distilled, num_inference_steps=4, guidance_scale=1.0).num_steps == 4
    error = refused(envelope(png_b64(IMAGE), parameters={"num_inference_steps": 30}), distilled)
    assert error.field == "parameters.num_inference_steps"  # the distilled schedule, our check, relabeled
    assert (
        refused(envelope(png_b64(IMAGE), parameters={"guidance_scale": 4.0}), distilled).field
        == "parameters.guidance_scale"
    )
    assert refused(envelope(png_b64(IMAGE), parameters={"seed": -1}), distilled).field == "parameters.seed"
    assert (
        refused(envelope(png_b64(IMAGE), parameters={"num_inference_steps": "many"}), base).field
        == "parameters.num_inference_steps"
    )


def test_frame_rates(distilled):
    assert settings(distilled, fps=5).fps == 5.0
    assert settings(distilled, action_fps=10).fps == 10.0
    assert settings(distilled, fps=10, action_fps=10.0).fps == 10.0
    assert (
        refused(envelope(png_b64(IMAGE), parameters={"fps": 5, "action_fps": 10}), distilled).field
        == "parameters.action_fps"
    )
    assert refused(envelope(png_b64(IMAGE), parameters={"fps": 0}), distilled).field == "parameters.fps"


def test_null_parameters_are_absent_ones(distilled):
    request = settings(distilled, action_mode=None, seed=None, fps=None, num_inference_steps=None)
    assert (request.action_mode, request.seed, request.fps) == ("policy", None, 24.0)
    assert settings(distilled, action_mode=" Policy ").action_mode == "policy"  # SGLang strips and lowercases
    error = refused(envelope(png_b64(IMAGE), parameters={"action_mode": "teleport"}), distilled)
    assert (error.code, error.field) == ("invalid_field", "parameters.action_mode")  # as our flat form answers


def test_view_point(distilled):
    assert settings(distilled, action_view_point="wrist_view").view_point == "wrist_view"
    assert (
        refused(envelope(png_b64(IMAGE), parameters={"action_view_point": "satellite"}), distilled).field
        == "parameters.action_view_point"
    )


def test_height_and_width_name_a_tier(distilled):
    assert settings(distilled, height=480, width=832).resolution_tier == 480
    assert settings(distilled, height=256, width=256).resolution_tier == 256
    assert settings(distilled, height=720, width=1280).resolution_tier == 720
    error = refused(envelope(png_b64(IMAGE), parameters={"height": 500, "width": 500}), distilled)
    assert (error.code, error.field) == ("unsupported_tier", "parameters.height")
    error = refused(envelope(png_b64(IMAGE), parameters={"height": 480}), distilled)
    assert (error.code, error.field) == ("missing_field", "parameters.width")


def test_height_and_width_use_the_engines_canvases_when_described(distilled):
    described = replace(distilled, canvases=canvas_bins())  # diffusers' bins of every tier
    assert settings(described, height=640, width=640).resolution_tier == 480  # square canvas of tier 480
    assert settings(described, height=960, width=960).resolution_tier == 704  # both 704 and 720: the smaller
    assert settings(described, height=192, width=320).resolution_tier == 256
    error = refused(envelope(png_b64(IMAGE), parameters={"height": 480, "width": 480}), described)
    assert error.code == "unsupported_tier" and "832x480" in error.message


def test_guardrails_and_runtime_knobs(distilled):
    assert settings(distilled, use_guardrails=False).domain_name == "droid_lerobot"
    assert (
        refused(envelope(png_b64(IMAGE), parameters={"use_guardrails": True}), distilled).field
        == "parameters.use_guardrails"
    )
    for runtime in ({"prefix_cache": "auto", "cuda_graph": "AUTO"}, {}):
        parse({**envelope(png_b64(IMAGE)), "runtime": runtime}, distilled)
    for name, value in (
        ("prefix_cache", False),
        ("cuda_graph", True),
        ("response_format", "xml"),
        ("output_format", "arrow"),
        ("return_timing", "sometimes"),
    ):
        error = refused({**envelope(png_b64(IMAGE)), "runtime": {name: value}}, distilled)
        assert error.field == f"runtime.{name}", error.message


def test_response_and_output_formats(distilled):
    call = parse(envelope(png_b64(IMAGE)), distilled)
    assert (call.response_format, call.output_format, call.return_timing) == ("envelope", "list", False)
    assert parse(envelope(png_b64(IMAGE)), distilled, msgpack_reply=True).output_format == "numpy"
    body = {
        **envelope(png_b64(IMAGE)),
        "runtime": {"response_format": "RAW", "output_format": "numpy", "return_timing": True},
    }
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
    call, built = requests_of(
        envelope(png_b64(IMAGE), parameters={"candidate_count": 2, "return_candidates": True}), distilled
    )
    assert [request.seed for request in built] == [None, None]  # each drawn by the engine
    assert (
        len(
            parse(
                envelope(png_b64(IMAGE), parameters={"candidate_count": 1, "candidate_reducer": "none"}), distilled
            ).items
        )
        == 1
    )


@pytest.mark.parametrize(
    "parameters, image, max_items, field",
    [
        ({"candidate_count": 2}, [png_b64(IMAGE)] * 2, 4, "parameters.candidate_count"),
        ({"candidate_count": 5}, png_b64(IMAGE), 4, "parameters.candidate_count"),
        ({"candidate_count": 0}, png_b64(IMAGE), 4, "parameters.candidate_count"),
        ({"candidate_count": 2, "candidate_reducer": "mean"}, png_b64(IMAGE), 4, "parameters.candidate_reducer"),
        ({"candidate_count": 2, "return_candidates": False}, png_b64(IMAGE), 4, "parameters.return_candidates"),
        ({}, [png_b64(IMAGE)] * 5, 4, "input.observation.image"),
    ],
    ids=["with_batch", "over_limit", "zero", "mean_reducer", "reduced_only", "batch_over_limit"],
)
def test_candidate_requests_the_server_would_not_honour_are_refused(distilled, parameters, image, max_items, field):
    error = refused(envelope(image, parameters=parameters), distilled, max_items)
    assert (error.code, error.field) == ("invalid_field", field), error.message


# -- the multipart form ----------------------------------------------------------------------------------


def test_sglang_multipart_form_becomes_the_envelope(distilled):
    form = [
        ("request_id", "form-1"),
        ("prompt", "pick up the block"),
        ("input_reference", Upload(png_bytes(IMAGE), "image/png")),
        ("action_mode", "policy"),
        ("domain_name", "droid_lerobot"),
        ("num_inference_steps", "4"),
        ("seed", "5"),
        ("fps", "5"),
        ("extra_params", '{"action_horizon": 8}'),
        ("output_format", "numpy"),
    ]
    body = envelope_from_form(form)
    assert is_sglang_envelope(body)
    call, (request,) = requests_of(body, distilled)
    assert call.request_id == "form-1" and parse(body, distilled, msgpack_reply=True).output_format == "numpy"
    assert (request.prompt, request.num_steps, request.seed, request.fps, request.action_horizon) == (
        "pick up the block",
        4,
        5,
        5.0,
        8,
    )
    np.testing.assert_array_equal(request.image, IMAGE)


def test_form_detection_tells_sglang_forms_from_ours():
    native = ("domain_name", "action_mode", "image", "video", "prompt", "seed", "num_steps")
    assert not is_sglang_form(["image", "prompt", "domain_name"], native)
    assert is_sglang_form(["input_reference", "prompt", "domain_name"], native)
    assert is_sglang_form(["image_reference"], native)


@pytest.mark.parametrize(
    "form, field",
    [
        ([("prompt", "a"), ("prompt", "b")], "prompt"),
        ([("domain_name", Upload(b"x", "image/png"))], "domain_name"),
        (
            [
                ("image_reference", Upload(png_bytes(IMAGE), "image/png")),
                ("video_reference", Upload(b"x", "video/mp4")),
            ],
            "video_reference",
        ),
        ([("reference_url", "https://example.com/x.png")], "reference_url"),
        ([("generator_device", "cuda")], "generator_device"),
        ([("seed", "1"), ("extra_body", '{"seed": 2}')], "extra_body.seed"),
        ([("extra_params", "[1, 2]")], "extra_params"),
    ],
)
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
    assert envelope_from_form([("input_reference", base64.b64encode(b"x").decode())])["input"]["observation"] == {
        "input_reference": "eA=="
    }
