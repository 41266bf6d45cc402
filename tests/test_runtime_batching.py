"""Batching across requests: compatible jobs share transformer calls, each result equals its unbatched run."""

from __future__ import annotations

import numpy as np
import pytest

from cosmos3_runtime.engine import Cosmos3Engine
from cosmos3_runtime.errors import UnknownDomainError
from cosmos3_runtime.requests import ActionRequest


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return Cosmos3Engine.load(tiny_checkpoint("base"), prefix_cache_mb=64)


def _images(n):
    rng = np.random.default_rng(9)
    sizes = [(224, 224), (180, 240), (256, 192), (224, 224)]
    return [rng.integers(0, 256, (*sizes[i % 4], 3), dtype=np.uint8) for i in range(n)]


def _requests(n, **common):
    """Different robots: different images (and sizes), prompts, domains, horizons, seeds, one schedule."""
    domains = ["bridge_orig_lerobot", "droid_lerobot", "fractal", "pusht"]
    prompts = ["pick up the cube", "open the drawer", "", "push the T"]
    return [
        ActionRequest(
            domain_name=domains[i % 4],
            image=img,
            prompt=prompts[i % 4],
            seed=100 + i,
            action_horizon=[16, 8, 16, 12][i % 4],
            **common,
        )
        for i, img in enumerate(_images(n))
    ]


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_batched_chunks_equal_unbatched(engine, guidance):
    requests = _requests(4, num_steps=4, guidance_scale=guidance)
    alone = [engine.predict_actions(r) for r in requests]
    together = engine.predict_actions_batch(requests)
    for a, b in zip(alone, together):
        assert b.batch_size == 4 and a.batch_size == 1
        assert a.actions.shape == b.actions.shape
        assert np.abs(a.actions - b.actions).max() < 1e-4
        assert b.transformer_forwards == a.transformer_forwards


def test_batch_shares_transformer_calls(engine):
    calls = []
    handle = engine.pipe.transformer.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        engine.predict_actions_batch(_requests(3, num_steps=5, guidance_scale=1.0))
    finally:
        handle.remove()
    assert len(calls) == 5  # one call per step for all three, not fifteen


@pytest.mark.parametrize("cached", [False, True])
def test_robots_with_one_prompt_share_its_text_in_a_batch_and_each_chunk_equals_its_own(tiny_checkpoint, cached):
    """Robots asking with the same prompt: the joint call carries the text once (its keys/values depend on
    the token ids alone), with or without the prefix cache, and each chunk equals the robot's run alone."""
    engine = Cosmos3Engine.load(tiny_checkpoint("base"), prefix_cache_mb=64 if cached else 0)
    # One camera size: the caption names the canvas, so robots on other canvases have other texts.
    images = np.random.default_rng(3).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
    requests = [
        ActionRequest(domain_name="bridge_orig_lerobot", image=img, prompt="pick up the cube", seed=7 + i, num_steps=2)
        for i, img in enumerate(images)
    ]
    text_rows: list[int] = []
    handle = engine.pipe.transformer.register_forward_pre_hook(
        lambda _module, _args, kwargs: text_rows.append(kwargs["und_len"]), with_kwargs=True
    )
    try:
        alone = [engine.predict_actions(r) for r in requests]
        one_text = text_rows[0]  # the first robot's first call: its own text, computed
        if engine.sampler.prefix_cache is not None:
            engine.sampler.prefix_cache.clear()  # so that the batch's first call computes the text too
        text_rows.clear()
        together = engine.predict_actions_batch(requests)
    finally:
        handle.remove()
    for a, b in zip(alone, together):
        assert np.abs(a.actions - b.actions).max() < 1e-4
    assert one_text > 0 and text_rows[0] == one_text, (one_text, text_rows)  # not three times that


def test_incompatible_schedules_are_grouped_separately_and_bad_requests_fail_alone(engine):
    good = _requests(2, num_steps=3, guidance_scale=1.0)
    other = _requests(1, num_steps=2, guidance_scale=1.0)[0]
    bad = ActionRequest(domain_name="no_such_robot", image=_images(1)[0])
    results = engine.predict_actions_batch([good[0], bad, other, good[1]])
    assert isinstance(results[1], UnknownDomainError)
    assert results[0].batch_size == 2 and results[3].batch_size == 2 and results[2].batch_size == 1
    assert results[2].num_steps == 2
    np.testing.assert_allclose(results[0].actions, engine.predict_actions(good[0]).actions, atol=1e-4)


def test_mixed_modes_and_prefixes_in_one_batch(engine):
    img = _images(1)[0]
    requests = [
        # The 256 tier and a 5-frame clip: mixing modes is the point, not the size (the default tier's
        # 9-frame clip costs six times the CPU).
        ActionRequest(
            domain_name="droid_lerobot",
            action_mode="inverse_dynamics",
            video=np.stack([img] * 5),
            seed=1,
            num_steps=3,
            guidance_scale=1.0,
            resolution_tier=256,
        ),
        ActionRequest(
            domain_name="bridge_orig_lerobot",
            image=img,
            seed=2,
            num_steps=3,
            guidance_scale=1.0,
            resolution_tier=256,
            prefix_actions=np.full((4, 10), 0.02, np.float32),
        ),
    ]
    together = engine.predict_actions_batch(requests)
    for request, chunk in zip(requests, together):
        assert np.abs(chunk.actions - engine.predict_actions(request).actions).max() < 1e-4
    np.testing.assert_allclose(together[1].actions[:4], 0.02, atol=1e-5)


def test_mixed_tiers_view_points_and_fps_in_one_batch(engine):
    """Everything but the schedule is per item in a packed forward: requests that differ in tier, view
    point and fps share one and each chunk equals its unbatched run."""
    img = _images(1)[0]
    requests = [
        ActionRequest(
            domain_name="bridge_orig_lerobot",
            image=img,
            seed=5,
            num_steps=2,
            guidance_scale=1.0,
            resolution_tier=256,
            view_point="wrist_view",
            fps=10.0,
            action_horizon=4,
        ),
        ActionRequest(
            domain_name="bridge_orig_lerobot",
            image=img,
            seed=5,
            num_steps=2,
            guidance_scale=1.0,
            resolution_tier=480,
            view_point="concat_view",
            fps=30.0,
            action_horizon=4,
        ),
    ]
    together = engine.predict_actions_batch(requests)
    for request, chunk in zip(requests, together):
        assert chunk.batch_size == 2
        assert np.abs(chunk.actions - engine.predict_actions(request).actions).max() < 1e-4
    assert np.abs(together[0].actions - together[1].actions).max() > 1e-6  # the settings did change the chunk
