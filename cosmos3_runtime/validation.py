"""Checks every request against what the loaded checkpoint can do, before any tensor is made, and resolves
it into the :class:`DenoiseJob` the sampler runs.

Each failure is a typed error from :mod:`cosmos3_runtime.errors` that names the offending field, so
the server can tell a robot exactly what to fix. Defaults come from :class:`~cosmos3_runtime.description.EngineSpec`,
which the engine builds once at load from the checkpoint's own files.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from .description import EngineSpec, RequestDefaults, check_horizon
from .errors import (
    InvalidFieldError,
    InvalidRequestError,
    MissingFieldError,
    UnknownDomainError,
    UnsupportedModeError,
    UnsupportedTierError,
)
from .profiles import VIEW_POINTS, PolicyProfile
from .requests import ACTION_MODES, ActionRequest, VideoRequest


@dataclass
class DenoiseJob:
    """One fully resolved sampling problem (built by the engine from a validated request)."""

    mode: str  # "policy", "inverse_dynamics" or "forward_dynamics"
    frames: np.ndarray  # (T, H, W, 3) uint8: 1 frame for policy/forward_dynamics, the clip for inverse
    horizon: int
    domain_id: int
    raw_action_dim: int
    prompt: str
    view_point: str
    resolution_tier: int
    fps: float
    sigmas: list[float] | None  # a fixed (distilled) schedule, else None
    num_steps: int
    guidance_scale: float
    guidance_interval: tuple[float, float] | None
    seed: int
    # Normalized clean action frames (K x raw_action_dim) kept fixed from the start of the chunk:
    # the raw actions of forward_dynamics, or the real-time-chunking prefix of a policy request.
    clean_actions: np.ndarray | None = None
    decode_video: bool = False
    prompt_format: str = (
        "json"  # the caption format the checkpoint was trained with (cosmos3_runtime.sampling.action_caption)
    )
    view_description: str | None = None  # how a composed view is laid out, added to the view sentence
    # Normalized robot state rows (history_length x raw_action_dim), clean action frames placed in front
    # of the chunk; the output drops them.
    state_rows: np.ndarray | None = None

    @property
    def leading_rows(self) -> int:
        return 0 if self.state_rows is None else int(self.state_rows.shape[0])

    @property
    def schedule_key(self) -> tuple[Any, ...]:
        """Jobs with equal keys step through the same timesteps and passes, so they can share forwards."""
        sigmas = tuple(self.sigmas) if self.sigmas is not None else None
        return (sigmas, self.num_steps, self.guidance_scale, self.guidance_interval)


def job_for_actions(request: ActionRequest, spec: EngineSpec) -> tuple[DenoiseJob, PolicyProfile]:
    """Validate a ``policy`` / ``inverse_dynamics`` request and resolve its defaults."""
    mode = _mode_name(request.action_mode)
    if mode == "forward_dynamics":
        raise UnsupportedModeError(
            "forward_dynamics produces video, not actions: submit it as a video rollout", "action_mode"
        )
    _check_mode(mode, spec)
    profile = _profile(request.domain_name, spec)
    if request.image is not None and request.video is not None:
        raise InvalidRequestError("give either image or video, not both", "video")
    if mode == "inverse_dynamics":
        if request.video is None:
            raise InvalidRequestError("inverse_dynamics needs a video clip (T x H x W x 3 uint8)", "video")
        frames = _clip(request.video, "video", spec)
        horizon = request.action_horizon if request.action_horizon is not None else frames.shape[0] - 1
        horizon = check_horizon(horizon, spec)
        if frames.shape[0] != horizon + 1:
            raise InvalidRequestError(
                f"inverse_dynamics needs action_horizon + 1 = {horizon + 1} frames, got {frames.shape[0]}", "video"
            )
    else:
        if request.image is not None:
            frames = _image(request.image, "image", spec)[None]
        elif request.video is not None:
            frames = _clip(request.video, "video", spec)[:1]
        else:
            raise InvalidRequestError("policy needs an image (H x W x 3 uint8)", "image")
        horizon = check_horizon(
            request.action_horizon if request.action_horizon is not None else profile.default_horizon, spec
        )

    clean = None
    if request.prefix_actions is not None:
        if mode != "policy":
            raise InvalidRequestError(
                "prefix_actions (real-time chunking) apply to policy requests only", "prefix_actions"
            )
        prefix = _actions(request.prefix_actions, profile, "prefix_actions")
        if prefix.shape[0] >= horizon:
            raise InvalidRequestError(
                f"prefix_actions must be shorter than the horizon ({horizon}), got {prefix.shape[0]}", "prefix_actions"
            )
        clean = _normalize(prefix, profile, spec, "prefix_actions")

    state_rows = _state(request.state, profile, spec)
    if not isinstance(request.decode_video, bool):
        raise InvalidRequestError("decode_video must be true or false", "decode_video")
    job = _job(
        request, spec, profile, mode, frames, horizon, clean, decode_video=request.decode_video, state_rows=state_rows
    )
    return job, profile


def job_for_video(request: VideoRequest, spec: EngineSpec) -> tuple[DenoiseJob, PolicyProfile]:
    """Validate a ``forward_dynamics`` rollout and resolve its defaults."""
    _check_mode("forward_dynamics", spec)
    profile = _profile(request.domain_name, spec)
    frames = _image(request.image, "image", spec)[None]
    actions = _actions(request.actions, profile, "actions")
    horizon = check_horizon(actions.shape[0], spec, field_name="actions")
    clean = _normalize(actions, profile, spec, "actions")
    job = _job(request, spec, profile, "forward_dynamics", frames, horizon, clean, decode_video=True)
    return job, profile


def _job(
    request: ActionRequest | VideoRequest,
    spec: EngineSpec,
    profile: PolicyProfile,
    mode: str,
    frames: np.ndarray,
    horizon: int,
    clean: np.ndarray | None,
    decode_video: bool,
    state_rows: np.ndarray | None = None,
) -> DenoiseJob:
    info = spec.info
    defaults = spec.defaults_for(profile)
    tier = request.resolution_tier if request.resolution_tier is not None else defaults.resolution_tier
    if isinstance(tier, bool) or not isinstance(tier, (int, np.integer)) or int(tier) not in info.resolution_tiers:
        raise UnsupportedTierError(
            f"resolution tier {tier!r} is not supported by this {info.variant} checkpoint; "
            f"supported: {', '.join(map(str, info.resolution_tiers))}",
            "resolution_tier",
        )
    view_point = request.view_point or defaults.view_point
    if view_point not in VIEW_POINTS:
        raise InvalidRequestError(
            f"unknown view_point {view_point!r}; expected one of {', '.join(VIEW_POINTS)}", "view_point"
        )
    if not isinstance(request.prompt, str) or len(request.prompt) > spec.limits.max_prompt_chars:
        raise InvalidRequestError(
            f"prompt must be a string of at most {spec.limits.max_prompt_chars} characters", "prompt"
        )
    lim = spec.limits
    fps = request.fps if request.fps is not None else defaults.fps
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not lim.min_fps <= float(fps) <= lim.max_fps:
        raise InvalidRequestError(f"fps must be a number in [{lim.min_fps:g}, {lim.max_fps:g}]", "fps")

    steps, guidance, interval = _sampling(request, spec, defaults)
    seed = request.seed
    if seed is None:
        seed = secrets.randbits(63)
    elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) <= lim.max_seed:
        raise InvalidRequestError(f"seed must be an integer in [0, {lim.max_seed}]", "seed")
    return DenoiseJob(
        mode=mode,
        frames=frames,
        horizon=horizon,
        domain_id=profile.domain_id,
        raw_action_dim=profile.raw_action_dim,
        prompt=request.prompt,
        view_point=view_point,
        view_description=profile.view_description if view_point == profile.view_point else None,
        prompt_format=profile.prompt_format,
        resolution_tier=int(tier),
        fps=float(fps),
        sigmas=info.distilled_sigmas,
        num_steps=steps,
        guidance_scale=guidance,
        guidance_interval=interval,
        seed=int(seed),
        clean_actions=clean,
        decode_video=decode_video,
        state_rows=state_rows,
    )


def _sampling(
    request: ActionRequest | VideoRequest, spec: EngineSpec, defaults: RequestDefaults
) -> tuple[int, float, tuple[float, float] | None]:
    """Steps, guidance and interval: the distilled schedule is fixed; base takes request values."""
    steps, guidance, interval = request.num_steps, request.guidance_scale, request.guidance_interval
    if spec.info.distilled_sigmas is not None:  # set exactly when the checkpoint is distilled
        fixed = len(spec.info.distilled_sigmas)
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
        return fixed, 1.0, None
    steps = defaults.num_steps if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= spec.limits.max_steps:
        raise InvalidRequestError(f"num_steps must be an integer in [1, {spec.limits.max_steps}]", "num_steps")
    guidance = defaults.guidance_scale if guidance is None else guidance
    if (
        isinstance(guidance, bool)
        or not isinstance(guidance, (int, float))
        or not math.isfinite(guidance)
        or not 0.0 <= guidance <= spec.limits.max_guidance_scale
    ):
        raise InvalidRequestError(
            f"guidance_scale must be a number in [0, {spec.limits.max_guidance_scale:g}]", "guidance_scale"
        )
    if interval is not None:
        try:
            lo, hi = (float(v) for v in interval)
        except (TypeError, ValueError):
            raise InvalidRequestError("guidance_interval must be two sigmas [low, high]", "guidance_interval") from None
        if not 0.0 <= lo <= hi <= 1.0:
            raise InvalidRequestError("guidance_interval must satisfy 0 <= low <= high <= 1", "guidance_interval")
        interval = (lo, hi)
    else:
        interval = defaults.guidance_interval
    return int(steps), float(guidance), interval


def _state(state: object, profile: PolicyProfile, spec: EngineSpec) -> np.ndarray | None:
    """The request's state as model-space action rows, or None for a domain that takes no state."""
    rows, name = profile.history_length, profile.domain_name
    if not rows:
        if state is not None:
            raise InvalidFieldError(
                f"domain {name!r} does not condition on the robot's state; leave state unset", "state"
            )
        return None
    shape = f"[{profile.state_dim}]" if rows == 1 else f"[{rows}, {profile.state_dim}]"
    if state is None:
        raise MissingFieldError(
            f"domain {name!r} conditions on the robot's state: send state, a float array "
            f"{shape}" + (" (oldest row first)" if rows > 1 else ""),
            "state",
        )
    if not isinstance(state, np.ndarray) or state.dtype.kind not in "fiu":
        raise InvalidFieldError(f"state must be a numeric array {shape}", "state")
    matrix = state[None] if state.ndim == 1 else state
    if matrix.ndim != 2 or matrix.shape[1] != profile.state_dim:
        raise InvalidFieldError(
            f"state has shape {list(state.shape)}; domain {name!r} has state_dim "
            f"{profile.state_dim}, so state must be {shape}",
            "state",
        )
    if matrix.shape[0] != rows:
        raise InvalidFieldError(
            f"state has {matrix.shape[0]} row(s); domain {name!r} conditions on {rows} "
            f"(history_length), so state must be {shape}",
            "state",
        )
    matrix = matrix.astype(np.float32)
    if not np.isfinite(matrix).all():
        raise InvalidFieldError(f"state contains NaN or infinity; send finite values {shape}", "state")
    try:
        return _normalize(matrix, profile, spec, "state")
    except InvalidRequestError as exc:  # the state is one field of its own: name it as such
        raise InvalidFieldError(exc.message, "state") from None


def _mode_name(mode: object) -> str:
    """The mode as the runtime spells it: clients send " Policy" or "POLICY" too, and mean "policy"."""
    if not isinstance(mode, str):
        raise UnsupportedModeError(f"action_mode must be a string, one of {', '.join(ACTION_MODES)}", "action_mode")
    return mode.strip().lower()


def _check_mode(mode: str, spec: EngineSpec) -> None:
    if mode not in ACTION_MODES:
        raise UnsupportedModeError(
            f"unknown action_mode {mode!r}; expected one of {', '.join(ACTION_MODES)}", "action_mode"
        )
    if not spec.info.has_action_head:
        raise UnsupportedModeError(
            f"this checkpoint has no action head (transformer action_gen is false): it cannot serve {mode}",
            "action_mode",
        )


def _profile(domain_name: object, spec: EngineSpec) -> PolicyProfile:
    profile = spec.profiles.get(domain_name) if isinstance(domain_name, str) else None
    if profile is None:
        known = ", ".join(sorted(spec.profiles))
        raise UnknownDomainError(f"unknown domain_name {domain_name!r}; this model knows: {known}", "domain_name")
    return profile


def _image(image: object, field_name: str, spec: EngineSpec) -> np.ndarray:
    return _rgb(image, field_name, spec, layout="H x W x 3")


def _clip(video: object, field_name: str, spec: EngineSpec) -> np.ndarray:
    clip = _rgb(video, field_name, spec, layout="T x H x W x 3")
    if not 1 <= clip.shape[0] <= spec.limits.max_clip_frames:
        raise InvalidRequestError(
            f"{field_name} must have 1 to {spec.limits.max_clip_frames} frames, got {clip.shape[0]}", field_name
        )
    return clip


def _rgb(array: object, field_name: str, spec: EngineSpec, layout: str) -> np.ndarray:
    """A uint8 RGB image (``H x W x 3``) or clip (``T x H x W x 3``) of an acceptable size."""
    if not isinstance(array, np.ndarray):
        raise InvalidRequestError(f"{field_name} must be an array ({layout} uint8)", field_name)
    if array.dtype != np.uint8:
        raise InvalidRequestError(f"{field_name} must be uint8 RGB, got dtype {array.dtype}", field_name)
    if array.ndim != layout.count("x") + 1 or array.shape[-1] != 3:
        raise InvalidRequestError(f"{field_name} must have shape {layout}, got {list(array.shape)}", field_name)
    _check_size(array.shape[-3], array.shape[-2], field_name, spec)
    return array


def _check_size(height: int, width: int, field_name: str, spec: EngineSpec) -> None:
    lim = spec.limits
    if min(height, width) < lim.min_image_side or max(height, width) > lim.max_image_side:
        raise InvalidRequestError(
            f"{field_name} is {height}x{width}; each side must be in [{lim.min_image_side}, {lim.max_image_side}]",
            field_name,
        )


def _actions(actions: object, profile: PolicyProfile, field_name: str) -> np.ndarray:
    if not isinstance(actions, np.ndarray) or actions.dtype.kind not in "fiu":
        raise InvalidRequestError(f"{field_name} must be a numeric array (T x {profile.raw_action_dim})", field_name)
    if actions.ndim != 2 or actions.shape[0] < 1:
        raise InvalidRequestError(f"{field_name} must have shape T x D, got {list(actions.shape)}", field_name)
    if actions.shape[1] != profile.raw_action_dim:
        raise InvalidRequestError(
            f"{field_name} has width {actions.shape[1]} but domain {profile.domain_name!r} has "
            f"{profile.raw_action_dim} action dimensions",
            field_name,
        )
    rows = actions.astype(np.float32)
    if not np.isfinite(rows).all():
        raise InvalidRequestError(f"{field_name} contains NaN or infinity", field_name)
    return rows


def _normalize(actions: np.ndarray, profile: PolicyProfile, spec: EngineSpec, field_name: str) -> np.ndarray:
    """Raw actions into the model's space. Values far outside the domain's range (1e38, say) would make
    the networks overflow: they are the caller's mistake, refused here, not a model failure later."""
    with np.errstate(over="ignore", invalid="ignore"):
        normalized = profile.to_model(actions)  # the gripper flipped, then normalized
    bound = spec.limits.max_normalized_action
    if not (np.isfinite(normalized).all() and np.abs(normalized).max(initial=0.0) <= bound):
        raise InvalidRequestError(
            f"{field_name} lie too far outside domain {profile.domain_name!r}'s action range: normalized by its "
            f"statistics they must stay within ±{bound:g} (its recorded actions lie within about ±1)",
            field_name,
        )
    return normalized
