"""What a checkpoint is, read once from its own files.

Everything here comes from the checkpoint's config files and safetensors headers; no weights are
loaded, so inspecting a 30 GB checkpoint is as quick as a tiny one. A variant is recognised by exact
values in its config files, never by a substring of a name:

- Edge: ``transformer/config.json`` has ``backbone_type == "cosmos3_edge_nemotron_dense"`` or
  ``hidden_act == "relu2"`` (the squared-ReLU MLP only the Edge backbone uses).
- distilled: ``scheduler/scheduler_config.json`` is a ``FlowMatchEulerDiscreteScheduler`` with a
  non-empty ``fixed_step_sampler_config.t_list``, or ``modular_model_index.json`` carries
  ``distilled_sigmas`` (diffusers' own convention).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointError

PIPELINE_CLASS_NAMES = ("Cosmos3OmniPipeline", "Cosmos3OmniDiffusersPipeline")
ALL_RESOLUTION_TIERS = (256, 480, 704, 720)
EDGE_RESOLUTION_TIERS = (256, 480)
EDGE_BACKBONE_TYPE = "cosmos3_edge_nemotron_dense"
EDGE_HIDDEN_ACT = "relu2"

_SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}


@dataclass
class WeightStats:
    """Parameter count and stored bytes of one component, from safetensors headers."""

    parameters: int = 0
    bytes: int = 0
    files: int = 0


@dataclass
class CheckpointInfo:
    """The facts about a checkpoint that the runtime decides things by."""

    path: str
    pipeline_class: str
    variant: str  # "base", "edge", "distilled" or "edge-distilled"
    is_edge: bool
    is_distilled: bool
    distilled_sigmas: list[float] | None
    scheduler_class: str
    scheduler_config: dict[str, Any]
    ignored_scheduler_keys: list[str]
    has_action_head: bool
    action_dim: int | None
    num_embodiment_domains: int
    resolution_tiers: tuple[int, ...]
    transformer_config: dict[str, Any]
    vae_config: dict[str, Any]
    has_profiles: bool
    weights: dict[str, WeightStats] = field(default_factory=dict)

    @property
    def parameters(self) -> int:
        return sum(w.parameters for w in self.weights.values())

    @property
    def parameter_bytes(self) -> int:
        return sum(w.bytes for w in self.weights.values())

    def summary(self) -> dict[str, Any]:
        """A JSON-able digest for humans and the metadata endpoints."""
        data = asdict(self)
        for key in ("transformer_config", "vae_config", "scheduler_config"):
            data.pop(key)
        data["parameters"] = self.parameters
        data["parameter_bytes"] = self.parameter_bytes
        data["resolution_tiers"] = list(self.resolution_tiers)
        return data


def inspect_checkpoint(path: str | Path) -> CheckpointInfo:
    """Read a checkpoint folder in diffusers layout and classify it."""
    root = Path(path)
    model_index = _read_json(root / "model_index.json")
    pipeline_class = model_index.get("_class_name")
    if pipeline_class not in PIPELINE_CLASS_NAMES:
        raise CheckpointError(
            f"{root} is not a Cosmos3 checkpoint: model_index.json _class_name is {pipeline_class!r}, "
            f"expected one of {', '.join(PIPELINE_CLASS_NAMES)}"
        )
    transformer_config = _read_json(root / "transformer" / "config.json")
    vae_config = _read_json(root / "vae" / "config.json")
    scheduler_config = _read_json(root / "scheduler" / "scheduler_config.json")
    scheduler_class = scheduler_config.get("_class_name", "")

    is_edge = (
        transformer_config.get("backbone_type") == EDGE_BACKBONE_TYPE
        or transformer_config.get("hidden_act") == EDGE_HIDDEN_ACT
    )

    distilled_sigmas = _distilled_sigmas(root, scheduler_class, scheduler_config)
    is_distilled = distilled_sigmas is not None
    variant = {(False, False): "base", (True, False): "edge", (False, True): "distilled"}.get(
        (is_edge, is_distilled), "edge-distilled"
    )

    accepted = _accepted_scheduler_keys(scheduler_class)
    ignored = sorted(
        k for k in scheduler_config if not k.startswith("_") and accepted is not None and k not in accepted
    )

    has_action_head = bool(transformer_config.get("action_gen", False))
    weights = {
        name: _weight_stats(root / name) for name in ("transformer", "vae", "sound_tokenizer") if (root / name).is_dir()
    }
    return CheckpointInfo(
        path=str(root),
        pipeline_class=pipeline_class,
        variant=variant,
        is_edge=is_edge,
        is_distilled=is_distilled,
        distilled_sigmas=distilled_sigmas,
        scheduler_class=scheduler_class,
        scheduler_config=scheduler_config,
        ignored_scheduler_keys=ignored,
        has_action_head=has_action_head,
        action_dim=transformer_config.get("action_dim") if has_action_head else None,
        num_embodiment_domains=int(transformer_config.get("num_embodiment_domains", 32)),
        resolution_tiers=EDGE_RESOLUTION_TIERS if is_edge else ALL_RESOLUTION_TIERS,
        transformer_config=transformer_config,
        vae_config=vae_config,
        has_profiles=(root / "policy_profiles.json").is_file(),
        weights=weights,
    )


def _distilled_sigmas(root: Path, scheduler_class: str, scheduler_config: dict[str, Any]) -> list[float] | None:
    sigmas = None
    if scheduler_class == "FlowMatchEulerDiscreteScheduler":
        fixed = scheduler_config.get("fixed_step_sampler_config") or {}
        sigmas = fixed.get("t_list") or None
    modular_index = root / "modular_model_index.json"
    if sigmas is None and modular_index.is_file():
        sigmas = _read_json(modular_index).get("distilled_sigmas") or None
    if sigmas is None:
        return None
    values = [float(s) for s in sigmas]
    # Some exports write the list in timestep units (0..num_train_timesteps); the sampler wants sigmas.
    if max(values) > 1.0:
        scale = float(scheduler_config.get("num_train_timesteps", 1000))
        values = [v / scale for v in values]
    if any(not 0.0 < v <= 1.0 for v in values) or values != sorted(values, reverse=True):
        raise CheckpointError(f"distilled sigma list {sigmas} is not a decreasing list in (0, 1]")
    return values


def _accepted_scheduler_keys(scheduler_class: str) -> set[str] | None:
    import inspect

    try:
        import diffusers

        cls = getattr(diffusers, scheduler_class)
    except (ImportError, AttributeError):
        return None
    return set(inspect.signature(cls.__init__).parameters) - {"self"}


def _weight_stats(folder: Path) -> WeightStats:
    """Sum parameter counts and bytes over the safetensors headers in ``folder`` (weights not read)."""
    stats = WeightStats()
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(header_len))
        stats.files += 1
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in entry["shape"]:
                count *= dim
            stats.parameters += count
            stats.bytes += count * _SAFETENSORS_DTYPE_BYTES.get(entry["dtype"], 0)
    if stats.files == 0:
        # Only the index was fetched (config-only inspection of a Hub checkpoint): bytes, not counts.
        for index in folder.glob("*.safetensors.index.json"):
            stats.bytes += int(_read_json(index).get("metadata", {}).get("total_size", 0))
    return stats


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint file missing: {path}") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"checkpoint file {path} is not valid JSON: {exc}") from exc
