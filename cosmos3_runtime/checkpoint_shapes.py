"""The published sizes of Cosmos3, and random-weight checkpoints built at exactly those sizes.

No real weights can be fetched where this project is developed, yet users serve Cosmos3 Edge (3.4 B
parameters), Nano (15.2 B) and Super (64 B). Each :class:`CheckpointShape` below is the
``transformer/config.json`` a published checkpoint carries, as NVIDIA's converter
(``cosmos_framework/scripts/_convert_model_to_diffusers.py``) writes it from the model's own configs:

- Edge: the Nemotron-3 2B dense VL backbone (``Nemotron-2B-Dense-VL.json``): ReLU² MLP without a gate,
  no text QK-norm, an extra key norm for the generation pathway, and the two Edge keys the converter
  adds (``backbone_type``, ``temporal_compression_factor``).
- Nano: the Qwen3-VL-8B backbone; Super: the Qwen3-VL-32B backbone. Both are published with a sound head
  (``sound_gen``, ``sound_dim`` 64), which is part of their parameter count.
- Shared by all: 48 latent channels patched 2×2 (192 per token), multi-axis RoPE of [24, 20, 20],
  64 action channels, 32 embodiment slots, base fps 24, timestep scale 0.001, no attention bias.

The VAE is Wan2.2's (``Wan-AI/Wan2.2-TI2V-5B-Diffusers``, which the converter copies): z_dim 48, base
width 160 (decoder 256), 12 channels in and out (2×2 pixel patches), residual, 16× spatial and 4×
temporal compression, with Wan2.2's published latent mean and standard deviation.

:func:`build_shaped_checkpoint` writes a checkpoint of one of these shapes in the real diffusers layout.
It never holds the model twice: the modules are created on the meta device (shapes only), then each
tensor is drawn, cast to bf16 and written shard by shard, and freed before the next shard. Everything
that is not a weight (tokenizer, scheduler, policy profiles, ``model_index.json``) is the tiny
checkpoint's: those files are the same at every size.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .wan_vae import WAN22_VAE_CONFIG

SHAPES = ("tiny", "edge", "nano", "super")

# The converter's keys common to every published transformer config.
_SHARED_TRANSFORMER = dict(
    head_dim=128,
    latent_channel=48,
    latent_patch_size=2,
    patch_latent_dim=192,
    rope_axes_dim=[24, 20, 20],
    action_gen=True,
    action_dim=64,
    num_embodiment_domains=32,
    base_fps=24,
    enable_fps_modulation=True,
    timestep_scale=0.001,
    attention_bias=False,
    attention_dropout=0.0,
    unified_3d_mrope_reset_spatial_ids=True,
    unified_3d_mrope_temporal_modality_margin=15000,
    sound_latent_fps=25.0,
)

# The Nemotron-3 dense backbone (Edge): ReLU² MLP without a gate, no text QK-norm, a key norm for generation.
_NEMOTRON_DENSE = dict(
    vocab_size=131072,
    hidden_act="relu2",
    rope_theta=100000000.0,
    rms_norm_eps=1e-5,
    qk_norm_for_text=False,
    use_und_k_norm_for_gen=True,
    sound_gen=False,
    sound_dim=None,
    # Written by the converter for Edge exports; the pipeline reads them, the transformer does not.
    backbone_type="cosmos3_edge_nemotron_dense",
    temporal_compression_factor=4,
    rope_scaling={"mrope_section": [24, 20, 20]},
)

# Qwen3-VL backbones (Nano, Super): gated SiLU MLP, text QK-norm, a sound head.
_QWEN3_VL = dict(
    vocab_size=151936,
    hidden_act="silu",
    rope_theta=5000000.0,
    rms_norm_eps=1e-6,
    qk_norm_for_text=True,
    use_und_k_norm_for_gen=False,
    sound_gen=True,
    sound_dim=64,
)

# Shards of at most this many bytes: loading reads one shard at a time, so this bounds the transient
# memory of a load on top of the model itself.
DEFAULT_MAX_SHARD_BYTES = 1 << 30


@dataclass(frozen=True)
class CheckpointShape:
    """One published Cosmos3 size: its transformer config as the checkpoint stores it, and its size."""

    name: str
    transformer_config: dict[str, Any]
    # What diffusers' Cosmos3OmniTransformer built from ``transformer_config`` holds (checked in tests).
    transformer_parameters: int
    vae_config: dict[str, Any] = field(default_factory=lambda: dict(WAN22_VAE_CONFIG))

    @property
    def is_edge(self) -> bool:
        return bool(self.transformer_config["hidden_act"] == "relu2")

    def variants(self) -> tuple[str, str]:
        """The two checkpoint variants of this backbone: its base and its distilled schedule."""
        return ("edge", "edge-distilled") if self.is_edge else ("base", "distilled")


PUBLISHED_SHAPES = {
    "edge": CheckpointShape(
        "edge",
        dict(
            _SHARED_TRANSFORMER,
            **_NEMOTRON_DENSE,
            hidden_size=2048,
            intermediate_size=9216,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
        ),
        transformer_parameters=3_369_657_024,
    ),
    "nano": CheckpointShape(
        "nano",
        dict(
            _SHARED_TRANSFORMER,
            **_QWEN3_VL,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
        ),
        transformer_parameters=15_173_669_120,
    ),
    "super": CheckpointShape(
        "super",
        dict(
            _SHARED_TRANSFORMER,
            **_QWEN3_VL,
            hidden_size=5120,
            intermediate_size=25600,
            num_hidden_layers=64,
            num_attention_heads=64,
            num_key_value_heads=8,
        ),
        transformer_parameters=64_019_736_832,
    ),
}


def transformer_on_meta(shape: CheckpointShape) -> Any:
    """diffusers' ``Cosmos3OmniTransformer`` of ``shape`` with every tensor on the meta device (no memory)."""
    import inspect

    import torch
    from diffusers import Cosmos3OmniTransformer

    accepted = inspect.signature(Cosmos3OmniTransformer.__init__).parameters
    with torch.device("meta"):
        return Cosmos3OmniTransformer(**{k: v for k, v in shape.transformer_config.items() if k in accepted})


def vae_on_meta(config: dict[str, Any] = WAN22_VAE_CONFIG) -> Any:
    """diffusers' ``AutoencoderKLWan`` (Wan2.2's by default) on the meta device."""
    import torch
    from diffusers import AutoencoderKLWan

    with torch.device("meta"):
        return AutoencoderKLWan(**config)


def resolve_variant(shape: CheckpointShape, variant: str | None) -> str:
    """The checkpoint variant for ``shape``: the distilled one by default; an Edge-ness mismatch is refused."""
    if variant is None:
        return shape.variants()[1]
    if variant not in shape.variants():
        raise ValueError(
            f"shape {shape.name} is {'an Edge' if shape.is_edge else 'a Qwen3-VL'} backbone: "
            f"variant {variant!r} does not fit it; use one of {', '.join(shape.variants())}"
        )
    return variant


def build_shaped_checkpoint(
    out_dir: str | Path,
    shape: str | CheckpointShape = "edge",
    variant: str | None = None,
    *,
    seed: int = 0,
    device: str = "cpu",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = True,
) -> Path:
    """Write a random-weight checkpoint of a published ``shape`` (edge, nano, super, or a
    :class:`CheckpointShape`) to ``out_dir``.

    Weights are bf16, drawn on ``device`` (``cuda`` draws an Edge checkpoint in seconds) and written in
    shards of at most ``max_shard_bytes``. Peak memory is one shard, whatever the model's size.
    """
    from .tiny import build_tiny_checkpoint

    if isinstance(shape, CheckpointShape):
        spec = shape
    elif shape in PUBLISHED_SHAPES:
        spec = PUBLISHED_SHAPES[shape]
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(PUBLISHED_SHAPES)}")
    out = build_tiny_checkpoint(out_dir, resolve_variant(spec, variant), seed=seed, overwrite=overwrite)
    for component, model in (("transformer", transformer_on_meta(spec)), ("vae", vae_on_meta(spec.vae_config))):
        folder = out / component
        shutil.rmtree(folder)
        folder.mkdir()
        model.save_config(folder)
        if component == "transformer":
            # Keys the transformer class does not take (the Edge markers) are not in model.config.
            config_path = folder / "config.json"
            config = json.loads(config_path.read_text())
            config.update({k: v for k, v in spec.transformer_config.items() if k not in config})
            config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
        write_random_weights(
            model, folder, seed=seed + (component == "vae"), device=device, max_shard_bytes=max_shard_bytes
        )
        del model
    return out


def write_random_weights(
    model: Any, folder: Path, *, seed: int = 0, device: str = "cpu", max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
) -> int:
    """Draw every tensor of ``model`` (on the meta device) and write it as bf16 diffusers shards in ``folder``.

    Returns the bytes written. Norm weights are ones and biases zeros, as a fresh model has them; other
    weights are drawn N(0, 1/fan_in) (token embeddings N(0, 0.02²)), so activations stay in range
    through every layer of a random model. Each shard is written and freed before the next is drawn.
    """
    import torch
    from safetensors.torch import save_file

    fan_ins = _domain_fan_ins(model)
    entries = [
        (name, tuple(t.shape), _init_std(name, tuple(t.shape), fan_ins)) for name, t in model.state_dict().items()
    ]
    shards: list[list[tuple[str, tuple[int, ...], float | None]]] = [[]]
    shard_bytes = 0
    for entry in entries:
        size = math.prod(entry[1]) * 2
        if shards[-1] and shard_bytes + size > max_shard_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(entry)
        shard_bytes += size
    count = len(shards)
    names = (
        ["diffusion_pytorch_model.safetensors"]
        if count == 1
        else [f"diffusion_pytorch_model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    )
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map, total = {}, 0
    for file_name, shard in zip(names, shards):
        tensors = {}
        for name, shape, std in shard:
            if std is None or std == 0.0:  # ones (norm weights) or zeros (biases)
                fill = 1.0 if std is None else 0.0
                tensor = torch.full(shape, fill, dtype=torch.bfloat16, device=device)
            else:
                tensor = torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(0.0, std, generator=generator)
            tensors[name] = tensor.cpu()
            weight_map[name] = file_name
            total += tensor.numel() * 2
            del tensor
        save_file(tensors, str(folder / file_name), metadata={"format": "pt"})
        del tensors
    if count > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def _init_std(name: str, shape: tuple[int, ...], fan_in_of: dict[str, int]) -> float | None:
    """How a tensor of a fresh random model is drawn: None = ones, 0.0 = zeros, else a normal's std."""
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name and leaf in ("weight", "gamma"):
        return None
    if "embed_tokens" in name or "modality_embed" in name:
        return 0.02
    if len(shape) == 1 or name.endswith(".bias.weight"):  # biases (DomainAwareLinear keeps its own in an embedding)
        return 0.0
    module = name.rsplit(".", 2)[0] if name.count(".") >= 2 else ""
    fan_in = fan_in_of.get(module, math.prod(shape[1:]))
    return 1.0 / math.sqrt(max(1, fan_in))


def _domain_fan_ins(model: Any) -> dict[str, int]:
    """Fan-in of each DomainAwareLinear: its weights live in embedding rows of input x output values."""
    return {
        name: module.input_size
        for name, module in model.named_modules()
        if hasattr(module, "num_domains") and hasattr(module, "input_size")
    }
