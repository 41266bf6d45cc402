"""Checks every request against what the loaded checkpoint can do, before any tensor is made, and resolves
it into the :class:`DenoiseJob` the sampler runs.

The settings' rules and defaults have one keeper, the model's description
(:meth:`~cosmos3_runtime.description.ModelDescription.check` and ``resolve``): this module adds the checks of
the request's arrays (frames, actions, state) and builds the job. Each failure is a typed error from
:mod:`cosmos3_runtime.errors` that names the offending field, so the server can tell a robot exactly what
to fix.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import poses
from .description import Media, ModelDescription
from .errors import InvalidFieldError, InvalidRequestError, UnsupportedModeError
from .profiles import PolicyProfile
from .requests import ActionRequest, ResolvedSettings, VideoRequest


@dataclass
class DenoiseJob:
    """One fully resolved sampling problem (built by the engine from a validated request)."""

    settings: ResolvedSettings  # every setting, resolved and its seed drawn: what the job runs, and its result reports
    frames: np.ndarray  # (T, H, W, 3) uint8: 1 frame for policy/forward_dynamics, the clip for inverse
    domain_id: int
    raw_action_dim: int
    sigmas: list[float] | None  # a fixed (distilled) schedule, else None (the settings' steps and shift)
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
    # A midtrain domain's current pose [x, y, z, qx, qy, qz, qw, gripper] (the state's last row): the
    # chunk's relative poses are composed from it into absolute ones.
    pose_origin: np.ndarray | None = None

    @property
    def mode(self) -> str:
        """``policy``, ``inverse_dynamics`` or ``forward_dynamics``."""
        return self.settings.action_mode

    @property
    def horizon(self) -> int:
        return self.settings.action_horizon

    @property
    def seed(self) -> int:
        assert self.settings.seed is not None, "a job's seed is drawn when it is built"
        return self.settings.seed

    @property
    def leading_rows(self) -> int:
        return 0 if self.state_rows is None else int(self.state_rows.shape[0])

    @property
    def schedule_key(self) -> tuple[Any, ...]:
        """Jobs with equal keys step through the same timesteps and passes, so they can share forwards."""
        sigmas = tuple(self.sigmas) if self.sigmas is not None else None
        return (
            sigmas,
            self.settings.num_steps,
            self.settings.guidance_scale,
            self.settings.guidance_interval,
            self.settings.shift,
        )


def job_for_actions(request: ActionRequest, description: ModelDescription) -> tuple[DenoiseJob, PolicyProfile]:
    """Validate a ``policy`` / ``inverse_dynamics`` request and resolve its defaults: its settings and its
    shape (its media against its mode) checked and resolved once, by the model's description, then its arrays."""
    resolved = description.resolve(request.named_settings(), Media.of(request.image, request.video))
    mode, horizon = resolved.action_mode, resolved.action_horizon
    profile = description.domains[resolved.domain_name]
    if mode == "inverse_dynamics":
        frames = _clip(request.video, "video", description)
    elif request.image is not None:
        frames = _image(request.image, "image", description)[None]
    else:  # a policy request may send a clip: its first frame is the observation
        frames = _clip(request.video, "video", description)[:1]

    state_rows = _state(request.state, profile, description)
    origin = _pose_origin(request.state, profile)
    clean = None
    if request.prefix_actions is not None:
        # Checked whole, then clamped to what the policy was trained to continue (its profile's max_prefix).
        prefix = profile.trained_prefix(profile.check_prefix(request.prefix_actions, mode, horizon))
        if prefix is not None and origin is not None:
            prefix = _relative_poses(prefix, origin)
        if prefix is not None:
            clean = _normalize(prefix, profile, description, "prefix_actions")

    if not isinstance(request.decode_video, bool):
        raise InvalidRequestError("decode_video must be true or false", "decode_video")
    job = _job(resolved, description, profile, frames, clean, decode_video=request.decode_video, state_rows=state_rows)
    job.pose_origin = origin
    return job, profile


def job_for_video(request: VideoRequest, description: ModelDescription) -> tuple[DenoiseJob, PolicyProfile]:
    """Validate a ``forward_dynamics`` rollout and resolve its defaults (once, by the model's description),
    then its arrays: the rollout's horizon is its actions' rows."""
    settings = {**request.named_settings(), "action_mode": "forward_dynamics"}
    resolved = description.resolve(settings, Media.of(request.image, None), output="video")
    profile = description.domains[resolved.domain_name]
    if profile.action_space == "midtrain":
        raise UnsupportedModeError(
            f"domain {profile.domain_name!r} acts in end-effector poses (midtrain), whose relative steps need "
            "the starting pose: forward_dynamics does not take one, so it cannot roll out this domain",
            "action_mode",
        )
    frames = _image(request.image, "image", description)[None]
    actions = profile.check_actions(request.actions, "actions")
    resolved = replace(resolved, action_horizon=description.check_horizon(actions.shape[0], "actions"))
    clean = _normalize(actions, profile, description, "actions")
    return _job(resolved, description, profile, frames, clean, decode_video=True), profile


def _job(
    resolved: ResolvedSettings,
    description: ModelDescription,
    profile: PolicyProfile,
    frames: np.ndarray,
    clean: np.ndarray | None,
    decode_video: bool,
    state_rows: np.ndarray | None = None,
) -> DenoiseJob:
    if resolved.seed is None:  # drawn here, once, so the result reports the seed that reproduces it
        resolved = replace(resolved, seed=secrets.randbits(63))
    assert resolved.seed is not None
    sigmas = description.distilled_sigmas
    return DenoiseJob(
        settings=resolved,
        frames=frames,
        domain_id=profile.domain_id,
        raw_action_dim=profile.model_action_dim,
        sigmas=list(sigmas) if sigmas is not None else None,
        view_description=profile.view_description if resolved.view_point == profile.view_point else None,
        prompt_format=profile.prompt_format,
        clean_actions=clean,
        decode_video=decode_video,
        state_rows=state_rows,
    )


def _state(state: object, profile: PolicyProfile, description: ModelDescription) -> np.ndarray | None:
    """The request's state as model-space action rows, or None for a domain that takes no state."""
    matrix = profile.check_state(state)
    if matrix is None:
        return None
    if profile.action_space == "midtrain":
        try:
            matrix = poses.midtrain_state_rows(matrix)
        except ValueError as exc:
            raise InvalidFieldError(
                f"state rows are poses [x, y, z, qx, qy, qz, qw, gripper]: {exc}", "state"
            ) from None
    try:
        return _normalize(matrix, profile, description, "state")
    except InvalidRequestError as exc:  # the state is one field of its own: name it as such
        raise InvalidFieldError(exc.message, "state") from None


def _pose_origin(state: object, profile: PolicyProfile) -> np.ndarray | None:
    """A midtrain domain's current pose, the (checked) state's last row; None for any other domain."""
    if profile.action_space != "midtrain" or not isinstance(state, np.ndarray):
        return None
    origin: np.ndarray = np.asarray(state, dtype=np.float32).reshape(-1, profile.raw_action_dim)[-1].copy()
    return origin


def _relative_poses(prefix: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """Absolute prefix poses as the model's relative rows, from the current pose on."""
    try:
        return poses.midtrain_relative_rows(prefix, origin)
    except ValueError as exc:
        raise InvalidRequestError(
            f"prefix_actions rows are poses [x, y, z, qx, qy, qz, qw, gripper]: {exc}", "prefix_actions"
        ) from None


def _image(image: object, field_name: str, description: ModelDescription) -> np.ndarray:
    return _rgb(image, field_name, description, layout="H x W x 3")


def _clip(video: object, field_name: str, description: ModelDescription) -> np.ndarray:
    clip = _rgb(video, field_name, description, layout="T x H x W x 3")
    if not 1 <= clip.shape[0] <= description.limits.max_clip_frames:
        raise InvalidRequestError(
            f"{field_name} must have 1 to {description.limits.max_clip_frames} frames, got {clip.shape[0]}", field_name
        )
    return clip


def _rgb(array: object, field_name: str, description: ModelDescription, layout: str) -> np.ndarray:
    """A uint8 RGB image (``H x W x 3``) or clip (``T x H x W x 3``) of an acceptable size."""
    if not isinstance(array, np.ndarray):
        raise InvalidRequestError(f"{field_name} must be an array ({layout} uint8)", field_name)
    if array.dtype != np.uint8:
        raise InvalidRequestError(f"{field_name} must be uint8 RGB, got dtype {array.dtype}", field_name)
    if array.ndim != layout.count("x") + 1 or array.shape[-1] != 3:
        raise InvalidRequestError(f"{field_name} must have shape {layout}, got {list(array.shape)}", field_name)
    _check_size(array.shape[-3], array.shape[-2], field_name, description)
    return array


def _check_size(height: int, width: int, field_name: str, description: ModelDescription) -> None:
    lim = description.limits
    if min(height, width) < lim.min_image_side or max(height, width) > lim.max_image_side:
        raise InvalidRequestError(
            f"{field_name} is {height}x{width}; each side must be in [{lim.min_image_side}, {lim.max_image_side}]",
            field_name,
        )


def _normalize(
    actions: np.ndarray, profile: PolicyProfile, description: ModelDescription, field_name: str
) -> np.ndarray:
    """Raw actions into the model's space. Values far outside the domain's range (1e38, say) would make
    the networks overflow: they are the caller's mistake, refused here, not a model failure later."""
    with np.errstate(over="ignore", invalid="ignore"):
        normalized = profile.to_model(actions)  # the gripper flipped, then normalized
    bound = description.limits.max_normalized_action
    if not (np.isfinite(normalized).all() and np.abs(normalized).max(initial=0.0) <= bound):
        raise InvalidRequestError(
            f"{field_name} lie too far outside domain {profile.domain_name!r}'s action range: normalized by its "
            f"statistics they must stay within ±{bound:g} (its recorded actions lie within about ±1)",
            field_name,
        )
    return normalized
