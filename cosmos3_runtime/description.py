"""What a loaded model offers, typed: the one description the engine gives and the server reads.

:meth:`Cosmos3Engine.describe` returns a :class:`ModelDescription` (``cosmos3-inspect`` builds the same one
from a checkpoint's config files, without weights): modes, tiers and their canvases, the defaults, the
action horizons, the limits of every request field, and one :class:`~cosmos3_runtime.profiles.PolicyProfile`
per domain with the defaults it resolves to. It is a frozen dataclass of plain values, so it pickles (the
Ray replicas return it) and the server reads attributes, never keys. :meth:`ModelDescription.as_json` is
its one JSON form, for every answer that passes it on to clients and for recordings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .engine_spec import EngineLimits, EngineSpec, RequestDefaults
from .profiles import VIEW_POINTS, PolicyProfile

# What identifies the model in a recording (:meth:`ModelDescription.identity`).
MODEL_IDENTITY_KEYS = (
    "model",
    "variant",
    "is_distilled",
    "is_edge",
    "dtype",
    "device",
    "parameters",
    "action_dim",
    "num_embodiment_domains",
)
# Modes that answer with actions (the realtime endpoints, HTTP action generations); forward_dynamics
# answers with video (the HTTP video jobs).
VIDEO_MODES = ("forward_dynamics",)


@dataclass(frozen=True)
class TierCanvas:
    """One canvas of a resolution tier: frames whose aspect ratio is closest to ``aspect_ratio`` land on it."""

    aspect_ratio: float
    height: int
    width: int


def canvas_bins() -> dict[int, tuple[TierCanvas, ...]]:
    """Every tier's canvases, as diffusers' pipeline chooses among them (``frame_preprocessing.canvas_for``)."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _ACTION_RESOLUTION_BINS

    return {
        int(tier): tuple(TierCanvas(float(ratio), int(h), int(w)) for ratio, (h, w) in bins.items())
        for tier, bins in _ACTION_RESOLUTION_BINS.items()
    }


@dataclass(frozen=True)
class PrefixCacheStats:
    """The text prefix cache at one moment (:class:`~cosmos3_runtime.prefix_cache.TextPrefixCache`)."""

    entries: int
    bytes: int
    budget_bytes: int
    hits: int
    misses: int
    evictions: int


@dataclass(frozen=True)
class HorizonRange:
    """The action horizons the model accepts: between ``min`` and ``max``, a multiple of ``multiple_of``."""

    min: int
    max: int
    multiple_of: int

    def accepts(self, value: int) -> bool:
        return self.min <= value <= self.max and value % self.multiple_of == 0


@dataclass(frozen=True)
class ModelDescription:
    """The loaded model, as the server's every part sees it (see the module docstring)."""

    model: str
    variant: str
    is_distilled: bool
    is_edge: bool
    modes: tuple[str, ...]
    resolution_tiers: tuple[int, ...]
    # Per served tier, its canvases (aspect-ratio bins): a client sizes its frames to these before sending.
    canvases: Mapping[int, tuple[TierCanvas, ...]]
    distilled_sigmas: tuple[float, ...] | None
    # What a request that names nothing runs with: the default domain's defaults (``domain_name``).
    defaults: RequestDefaults
    horizon_multiple: int  # the VAE's temporal compression: a chunk spans horizon + 1 frames
    domains: Mapping[str, PolicyProfile]
    domain_defaults: Mapping[str, RequestDefaults]
    limits: EngineLimits
    parameters: int
    parameter_bytes: int
    action_dim: int | None  # the model's (padded) action width; None without an action head
    num_embodiment_domains: int
    view_points: tuple[str, ...] = VIEW_POINTS
    device: str | None = None  # None: described from config files, nothing loaded
    dtype: str | None = None
    prefix_cache: PrefixCacheStats | None = field(default=None, compare=False)

    @classmethod
    def of_spec(
        cls,
        spec: EngineSpec,
        model: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        prefix_cache: PrefixCacheStats | None = None,
    ) -> ModelDescription:
        """The description of a checkpoint from its spec (``device`` and ``dtype``: where it is loaded)."""
        info = spec.info
        tiers = tuple(int(tier) for tier in info.resolution_tiers)
        return cls(
            model=model,
            variant=info.variant,
            is_distilled=info.is_distilled,
            is_edge=info.is_edge,
            modes=tuple(spec.modes),
            resolution_tiers=tiers,
            canvases={tier: bins for tier, bins in canvas_bins().items() if tier in tiers},
            distilled_sigmas=tuple(info.distilled_sigmas) if info.distilled_sigmas is not None else None,
            defaults=spec.model_defaults(),
            horizon_multiple=spec.horizon_multiple,
            domains=dict(sorted(spec.profiles.items())),
            domain_defaults={name: spec.defaults_for(profile) for name, profile in sorted(spec.profiles.items())},
            limits=spec.limits,
            parameters=info.parameters,
            parameter_bytes=info.parameter_bytes,
            action_dim=info.action_dim if info.has_action_head else None,
            num_embodiment_domains=info.num_embodiment_domains,
            device=device,
            dtype=dtype,
            prefix_cache=prefix_cache,
        )

    @property
    def action_modes(self) -> tuple[str, ...]:
        """The modes answered with actions (``policy``, ``inverse_dynamics``): the realtime endpoints' modes."""
        return tuple(mode for mode in self.modes if mode not in VIDEO_MODES)

    @property
    def video_modes(self) -> tuple[str, ...]:
        return tuple(mode for mode in self.modes if mode in VIDEO_MODES)

    @property
    def action_horizon(self) -> HorizonRange:
        return HorizonRange(self.limits.min_action_horizon, self.limits.max_action_horizon, self.horizon_multiple)

    def domain(self, name: str | None) -> PolicyProfile | None:
        return self.domains.get(name) if name is not None else None

    def identity(self) -> dict[str, Any]:
        """What identifies the model (checkpoint, variant, dtype, device, size): what a recording keeps."""
        return {key: getattr(self, key) for key in MODEL_IDENTITY_KEYS}

    def as_json(self) -> dict[str, Any]:
        """The description as JSON values: what the metadata answers, ``/healthz`` and recordings pass on."""
        return {
            "model": self.model,
            "variant": self.variant,
            "is_distilled": self.is_distilled,
            "is_edge": self.is_edge,
            "modes": list(self.modes),
            "action_modes": list(self.action_modes),
            "video_modes": list(self.video_modes),
            "resolution_tiers": list(self.resolution_tiers),
            "canvases": {str(tier): [asdict(b) for b in bins] for tier, bins in self.canvases.items()},
            "distilled_sigmas": list(self.distilled_sigmas) if self.distilled_sigmas is not None else None,
            "defaults": defaults_json(self.defaults),
            "action_horizon": asdict(self.action_horizon),
            "domains": {name: self.domain_json(name) for name in self.domains},
            "view_points": list(self.view_points),
            "limits": limits_json(self.limits),
            "device": self.device,
            "dtype": self.dtype,
            "parameters": self.parameters,
            "parameter_bytes": self.parameter_bytes,
            "action_dim": self.action_dim,
            "num_embodiment_domains": self.num_embodiment_domains,
            "prefix_cache": asdict(self.prefix_cache) if self.prefix_cache is not None else None,
        }

    def domain_json(self, name: str) -> dict[str, Any]:
        """One domain's profile and the defaults it resolves to, as JSON values."""
        p = self.domains[name]
        return {
            "domain_id": p.domain_id,
            "action_space": p.action_space,
            "raw_action_dim": p.raw_action_dim,
            "default_horizon": p.default_horizon,
            "fps": p.fps,
            "resolution_tier": p.resolution_tier,
            "view_point": p.view_point,
            "view_description": p.view_description,
            "prompt_format": p.prompt_format,
            "guidance_interval": list(p.guidance_interval) if p.guidance_interval is not None else None,
            "gripper_flip_index": p.gripper_flip_index,
            "normalization": p.normalization.kind if p.normalization is not None else None,
            "state_dim": p.state_dim,
            "use_state": p.use_state,
            "history_length": p.history_length,
            "defaults": defaults_json(self.domain_defaults[name], with_domain=False),
        }


def limits_json(limits: EngineLimits) -> dict[str, Any]:
    """The bounds of every request field (the horizon's are in ``action_horizon``)."""
    data = asdict(limits)
    del data["min_action_horizon"], data["max_action_horizon"]
    return {**data, "max_clip_frames": limits.max_clip_frames}


def defaults_json(defaults: RequestDefaults, with_domain: bool = True) -> dict[str, Any]:
    """``with_domain``: with ``domain_name`` (the model's defaults; a domain's own do not repeat its name)."""
    data = asdict(defaults)
    if not with_domain:
        del data["domain_name"]
    data["guidance_interval"] = list(defaults.guidance_interval) if defaults.guidance_interval is not None else None
    return data
