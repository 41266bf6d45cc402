"""Random-weight Cosmos3 checkpoints in the real diffusers layout, built offline: tiny ones, and ones at the
published sizes.

No weights can be downloaded where this project is developed and tested, so tests, the demo and the
benchmarks run on checkpoints drawn here. They are laid out exactly as a published checkpoint
(``model_index.json``, ``transformer/``, ``vae/``, ``text_tokenizer/``, ``scheduler/``) and are read back
through the same loading path as a 30 GB one; only the sizes differ.

**Tiny** (:func:`build_tiny_checkpoint`): four variants that differ the way the real ones do, in their own
config files:

- ``base``: a UniPC flow-matching scheduler; multi-step sampling with classifier-free guidance.
- ``edge``: the Edge backbone (``hidden_act: "relu2"``, Nemotron RMS norms).
- ``distilled``: a stochastic ``FlowMatchEulerDiscreteScheduler`` whose config carries the fixed
  sigma list in ``fixed_step_sampler_config.t_list`` (a key diffusers does not read; it also carries a
  ``shift`` that must *not* be applied on top of the list, as real distilled configs do).
- ``edge-distilled``: both.

Any of them can be one of NVIDIA's DROID joint-position policies (``droid=True``, ``cosmos3-tiny --droid``:
the ``checkpoint.json`` NVIDIA's Edge export carries, by which the runtime applies NVIDIA's DROID contract), so
the state-conditioned path runs end to end on a tiny model too, or the same profile in the ``midtrain``
end-effector action space (``droid_midtrain=True``, ``cosmos3-tiny --droid-midtrain``).

**Published sizes** (:func:`build_shaped_checkpoint`): users serve Cosmos3 Edge (3.4 B parameters), Nano
(15.2 B) and Super (64 B). Each :class:`CheckpointShape` is the ``transformer/config.json`` a published
checkpoint carries, as NVIDIA's converter (``cosmos_framework/scripts/_convert_model_to_diffusers.py``)
writes it from the model's own configs:

- Edge: the Nemotron-3 2B dense VL backbone (``Nemotron-2B-Dense-VL.json``): ReLU² MLP without a gate,
  no text QK-norm, an extra key norm for the generation pathway, and the two Edge keys the converter
  adds (``backbone_type``, ``temporal_compression_factor``).
- Nano: the Qwen3-VL-8B backbone; Super: the Qwen3-VL-32B backbone. Both are published with a sound head
  (``sound_gen``, ``sound_dim`` 64), which is part of their parameter count.
- Shared by all: 48 latent channels patched 2×2 (192 per token), multi-axis RoPE of [24, 20, 20],
  64 action channels, 32 embodiment slots, base fps 24, timestep scale 0.001, no attention bias.

The VAE is Wan2.2's (``Wan-AI/Wan2.2-TI2V-5B-Diffusers``, which the converter copies,
:data:`WAN22_VAE_CONFIG`): z_dim 48, base width 160 (decoder 256), 12 channels in and out (2×2 pixel
patches), residual, 16× spatial and 4× temporal compression, with Wan2.2's published latent mean and
standard deviation. The tiny checkpoints use the same architecture at a few channels' width.

A published size never holds the model twice: the modules are created on the meta device (shapes only),
then each tensor is drawn, cast to bf16 and written shard by shard, and freed before the next shard.
Everything that is not a weight (tokenizer, scheduler, policy profiles, ``model_index.json``) is the tiny
checkpoint's: those files are the same at every size.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .profiles import NVIDIA_DROID_CONTRACT

# Wan2.2's VAE as Cosmos3 checkpoints carry it (``Wan-AI/Wan2.2-TI2V-5B-Diffusers``, copied by NVIDIA's converter).
WAN22_VAE_CONFIG = dict(
    base_dim=160,
    decoder_base_dim=256,
    z_dim=48,
    dim_mult=[1, 2, 4, 4],
    num_res_blocks=2,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    dropout=0.0,
    is_residual=True,
    in_channels=12,
    out_channels=12,
    patch_size=2,
    scale_factor_spatial=16,
    scale_factor_temporal=4,
    latents_mean=[
        -0.2289,
        -0.0052,
        -0.1323,
        -0.2339,
        -0.2799,
        0.0174,
        0.1838,
        0.1557,
        -0.1382,
        0.0542,
        0.2813,
        0.0891,
        0.1570,
        -0.0098,
        0.0375,
        -0.1825,
        -0.2246,
        -0.1207,
        -0.0698,
        0.5109,
        0.2665,
        -0.2108,
        -0.2158,
        0.2502,
        -0.2055,
        -0.0322,
        0.1109,
        0.1567,
        -0.0729,
        0.0899,
        -0.2799,
        -0.1230,
        -0.0313,
        -0.1649,
        0.0117,
        0.0723,
        -0.2839,
        -0.2083,
        -0.0520,
        0.3748,
        0.0152,
        0.1957,
        0.1433,
        -0.2944,
        0.3573,
        -0.0548,
        -0.1681,
        -0.0667,
    ],
    latents_std=[
        0.4765,
        1.0364,
        0.4514,
        1.1677,
        0.5313,
        0.4990,
        0.4818,
        0.5013,
        0.8158,
        1.0344,
        0.5894,
        1.0901,
        0.6885,
        0.6165,
        0.8454,
        0.4978,
        0.5759,
        0.3523,
        0.7135,
        0.6804,
        0.5833,
        1.4146,
        0.8986,
        0.5659,
        0.7069,
        0.5338,
        0.4889,
        0.4917,
        0.4069,
        0.4999,
        0.6866,
        0.4093,
        0.5709,
        0.6065,
        0.6415,
        0.4944,
        0.5726,
        1.2042,
        0.5458,
        1.6887,
        0.3971,
        1.0600,
        0.3943,
        0.5537,
        0.5444,
        0.4089,
        0.7468,
        0.7744,
    ],
)

# -- tiny checkpoints ------------------------------------------------------------------------------


VARIANTS = ("base", "edge", "distilled", "edge-distilled")

# The fixed schedule of the tiny distilled checkpoints: four sigmas, one transformer forward each.
TINY_DISTILLED_SIGMAS = [0.9997, 0.9, 0.75, 0.5]

# Sentences the byte-level BPE tokenizer is trained on: enough to give it merges for the chat template,
# the action JSON caption and typical robot prompts. Any text still tokenizes (byte fallback).
_TOKENIZER_CORPUS = [
    "You are a helpful assistant who will generate videos from a give prompt.",
    "You are a helpful assistant who will generate images from a give prompt.",
    "pick up the red cube and place it in the bowl",
    "open the drawer, then push the green block to the left",
    "This video is captured from a first-person perspective looking at the scene.",
    "This video is captured from a wrist-mounted camera.",
    '{"cinematography": {"framing": "ego"}, "actions": [{"time": "0:00-0:01", "description": "move"}], '
    '"duration": "1s", "fps": 24.0, "resolution": {"H": 256, "W": 256}, "aspect_ratio": "1,1"}',
    "user assistant system",
]
_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
# A Qwen-style chat template: the pipeline calls apply_chat_template(..., add_vision_id=False).
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_TINY_TRANSFORMER: dict[str, Any] = dict(
    head_dim=16,
    hidden_size=64,
    intermediate_size=128,
    latent_channel=8,
    num_attention_heads=4,
    num_hidden_layers=2,
    num_key_value_heads=2,
    patch_latent_dim=8 * 2 * 2,  # latent_channel * latent_patch_size**2
    latent_patch_size=2,
    rope_axes_dim=[4, 2, 2],  # sums to head_dim // 2
    action_dim=64,
    action_gen=True,
    num_embodiment_domains=32,
    vocab_size=512,
)

# Wan2.2's VAE (same patching and compression) at a few channels' width. The latent statistics written
# with it are measured on the drawn VAE (:func:`_latent_statistics`); these unit values are placeholders.
TINY_VAE_CONFIG = dict(
    WAN22_VAE_CONFIG,
    base_dim=8,
    decoder_base_dim=None,
    z_dim=_TINY_TRANSFORMER["latent_channel"],
    dim_mult=[1, 2, 2, 2],
    num_res_blocks=1,
    latents_mean=[0.0] * _TINY_TRANSFORMER["latent_channel"],
    latents_std=[1.0] * _TINY_TRANSFORMER["latent_channel"],
)

# Per-embodiment profiles the tiny checkpoint ships, to exercise "read from the checkpoint":
# inline quantile stats for one domain, a mean/std stats file nested under "global" for another.
_TINY_PROFILES = {
    "domains": {
        "bridge_orig_lerobot": {
            "default_horizon": 16,
            "view_point": "third_person_view",
            "normalization": {
                "q01": [-0.05, -0.05, -0.05, -0.2, -0.2, -0.2, -0.2, -0.2, -0.2, 0.0],
                "q99": [0.05, 0.05, 0.05, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 1.0],
            },
        },
        "droid_lerobot": {
            "default_horizon": 16,
            "view_point": "ego_view",
            "normalization_file": "stats/droid_lerobot.json",
        },
    }
}
# ``droid=True`` ships what NVIDIA's Edge DROID export carries: a checkpoint.json naming the DROID domain, its
# chunk and fps. The runtime recognises the checkpoint by it and applies NVIDIA's DROID contract
# (profiles.NVIDIA_DROID_CONTRACT, with NVIDIA's sampler on non-distilled variants): no profile file.
TINY_DROID_POLICY = {"action_chunk_size": 32, "conditioning_fps": 15.0, "domain_name": "droid_lerobot"}
# The profile ``droid_midtrain=True`` ships: the DROID settings in the reference server's ``midtrain`` action
# space (poses [x, y, z, qx, qy, qz, qw, gripper] in and out; the model's rows [translation, rot6d, gripper]).
TINY_DROID_MIDTRAIN_PROFILE = {
    **NVIDIA_DROID_CONTRACT,
    "action_space": "midtrain",
    "raw_action_dim": 10,
    "gripper_flip_index": 9,
}
_TINY_DROID_STATS = {
    "global": {
        "mean": [0.0, 0.1, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5],
        "std": [0.1, 0.1, 0.1, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.5],
    }
}


def build_tiny_checkpoint(
    out_dir: str | Path,
    variant: str = "distilled",
    *,
    seed: int = 0,
    vae_seed: int | None = None,
    transformer_overrides: dict[str, Any] | None = None,
    legacy_class_name: bool = False,
    with_action_head: bool = True,
    overwrite: bool = True,
    droid: bool = False,
    droid_midtrain: bool = False,
) -> Path:
    """Write a tiny random Cosmos3 checkpoint of ``variant`` to ``out_dir`` and return its path.

    Deterministic for a given ``seed``. The VAE is drawn from its own random stream (``vae_seed``, default
    ``seed``), so a transformer of another size gets the same VAE; its ``latents_mean``/``latents_std``
    are measured on it (:func:`_latent_statistics`), so its normalised latents have unit scale.
    ``transformer_overrides`` change the transformer's config (``hidden_size``, ``num_hidden_layers``, ...).
    ``legacy_class_name`` writes the older
    ``Cosmos3OmniDiffusersPipeline`` spelling into ``model_index.json``; ``with_action_head=False``
    builds a video-only transformer (no action modes); ``droid=True`` ships :data:`TINY_DROID_POLICY` in
    ``checkpoint.json``, as NVIDIA's Edge DROID export does (the runtime then applies NVIDIA's DROID contract),
    ``droid_midtrain=True`` that and :data:`TINY_DROID_MIDTRAIN_PROFILE`.
    """
    import torch
    from diffusers import (
        AutoencoderKLWan,
        Cosmos3OmniTransformer,
        FlowMatchEulerDiscreteScheduler,
        UniPCMultistepScheduler,
    )

    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    out = Path(out_dir)
    if out.exists():
        if not overwrite:
            raise FileExistsError(f"{out} already exists")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    is_edge = variant.startswith("edge")
    is_distilled = variant.endswith("distilled")

    tokenizer = _build_tokenizer()
    tokenizer.save_pretrained(out / "text_tokenizer")

    transformer_config = dict(_TINY_TRANSFORMER, hidden_act="relu2" if is_edge else "silu")
    transformer_config.update(transformer_overrides or {})
    if not with_action_head:
        transformer_config.update(action_gen=False, action_dim=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = Cosmos3OmniTransformer(**transformer_config)
        # The action embedding starts at zero in a fresh model; give it values so the action
        # pathway is exercised the way a trained one is.
        if with_action_head:
            torch.nn.init.normal_(transformer.action_modality_embed, std=0.02)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed if vae_seed is None else vae_seed)
        vae = AutoencoderKLWan(**TINY_VAE_CONFIG)
    mean, std = _latent_statistics(vae)
    vae.register_to_config(latents_mean=mean, latents_std=std)
    transformer.save_pretrained(out / "transformer")
    vae.save_pretrained(out / "vae")

    if is_distilled:
        scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0, stochastic_sampling=True)
        scheduler.save_pretrained(out / "scheduler")
        # Real distilled checkpoints carry their schedule in keys the scheduler class does not accept.
        config_path = out / "scheduler" / "scheduler_config.json"
        config = json.loads(config_path.read_text())
        config["fixed_step_sampler_config"] = {"t_list": list(TINY_DISTILLED_SIGMAS)}
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
        scheduler_class = "FlowMatchEulerDiscreteScheduler"
    else:
        scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
        scheduler.save_pretrained(out / "scheduler")
        scheduler_class = "UniPCMultistepScheduler"

    import diffusers

    model_index = {
        "_class_name": "Cosmos3OmniDiffusersPipeline" if legacy_class_name else "Cosmos3OmniPipeline",
        "_diffusers_version": diffusers.__version__,
        "enable_safety_checker": False,
        "safety_checker": [None, None],
        "sound_tokenizer": [None, None],
        "scheduler": ["diffusers", scheduler_class],
        "text_tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": ["diffusers", "Cosmos3OmniTransformer"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    (out / "model_index.json").write_text(json.dumps(model_index, indent=2, sort_keys=True))

    if with_action_head:
        (out / "stats").mkdir()
        (out / "stats" / "droid_lerobot.json").write_text(json.dumps(_TINY_DROID_STATS, indent=2))
        profiles: dict[str, Any] = dict(_TINY_PROFILES)
        if droid or droid_midtrain:
            (out / "checkpoint.json").write_text(json.dumps({"policy": TINY_DROID_POLICY}, indent=2))
            # The other tiny domains stay; droid_lerobot is NVIDIA's (or, for midtrain, that in poses).
            others = {name: entry for name, entry in _TINY_PROFILES["domains"].items() if name != "droid_lerobot"}
            droid_entry = {"droid_lerobot": TINY_DROID_MIDTRAIN_PROFILE} if droid_midtrain else {}
            profiles = {"domains": {**others, **droid_entry}}
        (out / "policy_profiles.json").write_text(json.dumps(profiles, indent=2))
    return out


def _latent_statistics(vae: Any) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of ``vae``'s latents over a fixed set of synthetic 256 x 256 frames.

    A random encoder's latents have offsets of a few tenths and a spread of a few hundredths per channel;
    written as unit statistics, everything an image changes would sit at 1/100 of the unit noise the model
    works in. A trainer that knows its own frames writes theirs instead (``cosmos3-train``).
    """
    import torch

    side = 256
    ramp = torch.linspace(-1.0, 1.0, side)
    generator = torch.Generator().manual_seed(0)
    frames = [
        torch.zeros(3, side, side),
        ramp.view(1, 1, side).expand(3, side, side),
        ramp.view(1, side, 1).expand(3, side, side),
        torch.rand(3, side, side, generator=generator) * 2.0 - 1.0,
        torch.stack(
            [
                ramp.view(1, side).expand(side, side),
                -ramp.view(side, 1).expand(side, side),
                ramp.abs().view(1, side).expand(side, side),
            ]
        ),
    ]
    clip = torch.stack(frames).unsqueeze(2)  # (B, 3, 1, H, W)
    with torch.no_grad():
        latents = vae.encode(clip).latent_dist.mode()
    per_channel = latents.transpose(0, 1).reshape(latents.shape[1], -1).double()
    return per_channel.mean(1).tolist(), per_channel.std(1).clamp_min(1e-6).tolist()


def _build_tokenizer() -> Any:
    """A byte-level BPE tokenizer with the special tokens and chat template the pipeline uses."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TOKENIZER_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|vision_start|>", "<|vision_end|>"],
    )
    fast.chat_template = _CHAT_TEMPLATE
    if len(fast) > _TINY_TRANSFORMER["vocab_size"]:
        raise RuntimeError("tiny tokenizer outgrew the tiny transformer's vocabulary")
    return fast


# -- checkpoints at the published sizes ------------------------------------------------------------


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
    weights: bool = True,
) -> Path:
    """Write a random-weight checkpoint of a published ``shape`` (edge, nano, super, or a
    :class:`CheckpointShape`) to ``out_dir``.

    Weights are bf16, drawn on ``device`` (``cuda`` draws an Edge checkpoint in seconds) and written in
    shards of at most ``max_shard_bytes``. Peak memory is one shard, whatever the model's size.
    ``weights=False`` writes the config files and the shard index only, as a Hub checkpoint fetched for
    inspection has them: enough for ``cosmos3-inspect``'s memory plan of a size this disk cannot hold.
    """
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
            model,
            folder,
            seed=seed + (component == "vae"),
            device=device,
            max_shard_bytes=max_shard_bytes,
            index_only=not weights,
        )
        del model
    return out


def write_random_weights(
    model: Any,
    folder: Path,
    *,
    seed: int = 0,
    device: str = "cpu",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    index_only: bool = False,
) -> int:
    """Draw every tensor of ``model`` (on the meta device) and write it as bf16 diffusers shards in ``folder``.

    Returns the bytes written (``index_only``: the bytes the shards would take; only the index is written).
    Norm weights are ones and biases zeros, as a fresh model has them; other
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
    if index_only:
        weight_map = {name: file_name for file_name, shard in zip(names, shards) for name, _, _ in shard}
        total = sum(math.prod(shape) * 2 for shard in shards for _, shape, _ in shard)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        return total
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
