"""Policy profiles read from the checkpoint's files: their format, the defaults they set, the caption
formats they select, the gripper they flip."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from cosmos3_runtime.checkpoints import inspect_checkpoint
from cosmos3_runtime.description import EngineSpec, ModelDescription
from cosmos3_runtime.engine import Cosmos3Engine
from cosmos3_runtime.errors import CheckpointError, InvalidRequestError
from cosmos3_runtime.profiles import load_profiles, profiles_for_checkpoint
from cosmos3_runtime.requests import ActionRequest
from cosmos3_runtime.sampling import action_caption
from cosmos3_runtime.validation import job_for_actions

IMAGE = np.zeros((64, 64, 3), np.uint8)
WRIST_ON_TOP = "The top row is from the wrist-mounted camera."
DROID_LIKE = {
    "action_space": "joint_pos",
    "raw_action_dim": 8,
    "default_horizon": 32,
    "fps": 15,
    "resolution_tier": 480,
    "view_point": "concat_view",
    "view_description": WRIST_ON_TOP,
    "prompt_format": "json",
    "guidance_interval": [960, 1001],
    "gripper_flip_index": 7,
    "normalization": "none",
}


def _profile_file(tmp_path, domains, **top):
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"domains": domains, **top}))
    return path


def _spec(checkpoint, override) -> EngineSpec:
    """The engine's spec for ``checkpoint`` with ``override`` merged, from config files only (no weights)."""
    info = inspect_checkpoint(checkpoint)
    return EngineSpec.for_checkpoint(info, profiles_for_checkpoint(checkpoint, info, override))


def test_a_droid_profile_parses_with_every_field(tiny_checkpoint, tmp_path):
    override = _profile_file(tmp_path, {"droid_lerobot": DROID_LIKE}, default_domain="droid_lerobot")
    table = load_profiles(tiny_checkpoint("base"), action_dim=64, num_domains=32, override_file=override)
    p = table.domains["droid_lerobot"]
    assert table.default_domain == "droid_lerobot"
    assert (p.domain_id, p.action_space, p.raw_action_dim, p.default_horizon, p.fps, p.resolution_tier) == (
        8,
        "joint_pos",
        8,
        32,
        15.0,
        480,
    )  # the domain id comes from diffusers' table
    assert (p.view_point, p.view_description, p.prompt_format, p.gripper_flip_index) == (
        "concat_view",
        WRIST_ON_TOP,
        "json",
        7,
    )
    # "none" overrides the mean/std statistics the tiny checkpoint ships for this domain.
    assert p.normalization is None
    # NVIDIA's Edge DROID interval, written in timesteps, is kept in sigmas (none exceeds 1).
    assert p.guidance_interval == pytest.approx((0.96, 1.0))


@pytest.mark.parametrize(
    "normalization, kind",
    [
        ("none", None),
        (None, None),
        ({"q01": [-1.0] * 8, "q99": [1.0] * 8}, "quantile"),
        ({"global": {"action": {"mean": [0.0] * 8, "std": [2.0] * 8}}}, "mean_std"),
        ({"min": [0.0] * 8, "max": [4.0] * 8}, "min_max"),
    ],
)
def test_normalization_none_quantile_and_mean_std(tiny_checkpoint, tmp_path, normalization, kind):
    override = _profile_file(tmp_path, {"droid_lerobot": {**DROID_LIKE, "normalization": normalization}})
    stats = (
        load_profiles(tiny_checkpoint("base"), action_dim=64, num_domains=32, override_file=override)
        .domains["droid_lerobot"]
        .normalization
    )
    assert (stats.kind if stats is not None else None) == kind


def test_normalization_from_its_own_file(tiny_checkpoint, tmp_path):
    (tmp_path / "stats.json").write_text(json.dumps({"action": {"q01": [0.0] * 8, "q99": [2.0] * 8}}))
    droid = {key: value for key, value in DROID_LIKE.items() if key != "normalization"}
    override = _profile_file(tmp_path, {"droid_lerobot": {**droid, "normalization_file": "stats.json"}})
    p = load_profiles(tiny_checkpoint("base"), action_dim=64, num_domains=32, override_file=override).domains[
        "droid_lerobot"
    ]
    assert p.normalization.kind == "quantile"
    np.testing.assert_allclose(p.normalization.normalize(np.full((1, 8), 2.0)), 1.0)


BAD_PROFILES = [
    ({"droid_lerobot": {**DROID_LIKE, "use_stat": True}}, {}, "unknown key"),
    ({"droid_lerobot": {**DROID_LIKE, "view_point": "top_down"}}, {}, "view_point"),
    ({"droid_lerobot": {**DROID_LIKE, "prompt_format": "yaml"}}, {}, "prompt_format"),
    ({"droid_lerobot": {**DROID_LIKE, "resolution_tier": 300}}, {}, "resolution_tier"),
    ({"droid_lerobot": {**DROID_LIKE, "fps": 0}}, {}, "fps"),
    ({"droid_lerobot": {**DROID_LIKE, "fps": True}}, {}, "fps"),
    ({"droid_lerobot": {**DROID_LIKE, "gripper_flip_index": 8}}, {}, "gripper_flip_index"),
    ({"droid_lerobot": {**DROID_LIKE, "guidance_interval": [0.9, 0.1]}}, {}, "guidance_interval"),
    ({"droid_lerobot": {**DROID_LIKE, "guidance_interval": "late"}}, {}, "guidance_interval"),
    ({"droid_lerobot": {**DROID_LIKE, "normalization": "zscore"}}, {}, "normalization"),
    ({"droid_lerobot": {**DROID_LIKE, "view_description": ""}}, {}, "view_description"),
    ({"droid_lerobot": {**DROID_LIKE, "default_horizon": "32"}}, {}, "default_horizon"),
    ({"droid_lerobot": DROID_LIKE}, {"default_domain": "franka"}, "default_domain"),
    ({"droid_lerobot": DROID_LIKE}, {"robots": {}}, "unknown top-level"),
]


@pytest.mark.parametrize(
    "domains, top, match", BAD_PROFILES, ids=[m + str(i) for i, (_, _, m) in enumerate(BAD_PROFILES)]
)
def test_bad_profiles_are_refused_naming_the_problem(tiny_checkpoint, tmp_path, domains, top, match):
    override = _profile_file(tmp_path, domains, **top)
    with pytest.raises(CheckpointError, match=match):
        load_profiles(tiny_checkpoint("base"), action_dim=64, num_domains=32, override_file=override)


def test_a_profile_the_variant_cannot_serve_is_refused_at_load(tiny_checkpoint, tmp_path):
    edge = tiny_checkpoint("edge-distilled")
    with pytest.raises(CheckpointError, match="resolution tier 720"):
        _spec(edge, _profile_file(tmp_path, {"droid_lerobot": {**DROID_LIKE, "resolution_tier": 720}}))
    with pytest.raises(CheckpointError, match="default_horizon"):
        _spec(edge, _profile_file(tmp_path, {"droid_lerobot": {**DROID_LIKE, "default_horizon": 30}}))


def test_profile_settings_are_the_domain_defaults_and_requests_still_win(tiny_checkpoint, tmp_path):
    spec = _spec(
        tiny_checkpoint("base"), _profile_file(tmp_path, {"droid_lerobot": DROID_LIKE}, default_domain="droid_lerobot")
    )
    job, _ = job_for_actions(
        ActionRequest(domain_name="droid_lerobot", image=IMAGE, seed=0), ModelDescription.of_spec(spec, "tiny")
    )
    assert (
        job.horizon,
        job.settings.fps,
        job.settings.resolution_tier,
        job.settings.view_point,
        job.prompt_format,
    ) == (
        32,
        15.0,
        480,
        "concat_view",
        "json",
    )
    assert job.view_description == WRIST_ON_TOP and job.settings.guidance_interval == pytest.approx((0.96, 1.0))
    assert (job.settings.num_steps, job.settings.guidance_scale) == (35, 6.0)  # the variant's
    job, _ = job_for_actions(
        ActionRequest(
            domain_name="droid_lerobot",
            image=IMAGE,
            seed=0,
            action_horizon=8,
            fps=30.0,
            resolution_tier=256,
            view_point="wrist_view",
            guidance_interval=(0.0, 1.0),
        ),
        ModelDescription.of_spec(spec, "tiny"),
    )
    assert (
        job.horizon,
        job.settings.fps,
        job.settings.resolution_tier,
        job.settings.view_point,
        job.settings.guidance_interval,
    ) == (
        8,
        30.0,
        256,
        "wrist_view",
        (0.0, 1.0),
    )
    assert job.view_description is None  # it describes the concat layout, not the wrist camera
    # A request that names nothing runs the named default domain, with its own view point and tier.
    defaults = spec.model_defaults()
    assert (defaults.domain_name, defaults.view_point, defaults.resolution_tier) == (
        "droid_lerobot",
        "concat_view",
        480,
    )
    # Distilled checkpoints run without guidance, so a profile's interval does not apply there.
    distilled = _spec(tiny_checkpoint("distilled"), _profile_file(tmp_path, {"droid_lerobot": DROID_LIKE}))
    assert distilled.defaults_for(distilled.profiles["droid_lerobot"]).guidance_interval is None


def test_the_profiles_guidance_interval_is_the_one_run(tiny_checkpoint, tmp_path, camera_image):
    engine = Cosmos3Engine.load(
        tiny_checkpoint("base"), profiles_path=_profile_file(tmp_path, {"fractal": {"guidance_interval": [0.9, 1.0]}})
    )
    forwards = []
    hook = engine.pipe.transformer.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        request = dict(
            domain_name="fractal", image=camera_image, seed=2, num_steps=4, guidance_scale=3.0, action_horizon=8
        )
        by_profile = engine.predict_actions(ActionRequest(**request))
        count = len(forwards)
        explicit = engine.predict_actions(ActionRequest(**request, guidance_interval=(0.9, 1.0)))
        everywhere = engine.predict_actions(ActionRequest(**request, guidance_interval=(0.0, 1.0)))
    finally:
        hook.remove()
    assert 4 < by_profile.transformer_forwards < 8 and count == by_profile.transformer_forwards
    assert explicit.transformer_forwards == by_profile.transformer_forwards and everywhere.transformer_forwards == 8
    np.testing.assert_array_equal(by_profile.actions, explicit.actions)


def test_a_flipped_gripper_is_flipped_on_the_way_in_and_out(tiny_engine, tiny_checkpoint, tmp_path, camera_image):
    plain = tiny_engine("distilled")
    flipped = Cosmos3Engine.load(
        tiny_checkpoint("distilled"), profiles_path=_profile_file(tmp_path, {"fractal": {"gripper_flip_index": 9}})
    )
    request = dict(domain_name="fractal", image=camera_image, seed=4)
    a = plain.predict_actions(ActionRequest(**request)).actions
    b = flipped.predict_actions(ActionRequest(**request)).actions
    np.testing.assert_allclose(b[:, :9], a[:, :9], atol=1e-6)
    np.testing.assert_allclose(b[:, 9], 1.0 - a[:, 9], atol=1e-6)
    # Raw actions sent in (a real-time-chunking prefix) are in the robot's convention and come back unchanged.
    prefix = np.tile(np.linspace(0.0, 0.9, 10, dtype=np.float32), (3, 1))
    chunk = flipped.predict_actions(ActionRequest(**request, prefix_actions=prefix)).actions
    np.testing.assert_allclose(chunk[:3], prefix, atol=1e-5)


def test_json_captions_tokenize_exactly_as_diffusers_does(tiny_engine):
    engine = tiny_engine("distilled")
    job, _ = job_for_actions(
        ActionRequest(domain_name="bridge_orig_lerobot", image=IMAGE, seed=0, prompt="pick up the red cube"),
        engine.description,
    )
    ours = engine.sampler.tokenize(job, 256, 256)
    theirs = engine.pipe.tokenize_prompt(
        "pick up the red cube",
        None,
        num_frames=17,
        height=256,
        width=256,
        fps=24.0,
        action_mode="policy",
        action_view_point="third_person_view",
    )
    assert ours == theirs


def _caption_job(engine, prompt, **fields):
    """A job of a 33-frame clip at 15 fps in the concat view (a DROID-like caption), ``fields`` replaced."""
    job, _ = job_for_actions(
        ActionRequest(domain_name="bridge_orig_lerobot", image=IMAGE, prompt=prompt), engine.description
    )
    settings = dataclasses.replace(job.settings, action_horizon=32, fps=15.0, view_point="concat_view")
    return dataclasses.replace(job, settings=settings, **fields)


def test_a_view_description_extends_the_json_framing(tiny_engine):
    engine = tiny_engine("distilled")
    pipe = engine.pipe
    plain = json.loads(action_caption(pipe, _caption_job(engine, "open the drawer", prompt_format="json"), 480, 832))
    described = json.loads(
        action_caption(
            pipe,
            _caption_job(engine, "open the drawer", prompt_format="json", view_description=WRIST_ON_TOP),
            480,
            832,
        )
    )
    assert described["cinematography"]["framing"] == plain["cinematography"]["framing"] + " " + WRIST_ON_TOP
    assert {k: v for k, v in described.items() if k != "cinematography"} == {
        k: v for k, v in plain.items() if k != "cinematography"
    }


def test_prose_captions_are_cosmos_frameworks_sentences(tiny_engine):
    engine = tiny_engine("distilled")
    pipe = engine.pipe

    def prose(prompt, view_description):
        job = _caption_job(engine, prompt, prompt_format="prose", view_description=view_description)
        return action_caption(pipe, job, 480, 832)

    assert prose("pick up the cube", WRIST_ON_TOP) == (
        "pick up the cube. This video contains concatenated views from multiple camera perspectives. "
        "The top row is from the wrist-mounted camera. The video is 2.0 seconds long and is of 15 FPS. "
        "This video is of 480x832 resolution."
    )
    assert prose("Open the drawer. ", None).startswith("Open the drawer. This video contains")
    assert prose("", None) == ""


def test_the_profiles_prompt_format_is_what_the_model_reads(tiny_checkpoint, tmp_path):
    spec = _spec(
        tiny_checkpoint("distilled"),
        _profile_file(tmp_path, {"fractal": {"prompt_format": "prose", "view_point": "wrist_view"}}),
    )
    job, _ = job_for_actions(
        ActionRequest(domain_name="fractal", image=IMAGE, seed=0, prompt="wipe the table"),
        ModelDescription.of_spec(spec, "tiny"),
    )
    assert job.prompt_format == "prose"
    engine = Cosmos3Engine.load(tiny_checkpoint("distilled"))
    cond, uncond = engine.sampler.tokenize(job, 256, 256)
    text = engine.pipe.text_tokenizer.decode(cond)
    assert "wipe the table. This video is captured from a wrist-mounted camera. The video is 0.0 seconds" in text
    assert (
        "{" not in text
        and uncond
        == engine.pipe.tokenize_prompt("", None, num_frames=17, height=256, width=256, action_mode="policy")[1]
    )


def _hub_snapshot(checkpoint, tmp_path, repo):
    """``checkpoint`` copied to where the Hub's cache keeps ``repo``, without any profile file: what a user
    who serves NVIDIA's repo id has on disk."""
    import shutil

    folder = tmp_path / ("models--" + repo.replace("/", "--")) / "snapshots" / "0123abc"
    shutil.copytree(checkpoint, folder, ignore=shutil.ignore_patterns("policy_profiles.json", "checkpoint.json"))
    return folder


@pytest.mark.parametrize(
    "variant,repo,interval,forwards",
    [
        ("base", "nvidia/Cosmos3-Nano-Policy-DROID", None, 8),
        ("edge", "nvidia/Cosmos3-Edge-Policy-DROID", (0.96, 1.0), 5),
    ],
)
def test_nvidias_droid_policies_are_served_with_nvidias_settings_and_no_profile_file(
    tiny_checkpoint, tmp_path, variant, repo, interval, forwards
):
    folder = _hub_snapshot(tiny_checkpoint(variant), tmp_path, repo)
    info = inspect_checkpoint(folder)
    description = ModelDescription.of_spec(EngineSpec.for_checkpoint(info, profiles_for_checkpoint(folder, info)), repo)
    assert description.defaults.domain_name == "droid_lerobot"
    droid, defaults = description.domains["droid_lerobot"], description.domain_defaults["droid_lerobot"]
    assert (droid.raw_action_dim, droid.use_state, droid.gripper_flip_index, droid.normalization) == (8, True, 7, None)
    assert (defaults.action_horizon, defaults.fps, defaults.resolution_tier, defaults.view_point) == (
        32,
        15.0,
        480,
        "concat_view",
    )
    assert (defaults.num_steps, defaults.guidance_scale, defaults.shift) == (4, 3.0, 5.0)
    assert defaults.guidance_interval == (pytest.approx(interval) if interval else None)
    assert description.chunk_forwards["droid_lerobot"] == forwards
    # Named by its Hub id, from any folder, it is recognised too.
    plain = tmp_path / "plain"
    plain.mkdir()
    moved = _hub_snapshot(tiny_checkpoint(variant), plain, "someone/else")
    assert profiles_for_checkpoint(moved, info, source=repo).default_domain == "droid_lerobot"


def test_another_checkpoint_gets_no_droid_contract_and_an_operator_file_overrides_it(tiny_checkpoint, tmp_path):
    other = _hub_snapshot(tiny_checkpoint("base"), tmp_path, "someone/Cosmos3-finetune")
    info = inspect_checkpoint(other)
    droid = profiles_for_checkpoint(other, info).domains["droid_lerobot"]
    assert droid.raw_action_dim == 10 and droid.num_steps is None  # diffusers' table, nothing of NVIDIA's
    nvidia = _hub_snapshot(tiny_checkpoint("base"), tmp_path / "n", "nvidia/Cosmos3-Nano-Policy-DROID")
    override = _profile_file(tmp_path, {"droid_lerobot": {"num_steps": 8, "guidance_scale": 2.0}})
    table = profiles_for_checkpoint(nvidia, info, override)
    assert (table.domains["droid_lerobot"].num_steps, table.domains["droid_lerobot"].guidance_scale) == (8, 2.0)
    assert table.domains["droid_lerobot"].shift == 5.0  # the rest of NVIDIA's contract stays


def test_a_prefix_longer_than_the_trained_one_is_clamped_not_refused(tiny_checkpoint, tmp_path, camera_image):
    """A policy trained with prefixes of at most ``max_prefix`` rows, asked to continue a longer one (the robot's
    delay grew), is conditioned on the first ``max_prefix`` rows only: no error, the rows after the prefix are
    those of a request that sent only the trained rows, and the reply still starts with every row sent (the
    robot executes them whatever the model does). ``max_prefix`` 0 (trained without prefixes) generates as
    without a prefix."""
    clamped = Cosmos3Engine.load(
        tiny_checkpoint("distilled"), profiles_path=_profile_file(tmp_path, {"fractal": {"max_prefix": 4}})
    )
    assert clamped.spec.profiles["fractal"].max_prefix == 4
    request = dict(domain_name="fractal", image=camera_image, seed=4)
    prefix = np.linspace(-0.04, 0.04, 120, dtype=np.float32).reshape(12, 10)
    long = clamped.predict_actions(ActionRequest(**request, prefix_actions=prefix)).actions
    short = clamped.predict_actions(ActionRequest(**request, prefix_actions=prefix[:4])).actions
    assert long.shape == (16, 10)
    np.testing.assert_array_equal(long[:12], prefix)
    np.testing.assert_array_equal(long[12:], short[12:])
    unclamped = Cosmos3Engine.load(tiny_checkpoint("distilled"), profiles_path=_profile_file(tmp_path, {"fractal": {}}))
    whole = unclamped.predict_actions(ActionRequest(**request, prefix_actions=prefix)).actions
    assert np.abs(whole[12:] - long[12:]).max() > 1e-3  # without the bound, all 12 rows condition the rest
    (tmp_path / "none").mkdir()
    untrained = Cosmos3Engine.load(
        tiny_checkpoint("distilled"),
        profiles_path=_profile_file(tmp_path / "none", {"fractal": {"max_prefix": 0}}),
    )
    ignored = untrained.predict_actions(ActionRequest(**request, prefix_actions=prefix)).actions
    plain = untrained.predict_actions(ActionRequest(**request)).actions
    np.testing.assert_array_equal(ignored[:12], prefix)
    np.testing.assert_array_equal(ignored[12:], plain[12:])
    # Still checked whole before the clamp: a prefix as long as the chunk is refused, as without a bound.
    with pytest.raises(InvalidRequestError) as err:
        clamped.predict_actions(ActionRequest(**request, prefix_actions=np.zeros((16, 10), np.float32)))
    assert err.value.field == "prefix_actions"
