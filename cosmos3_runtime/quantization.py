"""Quantized weights, chosen at load: which ones, how many bytes they take, and where they can run.

The transformer's linear layers are quantized by diffusers' own quantization config with torchao
(``from_pretrained(..., quantization_config=TorchAoConfig(...))``): diffusers hands each linear weight to
torchao as it reads it from its shard, so the full-precision transformer is never held whole. This module
writes no quantizer; it chooses torchao's config and says what it costs.

- ``int8``: weight-only int8 (``Int8WeightOnlyConfig``): one int8 per weight plus, per output row, a
  float32 scale and an int8 zero point. Activations stay in the serving dtype. Runs on CPU and GPU.
- ``fp8``: float8 (e4m3) weights and activations with a per-row scale
  (``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``), torch's scaled matmul. Needs a
  CUDA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell).

What stays at full precision, and why (:data:`FULL_PRECISION_MODULES`): the VAE (convolutions, not
linear layers, and it is loaded without a quantization config); the token embedding, the norms, biases and
the per-domain action head (``action_proj_in`` / ``action_proj_out`` are embedding tables, not linear
layers); and, by name, the transformer's input and output projections and its timestep embedder. Those
are where a rounding error is not averaged over a hidden dimension: ``proj_in`` / ``proj_out`` map the
VAE's latent patches in and out, and diffusers keeps the timestep embedder in float32 anyway. They are
a few million parameters of billions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

from .errors import CheckpointError

if TYPE_CHECKING:
    import torch

Quantization = Literal["int8", "fp8"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)

# Linear layers kept at full precision by name (module paths in diffusers' Cosmos3OmniTransformer).
FULL_PRECISION_MODULES = ("proj_in", "proj_out", "time_embedder", "audio_proj_in", "audio_proj_out")

# The oldest CUDA compute capability with float8 matmuls (Ada Lovelace, sm_89).
FP8_MIN_CAPABILITY = (8, 9)


class QuantizationError(CheckpointError):
    """A quantization that cannot run here (an unknown name, or fp8 without a GPU that has it)."""

    code = "quantization_error"


def parse_quantization(value: str | None) -> Quantization | None:
    """``value`` as a :data:`Quantization`; None and ``"none"`` mean full precision."""
    if value is None or value == "none":
        return None
    if value not in QUANTIZATIONS:
        raise QuantizationError(f"unknown quantization {value!r}; expected one of none, {', '.join(QUANTIZATIONS)}")
    return value  # type: ignore[return-value]  # checked against the Literal's values just above


def check_device(quantization: Quantization | None, device: torch.device) -> None:
    """Refuse, before anything loads, a quantization this device cannot run (one line, naming the device)."""
    if quantization != "fp8":
        return
    import torch

    if device.type != "cuda":
        raise QuantizationError(
            f"--quantization fp8 needs a CUDA GPU of compute capability {FP8_MIN_CAPABILITY[0]}."
            f"{FP8_MIN_CAPABILITY[1]} or newer; this server runs on {device.type}: use --quantization int8"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise QuantizationError(
            f"--quantization fp8 needs compute capability {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or "
            f"newer; {name} has {capability[0]}.{capability[1]}: use --quantization int8"
        )


def torchao_config(quantization: Quantization) -> Any:
    """diffusers' ``TorchAoConfig`` for ``quantization``, with :data:`FULL_PRECISION_MODULES` left out."""
    from diffusers import TorchAoConfig

    if quantization == "int8":
        from torchao.quantization import Int8WeightOnlyConfig

        config: Any = Int8WeightOnlyConfig()
    else:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow

        config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())
    return TorchAoConfig(config, modules_to_not_convert=list(FULL_PRECISION_MODULES))


def is_quantized_linear(module_name: str) -> bool:
    """Whether the linear layer at ``module_name`` is quantized (it is not one of the full-precision ones).

    The same test diffusers' torchao quantizer makes with ``modules_to_not_convert``."""
    return not any(module_name == kept or module_name.startswith(kept + ".") for kept in FULL_PRECISION_MODULES)


def quantized_weight_bytes(quantization: Quantization, rows: int, columns: int) -> int:
    """Bytes of one quantized ``rows x columns`` linear weight as torchao stores it.

    int8: the int8 values, a float32 scale and an int8 zero point per row (``Int8Tensor``); fp8: the
    float8 values and a float32 scale per row (``Float8Tensor`` with ``PerRow``).
    """
    per_row = 4 + 1 if quantization == "int8" else 4
    return rows * columns + rows * per_row
