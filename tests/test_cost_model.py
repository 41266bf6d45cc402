"""The cost model of docs/benchmarks.md (``benchmarks/cost_model.py``) against what torch counts.

The model's FLOP formula is checked on the tiny checkpoint's real forwards: torch's ``FlopCounterMode``
counts every matrix product diffusers' transformer runs (attention is not counted by torch on CPU, so the
attention term is checked only for its form), and the token counts must be the ones the sampler packs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import cost_model  # noqa: E402

from cosmos3_runtime.engine import Cosmos3Engine  # noqa: E402
from cosmos3_runtime.requests import ActionRequest  # noqa: E402
from cosmos3_runtime.validation import job_for_actions  # noqa: E402


def _matrix_flops(counter: FlopCounterMode) -> int:
    counts = counter.get_flop_counts()["Global"]
    return sum(v for op, v in counts.items() if str(op) in ("aten.mm", "aten.addmm", "aten.bmm"))


@pytest.mark.parametrize(
    "variant, height, width, horizon",
    [("distilled", 224, 224, 16), ("edge", 480, 640, 16), ("distilled", 180, 320, 32)],
)
def test_forward_flops_match_torchs_count(tiny_checkpoint, variant, height, width, horizon):
    engine = Cosmos3Engine.load(tiny_checkpoint(variant), prefix_cache_mb=16)
    tier = 480 if height == 180 else 256
    image = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    job, _ = job_for_actions(
        ActionRequest(
            domain_name=engine.default_domain(), image=image, seed=0, action_horizon=horizon, resolution_tier=tier
        ),
        engine.description,
    )
    sampler = engine.sampler
    item = sampler._prepare(job, time.perf_counter)
    full = item.passes["cond"].full
    config = dict(engine.pipe.transformer.config)
    geometry = cost_model.Geometry("test", height, width, tier, horizon)
    tokens = cost_model.tokens_for(geometry, config, text_tokens=full["und_len"])
    assert (tokens.vision, tokens.action) == (full["num_vision_tokens"], full["action_len"])

    timesteps = item.scheduler.timesteps
    with torch.no_grad():
        for step, cached in ((0, False), (1, True)):  # the first forward records the text, the next replays it
            with FlopCounterMode(display=False) as counter:
                sampler._forward(
                    [item], "cond", timesteps[step], step, float(item.scheduler.sigmas[step]), len(timesteps)
                )
            expected = cost_model.forward_flops(config, tokens, text_cached=cached)["matrix"]
            assert _matrix_flops(counter) == pytest.approx(expected, rel=0.03)


def test_attention_and_floor_arithmetic():
    config = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "relu2",
        "patch_latent_dim": 32,
        "action_dim": 64,
        "latent_patch_size": 2,
    }
    tokens = cost_model.Tokens(text=10, vision=20, noisy_vision=16, action=4)
    full, cached = cost_model.forward_flops(config, tokens), cost_model.forward_flops(config, tokens, text_cached=True)
    # causal text attention (10 * 11 / 2 pairs) plus generation tokens over all 34 keys, 2 products x 2 FLOPs
    assert full["attention"] == 2 * 2 * 2 * 64 * (55 + 24 * 34)
    assert cached["attention"] == 2 * 2 * 2 * 64 * (24 * 34)  # cached text keys are still attended to
    assert full["matrix"] - cached["matrix"] == 10 * 2 * 2 * (64 * 64 * 2 + 2 * 64 * 32 + 2 * 64 * 128)


def test_edge_chunk_costs_and_vae_counts():
    from cosmos3_runtime.random_checkpoints import PUBLISHED_SHAPES

    edge = PUBLISHED_SHAPES["edge"]
    small = cost_model.vae_encode_flops(edge.vae_config, 256, 256)
    assert small > 1e11 and cost_model.vae_encode_flops(edge.vae_config, 512, 512) == pytest.approx(4 * small, rel=0.05)
    geometry = cost_model.GEOMETRIES[0]
    distilled = cost_model.chunk_cost("edge", edge.transformer_config, edge.vae_config, geometry, steps=4)
    base = cost_model.chunk_cost("edge", edge.transformer_config, edge.vae_config, geometry, steps=35, guided_steps=35)
    assert distilled.forwards == 4 and base.forwards == 70
    assert 10 < base.transformer_flops / distilled.transformer_flops < 20
    assert distilled.floor_ms > 1000 * distilled.flops / cost_model.H200_BF16_FLOPS * 0.99
