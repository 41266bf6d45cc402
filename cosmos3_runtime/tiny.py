"""Tiny, randomly initialised Cosmos3 checkpoints in the real diffusers layout, built offline.

No weights can be downloaded where this project is developed and tested, so tests, the demo and the
CPU benchmarks run on checkpoints built here. They are written exactly the way a published checkpoint
is laid out (``model_index.json``, ``transformer/``, ``vae/``, ``text_tokenizer/``, ``scheduler/``) and
are read back through the same loading path as a 30 GB one; only the sizes differ.

The four variants differ the way the real ones do, in their own config files:

- ``base``: a UniPC flow-matching scheduler; multi-step sampling with classifier-free guidance.
- ``edge``: the Edge backbone (``hidden_act: "relu2"``, Nemotron RMS norms).
- ``distilled``: a stochastic ``FlowMatchEulerDiscreteScheduler`` whose config carries the fixed
  sigma list in ``fixed_step_sampler_config.t_list`` (a key diffusers does not read; it also carries a
  ``shift`` that must *not* be applied on top of the list, as real distilled configs do).
- ``edge-distilled``: both.

Any of them can ship NVIDIA's DROID joint-position profile (``droid=True``, ``cosmos3-tiny --droid``), so
the state-conditioned path runs end to end on a tiny model too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .wan_vae import WAN22_VAE_CONFIG

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
# The profile ``droid=True`` ships instead for droid_lerobot, named the default domain: the settings of
# NVIDIA's DROID joint-position policy (docs/runtime.md, "Worked example").
TINY_DROID_PROFILE = {
    "action_space": "joint_pos",
    "raw_action_dim": 8,
    "default_horizon": 32,
    "use_state": True,
    "history_length": 1,
    "state_dim": 8,
    "gripper_flip_index": 7,
    "normalization": "none",
    "fps": 15,
    "resolution_tier": 480,
    "view_point": "concat_view",
    "view_description": "The top row is from the wrist-mounted camera. The bottom row contains two horizontally "
    "concatenated third-person perspective views of the scene from opposite sides, with the "
    "robot visible.",
    "prompt_format": "json",
    "guidance_interval": [960, 1001],
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
) -> Path:
    """Write a tiny random Cosmos3 checkpoint of ``variant`` to ``out_dir`` and return its path.

    Deterministic for a given ``seed``. The VAE is drawn from its own random stream (``vae_seed``, default
    ``seed``), so a transformer of another size gets the same VAE; its ``latents_mean``/``latents_std``
    are measured on it (:func:`_latent_statistics`), so its normalised latents have unit scale.
    ``transformer_overrides`` change the transformer's config (``hidden_size``, ``num_hidden_layers``, ...).
    ``legacy_class_name`` writes the older
    ``Cosmos3OmniDiffusersPipeline`` spelling into ``model_index.json``; ``with_action_head=False``
    builds a video-only transformer (no action modes); ``droid=True`` ships :data:`TINY_DROID_PROFILE`.
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
        profiles = (
            _TINY_PROFILES
            if not droid
            else {
                "default_domain": "droid_lerobot",
                "domains": {**_TINY_PROFILES["domains"], "droid_lerobot": TINY_DROID_PROFILE},
            }
        )
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
