"""What the loaded model offers, typed: read once from the engine's ``describe()``.

The engine describes itself as JSON (``cosmos3_runtime.engine.Cosmos3Engine.describe``): modes, tiers,
defaults, the action horizon's range, the limits of every request field, and one profile per domain
(action width, default horizon, view point, fps, tier, prompt format, guidance interval, proprio state).
:meth:`ModelDescription.from_describe` reads that once, when the model is ready; everything on the server
side (session settings, request checks, every metadata answer, observers, SGLang's mappings) then reads
typed attributes instead of looking keys up in a dict.

``raw`` keeps the description exactly as the engine gave it, for the answers that pass it on to clients
unchanged (the HTTP metadata's ``domains`` and ``defaults``, a recording's model identity): a key the
engine adds later reaches them without a change here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from robot_clients.protocol import FrameLimits

# Modes the realtime endpoints serve. forward_dynamics (video rollouts) belongs to the HTTP job API.
REALTIME_MODES = ("policy", "inverse_dynamics")


def _interval(value: Any) -> tuple[float, float] | None:
    return (float(value[0]), float(value[1])) if value else None


@dataclass(frozen=True)
class Defaults:
    """What each unset request setting becomes (for the model as a whole, or for one domain)."""

    action_horizon: int | None = None
    resolution_tier: int | None = None
    view_point: str | None = None
    fps: float | None = None
    num_steps: int | None = None
    guidance_scale: float | None = None
    guidance_interval: tuple[float, float] | None = None
    domain_name: str | None = None  # the model's default domain (None in a domain's own defaults)

    @classmethod
    def from_describe(cls, values: Mapping[str, Any] | None) -> Defaults:
        values = values or {}
        return cls(
            action_horizon=values.get("action_horizon"),
            resolution_tier=values.get("resolution_tier"),
            view_point=values.get("view_point"),
            fps=values.get("fps"),
            num_steps=values.get("num_steps"),
            guidance_scale=values.get("guidance_scale"),
            guidance_interval=_interval(values.get("guidance_interval")),
            domain_name=values.get("domain_name"),
        )


@dataclass(frozen=True)
class DomainProfile:
    """One embodiment the model knows: what its actions look like and how a request for it runs."""

    name: str
    domain_id: int | None = None
    raw_action_dim: int | None = None
    default_horizon: int | None = None
    view_point: str | None = None
    fps: float | None = None
    resolution_tier: int | None = None
    action_space: str | None = None
    view_description: str | None = None
    prompt_format: str | None = None
    guidance_interval: tuple[float, float] | None = None
    normalization: str | None = None
    # Proprio state: its width, whether the model conditions on it, and how many past steps it takes.
    state_dim: int | None = None
    use_state: bool = False
    history_length: int | None = None
    defaults: Defaults = field(default_factory=Defaults)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_describe(cls, name: str, values: Mapping[str, Any]) -> DomainProfile:
        return cls(
            name=name,
            domain_id=values.get("domain_id"),
            raw_action_dim=values.get("raw_action_dim"),
            default_horizon=values.get("default_horizon"),
            view_point=values.get("view_point"),
            fps=values.get("fps"),
            resolution_tier=values.get("resolution_tier"),
            action_space=values.get("action_space"),
            view_description=values.get("view_description"),
            prompt_format=values.get("prompt_format"),
            guidance_interval=_interval(values.get("guidance_interval")),
            normalization=values.get("normalization"),
            state_dim=values.get("state_dim"),
            use_state=bool(values.get("use_state")),
            history_length=values.get("history_length"),
            defaults=Defaults.from_describe(values.get("defaults")),
            raw=dict(values),
        )


@dataclass(frozen=True)
class HorizonRange:
    """The action horizons the model accepts: between ``min`` and ``max``, a multiple of ``multiple_of``."""

    min: int = 1
    max: int | None = None
    multiple_of: int = 1

    def accepts(self, value: int) -> bool:
        return self.min <= value and (self.max is None or value <= self.max) and value % self.multiple_of == 0

    def as_dict(self) -> dict[str, Any]:
        return {"min": self.min, "max": self.max, "multiple_of": self.multiple_of}


@dataclass(frozen=True)
class ModelLimits:
    """The bounds of every request field, as the engine enforces them (None: no bound stated)."""

    min_image_side: int = 1
    max_image_side: int = 4096
    max_clip_frames: int = 65
    max_steps: int | None = None
    max_prompt_chars: int | None = None
    min_fps: float = 0.0
    max_fps: float = math.inf
    max_guidance_scale: float = math.inf
    max_seed: int = 2**63 - 1
    max_normalized_action: float | None = None

    @classmethod
    def from_describe(cls, values: Mapping[str, Any] | None) -> ModelLimits:
        values = values or {}
        known = {name: values[name] for name in cls.__dataclass_fields__ if values.get(name) is not None}
        return cls(**known)

    def frame_limits(self, max_decoded_bytes: int | None = None) -> FrameLimits:
        """The pixel and frame bounds one observation or request is checked against."""
        return FrameLimits(self.min_image_side, self.max_image_side, self.max_clip_frames, max_decoded_bytes)


@dataclass(frozen=True)
class ModelDescription:
    """The loaded model, as the server's every part sees it (see the module docstring)."""

    model: str | None = None
    variant: str | None = None
    is_distilled: bool = False
    is_edge: bool = False
    modes: tuple[str, ...] = ()
    action_modes: tuple[str, ...] = ()
    video_modes: tuple[str, ...] = ()
    resolution_tiers: tuple[int, ...] = ()
    # Per tier, the (height, width) canvases it runs at, when the engine states them.
    resolution_canvases: Mapping[int, tuple[tuple[int, int], ...]] | None = None
    distilled_sigmas: tuple[float, ...] | None = None
    defaults: Defaults = field(default_factory=Defaults)
    action_horizon: HorizonRange = field(default_factory=HorizonRange)
    domains: Mapping[str, DomainProfile] = field(default_factory=dict)
    view_points: tuple[str, ...] = ()
    limits: ModelLimits = field(default_factory=ModelLimits)
    device: str | None = None
    dtype: str | None = None
    parameters: int | None = None
    action_dim: int | None = None  # the model's (padded) action width
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_describe(cls, description: Mapping[str, Any]) -> ModelDescription:
        """Read an engine's ``describe()`` (keys it lacks keep their defaults)."""
        d = description
        horizon = d.get("action_horizon") or {}
        # ``canvases``: tier -> [{aspect_ratio, height, width}, ...], the aspect-ratio bins a frame is placed in.
        canvases = d.get("canvases")
        return cls(
            model=d.get("model"),
            variant=d.get("variant"),
            is_distilled=bool(d.get("is_distilled")),
            is_edge=bool(d.get("is_edge")),
            modes=tuple(d.get("modes") or ()),
            action_modes=tuple(d.get("action_modes") or ()),
            video_modes=tuple(d.get("video_modes") or ()),
            resolution_tiers=tuple(int(t) for t in d.get("resolution_tiers") or ()),
            resolution_canvases=None
            if canvases is None
            else {
                int(tier): tuple((int(b["height"]), int(b["width"])) for b in bins) for tier, bins in canvases.items()
            },
            distilled_sigmas=None if d.get("distilled_sigmas") is None else tuple(d["distilled_sigmas"]),
            defaults=Defaults.from_describe(d.get("defaults")),
            action_horizon=HorizonRange(
                min=horizon.get("min") or 1, max=horizon.get("max"), multiple_of=horizon.get("multiple_of") or 1
            ),
            domains={
                name: DomainProfile.from_describe(name, values) for name, values in (d.get("domains") or {}).items()
            },
            view_points=tuple(d.get("view_points") or ()),
            limits=ModelLimits.from_describe(d.get("limits")),
            device=d.get("device"),
            dtype=d.get("dtype"),
            parameters=d.get("parameters"),
            action_dim=d.get("action_dim"),
            raw=dict(d),
        )

    @property
    def realtime_modes(self) -> tuple[str, ...]:
        """The modes a robot session may ask for (``policy``, ``inverse_dynamics``), as this model serves them."""
        return tuple(mode for mode in self.modes if mode in REALTIME_MODES)

    @property
    def frame_limits(self) -> FrameLimits:
        return self.limits.frame_limits()

    def domain(self, name: str | None) -> DomainProfile | None:
        return self.domains.get(name) if name is not None else None
