"""The text prefix cache: cached chunks equal uncached ones, hits where the prefix repeats, misses where it changes."""

from __future__ import annotations

import numpy as np
import pytest
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor

from cosmos3_runtime.engine import Cosmos3Engine
from cosmos3_runtime.requests import ActionRequest
from cosmos3_runtime.sequence_packing import PackedAttnProcessor, PrefixEntry, TextPrefixCache


@pytest.fixture(scope="module")
def engines(tiny_checkpoint):
    """The same base checkpoint loaded twice: diffusers' stock attention processors, and the cached engine."""
    path = tiny_checkpoint("base")
    uncached = Cosmos3Engine.load(path, prefix_cache_mb=0)
    uncached.pipe.transformer.set_attn_processor(Cosmos3AttnProcessor())
    return uncached, Cosmos3Engine.load(path, prefix_cache_mb=64)


def test_engines_use_packed_attention_through_diffusers_processor_mechanism(engines):
    uncached, cached = engines
    processors = cached.pipe.transformer.attn_processors
    assert processors and all(isinstance(p, PackedAttnProcessor) for p in processors.values())
    assert uncached.describe().prefix_cache is None
    assert cached.describe().prefix_cache.budget_bytes == 64 * 2**20


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_cached_chunks_equal_uncached(engines, camera_image, guidance):
    uncached, cached = engines
    for seed in range(3):  # the first request records, the next ones replay (within and across requests)
        request = ActionRequest(
            domain_name="fractal",
            image=camera_image,
            prompt="stack the blocks",
            seed=seed,
            num_steps=4,
            guidance_scale=guidance,
        )
        a = uncached.predict_actions(request).actions
        b = cached.predict_actions(request).actions
        assert np.abs(a - b).max() < 1e-5


def test_inverse_dynamics_and_prefix_actions_through_the_cache(engines, camera_image):
    uncached, cached = engines
    # The 256 tier and a 5-frame clip (horizon 4): the cache path is the same at any size, and a 9-frame clip
    # at the domain's default tier costs this test six times the CPU.
    clip = np.stack([np.roll(camera_image, 3 * i, axis=0) for i in range(5)])
    for request in (
        ActionRequest(
            domain_name="droid_lerobot",
            action_mode="inverse_dynamics",
            video=clip,
            seed=1,
            num_steps=3,
            resolution_tier=256,
        ),
        ActionRequest(
            domain_name="bridge_orig_lerobot",
            image=camera_image,
            seed=2,
            num_steps=3,
            resolution_tier=256,
            prefix_actions=np.full((2, 10), 0.01, np.float32),
        ),
    ):
        for _ in range(2):
            assert (
                np.abs(uncached.predict_actions(request).actions - cached.predict_actions(request).actions).max() < 1e-5
            )


def test_hits_when_the_prefix_repeats_and_misses_when_it_changes(tiny_checkpoint, camera_image):
    engine = Cosmos3Engine.load(tiny_checkpoint("distilled"), prefix_cache_mb=16)
    cache = engine.sampler.prefix_cache

    def run(**overrides):
        values = dict(domain_name="fractal", image=camera_image, prompt="open the drawer", seed=0)
        values.update(overrides)
        engine.predict_actions(ActionRequest(**values))
        return cache.stats()

    first = run()
    assert (first.misses, first.hits, first.entries) == (1, 0, 1)
    again = run(seed=5)  # a new seed does not change the text
    assert (again.misses, again.hits, again.entries) == (1, 1, 1)
    for change in (
        dict(prompt="close the drawer"),
        dict(view_point="wrist_view"),
        dict(action_horizon=8),
        dict(fps=10.0),
    ):
        before = cache.stats()
        after = run(**change)
        assert after.misses == before.misses + 1, change
        assert after.entries == before.entries + 1, change


def test_budget_is_bounded_in_bytes():
    import torch

    def entry(nbytes_per_tensor: int) -> PrefixEntry:
        t = torch.zeros(nbytes_per_tensor // 4)
        return PrefixEntry(keys={0: t}, values={0: t.clone()})

    cache = TextPrefixCache(budget_bytes=1000)
    cache.put((1,), entry(400))  # 800 bytes
    cache.put((2,), entry(200))  # 400 bytes: evicts (1,)
    assert cache.get((1,)) is None and cache.get((2,)) is not None
    assert cache.bytes == 400 and cache.evictions == 1
    cache.put((3,), entry(2000))  # larger than the whole budget: not kept
    assert cache.get((3,)) is None and cache.bytes <= cache.budget_bytes
