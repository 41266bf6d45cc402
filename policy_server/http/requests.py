"""Decoded HTTP fields to engine requests, checked against what the loaded model offers.

The sidecar answers a wrong request at once, with the field to fix, instead of accepting a video job
that would fail minutes later: every check that depends on the model (domain, action width, horizon,
tier, view point, the distilled schedule) is made here against the engine's ``describe()``. The engine
checks again when it runs a request (it is the authority); these are the early, cheap answers.

Action generations reuse the realtime session's settings rules (:func:`merge_session_config`), so a
request the WebSocket would refuse is refused here with the same code.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from cosmos3_runtime.requests import ActionRequest
from robot_clients.client_frames import ObservationFrame, parse_state
from robot_clients.protocol import ErrorCode, FrameLimits, ProtocolError

from ..engine.description import DomainProfile, ModelDescription
from ..media.media_check import DEFAULT_MAX_DECODED_BYTES
from ..sessions.config import check_schedule, merge_session_config
from ..videos.jobs import VideoJobInputs
from .codecs import to_actions
from .errors import ApiError
from .media_fields import decode_image_bytes, encoded_image, to_image, to_video
from .schemas import SEED_LIMIT, ActionGenerationParams, VideoCreateParams, normalized_mode

VIDEOS_PATH = "/v1/videos"
ACTION_GENERATIONS_PATH = "/v1/actions/generations"
ACTION_MODES = ("policy", "inverse_dynamics")
VIDEO_MODE = "forward_dynamics"


@dataclass
class VideoSubmission:
    """A checked ``POST /v1/videos``: the params to store (defaults resolved) and the input arrays."""

    params: dict[str, Any]
    inputs: VideoJobInputs


def _validate(model: type[BaseModel], fields: dict[str, Any]) -> BaseModel:
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error.get("loc", ())) or None
        if error.get("type") == "missing":
            raise ApiError(ErrorCode.MISSING_FIELD, f"`{field}` is required", field) from None
        if error.get("type") == "extra_forbidden":
            known = ", ".join(model.model_fields)
            raise ApiError(ErrorCode.INVALID_FIELD, f"unknown field `{field}`; known fields: {known}", field) from None
        raise ApiError(ErrorCode.INVALID_FIELD, f"`{field}`: {error.get('msg', 'invalid value')}", field) from None


def _check_model(name: str | None, description: ModelDescription) -> None:
    served = description.model
    if name is not None and name != served:
        raise ApiError(ErrorCode.INVALID_FIELD, f"this server serves {served!r}, not {name!r}", "model")


def _domain(name: str | None, description: ModelDescription) -> DomainProfile:
    domains = description.domains
    name = name or description.defaults.domain_name
    if name not in domains:
        raise ApiError(
            ErrorCode.UNKNOWN_DOMAIN,
            f"unknown domain {name!r}; this model knows: {', '.join(sorted(domains)) or 'none'}",
            "domain_name",
        )
    return domains[name]


def _schedule(num_steps: int | None, guidance: float | None, description: ModelDescription) -> None:
    """The distilled schedule is fixed; base models bound steps and guidance by the engine's limits."""
    try:
        check_schedule(num_steps, guidance, description)
    except ProtocolError as exc:
        raise ApiError.of(exc) from None


def _tier_and_view(tier: int | None, view_point: str | None, description: ModelDescription) -> None:
    tiers = list(description.resolution_tiers)
    if tier is not None and tier not in tiers:
        raise ApiError(
            ErrorCode.UNSUPPORTED_TIER,
            f"resolution_tier {tier} is not supported by this {description.variant or ''} model; choose one of {tiers}",
            "resolution_tier",
        )
    view_points = list(description.view_points)
    if view_point is not None and view_points and view_point not in view_points:
        raise ApiError(
            ErrorCode.INVALID_FIELD, f"unknown view_point {view_point!r}; choose one of {view_points}", "view_point"
        )


def _prompt(prompt: str, description: ModelDescription) -> None:
    limit = description.limits.max_prompt_chars
    if limit is not None and len(prompt) > limit:
        raise ApiError(ErrorCode.INVALID_FIELD, f"prompt must be at most {limit} characters", "prompt")


def _route_mode(fields: dict[str, Any], endpoint: str) -> None:
    """A mode served by the other endpoint is a 400 that names that endpoint."""
    mode = normalized_mode(fields.get("action_mode"))
    if endpoint == VIDEOS_PATH and mode in ACTION_MODES:
        raise ApiError(
            ErrorCode.UNSUPPORTED_MODE,
            f"{mode} produces actions, not video: POST it to {ACTION_GENERATIONS_PATH}",
            "action_mode",
        )
    if endpoint == ACTION_GENERATIONS_PATH and mode == VIDEO_MODE:
        raise ApiError(
            ErrorCode.UNSUPPORTED_MODE,
            f"forward_dynamics produces video, not actions: POST it to {VIDEOS_PATH} (an asynchronous job)",
            "action_mode",
        )


def video_submission(
    fields: dict[str, Any], description: ModelDescription, media_limits: FrameLimits | None = None
) -> VideoSubmission:
    """Check a ``POST /v1/videos`` body and resolve what the job will run with.

    ``media_limits`` adds the sidecar's decoding bounds to the model's (default: the model's alone)."""
    _route_mode(fields, VIDEOS_PATH)
    if VIDEO_MODE not in description.modes:
        raise ApiError(ErrorCode.UNSUPPORTED_MODE, "the loaded model cannot serve forward_dynamics", "action_mode")
    params: VideoCreateParams = _validate(VideoCreateParams, fields)  # type: ignore[assignment]
    _check_model(params.model, description)
    domain = _domain(params.domain_name, description)
    _schedule(params.num_steps, params.guidance_scale, description)
    _tier_and_view(params.resolution_tier, params.view_point, description)
    _prompt(params.prompt, description)

    action = to_actions(params.action, "action")
    width = domain.raw_action_dim
    if width is not None and action.shape[1] != width:
        raise ApiError(
            ErrorCode.INVALID_FIELD,
            f"`action` rows must have {width} values (raw_action_dim of {domain.name}), got {action.shape[1]}",
            "action",
        )
    horizon, steps = description.action_horizon, action.shape[0]
    if not horizon.accepts(steps):
        raise ApiError(
            ErrorCode.INVALID_FIELD,
            f"`action` has {steps} rows; this model rolls out between {horizon.min} and {horizon.max} "
            f"actions, a multiple of {horizon.multiple_of}",
            "action",
        )
    limits = media_limits or description.limits.frame_limits(DEFAULT_MAX_DECODED_BYTES)
    encoded = encoded_image(params.input_reference, "input_reference")  # stored as received, not as pixels
    image = (
        decode_image_bytes(encoded, "input_reference", limits)
        if encoded is not None
        else to_image(params.input_reference, "input_reference", limits)
    )

    defaults = description.defaults
    resolved = {
        "model": description.model,
        "domain_name": domain.name,
        "prompt": params.prompt,
        "fps": float(params.fps),
        # A seed is drawn now and stored, so a job re-run after a restart gives the same video.
        "seed": params.seed if params.seed is not None else secrets.randbelow(SEED_LIMIT),
        "num_steps": params.num_steps,
        "guidance_scale": params.guidance_scale,
        "resolution_tier": params.resolution_tier,
        "view_point": params.view_point,
        "action_shape": list(action.shape),
        "resolved": {  # what the engine's defaults make of the unset values, for the job object
            "num_steps": params.num_steps if params.num_steps is not None else defaults.num_steps,
            "guidance_scale": params.guidance_scale if params.guidance_scale is not None else defaults.guidance_scale,
            "resolution_tier": (
                params.resolution_tier if params.resolution_tier is not None else defaults.resolution_tier
            ),
        },
    }
    return VideoSubmission(resolved, VideoJobInputs(image=image, action=action, encoded_image=encoded))


def action_request(
    fields: dict[str, Any], description: ModelDescription, media_limits: FrameLimits | None = None
) -> ActionRequest:
    """Check a ``POST /v1/actions/generations`` body and build its engine request.

    The settings go through the realtime session's rules (:func:`merge_session_config`), so every field
    is checked with the engine's limits and refused with the same code as over the WebSocket; the mode,
    when unset, follows the media (a ``video`` asks for ``inverse_dynamics``). ``media_limits``: as for
    :func:`video_submission`.
    """
    _route_mode(fields, ACTION_GENERATIONS_PATH)
    params: ActionGenerationParams = _validate(ActionGenerationParams, fields)  # type: ignore[assignment]
    _check_model(params.model, description)
    domain_name = _domain(params.domain_name, description).name
    settings = {
        name: getattr(params, name)
        for name in (
            "action_mode",
            "action_horizon",
            "prompt",
            "resolution_tier",
            "view_point",
            "seed",
            "num_steps",
            "guidance_scale",
            "fps",
        )
        if getattr(params, name) is not None
    }
    settings["domain_name"] = domain_name
    limits = media_limits or description.limits.frame_limits(DEFAULT_MAX_DECODED_BYTES)
    image = video = prefix = None
    if params.image is not None and params.video is not None:
        raise ApiError(ErrorCode.INVALID_FIELD, "send either `image` or `video`, not both", "video")
    if params.image is not None:
        image = to_image(params.image, "image", limits)
    elif params.video is not None:
        video = to_video(params.video, "video", limits)
    elif params.action_mode == "inverse_dynamics":
        raise ApiError(ErrorCode.MISSING_FIELD, "inverse_dynamics needs a `video` (T×H×W×3)", "video")
    else:
        raise ApiError(ErrorCode.MISSING_FIELD, "policy needs an `image` (H×W×3) or a `video`", "image")
    if params.prefix_actions is not None:
        prefix = to_actions(params.prefix_actions, "prefix_actions")
    try:
        state = None if params.state is None else parse_state(params.state)
        config = merge_session_config(None, settings, description)
        return config.action_request(
            ObservationFrame(seq=0, image=image, video=video, prefix_actions=prefix, state=state), description
        )
    except ProtocolError as exc:
        raise ApiError.of(exc) from None


def actions_payload(actions: np.ndarray, as_msgpack: bool) -> Any:
    """The ``values`` of an action array: a float32 array for msgpack, nested lists for JSON."""
    actions = np.ascontiguousarray(actions, dtype=np.float32)
    return actions if as_msgpack else actions.tolist()
