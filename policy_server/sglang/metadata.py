"""SGLang's action metadata keys, read from the loaded model's description (``ModelDescription``).

SGLang answers ``GET /v1/actions/metadata`` (and opens its realtime WebSocket) with::

    {"object": "action.metadata", "model", "policy_family": "cosmos3",
     "input": {"modalities", "supported_resolutions", "state_dim"},
     "output": {"action_type", "action_horizon", "action_dim", "padded_action_dim", "dtype"},
     "defaults": {...}, "capabilities": {"action_modes", "realtime_websocket", "openpi_websocket",
                                         "batch_inputs", "max_batch_size", ...}}

where SGLang fills in literals (horizon 16, 480×832, fps 5). Here every value comes from the loaded
checkpoint, or from the server's own settings, which the caller passes in. :func:`merge_metadata` adds
these keys to one of our metadata answers without changing any key it already has (except ``object``,
which becomes SGLang's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cosmos3_runtime.description import ModelDescription

# The runtime (cosmos3_runtime) serves Cosmos3 checkpoints only.
POLICY_FAMILY = "cosmos3"
# The wire dtype of every action array this server sends.
ACTION_DTYPE = "float32"


def supported_resolutions(description: ModelDescription) -> list[list[int]]:
    """``[width, height]`` canvases of the model's tiers, when the engine describes them (SGLang's order)."""
    tiers = description.resolution_tiers
    sizes: list[list[int]] = []
    for tier, bins in sorted(description.canvases.items()):
        for canvas in bins if tier in tiers else ():
            if [canvas.width, canvas.height] not in sizes:
                sizes.append([canvas.width, canvas.height])
    return sizes


def sglang_metadata(
    description: ModelDescription,
    *,
    max_batch_size: int,
    openpi_websocket: bool,
    default_fps: float | None,
) -> dict[str, Any]:
    """SGLang's metadata keys for the loaded model.

    ``max_batch_size``: the most action chunks one request may ask for (images × candidates);
    ``openpi_websocket``: whether the server answers openpi clients; ``default_fps``: the rate a
    request without ``fps`` runs at. The rest is the loaded model's description.
    """
    action_modes = list(description.action_modes)
    defaults = description.defaults
    domains = description.domains.values()
    widths = {domain.raw_action_dim for domain in domains}
    state_dims = {domain.state_dim for domain in domains}
    modalities = (["image"] if "policy" in action_modes else []) + (["video"] if action_modes else [])
    return {
        "object": "action.metadata",
        "model": description.model,
        "policy_family": POLICY_FAMILY,
        "input": {
            "modalities": modalities,
            "supported_resolutions": supported_resolutions(description),
            "resolution_tiers": list(description.resolution_tiers),
            # One state width for every domain, or None: none (images only) or the requested domain's.
            "state_dim": state_dims.pop() if len(state_dims) == 1 else None,
        },
        "output": {
            "action_type": "continuous",
            "action_horizon": defaults.action_horizon,
            # One width for every domain, or None: it is the requested domain's raw_action_dim.
            "action_dim": widths.pop() if len(widths) == 1 else None,
            "padded_action_dim": description.action_dim,
            "dtype": ACTION_DTYPE,
        },
        "defaults": {
            "action_mode": "policy" if "policy" in action_modes else next(iter(action_modes), None),
            "action_horizon": defaults.action_horizon,
            "num_inference_steps": defaults.num_steps,
            "guidance_scale": defaults.guidance_scale,
            "resolution_tier": defaults.resolution_tier,
            "fps": default_fps,
        },
        "capabilities": {
            "action_modes": action_modes,
            "realtime_websocket": True,
            "openpi_websocket": openpi_websocket,
            "batch_inputs": max_batch_size > 1 and "policy" in action_modes,
            "max_batch_size": max_batch_size,
            "batched_action_modes": ["policy"] if max_batch_size > 1 and "policy" in action_modes else [],
            "multiple_candidates": max_batch_size > 1 and bool(action_modes),
        },
    }


def merge_metadata(ours: Mapping[str, Any], sglang: Mapping[str, Any]) -> dict[str, Any]:
    """``ours`` with SGLang's keys added: objects (``defaults``, ``capabilities``) merged key by key.

    A key both have keeps our value (they agree where both exist); ``object`` becomes SGLang's
    ``"action.metadata"``, the one value SGLang clients compare.
    """
    merged = dict(ours)
    for key, value in sglang.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **{k: v for k, v in value.items() if k not in merged[key]}}
        elif key == "object" or key not in merged:
            merged[key] = value
    return merged
