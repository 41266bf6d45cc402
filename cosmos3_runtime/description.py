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

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from .checkpoints import CheckpointInfo, ScheduleRule, configured_shift, step_sigmas
from .errors import (
    CheckpointError,
    InvalidRequestError,
    MissingMediumError,
    UnknownDomainError,
    UnsupportedModeError,
    UnsupportedTierError,
)
from .profiles import (
    MAX_GUIDANCE_SCALE,
    MAX_SHIFT,
    MAX_STEPS,
    MIN_SHIFT,
    VIEW_POINTS,
    NormalizationStats,
    PolicyProfile,
    ProfileTable,
)
from .requests import ACTION_MODES, SETTING_NAMES, ResolvedSettings
from .served_weights import ServedWeights

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
    max_steps: int = MAX_STEPS
    max_prompt_chars: int = 2000
    min_fps: float = 1.0
    max_fps: float = 240.0
    max_guidance_scale: float = MAX_GUIDANCE_SCALE
    min_shift: float = MIN_SHIFT
    max_shift: float = MAX_SHIFT
    max_seed: int = 2**63 - 1
    # Action inputs (prefix_actions, forward_dynamics actions) once normalized by the domain's statistics:
    # the training data lies within about ±1; far beyond, the networks' activations overflow.
    max_normalized_action: float = 1000.0
    # The most one request may cost, in default chunks of its domain (:meth:`ModelDescription.chunk_cost`:
    # transformer forwards x tokens); 0: unbounded. A server sets it (``cosmos3-serve --max-request-cost``) so
    # that no robot's request holds the engine for many robots' chunks.
    max_chunk_cost: float = 0.0

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
    shift: float | None = None  # None: no shift applies (a distilled checkpoint's fixed sigma list)
    action_horizon: int | None = None
    view_point: str | None = None
    fps: float | None = None
    domain_name: str | None = None

    def chunk_text(self) -> str:
        """The chunk's defaults in words (``cosmos3-inspect``): horizon, tier, frame rate and view."""
        fps = f"{self.fps:g}" if self.fps is not None else "-"
        return f"chunk {self.action_horizon}, tier {self.resolution_tier}, {fps} fps, {self.view_point}"

    def sampler_text(self, forwards: int | None) -> str:
        """The sampler's defaults in words (``cosmos3-inspect``), and the transformer forwards a chunk takes."""
        shift = f", shift {self.shift:g}" if self.shift is not None else ", unshifted"
        interval = f", guidance in sigmas {list(self.guidance_interval)}" if self.guidance_interval else ""
        each = f": {forwards} transformer forwards a chunk" if forwards is not None else ""
        return f"{self.num_steps} steps, guidance {self.guidance_scale:g}{shift}{interval}{each}"


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
    default_shift: float | None = None  # the shift the checkpoint's scheduler applies (None: none applies)

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
            default_shift=configured_shift(info),
        )
        for profile in profiles.domains.values():
            where = f"profile for domain {profile.domain_name!r}"
            try:  # a profile's sampler settings pass the check a request's do
                sampler = profile_sampler(profile, info.is_distilled)
                check_sampler(sampler, info.distilled_sigmas, spec.default_shift is not None, spec.limits)
            except InvalidRequestError as exc:
                raise CheckpointError(f"{where}: {exc.message}") from None
            if profile.resolution_tier is not None:
                try:
                    _tier(profile.resolution_tier, info.resolution_tiers, info.variant)
                except InvalidRequestError as exc:
                    raise CheckpointError(f"{where}: {exc.message}") from None
            try:
                check_horizon(profile.default_horizon, spec)
            except InvalidRequestError as exc:
                raise CheckpointError(f"{where}: default_horizon: {exc.message}") from None
        return spec

    @property
    def modes(self) -> list[str]:
        return list(ACTION_MODES) if self.info.has_action_head else []

    def defaults_for(self, profile: PolicyProfile) -> RequestDefaults:
        """The domain's own settings where its profile has them, the variant's elsewhere. A distilled
        checkpoint's sampler is its fixed list, without guidance or shift (profiles cannot change it)."""
        sampler = not self.info.is_distilled
        return RequestDefaults(
            action_horizon=profile.default_horizon,
            resolution_tier=profile.resolution_tier if profile.resolution_tier is not None else self.default_tier,
            view_point=profile.view_point,
            fps=profile.fps,
            num_steps=profile.num_steps if sampler and profile.num_steps is not None else self.default_steps,
            guidance_scale=(
                profile.guidance_scale if sampler and profile.guidance_scale is not None else self.default_guidance
            ),
            guidance_interval=profile.guidance_interval if sampler else None,
            shift=profile.shift if sampler and profile.shift is not None else self.default_shift,
        )

    def model_defaults(self) -> RequestDefaults:
        """What a request that names nothing runs with: the default domain's defaults."""
        profile = self.profiles.get(self.default_domain) if self.default_domain is not None else None
        if profile is None:  # no action head: only the variant's own values exist
            return RequestDefaults(
                self.default_steps, self.default_guidance, self.default_tier, shift=self.default_shift
            )
        return replace(self.defaults_for(profile), domain_name=profile.domain_name)


def check_sampler(
    settings: Mapping[str, object], distilled_sigmas: Sequence[float] | None, shiftable: bool, lim: EngineLimits
) -> None:
    """Steps, guidance, its interval and the shift (by name; ``None`` is unset), a request's or a profile's
    (:func:`profile_sampler`): a distilled model's (``distilled_sigmas`` set) are fixed, a base model's bounded,
    and a shift needs a scheduler that has one (``shiftable``). Raises :class:`InvalidRequestError`."""
    steps, guidance = settings.get("num_steps"), settings.get("guidance_scale")
    interval, shift = settings.get("guidance_interval"), settings.get("shift")
    if distilled_sigmas is not None:
        fixed = len(distilled_sigmas)
        if steps is not None and steps != fixed:
            raise InvalidRequestError(
                f"this distilled checkpoint runs its fixed {fixed}-step schedule; num_steps must be {fixed} or unset",
                "num_steps",
            )
        if guidance is not None and guidance != 1.0:
            raise InvalidRequestError(
                "guidance is distilled into this checkpoint's weights; guidance_scale must be 1.0 or unset",
                "guidance_scale",
            )
        if interval is not None:
            raise InvalidRequestError(
                "a distilled checkpoint runs without guidance; guidance_interval must be unset", "guidance_interval"
            )
        if shift is not None:
            raise InvalidRequestError(
                "a distilled checkpoint runs its sigma list unshifted; shift must be unset", "shift"
            )
        return
    if steps is not None and (
        isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= lim.max_steps
    ):
        raise InvalidRequestError(f"num_steps must be an integer in [1, {lim.max_steps}]", "num_steps")
    if guidance is not None and not _number_in(guidance, 0.0, lim.max_guidance_scale):
        raise InvalidRequestError(
            f"guidance_scale must be a number in [0, {lim.max_guidance_scale:g}]", "guidance_scale"
        )
    if interval is not None:
        _interval(interval)
    if shift is not None:
        if not shiftable:
            raise InvalidRequestError("this checkpoint's scheduler has no flow shift; leave shift unset", "shift")
        if not _number_in(shift, lim.min_shift, lim.max_shift):
            raise InvalidRequestError(f"shift must be a number in [{lim.min_shift:g}, {lim.max_shift:g}]", "shift")


def profile_sampler(profile: PolicyProfile, distilled: bool) -> dict[str, object]:
    """A profile's sampler settings (steps, guidance, its interval, the shift), by name, as a request names them.

    On a distilled checkpoint without its guidance interval: the interval is where the domain's guidance runs,
    and a distilled checkpoint runs none, so it does not apply there (:meth:`EngineSpec.defaults_for`), whereas
    a request asking for one asks for guidance it would not get."""
    return dict(
        num_steps=profile.num_steps,
        guidance_scale=profile.guidance_scale,
        guidance_interval=None if distilled else profile.guidance_interval,
        shift=profile.shift,
    )


def check_horizon(value: object, spec: EngineSpec, field_name: str = "action_horizon") -> int:
    """``value`` as an action horizon this model can take; raises :class:`InvalidRequestError` if it is not."""
    return _horizon(value, spec.limits, spec.horizon_multiple, field_name)


def _horizon(value: object, lim: EngineLimits, multiple: int, field_name: str) -> int:
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
    "weights",
)
# Modes that answer with actions (the WebSocket endpoints, HTTP action generations); forward_dynamics
# answers with video (the HTTP video jobs).
VIDEO_MODES = ("forward_dynamics",)


@dataclass(frozen=True)
class Media:
    """A request's camera input as the rules of its shape see it (:meth:`ModelDescription.resolve`): whether it
    holds an image (one frame, or named cameras composed into one) and a video, and the video's frames once
    known (a door that has not decoded it yet does not know them)."""

    image: bool = False
    video: bool = False
    clip_frames: int | None = None

    @classmethod
    def of(cls, image: object, video: object) -> Media:
        """The media of a request's ``image`` and ``video`` (None: absent); a video array's frames are known."""
        frames = int(video.shape[0]) if isinstance(video, np.ndarray) and video.ndim > 0 else None
        return cls(image=image is not None, video=video is not None, clip_frames=frames)


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
    # Transformer forwards one chunk takes at each domain's defaults (steps, plus a second pass per step
    # with guidance inside the guidance interval).
    chunk_forwards: Mapping[str, int] = field(default_factory=dict)
    shiftable: bool = False  # whether a request may set the scheduler's flow shift
    device: str | None = None  # None: described from config files, nothing loaded
    dtype: str | None = None
    # Which weights answer (quantization, SHA-256, Hub commit); None: described from config files, nothing loaded.
    weights: ServedWeights | None = None
    prefix_cache: PrefixCacheStats | None = field(default=None, compare=False)
    # Whether the checkpoint's scheduler runs a (steps, shift) schedule; None: not known (no checkpoint).
    schedules: ScheduleRule | None = field(default=None, compare=False, repr=False)
    # What :meth:`resolve` answered, by its arguments' typed values: a robot sends the same settings with every
    # observation, and both the session and the engine ask. Bounded (:data:`RESOLVED_MEMO_SIZE`); a copy of the
    # description (``replace``) starts empty.
    _resolved: dict[tuple[Any, ...], ResolvedSettings] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @classmethod
    def of_spec(
        cls,
        spec: EngineSpec,
        model: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        weights: ServedWeights | None = None,
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
            chunk_forwards={
                name: transformer_forwards(info, spec.defaults_for(profile)) for name, profile in spec.profiles.items()
            },
            shiftable=spec.default_shift is not None,
            limits=spec.limits,
            parameters=info.parameters,
            parameter_bytes=info.parameter_bytes,
            action_dim=info.action_dim if info.has_action_head else None,
            num_embodiment_domains=info.num_embodiment_domains,
            device=device,
            dtype=dtype,
            weights=weights,
            prefix_cache=prefix_cache,
            schedules=ScheduleRule(info) if not info.is_distilled else None,
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

    # -- the rules of every request setting: the one keeper, whoever asks -------------------------------

    def check(self, settings: Mapping[str, object], *, output: str = "actions", domain_name: str | None = None) -> None:
        """Check each setting in ``settings`` (by name, :data:`~cosmos3_runtime.requests.SETTING_NAMES`;
        ``None`` is unset and not checked) against this model and its limits.

        ``output``: what the request answers with, ``"actions"`` or ``"video"``; ``action_mode`` must be a
        mode of that kind. Raises the runtime's typed errors, each naming its field.
        """
        unknown = set(settings) - set(SETTING_NAMES)
        if unknown:
            raise TypeError(f"not request settings: {', '.join(sorted(unknown))}")
        lim = self.limits
        # The mode first: a checkpoint without an action head knows no domain, and says why.
        value = settings.get("action_mode")
        if value is not None:
            _mode(value, self.modes, output)
        value = settings.get("domain_name")
        if value is not None and (not isinstance(value, str) or value not in self.domains):
            known = ", ".join(sorted(self.domains)) or "none"
            raise UnknownDomainError(f"unknown domain_name {value!r}; this model knows: {known}", "domain_name")
        value = settings.get("action_horizon")
        if value is not None:
            _horizon(value, lim, self.horizon_multiple, "action_horizon")
        value = settings.get("prompt")
        if value is not None and (not isinstance(value, str) or len(value) > lim.max_prompt_chars):
            raise InvalidRequestError(f"prompt must be a string of at most {lim.max_prompt_chars} characters", "prompt")
        value = settings.get("resolution_tier")
        if value is not None:
            _tier(value, self.resolution_tiers, self.variant)
        value = settings.get("view_point")
        if value is not None and value not in self.view_points:
            raise InvalidRequestError(
                f"unknown view_point {value!r}; expected one of {', '.join(self.view_points)}", "view_point"
            )
        value = settings.get("seed")
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= lim.max_seed
        ):
            raise InvalidRequestError(f"seed must be an integer in [0, {lim.max_seed}]", "seed")
        value = settings.get("fps")
        if value is not None and not _number_in(value, lim.min_fps, lim.max_fps):
            raise InvalidRequestError(f"fps must be a number in [{lim.min_fps:g}, {lim.max_fps:g}]", "fps")
        check_sampler(settings, self.distilled_sigmas, self.shiftable, lim)
        domain = settings.get("domain_name") or domain_name
        self._check_schedule(settings, domain)  # type: ignore[arg-type]
        # The settings the cost is priced from (RequestDefaults' fields, the sampler's first): a refusal names
        # the first of them set.
        costly = [f.name for f in fields(RequestDefaults) if settings.get(f.name) is not None]
        # A robot's request runs as one engine call; a video job runs step by step, giving way between steps.
        if lim.max_chunk_cost > 0 and costly and self.domains and output == "actions":
            cost = self.chunk_cost(settings, domain)  # type: ignore[arg-type]
            if cost > lim.max_chunk_cost:
                raise InvalidRequestError(
                    f"this request would cost {cost:.1f} default chunks of its domain (transformer forwards x "
                    f"tokens), over the server's bound of {lim.max_chunk_cost:g} (--max-request-cost); ask for "
                    "fewer steps, a lower tier or a shorter horizon",
                    costly[0],
                )

    def _check_schedule(self, settings: Mapping[str, object], domain_name: str | None) -> None:
        """The steps and shift a schedule the checkpoint's scheduler runs (``domain_name``: whose defaults fill
        the one of them left unset; None: the model's). Called once :func:`check_sampler` passed."""
        steps, shift = settings.get("num_steps"), settings.get("shift")
        if self.schedules is None or (steps is None and shift is None):
            return
        defaults = self.domain_defaults.get(domain_name or "", self.defaults)
        steps_run = int(steps) if steps is not None else defaults.num_steps  # type: ignore[call-overload]
        shift_run = float(shift) if shift is not None else defaults.shift  # type: ignore[arg-type]
        fault = self.schedules.fault(steps_run, shift_run)
        if fault is not None:
            raise InvalidRequestError(fault, "num_steps" if steps is not None else "shift")

    def chunk_cost(self, settings: Mapping[str, object], domain_name: str | None = None) -> float:
        """What a request with ``settings`` (checked; unset ones take the domain's defaults) costs, in default
        chunks of ``domain_name`` (None: the model's default domain): its transformer forwards (steps, and a
        second pass on each step inside the guidance interval) times its tokens (latent frames x the
        largest canvas of its tier, plus the action rows), over the same of the domain's defaults."""
        name = domain_name if domain_name is not None else self.defaults.domain_name
        defaults = self.domain_defaults.get(name or "", self.defaults)

        def given(key: str, default: Any) -> Any:
            value = settings.get(key)
            return default if value is None else value

        asked = replace(
            defaults,
            num_steps=int(given("num_steps", defaults.num_steps)),
            guidance_scale=float(given("guidance_scale", defaults.guidance_scale)),
            guidance_interval=_interval(given("guidance_interval", None))
            if settings.get("guidance_interval") is not None
            else defaults.guidance_interval,
            shift=float(given("shift", defaults.shift)) if given("shift", defaults.shift) is not None else None,
            resolution_tier=int(given("resolution_tier", defaults.resolution_tier)),
            action_horizon=int(given("action_horizon", defaults.action_horizon or self.horizon_multiple)),
        )
        return self._forwards_x_tokens(asked) / self._forwards_x_tokens(defaults)

    def _forwards_x_tokens(self, asked: RequestDefaults) -> float:
        if self.distilled_sigmas is not None:
            forwards = len(self.distilled_sigmas)
        elif self.schedules is not None:
            forwards = transformer_forwards(self.schedules.info, asked)
        else:
            forwards = asked.num_steps * (1 if asked.guidance_scale == 1.0 else 2)
        horizon = asked.action_horizon or self.horizon_multiple
        canvases = self.canvases.get(asked.resolution_tier) or ()
        area = max((c.height * c.width for c in canvases), default=asked.resolution_tier**2)
        tokens = (horizon // self.horizon_multiple + 1) * area / 256 + horizon
        return float(forwards * tokens)

    def resolve(
        self, settings: Mapping[str, object], media: Media | None = None, *, output: str = "actions"
    ) -> ResolvedSettings:
        """The one answer to what a request runs with: ``settings`` (by name, unset ones ``None``) checked
        (:meth:`check`) and completed, and the request's shape judged by its ``media``.

        Each unset setting takes its domain's default (its profile's where it sets one), else the variant's;
        ``domain_name`` unset: the model's default domain. The mode, unset, follows the media: a video asks
        for ``inverse_dynamics``, anything else for ``policy`` (``output`` ``"video"``: ``forward_dynamics``).
        Given ``media``, a request with both an image and a video, or without the medium its mode needs, is
        refused, and an ``inverse_dynamics`` horizon follows from its clip's frames when they are known
        (:meth:`clip_horizon`). An unset seed stays None (drawn per request). ``media`` None: settings alone
        (a session's, before any observation).
        """
        key = _memo_key(settings, media, output)
        if key is not None:
            known = self._resolved.get(key)
            if known is not None:
                return known
        resolved = self._resolve(settings, media, output)
        if key is not None:
            if len(self._resolved) >= RESOLVED_MEMO_SIZE:
                self._resolved.clear()  # not LRU: a client that varies a setting every time gains nothing anyway
            self._resolved[key] = resolved
        return resolved

    def _resolve(self, settings: Mapping[str, object], media: Media | None, output: str) -> ResolvedSettings:
        self.check(settings, output=output)
        name = settings.get("domain_name")
        name = name if name is not None else self.defaults.domain_name
        if not isinstance(name, str) or name not in self.domains:
            known = ", ".join(sorted(self.domains)) or "none"
            raise UnknownDomainError(f"unknown domain_name {name!r}; this model knows: {known}", "domain_name")
        defaults = self.domain_defaults[name]

        def given(key: str) -> Any:
            return settings.get(key)

        if given("action_mode") is not None:
            mode = _mode(given("action_mode"), self.modes, output)
        elif output == "video":
            mode = "forward_dynamics"
        else:
            mode = "inverse_dynamics" if media is not None and media.video else "policy"
        horizon = given("action_horizon")
        if media is not None:
            horizon = self._shape(mode, media, horizon)
        if self.distilled_sigmas is not None:  # the fixed schedule, whatever was (validly) asked
            steps, guidance, interval, shift = len(self.distilled_sigmas), 1.0, None, None
        else:
            steps = int(given("num_steps")) if given("num_steps") is not None else defaults.num_steps
            guidance = (
                float(given("guidance_scale")) if given("guidance_scale") is not None else defaults.guidance_scale
            )
            interval = _interval(given("guidance_interval")) if given("guidance_interval") is not None else None
            interval = interval if interval is not None else defaults.guidance_interval
            shift = float(given("shift")) if given("shift") is not None else defaults.shift
        return ResolvedSettings(
            domain_name=name,
            action_mode=mode,
            action_horizon=int(horizon) if horizon is not None else int(defaults.action_horizon or 0),
            prompt=str(given("prompt") or ""),
            resolution_tier=int(given("resolution_tier") or defaults.resolution_tier),
            view_point=str(given("view_point") or defaults.view_point),
            fps=float(given("fps") or defaults.fps or 0.0),
            num_steps=steps,
            guidance_scale=guidance,
            guidance_interval=interval,
            shift=shift,
            seed=int(given("seed")) if given("seed") is not None else None,
        )

    def _shape(self, mode: str, media: Media, horizon: Any) -> Any:
        """The media against the mode: one medium, the one the mode needs; the horizon a clip decides."""
        if media.image and media.video:
            raise InvalidRequestError("give either an image or a video, not both", "video")
        if mode == "inverse_dynamics":
            if not media.video:
                raise MissingMediumError(
                    "inverse_dynamics needs a video clip (T x H x W x 3 uint8, action_horizon + 1 frames)", "video"
                )
            return self.clip_horizon(media.clip_frames, horizon) if media.clip_frames is not None else horizon
        if not (media.image or media.video):
            raise MissingMediumError(f"{mode} needs an image (H x W x 3 uint8)", "image")
        return horizon

    def check_horizon(self, value: object, field_name: str = "action_horizon") -> int:
        """``value`` as an action horizon this model takes (a multiple of the VAE's temporal compression,
        within the limits); raises :class:`InvalidRequestError` naming ``field_name`` if it is not."""
        return _horizon(value, self.limits, self.horizon_multiple, field_name)

    def clip_horizon(self, frames: int, horizon: int | None, field_name: str = "video") -> int:
        """The horizon of an inverse-dynamics clip of ``frames`` frames: ``horizon`` + 1 frames, or, with
        the horizon unset, ``frames - 1`` actions (which must be a horizon this model takes)."""
        if horizon is None:
            try:
                return _horizon(frames - 1, self.limits, self.horizon_multiple, field_name)
            except InvalidRequestError as exc:
                raise InvalidRequestError(
                    f"a {frames}-frame clip asks for {frames - 1} actions: {exc.message}", field_name
                ) from None
        if frames != horizon + 1:
            raise InvalidRequestError(
                f"inverse_dynamics with action_horizon {horizon} needs a clip of {horizon + 1} frames, got {frames}",
                field_name,
            )
        return horizon

    def identity(self) -> dict[str, Any]:
        """What identifies the model (checkpoint, variant, dtype, device, size, the weights served): what a
        recording keeps, as JSON values."""
        identity = {key: getattr(self, key) for key in MODEL_IDENTITY_KEYS}
        identity["weights"] = self.weights.as_json() if self.weights is not None else None
        return identity

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
            "weights": self.weights.as_json() if self.weights is not None else None,
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
        data["transformer_forwards"] = self.chunk_forwards.get(name)
        return data


# How many answers of ModelDescription.resolve are remembered: sessions x the media kinds they send, with room.
RESOLVED_MEMO_SIZE = 1024

# The types of setting value a memo key holds as they are: immutable scalars, by exact type (a subclass, or a
# list interval, is not memoised).
_SCALAR_TYPES = frozenset({str, int, bool, type(None), np.int64, np.int32, np.bool_})
_FLOAT_TYPES = frozenset({float, np.float64, np.float32})


def _memo_key(settings: Mapping[str, object], media: Media | None, output: str) -> tuple[Any, ...] | None:
    """``resolve``'s arguments as a key that equals another only where the answer must be the same: each value
    with its type (``True`` is refused as a seed where ``1`` is not, though they are equal) and a float by its
    ``repr`` (``-0.0``, ``nan``); None where a value is not such a scalar. Settings in another order make
    another key: a miss, never a wrong answer."""
    items: list[object] = [media, output]
    for name, value in settings.items():
        kind = type(value)
        if kind in _SCALAR_TYPES:
            items += (name, kind, value)
        elif kind in _FLOAT_TYPES:
            items += (name, kind, repr(value))
        else:
            return None
    return tuple(items)


def _mode(value: object, modes: tuple[str, ...], output: str) -> str:
    """The mode as the runtime spells it (clients send " Policy" and mean "policy"), one ``modes`` has
    and, for ``output`` "actions" / "video", one that answers with that."""
    if not isinstance(value, str):
        raise UnsupportedModeError(f"action_mode must be a string, one of {', '.join(ACTION_MODES)}", "action_mode")
    mode = value.strip().lower()
    if mode not in ACTION_MODES:
        raise UnsupportedModeError(
            f"unknown action_mode {mode!r}; expected one of {', '.join(ACTION_MODES)}", "action_mode"
        )
    if mode not in modes:
        raise UnsupportedModeError(
            f"this checkpoint has no action head (transformer action_gen is false): it cannot serve {mode}",
            "action_mode",
        )
    if output == "actions" and mode in VIDEO_MODES:
        raise UnsupportedModeError(
            f"{mode} produces video, not actions: submit it as a video rollout (HTTP /v1/videos)", "action_mode"
        )
    if output == "video" and mode not in VIDEO_MODES:
        raise UnsupportedModeError(f"{mode} produces actions, not video", "action_mode")
    return mode


def _tier(value: object, tiers: tuple[int, ...], variant: str) -> int:
    """``value`` as a resolution tier of ``tiers`` (the variant's); raises :class:`UnsupportedTierError`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) not in tiers:
        raise UnsupportedTierError(
            f"resolution tier {value!r} is not supported by this {variant} checkpoint; "
            f"supported: {', '.join(map(str, tiers))}",
            "resolution_tier",
        )
    return int(value)


def _number_in(value: object, low: float, high: float) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float, np.integer, np.floating))
        and math.isfinite(float(value))
        and low <= float(value) <= high
    )


def _interval(value: object) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)  # type: ignore[attr-defined]  # any iterable of two numbers
    except (TypeError, ValueError):
        raise InvalidRequestError("guidance_interval must be two sigmas [low, high]", "guidance_interval") from None
    if not 0.0 <= low <= high <= 1.0:
        raise InvalidRequestError("guidance_interval must satisfy 0 <= low <= high <= 1", "guidance_interval")
    return low, high


def transformer_forwards(info: CheckpointInfo, defaults: RequestDefaults) -> int:
    """Transformer forwards of one chunk at ``defaults``: one per step, and a second (the unconditioned
    pass) on each step whose sigma lies inside the guidance interval when guidance is on."""
    steps = len(info.distilled_sigmas) if info.distilled_sigmas is not None else defaults.num_steps
    if defaults.guidance_scale == 1.0:
        return steps
    interval = defaults.guidance_interval
    if interval is None:
        return 2 * steps
    sigmas = step_sigmas(info, steps, defaults.shift)
    return steps + sum(1 for sigma in sigmas if interval[0] <= sigma <= interval[1])


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
