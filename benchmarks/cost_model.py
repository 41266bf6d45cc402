"""The cost of one policy chunk per Cosmos3 shape and geometry, and the latency floor it implies on an H200.

A chunk is one VAE encode of the conditioning frame (policy mode encodes frame 0 alone) plus one
transformer forward per denoising step (two inside the guidance interval when the base model uses
classifier-free guidance). For each forward the cost model counts:

- matrix FLOPs, 2 per multiply-add: every token goes through one pathway's projections and MLP (text
  tokens the understanding weights, vision and action tokens the generation weights; ReLU² MLPs have two
  matrices, gated SiLU ones three), plus the patch and action projections and the timestep embedder of
  the noisy tokens. With the text prefix cached, text tokens cost nothing after the first forward.
- attention FLOPs: text attends causally to text, generation tokens to everything.
- bytes: the weights of the pathways a forward uses, read once (bf16), the floor when few tokens make a
  forward memory-bound.

The VAE encode's FLOPs are counted by torch's ``FlopCounterMode`` running diffusers' Wan2.2 encoder on the
meta device (shapes only, no weights). The floor of a forward is max(FLOPs / peak FLOP/s, bytes / memory
bandwidth); the floor of a chunk is the encode's plus its forwards'. The H200 figures are not measured
here (no GPU has run this project's code): NVIDIA's H200 data sheet (H200 SXM) gives 1,979 TFLOP/s bf16
with 2:4 sparsity, so about 989 dense, and 4.8 TB/s of HBM3e. The floors use 790 TFLOP/s and 4.3 TB/s,
an assumption of about 80 % and 90 % of those vendor figures (what large bf16 matmuls and copies
commonly sustain); ``make bench-gpu`` measures the chip itself. A measured chunk time divided by its
floor says how far a serving path is from the hardware.

Run: ``.venv/bin/python benchmarks/cost_model.py`` prints the table of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Assumed, not measured: about 80 % of NVIDIA's H200 SXM data sheet bf16 dense rate (1,979 TFLOP/s with
# sparsity, 989 dense) and 90 % of its 4.8 TB/s HBM3e (see the module docstring).
H200_BF16_FLOPS = 790e12
H200_BYTES_PER_S = 4.3e12
# Text tokens of the structured action caption with the chat template, as tokenized by the checkpoints
# built here (161 for the default prompt at horizon 16); published tokenizers differ by tens of tokens,
# which moves a forward's FLOPs by a few per cent.
DEFAULT_TEXT_TOKENS = 160


@dataclass(frozen=True)
class Geometry:
    """A request shape: the camera frame, the resolution tier, the action horizon."""

    name: str
    height: int
    width: int
    tier: int
    horizon: int


GEOMETRIES = (
    Geometry("256 tier, 224x224 camera, chunk 16", 224, 224, 256, 16),
    Geometry("256 tier, 480x640 camera, chunk 16", 480, 640, 256, 16),
    Geometry("DROID: 480 tier, 180x320 camera, chunk 32", 180, 320, 480, 32),
)


@dataclass(frozen=True)
class Tokens:
    text: int
    vision: int  # all latent frames
    noisy_vision: int  # all but the conditioning frame
    action: int


def tokens_for(
    geometry: Geometry,
    config: dict,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    vae_spatial: int = 16,
    vae_temporal: int = 4,
) -> Tokens:
    """Token counts of a policy request: the content's latent (canvas padding removed), patched 2x2."""
    from cosmos3_runtime.frame_preprocessing import canvas_for

    canvas = canvas_for(geometry.height, geometry.width, geometry.tier)
    patch = config["latent_patch_size"]
    per_frame = math.ceil(max(canvas.content_height // vae_spatial, 1) / patch) * math.ceil(
        max(canvas.content_width // vae_spatial, 1) / patch
    )
    latent_frames = geometry.horizon // vae_temporal + 1
    return Tokens(text_tokens, per_frame * latent_frames, per_frame * (latent_frames - 1), geometry.horizon)


def forward_flops(config: dict, tokens: Tokens, text_cached: bool = False) -> dict[str, float]:
    """Matrix and attention FLOPs of one transformer forward."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    mlp_matrices = 2 if config["hidden_act"] == "relu2" else 3
    per_token_layer = 2 * (h * q + 2 * h * kv + q * h + mlp_matrices * h * inter)
    text = 0 if text_cached else tokens.text
    generation = tokens.vision + tokens.action
    matrix = per_token_layer * layers * (text + generation)
    patch_dim, action_dim = config["patch_latent_dim"], config["action_dim"]
    matrix += 2 * tokens.vision * patch_dim * h * 2  # proj_in, proj_out
    matrix += 2 * tokens.action * action_dim * h * 2  # action_proj_in, action_proj_out
    matrix += 2 * (tokens.noisy_vision + tokens.action) * (256 * h + h * h)  # timestep embedder
    attention = layers * 2 * 2 * q * (text * (text + 1) / 2 + generation * (tokens.text + generation))
    return {"matrix": float(matrix), "attention": float(attention), "total": float(matrix + attention)}


def pathway_weight_bytes(config: dict, bytes_per_weight: int = 2) -> float:
    """Bytes of one pathway's decoder weights (what a forward of that pathway's tokens reads)."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    mlp_matrices = 2 if config["hidden_act"] == "relu2" else 3
    return float(layers * (2 * h * q + 2 * h * kv + mlp_matrices * h * inter) * bytes_per_weight)


def vae_encode_flops(vae_config: dict, canvas_height: int, canvas_width: int, frames: int = 1) -> float:
    """FLOPs of diffusers' AutoencoderKLWan encode of ``frames`` canvas frames, counted on the meta device."""
    import torch
    from diffusers import AutoencoderKLWan
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        vae = AutoencoderKLWan(**vae_config)
    with FlopCounterMode(display=False) as counter:
        vae.encode(torch.empty((1, 3, frames, canvas_height, canvas_width), device="meta"))
    return float(counter.get_total_flops())


@dataclass(frozen=True)
class ChunkCost:
    shape: str
    geometry: str
    schedule: str
    tokens: Tokens
    forwards: int
    encode_flops: float
    transformer_flops: float
    weight_bytes: float

    @property
    def flops(self) -> float:
        return self.encode_flops + self.transformer_flops

    @property
    def floor_ms(self) -> float:
        """max(compute, memory) per forward, plus the encode's compute, in ms on an H200."""
        per_forward_compute = self.transformer_flops / self.forwards / H200_BF16_FLOPS
        per_forward_memory = self.weight_bytes / self.forwards / H200_BYTES_PER_S
        return (
            self.encode_flops / H200_BF16_FLOPS + self.forwards * max(per_forward_compute, per_forward_memory)
        ) * 1e3

    @property
    def bound(self) -> str:
        return (
            "memory" if self.weight_bytes / H200_BYTES_PER_S > self.transformer_flops / H200_BF16_FLOPS else "compute"
        )


def chunk_cost(
    shape_name: str,
    config: dict,
    vae_config: dict,
    geometry: Geometry,
    *,
    steps: int,
    guided_steps: int = 0,
    prefix_cache: bool = True,
    text_tokens: int = DEFAULT_TEXT_TOKENS,
    schedule: str = "",
    batch: int = 1,
) -> ChunkCost:
    """The cost of ``batch`` policy chunks run together: ``steps`` forwards, ``guided_steps`` of them
    with a second (unconditional) pass; text computed on each pass's first forward only if cached."""
    from cosmos3_runtime.frame_preprocessing import canvas_for

    tokens = tokens_for(geometry, config, text_tokens)
    passes = [("cond", s) for s in range(steps)] + [("uncond", s) for s in range(guided_steps)]
    first_of_pass = {"cond": 0, "uncond": 0}
    transformer, weight_bytes = 0.0, 0.0
    und_bytes = gen_bytes = pathway_weight_bytes(config)
    for name, step in passes:
        cached = prefix_cache and step != first_of_pass[name]
        transformer += batch * forward_flops(config, tokens, text_cached=cached)["total"]
        weight_bytes += gen_bytes + (0 if cached else und_bytes)
    canvas = canvas_for(geometry.height, geometry.width, geometry.tier)
    encode = batch * vae_encode_flops(vae_config, canvas.height, canvas.width)
    return ChunkCost(shape_name, geometry.name, schedule, tokens, len(passes), encode, transformer, weight_bytes)


def table(batch: int = 1) -> list[ChunkCost]:
    from cosmos3_runtime.random_checkpoints import PUBLISHED_SHAPES

    rows = []
    for name, shape in PUBLISHED_SHAPES.items():
        for geometry in GEOMETRIES:
            rows.append(
                chunk_cost(
                    name,
                    shape.transformer_config,
                    shape.vae_config,
                    geometry,
                    steps=4,
                    schedule="distilled, 4 steps",
                    batch=batch,
                )
            )
            rows.append(
                chunk_cost(
                    name,
                    shape.transformer_config,
                    shape.vae_config,
                    geometry,
                    steps=35,
                    guided_steps=35,
                    schedule="base, 35 steps, guidance",
                    batch=batch,
                )
            )
    return rows


def markdown(rows: list[ChunkCost]) -> str:
    lines = [
        "| shape | geometry | schedule | tokens (text + vision + action) | forwards | encode TFLOP | "
        "transformer TFLOP | H200 floor ms | bound |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        t = r.tokens
        lines.append(
            f"| {r.shape} | {r.geometry} | {r.schedule} | {t.text} + {t.vision} + {t.action} | {r.forwards} | "
            f"{r.encode_flops / 1e12:.2f} | {r.transformer_flops / 1e12:.2f} | {r.floor_ms:.1f} | {r.bound} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    print(markdown(table(args.batch)))


if __name__ == "__main__":
    main()
