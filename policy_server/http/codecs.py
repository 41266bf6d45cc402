"""Request bodies in, plain fields out (JSON, msgpack and multipart), and fields into arrays: actions as
float32, images and clips as uint8 pixels with their sizes checked first.

One HTTP request can arrive three ways, all decoded here into one plain ``dict`` of fields:

* ``application/json``: images as base64 strings or nested lists, actions as nested lists;
* ``application/msgpack`` (also ``application/x-msgpack``, ``application/vnd.msgpack``): a map decoded by
  the shared wire codec (:mod:`robot_clients.wire_codec`), so arrays are numpy arrays in openpi's form and
  nothing is ever unpickled;
* ``multipart/form-data``: scalar fields as text (``action`` / ``prefix_actions`` / ``state`` as JSON text), images
  and videos as file uploads. An upload's declared content type must be one this field accepts; its
  file name is ignored (never used as a path: a video upload goes to a temporary file with a name of
  our own).

Action fields become T×D float32 (:func:`to_actions`). Image and clip fields become H×W×3 and T×H×W×3
uint8 RGB (:func:`to_image`, :func:`to_video`), whatever form they came in: base64 text (or a ``data:``
URL), encoded bytes, a multipart upload (:class:`Upload`), nested lists, or a uint8 array. Sizes are
checked before anything big is built, because a few kilobytes can claim gigabytes: encoded images and
clips pass the one media check every protocol uses (:mod:`policy_server.foundation.camera_intake`: headers,
frame count, decoded bytes), a video upload's frame count and sides come from its container or from
ffmpeg's stream header, and the pixels they would decode to are checked against
:attr:`FrameLimits.max_decoded_bytes` before the first pixel is decoded. Errors name the field
(:class:`~policy_server.foundation.api_errors.ApiError`: ``invalid_image``, or ``payload_too_large`` for media over
the request's pixel budget).

Nested-list JSON is bounded before it is parsed (:data:`DEFAULT_MAX_JSON_VALUES`: every element of a
nested list is a Python object, about 30 bytes of memory per byte of JSON), and msgpack while it is
parsed, so no body turns into a huge tree of Python objects.

Responses: :func:`wants_msgpack` reads ``Accept`` (and, when it does not decide, the request's own
format); msgpack responses are packed by the wire codec.
"""

from __future__ import annotations

import base64
import binascii
import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_clients.protocol import ErrorCode, FrameLimits
from robot_clients.wire_codec import WireFormatError, WireLimitError, unpackb

from ..foundation.api_errors import ApiError, HttpErrorCode
from ..foundation.camera_intake import (
    CameraSize,
    DecodedTooLarge,
    InvalidImage,
    check_clip_length,
    check_decoded_bytes,
    check_media,
    check_sides,
    decode_clip,
    decode_image,
)
from ..foundation.json_text import JsonTextError, loads_bounded
from ..sidecar_settings import DEFAULT_MAX_JSON_VALUES
from ..videos.encoding import VideoEncodingError, read_video_bytes

JSON_TYPE = "application/json"
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
MSGPACK_TYPE = MSGPACK_TYPES[0]
MULTIPART_TYPE = "multipart/form-data"

# Content types an image / a clip upload may declare (Pillow and ffmpeg then decode by content).
IMAGE_UPLOAD_TYPES = ("image/png", "image/jpeg", "image/webp")
VIDEO_UPLOAD_TYPES = ("video/mp4", "video/webm", "video/quicktime", "video/x-matroska")
# Fields a multipart body may carry as JSON text (arrays).
JSON_TEXT_FIELDS = ("action", "prefix_actions", "state")
# Multipart bounds beyond the body size limit: a form is a handful of settings and at most two files.
MAX_MULTIPART_FILES = 2
MAX_MULTIPART_FIELDS = 32
MAX_MULTIPART_TEXT_BYTES = 4 * 2**20  # an `action` array as JSON text


@dataclass
class Upload:
    """A multipart file part: its bytes and the content type the client declared (file name dropped)."""

    data: bytes
    content_type: str


def media_type(content_type: str | None) -> str:
    """``"application/json; charset=utf-8"`` -> ``"application/json"``."""
    return (content_type or "").split(";", 1)[0].strip().lower()


# -- bodies ----------------------------------------------------------------------------------------------


def count_json_marks(text: bytes | bytearray | str) -> int:
    """An upper bound on the elements of the JSON ``text`` (or of a piece of it), without parsing it.

    Every element of an array or object but the first is preceded by a comma, and every container
    opens with a bracket, so their count bounds the elements from above (commas inside strings only
    make it stricter). ``bytes.count`` runs at memory speed: 60 MiB in a few milliseconds.
    """
    if isinstance(text, str):
        return sum(text.count(mark) for mark in ("[", "{", ","))
    return sum(text.count(mark) for mark in (b"[", b"{", b","))


def too_many_json_values(limit: int, what: str, field: str | None = None, bound: int | None = None) -> ApiError:
    """The 413 for JSON with more than ``limit`` elements (``bound``: how many it may hold, when counted)."""
    holds = f"up to {bound}" if bound is not None else f"more than {limit}"
    return ApiError(
        HttpErrorCode.PAYLOAD_TOO_LARGE,
        f"{what} holds {holds} JSON elements; at most {limit} are accepted. Send pixels as encoded images "
        "(base64 PNG/JPEG/WebP), as a video upload, or as msgpack arrays",
        field,
    )


def check_json_values(text: bytes | bytearray | str, limit: int, what: str, field: str | None = None) -> None:
    """Refuse JSON that could hold more than ``limit`` elements, before parsing it."""
    bound = count_json_marks(text)
    if bound > limit:
        raise too_many_json_values(limit, what, field, bound)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while a body is parsed.

    Parsing builds up to ``max_values`` containers, none of which can form a cycle; meanwhile the
    collector would run full passes over every object of the process (the model's included), which
    made a refused 23 MiB msgpack body take 2.5 s instead of 0.6 s.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode_json_body(body: bytes | bytearray, max_values: int = DEFAULT_MAX_JSON_VALUES) -> dict[str, Any]:
    check_json_values(body, max_values, "the body")
    try:
        with _collector_paused():
            decoded = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(HttpErrorCode.BAD_BODY, f"the body is not valid JSON ({exc})") from None
    except RecursionError:  # `[[[[...]]]]` a thousand deep: Python's parser recurses per level
        raise ApiError(HttpErrorCode.BAD_BODY, "the JSON body is nested too deeply") from None
    return _as_fields(decoded, "JSON")


def decode_msgpack_body(body: bytes | bytearray, max_values: int = DEFAULT_MAX_JSON_VALUES) -> dict[str, Any]:
    try:
        with _collector_paused():
            decoded = unpackb(body, max_values=max_values)
    except WireLimitError as exc:
        raise ApiError(HttpErrorCode.PAYLOAD_TOO_LARGE, f"the body {exc.message[len('frame ') :]}") from None
    except WireFormatError as exc:
        raise ApiError(
            HttpErrorCode.BAD_BODY, f"the body is not a valid msgpack map: {exc.message}", exc.field
        ) from None
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


def decode_multipart_fields(
    items: list[tuple[str, Any]], file_fields: dict[str, tuple[str, ...]], max_values: int = DEFAULT_MAX_JSON_VALUES
) -> dict[str, Any]:
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
            check_json_values(value, max_values, f"`{name}`", name)
            try:
                fields[name] = loads_bounded(value, max_bytes=None)  # its depth checked first; the body bounds its size
            except JsonTextError as exc:
                if exc.too_large:
                    raise ApiError(HttpErrorCode.PAYLOAD_TOO_LARGE, f"`{name}`: {exc.message}", name) from None
                raise ApiError(
                    ErrorCode.INVALID_FIELD, f"`{name}` must be JSON text (nested lists of numbers)", name
                ) from None
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


def to_actions(value: Any, field: str) -> np.ndarray:
    """T×D numbers (nested lists or a float/int array) to float32, every value finite."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "fiu":
            raise ApiError(
                ErrorCode.INVALID_FIELD, f"`{field}` must be a numeric array, got dtype {value.dtype}", field
            )
        array = value.astype(np.float32)
    else:
        if not isinstance(value, list):
            raise ApiError(ErrorCode.INVALID_FIELD, f"`{field}` must be T×D nested lists of numbers", field)
        try:
            array = np.asarray(value, dtype=np.float64)
        except (ValueError, TypeError):
            raise ApiError(
                ErrorCode.INVALID_FIELD, f"`{field}` must be T×D nested lists of numbers (rows of equal length)", field
            ) from None
        array = array.astype(np.float32)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ApiError(ErrorCode.INVALID_FIELD, f"`{field}` must have shape T×D, got {list(array.shape)}", field)
    if not np.isfinite(array).all():
        raise ApiError(ErrorCode.INVALID_FIELD, f"`{field}` must hold finite numbers only", field)
    return np.ascontiguousarray(array)


# -- image and clip fields ---------------------------------------------------------------------------


@contextmanager
def _as_api_error() -> Iterator[None]:
    """The one media check's and the one decoder's refusals as this API's errors."""
    try:
        yield
    except (InvalidImage, DecodedTooLarge) as error:
        raise ApiError(error.code, error.message, error.field) from None


def _check_sides(height: int, width: int, field: str, limits: FrameLimits) -> None:
    with _as_api_error():
        check_sides(height, width, field, limits)


def _check_frames(frames: int, field: str, limits: FrameLimits) -> None:
    with _as_api_error():
        check_clip_length(frames, field, limits)


def _check_decoded_bytes(frames: int, height: int, width: int, field: str, limits: FrameLimits) -> None:
    """Refuse media that would decode to more than the request's pixel budget (413: too large, not wrong)."""
    with _as_api_error():
        check_decoded_bytes([CameraSize(field, frames, height, width, False)], field, limits)


def _b64(text: str, field: str) -> bytes:
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if ";base64" not in header:
            raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}` data URL must be base64-encoded", field)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}` is not valid base64", field) from None


def encoded_image(value: Any, field: str) -> bytes | None:
    """The encoded bytes of an image sent encoded (base64 text, bytes or an upload); None for pixel arrays."""
    if isinstance(value, Upload):
        return value.data
    if isinstance(value, str):
        return _b64(value, field)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return None


def decode_image_bytes(data: bytes, field: str, limits: FrameLimits) -> np.ndarray:
    """An encoded PNG/JPEG/WebP image to H×W×3 uint8 RGB, its size checked before it is decoded (with
    :mod:`policy_server.foundation.camera_intake`, the decoder the WebSocket sessions use)."""
    with _as_api_error():
        check_media([(field, data)], limits)
        return decode_image(data, field, limits)


def _decode_frames(blobs: list[bytes], field: str, limits: FrameLimits) -> np.ndarray:
    """Encoded frames to one T×H×W×3 clip: every header read and the whole size checked first."""
    with _as_api_error():
        check_media([(field, blobs)], limits)
        return decode_clip(blobs, field, limits)


def _pixel_array(value: Any, rank: int, field: str, limits: FrameLimits) -> np.ndarray:
    shape_text = "H×W×3" if rank == 3 else "T×H×W×3"
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8:
            raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}` must have dtype uint8, got {value.dtype}", field)
        array = value
    else:
        # Nested lists: their element count was bounded when the body was parsed (max JSON values).
        try:
            array = np.asarray(value)
        except (ValueError, TypeError):
            raise ApiError(
                ErrorCode.INVALID_IMAGE, f"`{field}` must be {shape_text} nested lists of integers", field
            ) from None
        if array.dtype.kind not in "iu" or (array.size and (array.min() < 0 or array.max() > 255)):
            raise ApiError(
                ErrorCode.INVALID_IMAGE, f"`{field}` must hold integers in [0, 255] ({shape_text} RGB)", field
            )
    if array.ndim != rank or array.shape[-1] != 3:
        raise ApiError(
            ErrorCode.INVALID_IMAGE, f"`{field}` must have shape {shape_text} (RGB), got {list(array.shape)}", field
        )
    frames = array.shape[0] if rank == 4 else 1
    if rank == 4:
        _check_frames(frames, field, limits)
    _check_sides(array.shape[-3], array.shape[-2], field, limits)
    _check_decoded_bytes(frames, array.shape[-3], array.shape[-2], field, limits)
    return np.ascontiguousarray(array, dtype=np.uint8)


def to_image(value: Any, field: str, limits: FrameLimits) -> np.ndarray:
    """Any accepted image form (base64, bytes, upload, nested lists, uint8 array) to H×W×3 uint8."""
    encoded = encoded_image(value, field)
    if encoded is not None:
        return decode_image_bytes(encoded, field, limits)
    if isinstance(value, (list, np.ndarray)):
        return _pixel_array(value, 3, field, limits)
    raise ApiError(
        ErrorCode.INVALID_IMAGE,
        f"`{field}` must be an image (base64 string, nested lists or an upload), got {type(value).__name__}",
        field,
    )


def _read_video_upload(data: bytes, field: str, limits: FrameLimits) -> np.ndarray:
    """A video upload to T×H×W×3: its frame count and sides read from the container (and from ffmpeg's
    stream header) and checked before ffmpeg decodes a frame; decoding stops at the limits."""

    def check(frames: int | None, height: int, width: int) -> None:
        if frames is not None and frames > limits.max_clip_frames:
            _check_frames(frames, field, limits)
        _check_sides(height, width, field, limits)
        _check_decoded_bytes(frames or 1, height, width, field, limits)

    try:
        return read_video_bytes(
            data,
            limits.max_clip_frames,
            max_bytes=limits.max_decoded_bytes,
            check=check,
            max_pixels=limits.max_image_side**2,
        )
    except VideoEncodingError as exc:
        raise ApiError(ErrorCode.INVALID_IMAGE, f"`{field}`: {exc}", field) from None


def to_video(value: Any, field: str, limits: FrameLimits) -> np.ndarray:
    """Any accepted clip form (upload, list of encoded frames, nested lists, uint8 array) to T×H×W×3 uint8."""
    if isinstance(value, Upload):
        clip = _read_video_upload(value.data, field, limits)
    elif isinstance(value, list) and value and isinstance(value[0], (str, bytes, bytearray)):
        _check_frames(len(value), field, limits)  # before decoding any base64
        blobs = []
        for frame in value:
            encoded = encoded_image(frame, field)
            if encoded is None:
                raise ApiError(ErrorCode.INVALID_IMAGE, f"every frame of `{field}` must be an encoded image", field)
            blobs.append(encoded)
        clip = _decode_frames(blobs, field, limits)
    elif isinstance(value, (list, np.ndarray)):
        clip = _pixel_array(value, 4, field, limits)
    else:
        raise ApiError(
            ErrorCode.INVALID_IMAGE,
            f"`{field}` must be a clip (a video upload, a list of base64 "
            f"frames or T×H×W×3 nested lists), got {type(value).__name__}",
            field,
        )
    _check_frames(clip.shape[0], field, limits)
    _check_sides(clip.shape[1], clip.shape[2], field, limits)
    return np.ascontiguousarray(clip)
