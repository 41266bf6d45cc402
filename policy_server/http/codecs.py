"""Request bodies in, plain fields out: JSON, msgpack and multipart; action arrays as float32.

One HTTP request can arrive three ways, all decoded here into one plain ``dict`` of fields:

* ``application/json``: images as base64 strings or nested lists, actions as nested lists;
* ``application/msgpack`` (also ``application/x-msgpack``, ``application/vnd.msgpack``): a map decoded by
  the shared wire codec (:mod:`robot_clients.wire_codec`), so arrays are numpy arrays in openpi's form and
  nothing is ever unpickled;
* ``multipart/form-data``: scalar fields as text (``action`` / ``prefix_actions`` / ``state`` as JSON text), images
  and videos as file uploads. An upload's declared content type must be one this field accepts; its
  file name is ignored (never used as a path: a video upload goes to a temporary file with a name of
  our own).

The image and clip fields are then decoded by :mod:`.media_fields` (H×W×3 and T×H×W×3 uint8, their sizes
checked before any pixel is decoded); action fields here by :func:`to_actions` (T×D float32), with
precise errors (:class:`~policy_server.http.errors.ApiError` naming the field).

Nested-list JSON is bounded before it is parsed (:data:`DEFAULT_MAX_JSON_VALUES`: every element of a
nested list is a Python object, about 30 bytes of memory per byte of JSON), and msgpack while it is
parsed, so no body turns into a huge tree of Python objects.

Responses: :func:`wants_msgpack` reads ``Accept`` (and, when it does not decide, the request's own
format); msgpack responses are packed by the wire codec.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_clients.protocol import ErrorCode
from robot_clients.wire_codec import WireFormatError, WireLimitError, unpackb

from .errors import ApiError, HttpErrorCode

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
# Elements (numbers, lists, maps) a JSON or msgpack body may hold. Parsed, each is a Python object or a
# pointer to one (a pixel as `[r, g, b]` costs about 90 bytes): 2 million stay under 200 MiB at their
# worst; that is a 700×700 image as nested lists. Larger pixel arrays travel as encoded images or as
# msgpack arrays, which cost one byte per value.
DEFAULT_MAX_JSON_VALUES = 2_000_000


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
                fields[name] = json.loads(value)
            except ValueError:
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
