"""What a loaded model offers, typed: what the checkpoint can do, and the one description of it the engine
gives and the server reads.

:class:`EngineSpec` comes from the checkpoint's own config files and its domain profiles (no weights
needed), built once at load: its capabilities, the defaults that follow from its variant and profiles,
and the limits of every request field (:class:`EngineLimits`). :mod:`cosmos3_runtime.validation` checks
each request against it.

:meth:`Cosmos3Engine.describe` returns a :class:`ModelDescription` (``cosmos3-inspect`` builds the same one
from a checkpoint's config files, without weights): modes, tiers and their canvases, the defaults, the
action horizons, the limits of every request field, and one :class:`~cosmos3_runtime.profiles.PolicyProfile`
per domain with the defaults it resolves to. It is a frozen dataclass of plain values, so it pickles (the
Ray replicas return it) and the server reads attributes, never keys. :meth:`ModelDescription.as_json` is
its one JSON form, for every answer that passes it on to clients and for recordings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from .checkpoints import CheckpointInfo
from .errors import CheckpointError, InvalidRequestError
from .profiles import VIEW_POINTS, NormalizationStats, PolicyProfile, ProfileTable
from .requests import ACTION_MODES

# -- what the checkpoint can do ---------------------------------------------------------------------

# Defaults where the checkpoint does not decide. Base: diffusers' own pipeline defaults. Edge (not
# distilled): guidance 5.0, SGLang's default for its Cosmos3 Edge variant. Distilled: the checkpoint's
# fixed list without guidance. The latency-oriented variants (distilled, Edge) take their lowest tier.
BASE_DEFAULT_STEPS = 35
BASE_DEFAULT_GUIDANCE = 6.0
EDGE_DEFAULT_GUIDANCE = 5.0
BASE_DEFAULT_TIER = 480


@dataclass(frozen=True)
class EngineLimits:
    """Bounds on what one request may ask for (documented in docs/runtime.md)."""

    # Sides below the VAE's 16-pixel multiple are snapped up to it (frame_preprocessing.snapped_side); 8
    # admits the smallest test images clients send (SGLang's are 8x8) and still catches a transposed array.
    min_image_side: int = 8
    max_image_side: int = 4096
    min_action_horizon: int = 4
    max_action_horizon: int = 64
    max_steps: int = 200
    max_prompt_chars: int = 2000
    min_fps: float = 1.0
    max_fps: float = 240.0
    max_guidance_scale: float = 30.0
    max_seed: int = 2**63 - 1
    # Action inputs (prefix_actions, forward_dynamics actions) once normalized by the domain's statistics:
    # the training data lies within about ±1; far beyond, the networks' activations overflow.
    max_normalized_action: float = 1000.0

    @property
    def max_clip_frames(self) -> int:
        return self.max_action_horizon + 1


@dataclass(frozen=True)
class RequestDefaults:
    """What each unset request field becomes: for one domain, or for a request that names no domain.

    ``domain_name`` is set in the model's defaults only: the domain a request that names none gets.
    Without an action head there is no domain: then only the variant's own values are set.
    """

    num_steps: int
    guidance_scale: float
    resolution_tier: int
    guidance_interval: tuple[float, float] | None = None
    action_horizon: int | None = None
    view_point: str | None = None
    fps: float | None = None
    domain_name: str | None = None


@dataclass(frozen=True)
class EngineSpec:
    """The loaded checkpoint's capabilities and the defaults that follow from its variant and profiles."""

    info: CheckpointInfo
    profiles: dict[str, PolicyProfile]
    horizon_multiple: int  # the VAE's temporal compression: a chunk spans horizon + 1 frames
    default_steps: int
    default_guidance: float
    default_tier: int
    limits: EngineLimits = field(default_factory=EngineLimits)
    default_domain: str | None = None

    @classmethod
    def for_checkpoint(
        cls, info: CheckpointInfo, profiles: ProfileTable, limits: EngineLimits | None = None
    ) -> EngineSpec:
        """The variant's defaults, from the checkpoint's config files alone (no weights needed).

        Raises :class:`CheckpointError` for a profile this variant cannot serve as written (a tier it
        lacks, a chunk it cannot take), so the operator learns it at load, not from every request.
        """
        if info.distilled_sigmas is not None:  # set exactly when the checkpoint is distilled
            steps, guidance = len(info.distilled_sigmas), 1.0
        else:
            steps, guidance = BASE_DEFAULT_STEPS, EDGE_DEFAULT_GUIDANCE if info.is_edge else BASE_DEFAULT_GUIDANCE
        latency_first = info.is_distilled or info.is_edge
        spec = cls(
            info=info,
            profiles=profiles.domains,
            # diffusers' pipeline reads the same key (Cosmos3OmniPipeline.vae_scale_factor_temporal).
            horizon_multiple=int(info.vae_config.get("scale_factor_temporal", 4)),
            default_steps=steps,
            default_guidance=guidance,
            default_tier=min(info.resolution_tiers) if latency_first else BASE_DEFAULT_TIER,
            limits=limits or EngineLimits(),
            default_domain=profiles.default_domain,
        )
        for profile in profiles.domains.values():
            where = f"profile for domain {profile.domain_name!r}"
            if profile.resolution_tier is not None and profile.resolution_tier not in info.resolution_tiers:
                tiers = ", ".join(map(str, info.resolution_tiers))
                raise CheckpointError(
                    f"{where}: resolution_tier {profile.resolution_tier} is not one this "
                    f"{info.variant} checkpoint supports ({tiers})"
                )
            try:
                check_horizon(profile.default_horizon, spec)
            except InvalidRequestError as exc:
                raise CheckpointError(f"{where}: default_horizon: {exc.message}") from None
        return spec

    @property
    def modes(self) -> list[str]:
        return list(ACTION_MODES) if self.info.has_action_head else []

    def defaults_for(self, profile: PolicyProfile) -> RequestDefaults:
        """The domain's own settings where its profile has them, the variant's elsewhere."""
        return RequestDefaults(
            action_horizon=profile.default_horizon,
            resolution_tier=profile.resolution_tier if profile.resolution_tier is not None else self.default_tier,
            view_point=profile.view_point,
            fps=profile.fps,
            num_steps=self.default_steps,
            guidance_scale=self.default_guidance,
            # A distilled checkpoint runs without guidance, so it has no interval to apply it in.
            guidance_interval=None if self.info.is_distilled else profile.guidance_interval,
        )

    def model_defaults(self) -> RequestDefaults:
        """What a request that names nothing runs with: the default domain's defaults."""
        profile = self.profiles.get(self.default_domain) if self.default_domain is not None else None
        if profile is None:  # no action head: only the variant's own values exist
            return RequestDefaults(self.default_steps, self.default_guidance, self.default_tier)
        return replace(self.defaults_for(profile), domain_name=profile.domain_name)


def check_horizon(value: object, spec: EngineSpec, field_name: str = "action_horizon") -> int:
    """``value`` as an action horizon this model can take; raises :class:`InvalidRequestError` if it is not."""
    lim, multiple = spec.limits, spec.horizon_multiple
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidRequestError(f"{field_name} must be an integer", field_name)
    horizon = int(value)
    if not lim.min_action_horizon <= horizon <= lim.max_action_horizon or horizon % multiple:
        raise InvalidRequestError(
            f"action horizon {horizon} is not one this model can take: it must be a multiple of {multiple} "
            f"(the chunk spans horizon + 1 video frames and the VAE compresses time {multiple}x) "
            f"in [{lim.min_action_horizon}, {lim.max_action_horizon}]",
            field_name,
        )
    return horizon


# -- the description the server reads ---------------------------------------------------------------

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
    """The text prefix cache at one moment (:class:`~cosmos3_runtime.sequence_packing.TextPrefixCache`)."""

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
        """One domain's profile (every field but its name, statistics by their kind) and the defaults it
        resolves to, as JSON values."""
        profile = self.domains[name]
        data: dict[str, Any] = {}
        for profile_field in fields(profile):
            value = getattr(profile, profile_field.name)
            if isinstance(value, NormalizationStats):
                value = value.kind
            data[profile_field.name] = list(value) if isinstance(value, tuple) else value
        del data["domain_name"]
        data["defaults"] = defaults_json(self.domain_defaults[name], with_domain=False)
        return data


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
