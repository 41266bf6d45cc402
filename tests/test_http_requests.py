"""The sidecar's request checks, in process (no server): decoded fields against the loaded model.

:func:`~policy_server.http.requests.action_request` and :func:`~policy_server.http.requests.video_submission`
take the fields a body decoded to and the typed model description (here the tiny engine's ``describe()``),
and return the engine request or the stored job's params, or refuse with the code and field to fix.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
from sglang_fixtures import base, distilled  # noqa: F401 - fixtures
from sidecar_fixtures import png_b64, rgb

from policy_server.foundation.api_errors import ApiError, HttpErrorCode
from policy_server.foundation.camera_intake import model_frame_limits
from policy_server.http.requests import VIDEO_SETTINGS, action_request, actions_payload, video_submission
from robot_clients.protocol import ErrorCode, FrameLimits

DOMAIN = "bridge_orig_lerobot"  # raw_action_dim 10 in the tiny checkpoints


def refused(call, *args) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)
    return caught.value


# -- POST /v1/actions/generations ---------------------------------------------------------------------------


def test_an_image_becomes_a_policy_request_with_the_given_settings(distilled):
    request = action_request(
        {"domain_name": DOMAIN, "image": png_b64(rgb(32)), "action_horizon": 8, "seed": 5, "prompt": "pick"}, distilled
    )
    assert (request.domain_name, request.action_mode, request.action_horizon, request.seed, request.prompt) == (
        DOMAIN,
        "policy",
        8,
        5,
        "pick",
    )
    assert request.image.shape == (32, 32, 3) and request.video is None


def test_a_video_makes_an_inverse_dynamics_request(distilled):
    clip = np.zeros((5, 16, 16, 3), dtype=np.uint8)  # 5 frames: 4 actions between them
    request = action_request({"domain_name": DOMAIN, "video": clip, "action_mode": "inverse_dynamics"}, distilled)
    assert request.action_mode == "inverse_dynamics" and request.video.shape == (5, 16, 16, 3)


def test_an_unset_domain_takes_the_models_default(distilled):
    request = action_request({"image": png_b64(rgb(16))}, distilled)
    assert request.domain_name == distilled.defaults.domain_name


@pytest.mark.parametrize(
    "fields, code, field",
    [
        ({"domain_name": "ur6", "image": "x"}, ErrorCode.UNKNOWN_DOMAIN, "domain_name"),
        ({"domain_name": DOMAIN}, ErrorCode.MISSING_FIELD, "image"),
        ({"domain_name": DOMAIN, "action_mode": "inverse_dynamics"}, ErrorCode.MISSING_FIELD, "video"),
        (
            {"domain_name": DOMAIN, "image": "x", "action_mode": "forward_dynamics"},
            ErrorCode.UNSUPPORTED_MODE,
            "action_mode",
        ),
        ({"domain_name": DOMAIN, "image": "x", "colour": "red"}, ErrorCode.INVALID_FIELD, "colour"),
        ({"domain_name": DOMAIN, "image": "x", "model": "another"}, ErrorCode.INVALID_FIELD, "model"),
        ({"domain_name": DOMAIN, "image": "x", "resolution_tier": 123}, ErrorCode.UNSUPPORTED_TIER, "resolution_tier"),
        ({"domain_name": DOMAIN, "image": "x", "view_point": "top"}, ErrorCode.INVALID_FIELD, "view_point"),
        ({"domain_name": DOMAIN, "image": "x", "video": "y"}, ErrorCode.INVALID_FIELD, "video"),
        ({"domain_name": DOMAIN, "image": "not base64!"}, ErrorCode.INVALID_IMAGE, "image"),
    ],
)
def test_action_requests_the_model_cannot_serve_name_the_field(distilled, fields, code, field):
    if fields.get("image") == "x":  # images are decoded before the settings are checked: send a real one
        fields = {**fields, "image": png_b64(rgb(16))}
    error = refused(action_request, fields, distilled)
    assert (error.code, error.field) == (code, field), error.message


def test_forward_dynamics_on_the_action_endpoint_names_the_video_endpoint(distilled):
    error = refused(action_request, {"domain_name": DOMAIN, "image": "x", "action_mode": "forward_dynamics"}, distilled)
    assert "/v1/videos" in error.message


def test_prefix_actions_must_be_finite_numbers(distilled):
    error = refused(
        action_request,
        {"domain_name": DOMAIN, "image": png_b64(rgb(16)), "prefix_actions": [[float("inf")] * 10]},
        distilled,
    )
    assert (error.code, error.field) == (ErrorCode.INVALID_FIELD, "prefix_actions")


def test_the_sidecars_decoding_budget_is_applied(distilled):
    tight = model_frame_limits(distilled.limits, 1000)
    error = refused(action_request, {"domain_name": DOMAIN, "image": png_b64(rgb(64))}, distilled, tight)
    assert (error.code, error.field) == (HttpErrorCode.PAYLOAD_TOO_LARGE, "image")


def test_actions_payload_is_an_array_for_msgpack_and_lists_for_json():
    actions = np.arange(4, dtype=np.float64).reshape(2, 2)
    assert actions_payload(actions, True).dtype == np.float32
    assert actions_payload(actions, False) == [[0.0, 1.0], [2.0, 3.0]]


# -- POST /v1/videos ----------------------------------------------------------------------------------------


def _video_fields(**extra):
    return {"domain_name": DOMAIN, "input_reference": png_b64(rgb(32)), "action": [[0.0] * 10] * 8, **extra}


def test_a_video_submission_resolves_defaults_and_keeps_the_encoded_frame(distilled):
    submission = video_submission(_video_fields(seed=9), distilled)
    params = submission.params
    assert (params["domain_name"], params["seed"], params["action_shape"]) == (DOMAIN, 9, [8, 10])
    assert params["resolved"]["num_steps"] == distilled.defaults.num_steps
    assert submission.inputs.encoded_image == base64.b64decode(png_b64(rgb(32)))
    assert submission.inputs.image.shape == (32, 32, 3) and submission.inputs.action.dtype == np.float32


def test_a_stored_job_holds_the_tables_video_settings_and_the_defaults_its_object_shows(distilled):
    params = video_submission(_video_fields(seed=9, guidance_scale=1.0), distilled).params
    assert set(VIDEO_SETTINGS) <= set(params)  # every setting the endpoint takes, as the job will run it
    shown = {**params, **params["resolved"]}  # what the job object reads
    assert shown["guidance_scale"] == 1.0 and shown["seed"] == 9  # as sent
    defaults = distilled.defaults
    assert (shown["num_steps"], shown["resolution_tier"]) == (defaults.num_steps, defaults.resolution_tier)


def test_an_unseeded_submission_draws_and_stores_a_seed(distilled):
    assert isinstance(video_submission(_video_fields(), distilled).params["seed"], int)


@pytest.mark.parametrize(
    "extra, code, field",
    [
        ({"action": [[0.0] * 9] * 8}, ErrorCode.INVALID_FIELD, "action"),  # not raw_action_dim wide
        ({"action": [[0.0] * 10] * 7}, ErrorCode.INVALID_FIELD, "action"),  # not a multiple of 4 rows
        ({"action_mode": "policy"}, ErrorCode.UNSUPPORTED_MODE, "action_mode"),  # names the action endpoint
        ({"domain_name": "ur6"}, ErrorCode.UNKNOWN_DOMAIN, "domain_name"),
        ({"input_reference": "not base64!"}, ErrorCode.INVALID_IMAGE, "input_reference"),
        ({"prompt": "x" * 100_000}, ErrorCode.INVALID_FIELD, "prompt"),
    ],
)
def test_video_submissions_the_model_cannot_serve_name_the_field(distilled, extra, code, field):
    error = refused(video_submission, _video_fields(**extra), distilled)
    assert (error.code, error.field) == (code, field), error.message


def test_the_distilled_schedule_is_fixed_and_a_base_model_bounds_it(distilled, base):
    assert (
        refused(video_submission, _video_fields(num_steps=distilled.defaults.num_steps + 1), distilled).field
        == "num_steps"
    )
    steps = base.limits.max_steps
    assert video_submission(_video_fields(num_steps=steps), base).params["num_steps"] == steps
    assert refused(video_submission, _video_fields(num_steps=steps + 1), base).field == "num_steps"


def test_frame_limits_of_the_model_bound_the_first_frame(distilled):
    tiny = FrameLimits(min_image_side=64, max_image_side=4096, max_clip_frames=65)
    error = refused(video_submission, _video_fields(), distilled, tiny)
    assert (error.code, error.field) == (ErrorCode.INVALID_IMAGE, "input_reference")


def test_a_video_job_shows_the_sampler_settings_of_its_own_domain(tiny_checkpoint, tmp_path):
    """A domain whose profile sets its own steps and guidance: the job object shows what the rollout runs
    with, that domain's values (the engine resolves them so), not the default domain's."""
    import json

    from cosmos3_runtime.checkpoints import inspect_checkpoint
    from cosmos3_runtime.description import EngineSpec, ModelDescription
    from cosmos3_runtime.profiles import profiles_for_checkpoint
    from cosmos3_runtime.requests import VideoRequest
    from cosmos3_runtime.validation import job_for_video

    checkpoint = tiny_checkpoint("base")
    info = inspect_checkpoint(checkpoint)
    profiles = tmp_path / "profiles.json"
    other = "umi"  # 10 actions wide, as DOMAIN (the default domain) is
    profiles.write_text(json.dumps({"domains": {other: {"num_steps": 7, "guidance_scale": 2.5}}}))
    spec = EngineSpec.for_checkpoint(info, profiles_for_checkpoint(checkpoint, info, profiles))
    description = ModelDescription.of_spec(spec, str(checkpoint))
    assert description.defaults.domain_name == DOMAIN  # the default domain runs the variant's own sampler
    assert (description.defaults.num_steps, description.defaults.guidance_scale) != (7, 2.5)
    params = video_submission(_video_fields(seed=1, domain_name=other), description).params
    shown = {**params, **params["resolved"]}  # what the job object reads
    assert (shown["num_steps"], shown["guidance_scale"]) == (7, 2.5)
    request = VideoRequest(domain_name=other, image=rgb(32), actions=np.zeros((8, 10), np.float32))
    ran = job_for_video(request, description)[0].settings  # what the engine runs the rollout with
    assert (ran.num_steps, ran.guidance_scale) == (7, 2.5)
