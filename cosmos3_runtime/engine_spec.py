"""What the loaded checkpoint can do, and the defaults that follow: built once at load, read by every check.

:class:`EngineSpec` comes from the checkpoint's own config files and its domain profiles (no weights
needed); :mod:`cosmos3_runtime.validation` checks each request against it and
:class:`~cosmos3_runtime.description.ModelDescription` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .errors import CheckpointError, InvalidRequestError
from .inspection import CheckpointInfo
from .profiles import PolicyProfile, ProfileTable
from .requests import ACTION_MODES

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
