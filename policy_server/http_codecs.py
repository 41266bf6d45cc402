"""Request bodies in, numpy arrays out: JSON, msgpack and multipart, plus the media they carry.

One HTTP request can arrive three ways, all decoded here into one plain ``dict`` of fields:

* ``application/json``: images as base64 strings or nested lists, actions as nested lists;
* ``application/msgpack`` (also ``application/x-msgpack``, ``application/vnd.msgpack``): a map decoded by
  the shared wire codec (:mod:`robot_clients.wire_codec`), so arrays are numpy arrays in openpi's form and
  nothing is ever unpickled;
* ``multipart/form-data``: scalar fields as text (``action`` / ``prefix_actions`` as JSON text), images
  and videos as file uploads. An upload's declared content type must be one this field accepts; its
  file name is ignored (never used as a path: a video upload goes to a temporary file with a name of
  our own).

Then the media fields are converted with precise errors (:class:`~policy_server.http_errors.ApiError`
naming the field): images become H×W×3 uint8, clips T×H×W×3 uint8, actions T×D float32. Encoded images
are decoded with Pillow after their pixel size is checked against the model's limits, so a small file
that claims to be a gigapixel image is refused before any pixel is allocated.

Responses: :func:`wants_msgpack` reads ``Accept`` (and, when it does not decide, the request's own
format); msgpack responses are packed by the wire codec.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_clients.wire_codec import WireFormatError, unpackb

from .http_errors import ApiError, HttpErrorCode
from .protocol import ErrorCode
from .video_encoding import VideoEncodingError, read_video_bytes

JSON_TYPE = "application/json"
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
MSGPACK_TYPE = MSGPACK_TYPES[0]
MULTIPART_TYPE = "multipart/form-data"

# Encoded image formats Pillow may decode here (by content, not by what the client claims).
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")
IMAGE_UPLOAD_TYPES = ("image/png", "image/jpeg", "image/webp")
VIDEO_UPLOAD_TYPES = ("video/mp4", "video/webm", "video/quicktime", "video/x-matroska")
# Fields a multipart body may carry as JSON text (arrays).
JSON_TEXT_FIELDS = ("action", "prefix_actions")
# Multipart bounds beyond the body size limit: a form is a handful of settings and at most two files.
MAX_MULTIPART_FILES = 2
MAX_MULTIPART_FIELDS = 32
MAX_MULTIPART_TEXT_BYTES = 4 * 2**20  # an `action` array as JSON text


@dataclass(frozen=True)
class MediaLimits:
    """Pixel and frame bounds (from the engine's ``describe()["limits"]``)."""

    min_image_side: int = 32
    max_image_side: int = 4096
    max_clip_frames: int = 65

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> "MediaLimits":
        limits = description.get("limits", {})
        return cls(
            min_image_side=int(limits.get("min_image_side", cls.min_image_side)),
            max_image_side=int(limits.get("max_image_side", cls.max_image_side)),
            max_clip_frames=int(limits.get("max_clip_frames", cls.max_clip_frames)),
        )


@dataclass
class Upload:
    """A multipart file part: its bytes and the content type the client declared (file name dropped)."""

    data: bytes
    content_type: str


def media_type(content_type: str | None) -> str:
    """``"application/json; charset=utf-8"`` -> ``"application/json"``."""
    return (content_type or "").split(";", 1)[0].strip().lower()


# -- bodies ----------------------------------------------------------------------------------------------


def decode_json_body(body: bytes) -> dict[str, Any]:
    try:
        decoded = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(HttpErrorCode.BAD_BODY, f"the body is not valid JSON ({exc})") from None
    except RecursionError:  # `[[[[...]]]]` a thousand deep: Python's parser recurses per level
        raise ApiError(HttpErrorCode.BAD_BODY, "the JSON body is nested too deeply") from None
    return _as_fields(decoded, "JSON")


def decode_msgpack_body(body: bytes) -> dict[str, Any]:
    try:
        decoded = unpackb(body)
    except WireFormatError as exc:
        raise ApiError(HttpErrorCode.BAD_BODY, f"the body is not a valid msgpack map: {exc.message}", exc.field) from None
    except Exception:  # noqa: BLE001 - msgpack raises several types for truncated or corrupt input
        raise ApiError(HttpErrorCode.BAD_BODY, "the body is not valid msgpack") from None
    return _as_fields(decoded, "msgpack")


def _as_fields(decoded: Any, what: str) -> dict[str, Any]:
    if not isinstance(decoded, dict):
        raise ApiError(HttpErrorCode.BAD_BODY, f"the {what} body must be an object/map, got {type(decoded).__name__}")
    fields: dict[str, Any] = {}
    for key, value in decoded.items():
        if isinstance(key, bytes):
            key = key.decode("utf-8", errors="replace")
        if not isinstance(key, str):
            raise ApiError(HttpErrorCode.BAD_BODY, f"field names must be strings, got {type(key).__name__}")
        fields[key] = value
    return fields


def decode_multipart_fields(items: list[tuple[str, Any]], file_fields: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """Turn parsed form items into fields; ``file_fields`` maps each upload field to its accepted types.

    ``items`` are ``(name, value)`` pairs where an upload's value is an :class:`Upload`.
    """
    fields: dict[str, Any] = {}
    for name, value in items:
        if name in fields:
            raise ApiError(ErrorCode.INVALID_FIELD, f"field `{name}` appears more than once", name)
        if isinstance(value, Upload):
            accepted = file_fields.get(name)
            if accepted is None:
                raise ApiError(
                    ErrorCode.INVALID_FIELD,
                    f"`{name}` cannot be a file upload; files are accepted for: {', '.join(file_fields) or 'none'}",
                    name,
                )
            declared = media_type(value.content_type)
            if declared not in accepted:
                raise ApiError(
                    HttpErrorCode.UNSUPPORTED_MEDIA_TYPE,
                    f"`{name}` upload has content type {declared or '(none)'!r}; accepted: {', '.join(accepted)}",
                    name,
                )
            fields[name] = value
        elif name in JSON_TEXT_FIELDS:
            try:
                fields[name] = json.loads(value)
            except ValueError:
                raise ApiError(ErrorCode.INVALID_FIELD, f"`{name}` must be JSON text (nested lists of numbers)",
                               name) from None
        else:
            fields[name] = value
    return fields


def wants_msgpack(accept: str | None, request_type: str) -> bool:
    """Answer in msgpack? Yes if ``Accept`` names a msgpack type before JSON, or says nothing and the
    request itself was msgpack."""
    accepted = [media_type(part) for part in (accept or "").split(",") if part.strip()]
    for entry in accepted:
        if entry in MSGPACK_TYPES:
            return True
        if entry == JSON_TYPE:
            return False
    return request_type in MSGPACK_TYPES


# -- media ---------------------------------------------------------------------------------------------


def _check_sides(height: int, width: int, field: str, limits: MediaLimits) -> None:
    if min(height, width) < limits.min_image_side or max(height, width) > limits.max_image_side:
        raise ApiError(
            ErrorCode.INVALID_IMAGE,
            f"`{field}` is {height}×{width} pixels; each side must be between {limits.min_image_side} and "
            f"{limits.max_image_side}",
            field,
        )


def _b64(text: str, field: str) -> bytes:
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if ";base64" not in header:
            raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}` data URL must be base64-encoded", field)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}` is not valid base64", field) from None


def decode_image_bytes(data: bytes, field: str, limits: MediaLimits) -> np.ndarray:
    """An encoded PNG/JPEG/WebP image to H×W×3 uint8 RGB, its size checked before it is decoded."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format not in IMAGE_FORMATS:
                raise ApiError(
                    ErrorCode.INVALID_IMAGE,
                    f"`{field}` is a {image.format} image; accepted formats: {', '.join(IMAGE_FORMATS)}",
                    field,
                )
            width, height = image.size
            _check_sides(height, width, field, limits)
            rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except ApiError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        raise ApiError(
            ErrorCode.INVALID_IMAGE, f"`{field}` is not an image Pillow can decode (PNG, JPEG or WebP)", field
        ) from None
    return np.ascontiguousarray(rgb)


def _pixel_array(value: Any, rank: int, field: str) -> np.ndarray:
    shape_text = "H×W×3" if rank == 3 else "T×H×W×3"
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8:
            raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}` must have dtype uint8, got {value.dtype}", field)
        array = value
    else:
        try:
            array = np.asarray(value)
        except (ValueError, TypeError):
            raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}` must be {shape_text} nested lists of integers",
                           field) from None
        if array.dtype.kind not in "iu" or (array.size and (array.min() < 0 or array.max() > 255)):
            raise ApiError(ErrorCode.INVALID_IMAGE,
                           f"`{field}` must hold integers in [0, 255] ({shape_text} RGB)", field)
        array = array.astype(np.uint8)
    if array.ndim != rank or array.shape[-1] != 3:
        raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}` must have shape {shape_text} (RGB), got "
                       f"{list(array.shape)}", field)
    return array


def to_image(value: Any, field: str, limits: MediaLimits) -> np.ndarray:
    """Any accepted image form (base64, bytes, upload, nested lists, uint8 array) to H×W×3 uint8."""
    if isinstance(value, Upload):
        return decode_image_bytes(value.data, field, limits)
    if isinstance(value, str):
        return decode_image_bytes(_b64(value, field), field, limits)
    if isinstance(value, (bytes, bytearray)):
        return decode_image_bytes(bytes(value), field, limits)
    if isinstance(value, (list, np.ndarray)):
        array = _pixel_array(value, 3, field)
        _check_sides(array.shape[0], array.shape[1], field, limits)
        return np.ascontiguousarray(array)
    raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}` must be an image (base64 string, nested lists or an "
                   f"upload), got {type(value).__name__}", field)


def to_video(value: Any, field: str, limits: MediaLimits) -> np.ndarray:
    """Any accepted clip form (upload, list of encoded frames, nested lists, uint8 array) to T×H×W×3 uint8."""
    if isinstance(value, Upload):
        try:
            clip = read_video_bytes(value.data, limits.max_clip_frames)
        except VideoEncodingError as exc:
            raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}`: {exc}", field) from None
    elif isinstance(value, list) and value and isinstance(value[0], (str, bytes, bytearray)):
        if len(value) > limits.max_clip_frames:
            raise ApiError(ErrorCode.INVALID_IMAGE,
                           f"`{field}` has {len(value)} frames; at most {limits.max_clip_frames} are allowed", field)
        frames = [to_image(frame, field, limits) for frame in value]
        if len({frame.shape for frame in frames}) != 1:
            raise ApiError(ErrorCode.INVALID_IMAGE, f"every frame of `{field}` must have the same size", field)
        clip = np.stack(frames)
    elif isinstance(value, (list, np.ndarray)):
        clip = _pixel_array(value, 4, field)
    else:
        raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}` must be a clip (a video upload, a list of base64 "
                       f"frames or T×H×W×3 nested lists), got {type(value).__name__}", field)
    if not 1 <= clip.shape[0] <= limits.max_clip_frames:
        raise ApiError(ErrorCode.INVALID_IMAGE,
                       f"`{field}` has {clip.shape[0]} frames; between 1 and {limits.max_clip_frames} are allowed", field)
    _check_sides(clip.shape[1], clip.shape[2], field, limits)
    return np.ascontiguousarray(clip)


def to_actions(value: Any, field: str) -> np.ndarray:
    """T×D numbers (nested lists or a float/int array) to float32, every value finite."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "fiu":
            raise ApiError(ErrorCode.INVALID_FIELD, f"`{field}` must be a numeric array, got dtype {value.dtype}", field)
        array = value.astype(np.float32)
    else:
        if not isinstance(value, list):
            raise ApiError(ErrorCode.INVALID_FIELD, f"`{field}` must be T×D nested lists of numbers", field)
        try:
            array = np.asarray(value, dtype=np.float64)
        except (ValueError, TypeError):
            raise ApiError(ErrorCode.INVALID_FIELD,
                           f"`{field}` must be T×D nested lists of numbers (rows of equal length)", field) from None
        array = array.astype(np.float32)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ApiError(ErrorCode.INVALID_FIELD, f"`{field}` must have shape T×D, got {list(array.shape)}", field)
    if not np.isfinite(array).all():
        raise ApiError(ErrorCode.INVALID_FIELD, f"`{field}` must hold finite numbers only", field)
    return np.ascontiguousarray(array)


def is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
