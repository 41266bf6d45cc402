"""Every bad request gets a typed error that names its field, before any model work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cosmos3_runtime.engine import Cosmos3Engine
from cosmos3_runtime.errors import (
    CheckpointError,
    InvalidRequestError,
    UnknownDomainError,
    UnsupportedModeError,
    UnsupportedTierError,
)
from cosmos3_runtime.profiles import NormalizationStats, load_profiles
from cosmos3_runtime.requests import ActionRequest, VideoRequest

IMAGE = np.zeros((64, 64, 3), np.uint8)


def _policy(**overrides):
    values = dict(domain_name="fractal", image=IMAGE)
    values.update(overrides)
    return ActionRequest(**values)


CASES = [
    ("unknown domain", _policy(domain_name="no_such_robot"), UnknownDomainError, "domain_name"),
    ("domain not a string", _policy(domain_name=7), UnknownDomainError, "domain_name"),
    ("unknown mode", _policy(action_mode="dance"), UnsupportedModeError, "action_mode"),
    ("mode not a string", _policy(action_mode=1), UnsupportedModeError, "action_mode"),
    ("forward_dynamics as actions", _policy(action_mode="forward_dynamics"), UnsupportedModeError, "action_mode"),
    ("missing image", _policy(image=None), InvalidRequestError, "image"),
    ("image and video", _policy(video=np.zeros((5, 64, 64, 3), np.uint8)), InvalidRequestError, "video"),
    ("image float", _policy(image=np.zeros((64, 64, 3), np.float32)), InvalidRequestError, "image"),
    ("image rank 2", _policy(image=np.zeros((64, 64), np.uint8)), InvalidRequestError, "image"),
    ("image RGBA", _policy(image=np.zeros((64, 64, 4), np.uint8)), InvalidRequestError, "image"),
    ("image too small", _policy(image=np.zeros((7, 64, 3), np.uint8)), InvalidRequestError, "image"),
    ("image too big", _policy(image=np.zeros((5000, 64, 3), np.uint8)), InvalidRequestError, "image"),
    ("image is a list", _policy(image=[[0, 0, 0]]), InvalidRequestError, "image"),
    ("horizon not a multiple", _policy(action_horizon=6), InvalidRequestError, "action_horizon"),
    ("horizon too long", _policy(action_horizon=128), InvalidRequestError, "action_horizon"),
    ("horizon zero", _policy(action_horizon=0), InvalidRequestError, "action_horizon"),
    ("horizon float", _policy(action_horizon=8.0), InvalidRequestError, "action_horizon"),
    ("tier unknown", _policy(resolution_tier=300), UnsupportedTierError, "resolution_tier"),
    ("view point", _policy(view_point="top_down"), InvalidRequestError, "view_point"),
    ("steps on distilled", _policy(num_steps=10), InvalidRequestError, "num_steps"),
    ("negative seed", _policy(seed=-1), InvalidRequestError, "seed"),
    ("prompt not text", _policy(prompt=b"bytes"), InvalidRequestError, "prompt"),
    ("fps zero", _policy(fps=0), InvalidRequestError, "fps"),
    ("inverse without clip", _policy(action_mode="inverse_dynamics"), InvalidRequestError, "video"),
    (
        "inverse clip length",
        _policy(action_mode="inverse_dynamics", image=None, action_horizon=8, video=np.zeros((5, 64, 64, 3), np.uint8)),
        InvalidRequestError,
        "video",
    ),
    (
        "clip rank",
        _policy(action_mode="inverse_dynamics", image=None, video=np.zeros((5, 64, 64), np.uint8)),
        InvalidRequestError,
        "video",
    ),
    ("prefix width", _policy(prefix_actions=np.zeros((2, 7), np.float32)), InvalidRequestError, "prefix_actions"),
    ("prefix too long", _policy(prefix_actions=np.zeros((16, 10), np.float32)), InvalidRequestError, "prefix_actions"),
    ("prefix NaN", _policy(prefix_actions=np.full((2, 10), np.nan, np.float32)), InvalidRequestError, "prefix_actions"),
    # Finite in float32, but it overflows once normalized (scale < 1): the caller's mistake, not engine_error.
    ("prefix 1e38", _policy(prefix_actions=np.full((2, 10), 1e38, np.float32)), InvalidRequestError, "prefix_actions"),
    ("fps above the limit", _policy(fps=1e9), InvalidRequestError, "fps"),
    ("fps tiny", _policy(fps=1e-300), InvalidRequestError, "fps"),
]


@pytest.mark.parametrize("name, request_, error, field", CASES, ids=[c[0] for c in CASES])
def test_bad_action_requests(tiny_engine, name, request_, error, field):
    engine = tiny_engine("distilled")
    with pytest.raises(error) as err:
        engine.predict_actions(request_)
    assert err.value.field == field
    assert err.value.code == error.code and err.value.message


def test_action_mode_is_trimmed_and_lower_cased(tiny_engine):
    engine = tiny_engine("distilled")
    chunk = engine.predict_actions(_policy(action_mode=" Policy\n", seed=0))
    assert chunk.action_mode == "policy"
    clip = np.zeros((17, 64, 64, 3), np.uint8)
    chunk = engine.predict_actions(_policy(action_mode="INVERSE_DYNAMICS", image=None, video=clip, seed=0))
    assert chunk.action_mode == "inverse_dynamics"
    with pytest.raises(UnsupportedModeError):
        engine.predict_actions(_policy(action_mode=" Forward_Dynamics "))


def test_edge_refuses_tiers_it_does_not_have(tiny_engine):
    with pytest.raises(UnsupportedTierError) as err:
        tiny_engine("edge").predict_actions(_policy(resolution_tier=720, num_steps=2))
    assert "256, 480" in err.value.message


def test_base_bounds_steps_guidance_and_interval(tiny_engine):
    base = tiny_engine("base")
    for bad, field in [
        (dict(num_steps=0), "num_steps"),
        (dict(guidance_scale=float("nan")), "guidance_scale"),
        (dict(guidance_interval=(0.8, 0.2)), "guidance_interval"),
    ]:
        with pytest.raises(InvalidRequestError) as err:
            base.predict_actions(_policy(**bad))
        assert err.value.field == field


def test_forward_dynamics_action_width_must_match_the_domain(tiny_engine):
    engine = tiny_engine("distilled")
    with pytest.raises(InvalidRequestError) as err:
        engine.rollout_video(VideoRequest(domain_name="fractal", image=IMAGE, actions=np.zeros((8, 7), np.float32)))
    assert err.value.field == "actions" and "width 7" in err.value.message
    with pytest.raises(InvalidRequestError) as err:
        engine.rollout_video(VideoRequest(domain_name="fractal", image=IMAGE, actions=np.zeros((6, 10), np.float32)))
    assert err.value.field == "actions"


def test_stats_formats(tmp_path):
    q = NormalizationStats.from_mapping({"q01": [-1.0, 0.0], "q99": [1.0, 4.0]}, "t")
    np.testing.assert_allclose(q.normalize(np.array([[1.0, 4.0], [-1.0, 0.0]])), [[1, 1], [-1, -1]])
    m = NormalizationStats.from_mapping({"global": {"action": {"mean": [1.0], "std": [2.0]}}}, "t")
    assert m.kind == "mean_std" and m.normalize(np.array([[3.0]]))[0, 0] == pytest.approx(1.0)
    mm = NormalizationStats.from_mapping({"min": [0.0], "max": [10.0]}, "t")
    raw = np.array([[2.5]], np.float32)
    np.testing.assert_allclose(mm.denormalize(mm.normalize(raw)), raw, atol=1e-6)
    with pytest.raises(CheckpointError, match="no q01/q99"):
        NormalizationStats.from_mapping({"p5": [0.0]}, "t")


def test_operator_profile_file_overrides_the_checkpoint(tiny_checkpoint, tmp_path):
    stats = tmp_path / "my_stats.json"
    stats.write_text(json.dumps({"global": {"min": [0.0] * 10, "max": [2.0] * 10}}))
    override = tmp_path / "profiles.json"
    override.write_text(
        json.dumps(
            {
                "domains": {
                    "bridge_orig_lerobot": {"default_horizon": 8, "normalization_file": "my_stats.json"},
                    "my_arm": {"domain_id": 30, "raw_action_dim": 7, "view_point": "wrist_view"},
                }
            }
        )
    )
    engine = Cosmos3Engine.load(tiny_checkpoint("distilled"), profiles_path=override)
    bridge = engine.spec.profiles["bridge_orig_lerobot"]
    assert bridge.default_horizon == 8 and bridge.normalization.kind == "min_max"
    assert bridge.view_point == "third_person_view"  # from the checkpoint, not overridden
    chunk = engine.predict_actions(ActionRequest(domain_name="my_arm", image=IMAGE, seed=0))
    assert chunk.actions.shape == (16, 7) and chunk.domain_id == 30


def test_profiles_that_the_action_head_cannot_represent_are_left_out(tiny_checkpoint, tmp_path):
    override = tmp_path / "profiles.json"
    override.write_text(
        json.dumps(
            {"domains": {"wide": {"domain_id": 3, "raw_action_dim": 99}, "far": {"domain_id": 40, "raw_action_dim": 4}}}
        )
    )
    profiles = load_profiles(
        tiny_checkpoint("distilled"), action_dim=64, num_domains=32, override_file=override
    ).domains
    assert "wide" not in profiles and "far" not in profiles and "fractal" in profiles


def test_broken_profile_files_are_checkpoint_errors(tiny_checkpoint, tmp_path):
    bad = tmp_path / "bad.json"
    for content in (
        "{not json",
        json.dumps({"nope": 1}),
        json.dumps({"domains": {"x": {"domain_id": 1}}}),
        json.dumps({"domains": {"fractal": {"normalization": {"q01": [0.0], "q99": [1.0]}}}}),
    ):
        bad.write_text(content)
        with pytest.raises(CheckpointError):
            load_profiles(tiny_checkpoint("distilled"), action_dim=64, num_domains=32, override_file=bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_profiles(
            tiny_checkpoint("distilled"), action_dim=64, num_domains=32, override_file=tmp_path / "missing.json"
        )
