"""Robot state conditioning: state rows become clean action frames in front of the chunk, positioned as
cosmos-framework trains them; the reply is the chunk alone, in the robot's gripper convention."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from diffusers.pipelines.cosmos import pipeline_cosmos3_omni as cosmos3
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

from cosmos3_runtime.engine import Cosmos3Engine, WarmupShape
from cosmos3_runtime.errors import InvalidFieldError, MissingFieldError
from cosmos3_runtime.requests import ActionRequest
from cosmos3_runtime.validation import job_for_actions

# fractal (width 10) conditioned on its state, the way the DROID policy is: the gripper (index 9) flipped,
# quantile statistics so that normalization is exercised too.
STATS = {"q01": [-2.0] * 10, "q99": [2.0] * 10}


def _engine(checkpoint, tmp_path, history_length, **profile) -> Cosmos3Engine:
    path = tmp_path / f"profiles-{history_length}.json"
    path.write_text(
        json.dumps(
            {
                "domains": {
                    "fractal": {
                        "use_state": True,
                        "history_length": history_length,
                        "gripper_flip_index": 9,
                        "normalization": STATS,
                        **profile,
                    }
                }
            }
        )
    )
    return Cosmos3Engine.load(checkpoint, profiles_path=path, prefix_cache_mb=0)


@pytest.fixture(scope="module")
def state_engine(tiny_checkpoint, tmp_path_factory):
    """A distilled engine whose fractal domain conditions on one state row."""
    return _engine(tiny_checkpoint("distilled"), tmp_path_factory.mktemp("profiles"), 1)


def _by_hand(state: np.ndarray) -> np.ndarray:
    """The profile's map to model space, written out: gripper flipped, then q01/q99 -> [-1, 1]."""
    rows = state.astype(np.float32).copy()
    rows[:, 9] = 1.0 - rows[:, 9]
    return rows / 2.0


def _reference(pipe, monkeypatch, state_rows, **call):
    """``Cosmos3OmniPipeline.__call__`` with cosmos-framework's state conditioning added by two patches.

    1. ``prepare_latents``: the state rows go in front of the action latents, marked clean in the action
       condition mask and listed as condition frames: how ``__call__`` holds forward_dynamics's actions.
    2. The action segment's positions: ``start_frame_offset = 1 - rows`` (the framework's
       ``action_start_frame_offset`` with that many history rows) instead of diffusers' 1.
    Returns all action rows, state rows first, in model space.
    """
    lead, original_prepare, original_ids = len(state_rows), pipe.prepare_latents, cosmos3.get_3d_mrope_ids_vae_tokens

    def prepare(*args, **kwargs):
        out = list(original_prepare(*args, **kwargs))
        latents, mask = out[2], out[7]
        rows = torch.zeros((lead, latents.shape[1]), dtype=latents.dtype)
        rows[:, : state_rows.shape[1]] = torch.from_numpy(state_rows)
        out[2] = torch.cat([rows, latents])
        out[7] = torch.cat([torch.ones((lead, 1), dtype=mask.dtype), mask])
        out[11] = list(range(lead))
        return tuple(out)

    def positions(*args, **kwargs):
        if kwargs.get("temporal_compression_factor") == 1:  # the action segment (vision compresses time)
            kwargs["start_frame_offset"] = 1 - lead
        return original_ids(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(pipe, "prepare_latents", prepare)
        patch.setattr(cosmos3, "get_3d_mrope_ids_vae_tokens", positions)
        return pipe(**call, output_type="latent", enable_safety_check=False).action[0].numpy()


@pytest.mark.parametrize("history_length", [1, 2])
def test_state_conditioning_equals_diffusers_pipeline_given_the_same_conditioning(
    tiny_checkpoint, tmp_path, monkeypatch, history_length
):
    engine = _engine(tiny_checkpoint("base"), tmp_path, history_length)
    rng = np.random.default_rng(5)
    image = rng.integers(0, 256, (200, 240, 3), dtype=np.uint8)
    state = rng.uniform(-1.0, 1.0, (history_length, 10)).astype(np.float32)
    request = ActionRequest(
        domain_name="fractal",
        image=image,
        state=state,
        seed=7,
        num_steps=3,
        guidance_scale=1.0,
        action_horizon=8,
        resolution_tier=256,
        prompt="pick the cube",
    )
    job, profile = job_for_actions(request, engine.description)
    np.testing.assert_allclose(job.state_rows, _by_hand(state), atol=1e-7)
    ours = engine.sampler.run(job, time.perf_counter).actions

    reference = _reference(
        engine.pipe,
        monkeypatch,
        _by_hand(state),
        prompt="pick the cube",
        num_inference_steps=3,
        guidance_scale=1.0,
        generator=torch.Generator().manual_seed(7),
        action=CosmosActionCondition(
            mode="policy",
            chunk_size=8,
            domain_name="fractal",
            resolution_tier=256,
            image=image.astype(np.float32) / 255.0,
        ),
    )
    assert reference.shape == (history_length + 8, 10) and ours.shape == (8, 10)
    np.testing.assert_allclose(reference[:history_length], _by_hand(state), atol=1e-6)  # held clean
    assert np.abs(ours - reference[history_length:]).max() <= 1e-5
    # The engine's chunk is those rows in robot units: denormalized, the gripper flipped back.
    chunk = engine.predict_actions(request).actions
    np.testing.assert_allclose(chunk, profile.to_robot(ours), atol=1e-6)
    np.testing.assert_allclose(chunk[:, 9], 1.0 - 2.0 * ours[:, 9], atol=1e-5)


def test_the_state_changes_the_actions_under_a_fixed_seed(state_engine, camera_image):
    request = dict(domain_name="fractal", image=camera_image, seed=11)
    a = state_engine.predict_actions(ActionRequest(**request, state=np.zeros(10, np.float32))).actions
    b = state_engine.predict_actions(ActionRequest(**request, state=np.zeros(10, np.float32))).actions
    c = state_engine.predict_actions(ActionRequest(**request, state=np.full(10, 0.5, np.float32))).actions
    np.testing.assert_array_equal(a, b)
    assert a.shape == c.shape == (16, 10) and np.abs(a - c).max() > 1e-3


def test_the_reply_drops_the_state_rows_and_flips_the_gripper_back(state_engine, camera_image):
    request = ActionRequest(
        domain_name="fractal",
        image=camera_image,
        seed=3,
        action_horizon=8,
        state=np.linspace(0, 1, 10, dtype=np.float32),
    )
    job, profile = job_for_actions(request, state_engine.description)
    model = state_engine.sampler.run(job, time.perf_counter).actions
    chunk = state_engine.predict_actions(request).actions
    assert model.shape == chunk.shape == (8, 10)  # the horizon, without the state row
    np.testing.assert_allclose(chunk[:, :9], 2.0 * model[:, :9], atol=1e-5)
    np.testing.assert_allclose(chunk[:, 9], 1.0 - 2.0 * model[:, 9], atol=1e-5)


def test_state_and_a_real_time_chunking_prefix_together(state_engine, camera_image):
    prefix = np.tile(np.linspace(-0.5, 0.5, 10, dtype=np.float32), (3, 1))
    chunk = state_engine.predict_actions(
        ActionRequest(
            domain_name="fractal", image=camera_image, seed=5, state=np.zeros(10, np.float32), prefix_actions=prefix
        )
    )
    assert chunk.actions.shape == (16, 10)
    np.testing.assert_allclose(chunk.actions[:3], prefix, atol=1e-5)


def test_inverse_dynamics_takes_state_too(state_engine):
    clip = np.random.default_rng(2).integers(0, 256, (9, 64, 64, 3), dtype=np.uint8)
    request = dict(domain_name="fractal", action_mode="inverse_dynamics", video=clip, seed=1)
    a = state_engine.predict_actions(ActionRequest(**request, state=np.zeros(10, np.float32))).actions
    b = state_engine.predict_actions(ActionRequest(**request, state=np.ones(10, np.float32))).actions
    assert a.shape == (8, 10) and np.abs(a - b).max() > 1e-3


def test_a_batch_mixing_state_and_stateless_domains_equals_each_alone(state_engine, camera_image):
    with_state = ActionRequest(domain_name="fractal", image=camera_image, seed=6, state=np.full(10, 0.3, np.float32))
    without = ActionRequest(domain_name="bridge_orig_lerobot", image=camera_image, seed=6)
    batched = state_engine.predict_actions_batch([with_state, without])
    assert batched[0].batch_size == 2
    for request, result in zip((with_state, without), batched):
        np.testing.assert_allclose(result.actions, state_engine.predict_actions(request).actions, atol=1e-5)


BAD_STATE = [
    ("missing", None, MissingFieldError),
    ("too narrow", np.zeros(9, np.float32), InvalidFieldError),
    ("too wide", np.zeros((1, 11), np.float32), InvalidFieldError),
    ("too many rows", np.zeros((2, 10), np.float32), InvalidFieldError),
    ("rank 3", np.zeros((1, 1, 10), np.float32), InvalidFieldError),
    ("not numeric", np.array(["a"] * 10), InvalidFieldError),
    ("a list", [0.0] * 10, InvalidFieldError),
    ("NaN", np.full(10, np.nan, np.float32), InvalidFieldError),
]


@pytest.mark.parametrize("name, state, error", BAD_STATE, ids=[case[0] for case in BAD_STATE])
def test_bad_or_missing_state_gets_its_typed_error(state_engine, name, state, error):
    with pytest.raises(error) as err:
        state_engine.predict_actions(
            ActionRequest(domain_name="fractal", image=np.zeros((64, 64, 3), np.uint8), state=state)
        )
    assert err.value.field == "state" and err.value.code == error.code
    assert err.value.code in ("missing_field", "invalid_field") and "[10]" in err.value.message


def test_state_for_a_domain_that_takes_none_is_refused(state_engine):
    with pytest.raises(InvalidFieldError) as err:
        state_engine.predict_actions(
            ActionRequest(
                domain_name="bridge_orig_lerobot", state=np.zeros(10, np.float32), image=np.zeros((64, 64, 3), np.uint8)
            )
        )
    assert err.value.field == "state" and "does not condition" in err.value.message


def test_warmup_sends_state_to_a_domain_that_needs_it(state_engine):
    state_engine.warmup([WarmupShape("policy", 8, 64, 64, domain_name="fractal")])
    assert state_engine.warmed_up


def test_describe_advertises_each_domains_state(state_engine):
    domains = state_engine.describe().as_json()["domains"]
    assert (domains["fractal"]["state_dim"], domains["fractal"]["use_state"], domains["fractal"]["history_length"]) == (
        10,
        True,
        1,
    )
    assert (domains["bridge_orig_lerobot"]["state_dim"], domains["bridge_orig_lerobot"]["history_length"]) == (None, 0)


# ---------------------------------------------------------------------------------------------- the DROID profile


@pytest.fixture(scope="module")
def droid_engine(tiny_checkpoint):
    """The tiny distilled checkpoint that ships the DROID joint-position profile (``cosmos3-tiny --droid``)."""
    return Cosmos3Engine.load(tiny_checkpoint("distilled", droid=True))


JOINTS = np.array([0.0, -0.6, 0.0, -2.2, 0.0, 1.6, 0.8], np.float32)


def test_a_droid_profile_returns_32_by_8_chunks_that_follow_the_joint_state(droid_engine, camera_image):
    d = droid_engine.describe().as_json()
    droid = d["domains"]["droid_lerobot"]
    assert d["defaults"]["domain_name"] == "droid_lerobot" and d["defaults"]["view_point"] == "concat_view"
    assert (
        droid["action_space"],
        droid["raw_action_dim"],
        droid["state_dim"],
        droid["use_state"],
        droid["history_length"],
        droid["gripper_flip_index"],
        droid["normalization"],
    ) == ("joint_pos", 8, 8, True, 1, 7, None)
    assert {k: droid["defaults"][k] for k in ("action_horizon", "fps", "resolution_tier", "view_point")} == {
        "action_horizon": 32,
        "fps": 15.0,
        "resolution_tier": 480,
        "view_point": "concat_view",
    }
    # The whole path at the profile's own settings: chunk 32, tier 480, 15 fps, the concat caption.
    state = np.concatenate([JOINTS, [0.0]]).astype(np.float32)
    request = dict(domain_name="droid_lerobot", image=camera_image, seed=0, prompt="put the marker in the cup")
    a = droid_engine.predict_actions(ActionRequest(**request, state=state))
    assert a.actions.shape == (32, 8) and a.actions.dtype == np.float32
    moved = state.copy()
    moved[:7] += 1.0
    b = droid_engine.predict_actions(ActionRequest(**request, state=moved))
    assert np.abs(a.actions - b.actions).max() > 1e-4


def test_a_droid_chunk_is_in_raw_joint_units_with_the_gripper_flipped_back(droid_engine, camera_image):
    request = ActionRequest(
        domain_name="droid_lerobot",
        image=camera_image,
        seed=1,
        resolution_tier=256,
        state=np.concatenate([JOINTS, [1.0]]).astype(np.float32),
    )
    job, _ = job_for_actions(request, droid_engine.description)
    assert job.state_rows[0, 7] == 0.0  # a closed gripper (1.0) is 0 to the model, as NVIDIA's server sends it
    model = droid_engine.sampler.run(job, time.perf_counter).actions
    chunk = droid_engine.predict_actions(request).actions
    np.testing.assert_allclose(chunk[:, :7], model[:, :7], atol=1e-6)  # no normalization
    np.testing.assert_allclose(chunk[:, 7], 1.0 - model[:, 7], atol=1e-6)


def test_a_droid_request_without_state_is_a_missing_field(droid_engine, camera_image):
    with pytest.raises(MissingFieldError) as err:
        droid_engine.predict_actions(ActionRequest(domain_name="droid_lerobot", image=camera_image))
    assert err.value.field == "state" and "[8]" in err.value.message
