"""Random checkpoints at the published Cosmos3 sizes: exact shapes, streamed bf16 weights, the real layout.

The parameter counts are the ones NVIDIA publishes for Cosmos3 Edge, Nano and Super; diffusers'
``Cosmos3OmniTransformer`` built on the meta device from our configs must hold exactly that many.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from cosmos3_runtime.random_checkpoints import (
    PUBLISHED_SHAPES,
    WAN22_VAE_CONFIG,
    CheckpointShape,
    build_shaped_checkpoint,
    resolve_variant,
    transformer_on_meta,
    vae_on_meta,
    write_random_weights,
)


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "shape, expected", [("edge", 3_369_657_024), ("nano", 15_173_669_120), ("super", 64_019_736_832)]
)
def test_published_shapes_have_the_published_parameter_counts(shape, expected):
    model = transformer_on_meta(PUBLISHED_SHAPES[shape])
    assert all(p.is_meta for p in model.parameters())  # nothing materialised: Super would need 128 GB
    assert _count(model) == expected == PUBLISHED_SHAPES[shape].transformer_parameters


def test_published_shape_details():
    edge = transformer_on_meta(PUBLISHED_SHAPES["edge"])
    cfg = edge.config
    assert (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.vocab_size,
    ) == (2048, 9216, 28, 16, 8, 131072)
    assert cfg.hidden_act == "relu2" and not hasattr(edge.layers[0].mlp, "gate_proj")
    assert cfg.qk_norm_for_text is False and cfg.use_und_k_norm_for_gen is True
    assert (cfg.rope_theta, cfg.rms_norm_eps) == (1e8, 1e-5)
    for name in ("edge", "nano", "super"):
        c = transformer_on_meta(PUBLISHED_SHAPES[name]).config
        assert (
            c.head_dim,
            c.latent_channel,
            c.latent_patch_size,
            c.patch_latent_dim,
            list(c.rope_axes_dim),
            c.action_dim,
            c.num_embodiment_domains,
            c.base_fps,
            c.timestep_scale,
            c.attention_bias,
        ) == (128, 48, 2, 192, [24, 20, 20], 64, 32, 24, 0.001, False)
    nano = transformer_on_meta(PUBLISHED_SHAPES["nano"]).config
    assert (nano.hidden_act, nano.rope_theta, nano.rms_norm_eps, nano.qk_norm_for_text) == ("silu", 5e6, 1e-6, True)
    vae = vae_on_meta()
    assert (
        vae.config.z_dim,
        vae.config.base_dim,
        vae.config.decoder_base_dim,
        vae.config.in_channels,
        vae.config.out_channels,
        vae.config.patch_size,
        vae.config.is_residual,
    ) == (48, 160, 256, 12, 12, 2, True)
    assert (vae.config.scale_factor_spatial, vae.config.scale_factor_temporal) == (16, 4)
    assert len(vae.config.latents_mean) == len(vae.config.latents_std) == 48


def test_variant_must_fit_the_backbone():
    edge, nano = PUBLISHED_SHAPES["edge"], PUBLISHED_SHAPES["nano"]
    assert resolve_variant(edge, None) == "edge-distilled" and resolve_variant(nano, None) == "distilled"
    assert resolve_variant(nano, "base") == "base"
    with pytest.raises(ValueError, match="Edge"):
        resolve_variant(edge, "distilled")
    with pytest.raises(ValueError, match="Qwen3-VL"):
        resolve_variant(nano, "edge")


def test_cli_refuses_a_variant_that_contradicts_the_shape(tmp_path, capsys):
    from cosmos3_runtime.cli import tiny_main

    with pytest.raises(SystemExit) as exit_info:
        tiny_main([str(tmp_path / "x"), "--shape", "edge", "--variant", "base"])
    assert exit_info.value.code == 2 and "edge-distilled" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        tiny_main([str(tmp_path / "x"), "--device", "cuda"])  # the tiny build has no device to honour
    assert exit_info.value.code == 2 and "--device" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def _safetensors_headers(folder):
    headers = {}
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            headers[file.name] = {k: v for k, v in json.loads(fh.read(n)).items() if k != "__metadata__"}
    return headers


# An Edge-keyed shape small enough to build in a fast test, with a small VAE of the Wan2.2 layout.
_MINI_EDGE = CheckpointShape(
    "mini-edge",
    dict(
        PUBLISHED_SHAPES["edge"].transformer_config,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=1024,
    ),
    transformer_parameters=0,  # not a published size
    vae_config=dict(WAN22_VAE_CONFIG, base_dim=8, decoder_base_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1),
)


def test_streamed_checkpoint_loads_through_the_production_path(tmp_path):
    """Sharded bf16 weights plus index, Edge config keys, loaded by the engine and answering a chunk."""
    from cosmos3_runtime.checkpoints import inspect_checkpoint
    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.requests import ActionRequest

    path = build_shaped_checkpoint(tmp_path / "mini", _MINI_EDGE, max_shard_bytes=200_000)
    transformer = path / "transformer"
    headers = _safetensors_headers(transformer)
    assert len(headers) > 1  # sharded, with an index naming every tensor's file
    index = json.loads((transformer / "diffusion_pytorch_model.safetensors.index.json").read_text())
    assert {k: f for f, h in headers.items() for k in h} == index["weight_map"]
    assert {e["dtype"] for h in headers.values() for e in h.values()} == {"BF16"}
    config = json.loads((transformer / "config.json").read_text())
    assert config["backbone_type"] == "cosmos3_edge_nemotron_dense" and config["temporal_compression_factor"] == 4
    assert config["_class_name"] == "Cosmos3OmniTransformer"

    info = inspect_checkpoint(path)
    assert info.variant == "edge-distilled" and info.is_edge
    meta = transformer_on_meta(_MINI_EDGE)
    assert info.weights["transformer"].parameters == _count(meta)
    assert info.weights["vae"].parameters == _count(vae_on_meta(_MINI_EDGE.vae_config))

    engine = Cosmos3Engine.load(path)
    image = np.random.default_rng(0).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    chunk = engine.predict_actions(ActionRequest(domain_name=engine.default_domain(), image=image, seed=0))
    assert chunk.transformer_forwards == len(info.distilled_sigmas)
    assert np.isfinite(chunk.actions).all() and chunk.actions.std() > 0


def test_weights_are_drawn_like_a_fresh_model(tmp_path):
    """Norm weights one, biases zero, matrices scaled by fan-in: a random model that stays finite."""
    from safetensors.torch import load_file

    meta = transformer_on_meta(_MINI_EDGE)
    written = write_random_weights(meta, tmp_path, seed=3)
    tensors = load_file(str(tmp_path / "diffusion_pytorch_model.safetensors"))
    assert written == sum(t.numel() * 2 for t in tensors.values())
    assert set(tensors) == set(meta.state_dict())
    assert (tensors["layers.0.input_layernorm.weight"].float() == 1).all()
    assert (tensors["proj_in.bias"].float() == 0).all()
    assert (tensors["action_proj_in.bias.weight"].float() == 0).all()
    up = tensors["layers.0.mlp.up_proj.weight"].float()
    assert abs(up.std().item() - 128**-0.5) < 0.01
    assert abs(tensors["action_proj_in.fc.weight"].float().std().item() - 64**-0.5) < 0.01
    again = write_random_weights(meta, tmp_path / "again", seed=3) if (tmp_path / "again").mkdir() is None else 0
    assert again == written
    assert load_file(str(tmp_path / "again" / "diffusion_pytorch_model.safetensors"))["lm_head.weight"].equal(
        tensors["lm_head.weight"]
    )  # deterministic for a seed
