"""The engine through the real diffusers pipeline on tiny checkpoints: what runs, how often, and what comes out."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

from cosmos3_runtime.engine import Cosmos3Engine
from cosmos3_runtime.errors import InvalidRequestError
from cosmos3_runtime.random_checkpoints import TINY_DISTILLED_SIGMAS
from cosmos3_runtime.requests import ActionRequest, VideoRequest
from cosmos3_runtime.validation import job_for_actions


class ForwardRecorder:
    """Counts transformer forwards and records the timestep each one was called at."""

    def __init__(self, module):
        self.calls = []
        self._handle = module.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        self.calls.append(float(kwargs["action_timesteps"][0]))

    def close(self):
        self._handle.remove()


@pytest.fixture
def record_forwards():
    recorders = []

    def start(engine):
        recorder = ForwardRecorder(engine.pipe.transformer)
        recorders.append(recorder)
        return recorder

    yield start
    for r in recorders:
        r.close()


@pytest.fixture
def count_vae(monkeypatch):
    """Counts VAE decoder and encoder module calls of an engine."""

    def start(engine):
        counts = {"decode": 0, "encode": 0}
        hooks = [
            engine.pipe.vae.decoder.register_forward_pre_hook(
                lambda *a: counts.__setitem__("decode", counts["decode"] + 1)
            ),
            engine.pipe.vae.encoder.register_forward_pre_hook(
                lambda *a: counts.__setitem__("encode", counts["encode"] + 1)
            ),
        ]
        return counts, hooks

    return start


def test_policy_chunk_shape_dtype_and_metadata(tiny_engine, camera_image):
    engine = tiny_engine("distilled")
    chunk = engine.predict_actions(ActionRequest(domain_name="bridge_orig_lerobot", image=camera_image, seed=1))
    assert chunk.actions.shape == (16, 10) and chunk.actions.dtype == np.float32
    assert np.isfinite(chunk.actions).all()
    assert (chunk.domain_id, chunk.raw_action_dim, chunk.action_mode) == (7, 10, "policy")
    assert chunk.num_steps == len(TINY_DISTILLED_SIGMAS)
    t = chunk.timing
    assert t.encode_ms > 0 and t.denoise_ms > 0 and t.decode_ms == 0
    assert t.total_ms == pytest.approx(t.preprocess_ms + t.encode_ms + t.denoise_ms + t.postprocess_ms)


def test_inverse_dynamics_chunk(tiny_engine, camera_image):
    engine = tiny_engine("distilled")
    clip = np.stack([np.roll(camera_image, 4 * i, axis=1) for i in range(9)])
    chunk = engine.predict_actions(
        ActionRequest(domain_name="droid_lerobot", action_mode="inverse_dynamics", video=clip, seed=2)
    )
    assert chunk.actions.shape == (8, 10) and np.isfinite(chunk.actions).all()
    assert chunk.action_mode == "inverse_dynamics"


def test_seed_reproduces_a_chunk_and_another_seed_changes_it(tiny_engine, camera_image):
    engine = tiny_engine("distilled")
    request = dict(domain_name="fractal", image=camera_image)
    a = engine.predict_actions(ActionRequest(seed=11, **request)).actions
    b = engine.predict_actions(ActionRequest(seed=11, **request)).actions
    c = engine.predict_actions(ActionRequest(seed=12, **request)).actions
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3


def test_unseeded_requests_report_the_seed_that_reproduces_them(tiny_engine, camera_image):
    engine = tiny_engine("distilled")
    first = engine.predict_actions(ActionRequest(domain_name="fractal", image=camera_image))
    again = engine.predict_actions(ActionRequest(domain_name="fractal", image=camera_image, seed=first.seed))
    np.testing.assert_array_equal(first.actions, again.actions)


def test_distilled_runs_the_fixed_sigma_list_one_forward_per_step(tiny_engine, camera_image, record_forwards):
    engine = tiny_engine("distilled")
    recorder = record_forwards(engine)
    chunk = engine.predict_actions(ActionRequest(domain_name="fractal", image=camera_image, seed=0))
    assert chunk.transformer_forwards == len(recorder.calls) == len(TINY_DISTILLED_SIGMAS)
    # The checkpoint's scheduler config carries shift=5.0; the fixed list must be used unshifted.
    sigmas = [t / 1000.0 for t in recorder.calls]
    np.testing.assert_allclose(sigmas, TINY_DISTILLED_SIGMAS, atol=1e-5)


def test_distilled_refuses_other_steps_or_guidance(tiny_engine, camera_image):
    from cosmos3_runtime.errors import InvalidRequestError

    engine = tiny_engine("distilled")
    with pytest.raises(InvalidRequestError) as err:
        engine.predict_actions(ActionRequest(domain_name="fractal", image=camera_image, num_steps=8))
    assert err.value.field == "num_steps"
    with pytest.raises(InvalidRequestError) as err:
        engine.predict_actions(ActionRequest(domain_name="fractal", image=camera_image, guidance_scale=3.0))
    assert err.value.field == "guidance_scale"


def test_base_with_guidance_runs_two_forwards_per_step(tiny_engine, camera_image, record_forwards):
    engine = tiny_engine("base")
    recorder = record_forwards(engine)
    chunk = engine.predict_actions(
        ActionRequest(domain_name="fractal", image=camera_image, num_steps=5, guidance_scale=4.0, seed=0)
    )
    assert chunk.num_steps == 5 and chunk.transformer_forwards == len(recorder.calls) == 10
    recorder.calls.clear()
    chunk = engine.predict_actions(
        ActionRequest(domain_name="fractal", image=camera_image, num_steps=5, guidance_scale=1.0, seed=0)
    )
    assert chunk.transformer_forwards == len(recorder.calls) == 5


def test_guidance_interval_applies_cfg_only_inside_it(tiny_engine, camera_image, record_forwards):
    engine = tiny_engine("base")
    recorder = record_forwards(engine)
    chunk = engine.predict_actions(
        ActionRequest(
            domain_name="fractal",
            image=camera_image,
            num_steps=6,
            guidance_scale=4.0,
            guidance_interval=(0.5, 1.0),
            seed=0,
        )
    )
    sigmas = [t / 1000.0 for t in recorder.calls]
    distinct = sorted(set(sigmas), reverse=True)
    doubled = [s for s in distinct if sigmas.count(s) == 2]
    assert doubled and all(0.5 <= s <= 1.0 for s in doubled)
    assert all(sigmas.count(s) == 1 for s in distinct if not 0.5 <= s <= 1.0)
    assert chunk.transformer_forwards == len(recorder.calls) == 6 + len(doubled) < 12


def test_action_modes_never_call_the_vae_decoder(tiny_engine, camera_image, count_vae):
    engine = tiny_engine("distilled")
    counts, hooks = count_vae(engine)
    try:
        engine.predict_actions(ActionRequest(domain_name="fractal", image=camera_image, seed=0))
        engine.predict_actions(
            ActionRequest(
                domain_name="fractal", action_mode="inverse_dynamics", video=np.stack([camera_image] * 5), seed=0
            )
        )
        assert counts["decode"] == 0 and counts["encode"] > 0
        engine.rollout_video(
            VideoRequest(domain_name="fractal", image=camera_image, actions=np.zeros((4, 10), np.float32), seed=0)
        )
        assert counts["decode"] > 0
    finally:
        for h in hooks:
            h.remove()


def test_decode_video_adds_the_predicted_frames_to_the_same_chunk(tiny_engine, camera_image, count_vae):
    """cosmos-framework's --decode-video: a policy request that asks for it also gets the video the model
    predicted with the chunk (uint8 [horizon + 1, H, W, 3], its time in decode_ms); the chunk is the one
    made without it. Off unless asked for; a value that is not a bool is refused, naming the field."""
    engine = tiny_engine("distilled")
    request = dict(domain_name="fractal", image=camera_image, action_horizon=8, seed=3)
    plain = engine.predict_actions(ActionRequest(**request))
    counts, hooks = count_vae(engine)
    try:
        decoded = engine.predict_actions(ActionRequest(**request, decode_video=True))
    finally:
        for h in hooks:
            h.remove()
    assert plain.video is None and plain.timing.decode_ms == 0.0
    assert counts["decode"] > 0
    video = decoded.video
    assert video is not None and video.dtype == np.uint8 and video.ndim == 4
    assert video.shape[0] == 9 and video.shape[-1] == 3 and video.std() > 0
    assert decoded.timing.decode_ms > 0.0
    np.testing.assert_array_equal(decoded.actions, plain.actions)
    with pytest.raises(InvalidRequestError) as refused:
        engine.predict_actions(ActionRequest(**request, decode_video="yes"))  # type: ignore[arg-type]
    assert refused.value.field == "decode_video"


def test_first_frame_encode_equals_the_full_clip_encode(tiny_engine, camera_image):
    """The Wan VAE is causal in time: latent frame 0 of the padded (horizon+1)-frame clip is frame 0's encoding."""
    engine = tiny_engine("distilled")
    sampler = engine.sampler
    horizon = 16
    clip, size, _, _ = sampler.preprocess(camera_image[None], 256, horizon + 1)  # diffusers' padded clip
    assert clip.shape[2] == horizon + 1
    full = sampler.encode(clip, size)
    single, size1, _, _ = sampler.preprocess(camera_image[None], 256, 1)
    first = sampler.encode(single, size1)
    assert full.shape[2] == horizon // 4 + 1 and first.shape[2] == 1
    torch.testing.assert_close(first[:, :, 0], full[:, :, 0], atol=1e-5, rtol=0)


def diffusers_chunk(pipe, prompt: str, condition, steps: int, guidance: float, seed: int) -> np.ndarray:
    """diffusers' own ``Cosmos3OmniPipeline.__call__`` for one action chunk: the reference a served chunk equals."""
    output = pipe(
        prompt=prompt,
        action=condition,
        num_inference_steps=steps,
        guidance_scale=guidance,
        generator=torch.Generator().manual_seed(seed),
        output_type="latent",
        enable_safety_check=False,
    )
    return output.action[0].numpy()


@pytest.mark.parametrize("mode", ["policy", "inverse_dynamics"])
def test_actions_equal_diffusers_own_pipeline(tiny_engine, tiny_checkpoint, mode):
    """Our step-by-step lowering (with the prefix cache) reproduces Cosmos3OmniPipeline.__call__ with diffusers'
    stock attention processors (base, CFG) for the same seed."""
    engine = tiny_engine("base")
    stock = Cosmos3Engine.load(tiny_checkpoint("base"), prefix_cache_mb=0).pipe
    stock.transformer.set_attn_processor(Cosmos3AttnProcessor())
    rng = np.random.default_rng(5)
    image = rng.integers(0, 256, (200, 240, 3), dtype=np.uint8)
    ours = dict(image=image) if mode == "policy" else dict(video=np.stack([image] * 9))
    chunk = engine.predict_actions(
        ActionRequest(
            domain_name="fractal",
            action_mode=mode,
            action_horizon=8,
            resolution_tier=256,
            seed=7,
            num_steps=5,
            guidance_scale=3.0,
            prompt="pick the cube",
            **ours,
        )
    )
    theirs = {k: v.astype(np.float32) / 255.0 for k, v in ours.items()}
    condition = CosmosActionCondition(mode=mode, chunk_size=8, domain_name="fractal", resolution_tier=256, **theirs)
    reference = diffusers_chunk(stock, "pick the cube", condition, steps=5, guidance=3.0, seed=7)
    np.testing.assert_allclose(chunk.actions, reference, atol=1e-4)


def test_a_profiles_sampler_settings_equal_diffusers_own_pipeline_with_that_scheduler(tiny_checkpoint, tmp_path):
    """NVIDIA's DROID serving settings (4 UniPC steps, guidance 3.0, shift 5.0) set by a profile: the served
    chunk is Cosmos3OmniPipeline.__call__'s with a UniPC scheduler of flow_shift 5.0, for the same seed."""
    import json

    from diffusers import UniPCMultistepScheduler

    sampler = {"num_steps": 4, "guidance_scale": 3.0, "shift": 5.0}
    profile_file = tmp_path / "profiles.json"
    profile_file.write_text(json.dumps({"domains": {"fractal": sampler}}))
    engine = Cosmos3Engine.load(tiny_checkpoint("base"), profiles_path=profile_file, prefix_cache_mb=0)
    defaults = engine.describe().domain_defaults["fractal"]
    assert (defaults.num_steps, defaults.guidance_scale, defaults.shift) == (4, 3.0, 5.0)
    assert engine.describe().chunk_forwards["fractal"] == 8
    image = np.random.default_rng(9).integers(0, 256, (200, 240, 3), dtype=np.uint8)
    request = ActionRequest(
        domain_name="fractal", image=image, action_horizon=8, resolution_tier=256, seed=3, prompt="open the drawer"
    )
    chunk = engine.predict_actions(request)  # no sampler setting in the request: the profile's apply
    assert (chunk.settings.num_steps, chunk.settings.guidance_scale, chunk.settings.shift) == (4, 3.0, 5.0)
    assert chunk.transformer_forwards == 8

    stock = Cosmos3Engine.load(tiny_checkpoint("base"), prefix_cache_mb=0).pipe
    stock.transformer.set_attn_processor(Cosmos3AttnProcessor())
    stock.scheduler = UniPCMultistepScheduler.from_config(stock.scheduler.config, flow_shift=5.0)
    condition = CosmosActionCondition(
        mode="policy", chunk_size=8, domain_name="fractal", resolution_tier=256, image=image.astype(np.float32) / 255.0
    )
    reference = diffusers_chunk(stock, "open the drawer", condition, steps=4, guidance=3.0, seed=3)
    np.testing.assert_allclose(chunk.actions, reference, atol=1e-4)
    # The shift is what makes them equal: the checkpoint's own (3.0) gives another chunk.
    unshifted = engine.predict_actions(dataclasses.replace(request, shift=3.0))
    assert np.abs(unshifted.actions - reference).max() > 1e-3


def _same_pack(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for key, x in a.items():
        y = b[key]
        if isinstance(x, torch.Tensor):
            if not (x.shape == y.shape and torch.equal(x, y)):
                return False
        elif isinstance(x, list):
            if len(x) != len(y) or not all(
                torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v for u, v in zip(x, y)
            ):
                return False
        elif x != y:
            return False
    return True


def test_a_packed_sequence_is_built_once_per_shape_and_never_shared_across_shapes(tiny_engine, camera_image):
    """The sampler keeps each job shape's packed sequence (indexes and positions only): a job of the same shape
    gets the same one, and a job that differs in any input the packing reads (token ids, latent shapes, clean
    frames, fps, state rows) gets its own, equal to the pipeline's segment helpers' own build."""
    from cosmos3_runtime.sequence_packing import pack_sequence

    engine = tiny_engine("distilled")
    sampler = engine.sampler
    job, _ = job_for_actions(
        ActionRequest(domain_name="bridge_orig_lerobot", image=camera_image, action_horizon=8, seed=1),
        engine.description,
    )
    frames = sampler.condition_frames(job, time.perf_counter)
    ids, _ = sampler.tokenize(job, frames.canvas_h, frames.canvas_w)
    item = sampler._prepare(job, time.perf_counter, frames)
    latents, actions = item.latents, item.action_latents
    stateful = dataclasses.replace(job, state_rows=np.zeros((1, actions.shape[1]), np.float32))
    variants = {
        "as served": (ids, latents, actions, [0], [], job),
        "other ids": ([*ids[:-1], ids[-1] + 1], latents, actions, [0], [], job),
        "other latents": (ids, latents[:, :, :, :-2], actions, [0], [], job),
        "other action rows": (ids, latents, actions[:-1], [0], [], job),
        "all frames clean": (ids, latents, actions, list(range(latents.shape[2])), [], job),
        "a prefix": (ids, latents, actions, [0], [0, 1], job),
        "other fps": (
            ids,
            latents,
            actions,
            [0],
            [],
            dataclasses.replace(job, settings=dataclasses.replace(job.settings, fps=job.settings.fps * 2)),
        ),
        "a state row": (ids, latents, actions, [0], [0], stateful),
        "a prefix row": (ids, latents, actions, [0], [0], job),
    }
    first = {name: sampler.sequence_pass(*args).full for name, args in variants.items()}
    for name, args in variants.items():
        again = sampler.sequence_pass(*args).full
        assert again is first[name], name  # built once
        fresh = pack_sequence(sampler.pipe, sampler.device, *args)
        assert _same_pack(again, fresh), name
    # Each differs from the one served, so a memo that confused them would have failed above.
    assert [name for name in variants if _same_pack(first["as served"], first[name])] == ["as served"]


def test_normalization_stats_denormalize_the_chunk(tiny_engine, camera_image):
    engine = tiny_engine("distilled")
    stats = engine.spec.profiles["bridge_orig_lerobot"].normalization
    assert stats.kind == "quantile"
    chunk = engine.predict_actions(ActionRequest(domain_name="bridge_orig_lerobot", image=camera_image, seed=3))
    model_space = stats.normalize(chunk.actions)
    np.testing.assert_allclose(stats.denormalize(model_space), chunk.actions, atol=1e-5)
    # The engine's output is exactly the model-space chunk mapped through the profile's stats.
    job, _ = job_for_actions(
        ActionRequest(domain_name="bridge_orig_lerobot", image=camera_image, seed=3), engine.description
    )
    raw_model = engine.sampler.run(job, time.perf_counter).actions
    np.testing.assert_allclose(chunk.actions, raw_model * stats.scale + stats.offset, atol=1e-5)


def test_real_time_chunking_prefix_is_kept(tiny_engine, camera_image):
    engine = tiny_engine("distilled")
    prefix = np.linspace(-0.04, 0.04, 30, dtype=np.float32).reshape(3, 10)
    chunk = engine.predict_actions(
        ActionRequest(domain_name="bridge_orig_lerobot", image=camera_image, seed=4, prefix_actions=prefix)
    )
    assert chunk.actions.shape == (16, 10)
    # Exactly the rows given, not their round trip through the domain's normalization.
    np.testing.assert_array_equal(chunk.actions[:3], prefix)
    batched = engine.predict_actions_batch(
        [
            ActionRequest(
                domain_name="bridge_orig_lerobot", image=camera_image, seed=4, prefix_actions=prefix.astype(np.float64)
            )
        ]
    )[0]
    np.testing.assert_array_equal(batched.actions[:3], prefix)


def test_describe_exposes_every_limit_validation_applies(tiny_engine):
    """The server validates a session's settings up front from describe(): every bound must be there."""
    limits = tiny_engine("distilled").describe().as_json()["limits"]
    assert (limits["min_fps"], limits["max_fps"], limits["max_guidance_scale"]) == (1.0, 240.0, 30.0)
    assert limits["max_seed"] == 2**63 - 1 and limits["max_prompt_chars"] == 2000 and limits["max_steps"] == 200


def test_forward_dynamics_rollout_returns_frames(tiny_engine, camera_image):
    engine = tiny_engine("distilled")
    result = engine.rollout_video(
        VideoRequest(
            domain_name="bridge_orig_lerobot", image=camera_image, actions=np.zeros((8, 10), np.float32), seed=0
        )
    )
    assert result.frames.dtype == np.uint8 and result.frames.shape == (9, 224, 224, 3)
    assert result.transformer_forwards == len(TINY_DISTILLED_SIGMAS) and result.timing.decode_ms > 0


def test_edge_defaults_to_its_lowest_tier_and_explicit_values_win(tiny_engine, camera_image):
    edge = tiny_engine("edge")
    assert edge.describe().defaults.resolution_tier == 256
    # SGLang's Edge default guidance (the base variant's diffusers default is 6.0).
    assert edge.describe().defaults.guidance_scale == 5.0
    assert tiny_engine("base").describe().defaults.guidance_scale == 6.0
    chunk = edge.predict_actions(
        ActionRequest(
            domain_name="fractal", image=camera_image, resolution_tier=480, num_steps=3, guidance_scale=1.0, seed=0
        )
    )
    assert chunk.num_steps == 3 and chunk.transformer_forwards == 3


def test_describe_reports_what_the_checkpoint_offers(tiny_engine):
    d = tiny_engine("distilled").describe().as_json()
    assert d["variant"] == "distilled" and d["modes"] == ["policy", "inverse_dynamics", "forward_dynamics"]
    assert d["defaults"]["num_steps"] == 4 and d["defaults"]["guidance_scale"] == 1.0
    assert d["domains"]["bridge_orig_lerobot"] == {
        "domain_id": 7,
        "action_space": "joint_pos",
        "raw_action_dim": 10,
        "default_horizon": 16,
        "fps": 24.0,
        "resolution_tier": None,
        "view_point": "third_person_view",
        "view_description": None,
        "prompt_format": "json",
        "num_steps": None,
        "guidance_scale": None,
        "shift": None,
        "guidance_interval": None,
        "gripper_flip_index": None,
        "normalization": "quantile",
        "state_dim": None,
        "use_state": False,
        "history_length": 0,
        "max_prefix": None,
        "defaults": {
            "action_horizon": 16,
            "resolution_tier": 256,
            "view_point": "third_person_view",
            "fps": 24.0,
            "num_steps": 4,
            "guidance_scale": 1.0,
            "guidance_interval": None,
            "shift": None,
        },
        # The fixed 4-step list, one forward a step: guidance is distilled into the weights.
        "transformer_forwards": 4,
    }
    # The top-level defaults are the default domain's: its view point, not a fixed "ego_view".
    assert d["defaults"]["domain_name"] == "bridge_orig_lerobot"
    assert d["defaults"]["view_point"] == "third_person_view"
    assert d["action_horizon"] == {"min": 4, "max": 64, "multiple_of": 4}
    assert d["device"] == "cpu" and d["dtype"] == "float32" and d["parameters"] > 0


def test_warmup_marks_the_engine_ready(tiny_engine):
    engine = tiny_engine("edge-distilled")
    assert not engine.warmed_up
    engine.warmup()
    assert engine.warmed_up


def test_warmup_runs_the_given_shapes(tiny_engine, record_forwards):
    from cosmos3_runtime.engine import WarmupShape

    engine = tiny_engine("distilled")
    recorder = record_forwards(engine)
    engine.warmup([WarmupShape("policy", 8, 120, 160), WarmupShape("inverse_dynamics", 4, 96, 96, 480)])
    assert len(recorder.calls) == 2 * len(TINY_DISTILLED_SIGMAS) and engine.warmed_up


@pytest.mark.slow
def test_compiled_transformer_gives_the_same_chunk(tiny_checkpoint, camera_image):
    """torch.compile (regional, dynamic shapes) is opt-in; its chunks match the eager ones."""
    eager = Cosmos3Engine.load(tiny_checkpoint("distilled"))
    compiled = Cosmos3Engine.load(tiny_checkpoint("distilled"), compile=True)
    compiled.warmup()
    request = ActionRequest(domain_name="fractal", image=camera_image, seed=3)
    np.testing.assert_allclose(
        compiled.predict_actions(request).actions, eager.predict_actions(request).actions, atol=1e-4
    )


def test_video_rollout_advances_step_by_step_and_lets_other_requests_run_between(tiny_engine, camera_image):
    engine = tiny_engine("distilled")
    request = VideoRequest(
        domain_name="bridge_orig_lerobot", image=camera_image, actions=np.zeros((8, 10), np.float32), seed=5
    )
    whole = engine.rollout_video(request)
    rollout = engine.start_video(request)
    policy = ActionRequest(domain_name="fractal", image=camera_image, seed=1)
    alone = engine.predict_actions(policy).actions
    progress = [rollout.progress]
    while not rollout.step():
        progress.append(rollout.progress)
        # A robot's request in the middle of the rollout: answered normally, rollout unaffected.
        np.testing.assert_array_equal(engine.predict_actions(policy).actions, alone)
    assert progress == sorted(progress) and progress[0] == 0.0 and rollout.progress == 1.0
    assert rollout.steps_done == len(TINY_DISTILLED_SIGMAS)
    np.testing.assert_array_equal(rollout.result().frames, whole.frames)
