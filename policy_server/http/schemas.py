"""The HTTP sidecar's request and response models: what ``/openapi.json`` describes and clients rely on.

Request models validate the scalar settings of a request (types, ranges, unknown fields); the media
fields (images, videos, action arrays) are declared here with their exact JSON schema but converted by
:mod:`policy_server.http.codecs`, because they arrive in several forms (base64, nested lists, msgpack
arrays, file uploads) that a JSON schema alone cannot turn into numpy arrays. Checks that depend on the
loaded model (domains, widths, horizons, tiers) are in :mod:`policy_server.http.requests`.

Response models are what the handlers return (FastAPI validates and documents them), so the schema and
the answers cannot drift apart.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

# -- media fields --------------------------------------------------------------------------------------

_IMAGE_SCHEMA = {
    "description": (
        "One RGB image: a base64 string of a PNG/JPEG/WebP file (a `data:image/...;base64,` URL is accepted), "
        "or H×W×3 nested lists of integers in [0, 255]. In msgpack bodies also raw encoded bytes or an "
        "H×W×3 uint8 array in the wire codec's form. In multipart bodies, a file upload."
    ),
    "anyOf": [
        {"type": "string", "contentEncoding": "base64"},
        {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}},
    ],
}
_VIDEO_SCHEMA = {
    "description": (
        "A T×H×W×3 RGB clip: a list of base64 frames (PNG/JPEG/WebP), or T×H×W×3 nested lists of integers "
        "in [0, 255]. In msgpack bodies also a T×H×W×3 uint8 array. In multipart bodies, a video file "
        "upload (MP4, WebM, ...)."
    ),
    "anyOf": [
        {"type": "array", "items": {"type": "string", "contentEncoding": "base64"}},
        {
            "type": "array",
            "items": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            },
        },
    ],
}
_ACTIONS_SCHEMA = {
    "description": (
        "Raw actions, T×D numbers (D = the domain's raw_action_dim). In msgpack bodies also a float array; "
        "in multipart bodies a JSON text field."
    ),
    "type": "array",
    "items": {"type": "array", "items": {"type": "number"}},
}

_STATE_SCHEMA = {
    "description": (
        "The robot's proprio state in raw units: [state_dim] numbers, or [history_length, state_dim] rows (oldest "
        "first), for a domain whose profile conditions on it (`state_dim` in the metadata's `domains`). In msgpack "
        "bodies also a float array; in multipart bodies a JSON text field."
    ),
    "anyOf": [
        {"type": "array", "items": {"type": "number"}},
        {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
    ],
}

ImageInput = Annotated[Any, WithJsonSchema(_IMAGE_SCHEMA)]
VideoInput = Annotated[Any, WithJsonSchema(_VIDEO_SCHEMA)]
ActionsInput = Annotated[Any, WithJsonSchema(_ACTIONS_SCHEMA)]
StateInput = Annotated[Any, WithJsonSchema(_STATE_SCHEMA)]

SEED_LIMIT = 2**63
# A video job's status as its object reports it (policy_server.videos.job_store.VideoJobStatus values).
VideoJobStatusName = Literal["queued", "in_progress", "completed", "failed"]


def normalized_mode(value: Any) -> Any:
    """``action_mode`` trimmed and lower-cased (" Policy" means policy); other values as they are."""
    return value.strip().lower() if isinstance(value, str) else value


class _Strict(BaseModel):
    """Every field is honoured or refused: an unknown one is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("action_mode", mode="before", check_fields=False)
    @classmethod
    def _trim_mode(cls, value: Any) -> Any:
        return normalized_mode(value)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any) -> Any:
        # Lax parsing would read `true` as 1 step or seed 1: no field here is a boolean.
        if isinstance(value, bool):
            raise ValueError("a boolean is not a valid value here")
        return value


# -- requests ------------------------------------------------------------------------------------------


class VideoCreateParams(_Strict):
    """``POST /v1/videos``: a ``forward_dynamics`` rollout, a first frame plus raw actions in, video out."""

    action: ActionsInput = Field(description="T×D raw actions to roll out from the first frame")
    input_reference: ImageInput = Field(description="the first frame the rollout starts from")
    domain_name: str | None = Field(None, description="embodiment (default: the model's default domain)")
    prompt: str = Field("", description="text conditioning")
    action_mode: Literal["forward_dynamics"] = Field(
        "forward_dynamics",
        description="only forward_dynamics here; policy and inverse_dynamics are served by "
        "POST /v1/actions/generations",
    )
    fps: float = Field(24.0, ge=1.0, le=240.0, description="frame rate of the actions and of the MP4")
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT, description="random seed (default: drawn and recorded)")
    num_steps: int | None = Field(None, ge=1, description="denoising steps (distilled: the fixed count or unset)")
    guidance_scale: float | None = Field(None, ge=0.0, description="classifier-free guidance (distilled: 1.0 or unset)")
    shift: float | None = Field(None, gt=0.0, description="the scheduler's flow shift (distilled: unset)")
    resolution_tier: int | None = Field(None, description="resolution tier, one of the model's `resolution_tiers`")
    view_point: str | None = Field(None, description="camera view point (default: the domain's)")
    model: str | None = Field(None, description="if given, must name the served model")


class ActionGenerationParams(_Strict):
    """``POST /v1/actions/generations``: one chunk of actions for one observation, without a WebSocket."""

    domain_name: str | None = Field(None, description="embodiment (default: the model's default domain)")
    action_mode: Literal["policy", "inverse_dynamics"] | None = Field(
        None,
        description="policy (image in) or inverse_dynamics (video in); forward_dynamics is POST /v1/videos. "
        "Default: inverse_dynamics for a `video`, policy for an `image`",
    )
    image: ImageInput = Field(None, description="the observation (policy)")
    video: VideoInput = Field(
        None,
        description="a clip of action_horizon + 1 frames (inverse_dynamics), or a "
        "clip whose first frame conditions a policy chunk (action_mode policy)",
    )
    prompt: str | None = Field(None, description="text conditioning (default: none)")
    action_horizon: int | None = Field(None, description="actions per chunk (default: the domain's)")
    resolution_tier: int | None = Field(None, description="resolution tier, one of the model's `resolution_tiers`")
    view_point: str | None = Field(None, description="camera view point (default: the domain's)")
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT, description="random seed (default: drawn)")
    num_steps: int | None = Field(None, ge=1, description="denoising steps (distilled: the fixed count or unset)")
    guidance_scale: float | None = Field(None, ge=0.0, description="classifier-free guidance (distilled: 1.0 or unset)")
    shift: float | None = Field(None, gt=0.0, description="the scheduler's flow shift (distilled: unset)")
    fps: float | None = Field(
        None,
        gt=0.0,
        le=240.0,
        description="control rate the actions are meant for "
        "(default: the domain's profile, else the model's; 1 to 240)",
    )
    prefix_actions: ActionsInput = Field(
        None, description="K×D raw actions the chunk must start with (real-time chunking, policy only)"
    )
    state: StateInput = Field(
        None, description="the robot's proprio state (required by a domain with a state_dim, refused by any other)"
    )
    model: str | None = Field(None, description="if given, must name the served model")


# -- responses -----------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    code: str = Field(description="stable error code; clients branch on it")
    message: str = Field(description="what went wrong and what to do about it")
    field: str | None = Field(None, description="the offending request field, when there is one")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class VideoJobObject(BaseModel):
    id: str
    object: Literal["video"] = "video"
    status: VideoJobStatusName
    progress: int = Field(description="0-100; coarse: 0 queued, 10 on the engine, 90 encoding, 100 done")
    created_at: int = Field(description="Unix seconds")
    started_at: int | None = Field(None, description="Unix seconds the latest attempt started")
    completed_at: int | None = Field(None, description="Unix seconds it completed or failed")
    expires_at: int | None = Field(None, description="Unix seconds retention deletes it (finished jobs only)")
    model: str | None = None
    prompt: str = ""
    domain_name: str
    action_shape: list[int] = Field(description="[T, D] of the submitted actions")
    fps: float
    seed: int
    num_steps: int | None = None
    guidance_scale: float | None = None
    resolution_tier: int | None = None
    size: str | None = Field(None, description="WIDTHxHEIGHT of the finished video")
    frames: int | None = Field(None, description="frames in the finished video")
    seconds: float | None = Field(None, description="duration of the finished video")
    bytes: int | None = Field(None, description="size of the finished MP4")
    attempts: int = Field(description="times the job was started (a restart mid-job starts it again)")
    error: ErrorDetail | None = None
    url: str | None = Field(
        None,
        description="where the finished MP4 is downloaded (GET /v1/videos/{id}/content); "
        "null until the job completed (SGLang's field)",
    )


class VideoJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VideoJobObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True


class ActionArray(BaseModel):
    type: Literal["continuous"] = "continuous"
    dtype: Literal["float32"] = "float32"
    shape: list[int] = Field(description="[action_horizon, raw_action_dim]")
    values: Any = Field(description="H×D nested lists (JSON) or a float32 array in the wire codec's form (msgpack)")
    action_mode: str
    domain_name: str
    domain_id: int
    raw_action_dim: int
    # What the chunk was made with, defaults resolved: each setting of the request is visible here.
    prompt: str | None = None
    resolution_tier: int | None = None
    view_point: str | None = None
    guidance_scale: float | None = None
    shift: float | None = None
    fps: float | None = None


class ActionGenerationItem(BaseModel):
    index: int = 0
    action: ActionArray


class ActionUsage(BaseModel):
    num_steps: int
    seed: int
    batch_size: int = Field(description="requests that shared this chunk's transformer calls")
    queue_ms: float
    model_ms: float = Field(description="the engine call (its batch's) in milliseconds")
    total_ms: float = Field(description="from the request's body being read to the answer being ready")


class ActionGeneration(BaseModel):
    id: str
    object: Literal["action.generation"] = "action.generation"
    created: int = Field(description="Unix seconds")
    model: str | None = None
    data: list[ActionGenerationItem]
    usage: ActionUsage


class Health(BaseModel):
    status: str = Field(description="alive: `ok` as long as the process serves HTTP")
    engine: str = Field(description="the engine worker's state: starting, loading, warming_up, ready, failed, stopped")
    uptime_s: float


class ServedWeightsInfo(BaseModel):
    """Which weights answer: the runtime's ``ServedWeights``."""

    quantization: str = Field(description="none, int8 or fp8 (the transformer's linear layers)")
    sha256: str = Field(description="the checkpoint folder's SHA-256 (docs/runtime.md, 'What is served')")
    revision: str | None = Field(default=None, description="the Hub commit the checkpoint resolved to")


class Readiness(BaseModel):
    ready: bool
    status: str = Field(description="ready, or why not: starting, loading, warming_up, failed, stopping")
    model: str | None = None
    variant: str | None = None
    weights: ServedWeightsInfo | None = None


class DomainInfo(BaseModel):
    domain_id: int
    raw_action_dim: int
    default_horizon: int | None = None
    view_point: str | None = None
    normalization: str | None = None
    # Proprio state the domain conditions on (None: it takes no state): its width and how many rows.
    state_dim: int | None = None
    use_state: bool = False
    history_length: int | None = None


class ActionMetadata(BaseModel):
    """``GET /v1/actions/metadata``: what the loaded checkpoint offers, read from the engine."""

    object: Literal["action.metadata"] = "action.metadata"  # SGLang's name, which its clients compare
    model: str | None
    variant: str | None
    is_distilled: bool
    is_edge: bool
    modes: list[str] = Field(description="every mode the checkpoint serves")
    action_modes: list[str] = Field(description="served by POST /v1/actions/generations and the WebSocket")
    video_modes: list[str] = Field(description="served by POST /v1/videos")
    endpoints: dict[str, str] = Field(description="which endpoint serves each mode")
    domains: dict[str, DomainInfo]
    action_horizon: dict[str, int | None] = Field(description="min, max, multiple_of")
    resolution_tiers: list[int]
    view_points: list[str]
    defaults: dict[str, Any]
    distilled_sigmas: list[float] | None = None
    limits: dict[str, Any]
    capabilities: dict[str, Any]
    device: str | None = None
    dtype: str | None = None
    weights: ServedWeightsInfo | None = None
    topology: dict[str, Any] = Field(
        default_factory=dict, description="where the engine runs: backend (local, ray) and its replicas"
    )
    # SGLang's keys (docs/sglang.md); its `defaults` and `capabilities` keys are merged into ours above.
    policy_family: str = Field(description="SGLang's model family: cosmos3")
    input: dict[str, Any] = Field(description="SGLang's input.{modalities, supported_resolutions, state_dim}")
    output: dict[str, Any] = Field(
        description="SGLang's output.{action_type, action_horizon, action_dim, padded_action_dim, dtype}"
    )
