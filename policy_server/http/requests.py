"""Decoded HTTP fields to engine requests, checked against what the loaded model offers.

The sidecar answers a wrong request at once, with the field to fix, instead of accepting a video job
that would fail minutes later: every check that depends on the model (domain, action width, horizon,
tier, view point, the distilled schedule) is made here against the engine's ``describe()``. The engine
checks again when it runs a request (it is the authority); these are the early, cheap answers.

Action generations reuse the native session's settings rules (:func:`request_config`, the model's one resolve),
so a request the WebSocket would refuse is refused here with the same code. SGLang's bodies on the same routes
(``docs/sglang.md``, "Telling the dialects apart") are told apart here and turned into engine requests by
the same checks, their errors naming the client's fields; the translation itself is
:mod:`policy_server.sglang` (pure functions).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from cosmos3_runtime.description import Media, ModelDescription
from cosmos3_runtime.errors import RuntimeErrorBase
from cosmos3_runtime.requests import ActionRequest, ResolvedSettings
from robot_clients.client_frames import REQUEST_SETTINGS, ObservationFrame, parse_state
from robot_clients.protocol import ErrorCode, FrameLimits, ProtocolError

from ..foundation.api_errors import ApiError
from ..foundation.camera_intake import DEFAULT_MAX_DECODED_BYTES, model_frame_limits
from ..metadata import public_model_name
from ..session_config import request_config, resolve_settings
from ..sglang.actions import (
    FORM_UPLOADS,
    ActionCall,
    envelope_from_form,
    is_sglang_envelope,
    is_sglang_form,
    parse_action_envelope,
)
from ..videos.job_store import VideoJobInputs
from . import codecs as http_codecs
from .codecs import decode_image_bytes, encoded_image, to_actions, to_image, to_video
from .schemas import SEED_LIMIT, ActionGenerationParams, VideoCreateParams, VideoJobObject, normalized_mode

VIDEOS_PATH = "/v1/videos"
ACTION_GENERATIONS_PATH = "/v1/actions/generations"
ACTION_MODES = ("policy", "inverse_dynamics")
VIDEO_MODE = "forward_dynamics"
# The settings each endpoint takes, in the table's order: the request settings among its schema's fields.
ACTION_SETTINGS = tuple(s.name for s in REQUEST_SETTINGS if s.name in ActionGenerationParams.model_fields)
VIDEO_SETTINGS = tuple(s.name for s in REQUEST_SETTINGS if s.name in VideoCreateParams.model_fields)
RequestModel = TypeVar("RequestModel", bound=BaseModel)


@dataclass
class VideoSubmission:
    """A checked ``POST /v1/videos``: the params to store (defaults resolved) and the input arrays."""

    params: dict[str, Any]
    inputs: VideoJobInputs


def _validate(model: type[RequestModel], fields: dict[str, Any]) -> RequestModel:
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
    """A request naming a model names the one served: as the metadata shows it, or by its full path."""
    served = public_model_name(description.model)
    if name is not None and name not in (served, description.model):
        raise ApiError(ErrorCode.INVALID_FIELD, f"this server serves {served!r}, not {name!r}", "model")


def _resolved(settings: dict[str, Any], description: ModelDescription, media: Media, output: str) -> ResolvedSettings:
    """The server's one resolve of a request's settings and shape (the sessions'), answered as a 400 naming the
    field."""
    try:
        return resolve_settings(settings, description, media, output=output)
    except ProtocolError as exc:
        raise ApiError.of(exc) from None


def _route_mode(fields: dict[str, Any], endpoint: str, description: ModelDescription) -> None:
    """A mode served by the other endpoint is a 400 that names that endpoint; a video job is one when the
    loaded model cannot roll out at all (the realtime modes are checked with the other settings)."""
    mode = normalized_mode(fields.get("action_mode"))
    if endpoint == VIDEOS_PATH and mode in ACTION_MODES:
        raise ApiError(
            ErrorCode.UNSUPPORTED_MODE,
            f"{mode} produces actions, not video: POST it to {ACTION_GENERATIONS_PATH}",
            "action_mode",
        )
    if endpoint == VIDEOS_PATH and VIDEO_MODE not in description.modes:
        raise ApiError(ErrorCode.UNSUPPORTED_MODE, "the loaded model cannot serve forward_dynamics", "action_mode")
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
    _route_mode(fields, VIDEOS_PATH, description)
    params = _validate(VideoCreateParams, fields)
    _check_model(params.model, description)
    # The endpoint is the mode; the rollout's horizon is its action rows (checked below).
    settings = {**params.model_dump(include=set(VIDEO_SETTINGS)), "action_mode": VIDEO_MODE}
    resolved = _resolved(settings, description, Media(image=True), output="video")
    params.domain_name = resolved.domain_name
    domain = description.domains[resolved.domain_name]

    action = to_actions(params.action, "action")
    width = domain.raw_action_dim
    if width is not None and action.shape[1] != width:
        raise ApiError(
            ErrorCode.INVALID_FIELD,
            f"`action` rows must have {width} values (raw_action_dim of {domain.domain_name}), got {action.shape[1]}",
            "action",
        )
    try:  # the rows are the rollout's horizon: the model's one rule for it
        description.check_horizon(action.shape[0], "action")
    except RuntimeErrorBase as exc:
        raise ApiError(
            ErrorCode.INVALID_FIELD, f"`action` has {action.shape[0]} rows: {exc.message}", "action"
        ) from None
    limits = media_limits or model_frame_limits(description.limits, DEFAULT_MAX_DECODED_BYTES)
    encoded = encoded_image(params.input_reference, "input_reference")  # stored as received, not as pixels
    image = (
        decode_image_bytes(encoded, "input_reference", limits)
        if encoded is not None
        else to_image(params.input_reference, "input_reference", limits)
    )

    if params.seed is None:  # drawn now and stored, so that a job re-run after a restart gives the same video
        params.seed = secrets.randbelow(SEED_LIMIT)
    settings = params.model_dump(include=set(VIDEO_SETTINGS))
    # What the settings left unset resolve to, for the job object to show: the job's domain's defaults, as the
    # engine resolves them when it runs the job (cosmos3_runtime.validation.job_for_video).
    used = resolved.as_json()
    shown = {
        name: used[name]
        for name, value in settings.items()
        if value is None and name in used and name in VideoJobObject.model_fields
    }
    stored = {
        "model": public_model_name(description.model),
        **settings,
        "action_shape": list(action.shape),
        "resolved": shown,
    }
    return VideoSubmission(stored, VideoJobInputs(image=image, action=action, encoded_image=encoded))


def action_request(
    fields: dict[str, Any], description: ModelDescription, media_limits: FrameLimits | None = None
) -> ActionRequest:
    """Check a ``POST /v1/actions/generations`` body and build its engine request.

    The settings and the media as sent go through the native session's rules (:func:`request_config`: the
    model's one resolve), so every field is checked with the engine's limits and refused with the same code as
    over the WebSocket; the mode, when unset, follows the media (a ``video`` asks for ``inverse_dynamics``).
    ``media_limits``: as for :func:`video_submission`.
    """
    _route_mode(fields, ACTION_GENERATIONS_PATH, description)
    params = _validate(ActionGenerationParams, fields)
    _check_model(params.model, description)
    settings = params.model_dump(include=set(ACTION_SETTINGS), exclude_none=True)
    # Asked before any media is decoded, with the media as sent: an unknown domain, a missing medium or two of
    # them are refused without decoding one.
    try:
        config, resolved = request_config(
            settings, description, Media(image=params.image is not None, video=params.video is not None)
        )
    except ProtocolError as exc:
        raise ApiError.of(exc) from None
    limits = media_limits or model_frame_limits(description.limits, DEFAULT_MAX_DECODED_BYTES)
    image = to_image(params.image, "image", limits) if params.image is not None else None
    video = to_video(params.video, "video", limits) if params.video is not None else None
    prefix = to_actions(params.prefix_actions, "prefix_actions") if params.prefix_actions is not None else None
    try:
        state = None if params.state is None else parse_state(params.state)
        obs = ObservationFrame(seq=0, image=image, video=video, prefix_actions=prefix, state=state)
        return config.action_request(obs, description, resolved)
    except ProtocolError as exc:
        raise ApiError.of(exc) from None


def actions_payload(actions: np.ndarray, as_msgpack: bool) -> Any:
    """The ``values`` of an action array: a float32 array for msgpack, nested lists for JSON."""
    actions = np.ascontiguousarray(actions, dtype=np.float32)
    return actions if as_msgpack else actions.tolist()


# -- SGLang's bodies on the same routes ------------------------------------------------------------

# The uploads an action generation form may carry: ours (`image`, `video`) and SGLang's (FORM_UPLOADS),
# each with the content types it may declare.
ACTION_UPLOADS = {
    "image": http_codecs.IMAGE_UPLOAD_TYPES,
    "video": http_codecs.VIDEO_UPLOAD_TYPES,
    **{name: http_codecs.IMAGE_UPLOAD_TYPES + http_codecs.VIDEO_UPLOAD_TYPES for name in FORM_UPLOADS},
}


def sglang_envelope(fields: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """SGLang's envelope if the decoded body (``kind``: its media type) is SGLang's, else None (ours).

    A JSON or msgpack body is SGLang's when it has the envelope's keys (``input``, ``parameters``, ...);
    a form when it has a field our flat form does not know (``image_reference``, ``task``, ...), and is
    then rebuilt as the envelope it flattens.
    """
    if kind == http_codecs.MULTIPART_TYPE:
        if not is_sglang_form(fields, ActionGenerationParams.model_fields):
            return None
        return envelope_from_form(list(fields.items()))
    return dict(fields) if is_sglang_envelope(fields) else None


def sglang_requests(
    envelope: dict[str, Any], description: ModelDescription, limits: FrameLimits, max_items: int, msgpack_reply: bool
) -> tuple[ActionCall, list[ActionRequest]]:
    """The checked envelope and one engine request per item (images × candidates, at most ``max_items``).

    Raises :class:`ApiError` naming the client's field (``parameters.num_inference_steps``, not ``num_steps``).
    """
    call = parse_action_envelope(envelope, description, max_items=max_items, msgpack_reply=msgpack_reply)
    return call, item_requests(call, description, limits)


def item_requests(
    call: ActionCall, description: ModelDescription, limits: FrameLimits | None = None
) -> list[ActionRequest]:
    """One engine request per item of a checked envelope, by our own checks; an error names the client's field."""
    requests = []
    for item in call.items:
        try:
            requests.append(action_request(item.fields, description, limits))
        except ApiError as exc:
            raise item.relabel(exc) from None
    return requests
