"""SGLang's ``/v1/videos`` field names onto ours: each field honoured or refused, never ignored.

Mapped fields go through our own submission checks (:func:`policy_server.http.requests.video_submission`)
against the real tiny checkpoint's ``describe()``, as the route will run them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sglang_fixtures import distilled, load_cases  # noqa: F401
from sidecar_fixtures import actions, png_b64, png_bytes, rgb

from policy_server.foundation.api_errors import ApiError
from policy_server.http.codecs import IMAGE_UPLOAD_TYPES, Upload, decode_multipart_fields
from policy_server.http.requests import video_submission
from policy_server.sglang.parameters import video_fields

FPS = 24.0  # VideoCreateParams' default rate


def sglang_body(**fields):
    """A forward_dynamics job in SGLang's names: 8 actions of bridge_orig_lerobot (domain_id 7, 10 wide)."""
    return {
        "prompt": "push the cube",
        "input_reference": png_b64(rgb(64)),
        "action": actions(8),
        "action_mode": "forward_dynamics",
        "domain_id": 7,
        "raw_action_dim": 10,
        **fields,
    }


def submit(body, description):
    mapped = video_fields(body, description, default_fps=FPS)
    try:
        return video_submission(mapped.fields, description)
    except ApiError as exc:
        raise mapped.relabel(exc) from None


def refused(body, description):
    with pytest.raises(ApiError) as info:
        submit(body, description)
    return info.value


def test_an_sglang_forward_dynamics_job_maps_every_field(distilled):
    body = sglang_body(
        num_inference_steps=4,
        guidance_scale=1.0,
        seed=9,
        fps=12,
        action_fps=12,
        action_view_point="third_person_view",
        action_normalization="quantile",
        num_frames=9,
        size="256x256",
        seconds=0.75,
        negative_prompt="",
        n=1,
        use_guardrails=False,
    )
    params = submit(body, distilled).params
    assert params["domain_name"] == "bridge_orig_lerobot"
    assert (params["num_steps"], params["guidance_scale"], params["seed"], params["fps"]) == (4, 1.0, 9, 12.0)
    assert (params["view_point"], params["resolution_tier"], params["action_shape"]) == (
        "third_person_view",
        256,
        [8, 10],
    )
    assert params["prompt"] == "push the cube"


def test_our_own_names_still_work_and_meet_sglangs(distilled):
    params = submit(
        {
            "input_reference": png_b64(rgb(64)),
            "action": actions(8),
            "domain_name": "bridge_orig_lerobot",
            "num_steps": 4,
            "view_point": "ego_view",
            "resolution_tier": 256,
        },
        distilled,
    ).params
    assert (params["num_steps"], params["view_point"], params["resolution_tier"]) == (4, "ego_view", 256)
    assert submit(sglang_body(num_steps=4, num_inference_steps=4), distilled).params["num_steps"] == 4
    assert refused(sglang_body(num_steps=4, num_inference_steps=3), distilled).field == "num_inference_steps"
    assert (
        refused(sglang_body(view_point="ego_view", action_view_point="wrist_view"), distilled).field
        == "action_view_point"
    )


def test_extra_params_and_extra_body(distilled):
    for name in ("extra_params", "extra_body", "extra_json"):
        for extra in ({"seed": 5}, json.dumps({"seed": 5})):
            assert submit(sglang_body(**{name: extra}), distilled).params["seed"] == 5
    nested = sglang_body(extra_body={"extra_params": {"seed": 6}})
    assert submit(nested, distilled).params["seed"] == 6
    assert submit(sglang_body(seed=5, extra_params={"seed": 5}), distilled).params["seed"] == 5
    assert refused(sglang_body(seed=5, extra_params={"seed": 6}), distilled).field == "extra_params.seed"
    assert refused(sglang_body(extra_body="{not json"), distilled).field == "extra_body"
    assert refused(sglang_body(extra_body=[1]), distilled).field == "extra_body"


def test_sglang_multipart_form(distilled):
    items = [
        ("prompt", "push"),
        ("input_reference", Upload(png_bytes(rgb(64)), "image/png")),
        ("action", json.dumps(actions(8))),
        ("domain_id", "7"),
        ("raw_action_dim", "10"),
        ("num_inference_steps", "4"),
        ("num_frames", "9"),
        ("fps", "12"),
        ("seconds", "0.75"),
        ("extra_body", json.dumps({"seed": 3, "action_normalization": "quantile"})),
    ]
    fields = decode_multipart_fields(items, {"input_reference": IMAGE_UPLOAD_TYPES})
    params = submit(fields, distilled).params
    assert (params["domain_name"], params["num_steps"], params["seed"], params["fps"]) == (
        "bridge_orig_lerobot",
        4,
        3,
        12.0,
    )


@pytest.mark.parametrize(
    "fields, code, field",
    [
        ({"num_frames": 8}, "invalid_field", "num_frames"),
        ({"seconds": 4}, "invalid_field", "seconds"),
        ({"fps": 12, "action_fps": 24}, "invalid_field", "action_fps"),
        ({"size": "500x500"}, "unsupported_tier", "size"),
        ({"size": "wide"}, "invalid_field", "size"),
        ({"size": "256x256", "height": 480, "width": 832}, "invalid_field", "size"),
        ({"height": 480}, "missing_field", "width"),
        ({"size": "832x480", "resolution_tier": 256}, "invalid_field", "size"),
        ({"negative_prompt": "blurry"}, "invalid_field", "negative_prompt"),
        ({"n": 2}, "invalid_field", "n"),
        ({"num_outputs_per_prompt": 3}, "invalid_field", "num_outputs_per_prompt"),
        ({"use_guardrails": True}, "invalid_field", "use_guardrails"),
        ({"guardrails": "true"}, "invalid_field", "guardrails"),
        ({"raw_action_dim": 9}, "invalid_field", "raw_action_dim"),
        ({"domain_id": 8}, "invalid_field", "domain_id"),
        ({"domain_id": 99}, "unknown_domain", "domain_id"),
        ({"action_normalization": "minmax"}, "invalid_field", "action_normalization"),
        ({"video_url": "https://example.com/in.mp4"}, "invalid_field", "video_url"),
        ({"reference_url": "https://example.com/in.png"}, "invalid_field", "reference_url"),
        ({"generator_device": "cuda"}, "invalid_field", "generator_device"),
        ({"action_mode": "policy"}, "unsupported_mode", "action_mode"),
        ({"num_inference_steps": 30}, "invalid_field", "num_inference_steps"),
        ({"action_view_point": "satellite"}, "invalid_field", "action_view_point"),
        ({"input_reference": "frame.png"}, "invalid_image", "input_reference"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_what_the_runtime_cannot_honour_is_refused(distilled, fields, code, field):
    error = refused(sglang_body(**fields), distilled)
    assert (error.code, error.field) == (code, field), error.message


def test_domain_defaults_and_checks_without_an_id(distilled):
    body = {"input_reference": png_b64(rgb(64)), "action": actions(8)}
    assert submit(body, distilled).params["domain_name"] == distilled.defaults.domain_name
    assert submit({**body, "raw_action_dim": 10}, distilled).params["domain_name"] == "bridge_orig_lerobot"
    assert refused({**body, "raw_action_dim": 9}, distilled).field == "raw_action_dim"
    assert (
        refused(
            {**body, "domain_name": "umi", "action": actions(8, dim=10), "action_normalization": "quantile"}, distilled
        ).field
        == "action_normalization"
    )  # umi has no statistics here


def test_seconds_and_num_frames_agree_with_the_actions(distilled):
    assert submit(sglang_body(num_frames=9, seconds=9 / 24), distilled).params["action_shape"] == [8, 10]
    error = refused(sglang_body(seconds=4), distilled)
    assert "9 frames at 24 fps = 0.375 s" in error.message
    array_body = sglang_body(action=np.asarray(actions(8), np.float32), num_frames=10)
    assert refused(array_body, distilled).field == "num_frames"


@pytest.mark.parametrize("recorded", load_cases("video_requests"), ids=lambda c: c["name"])
def test_sglangs_recorded_video_requests_are_refused_by_name(distilled, recorded):
    """SGLang's Cosmos3 video tests exercise sound, control and video-to-video inputs this runtime has not."""
    body = recorded["body"]
    if recorded["encoding"] == "multipart":
        body = decode_multipart_fields(list(body.items()), {"input_reference": IMAGE_UPLOAD_TYPES})
    error = refused(body, distilled)
    assert error.code in ("invalid_field", "unsupported_mode") and error.field in body
    assert error.field in error.message
