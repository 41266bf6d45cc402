"""Image and clip fields of an HTTP request, decoded to uint8 pixels with their sizes checked first.

Images become H×W×3 uint8 RGB, clips T×H×W×3 uint8, whatever form they came in: base64 text (or a
``data:`` URL), encoded bytes, a multipart upload (:class:`~.codecs.Upload`), nested lists, or a uint8
array. Errors name the field (:class:`~policy_server.http.errors.ApiError`, ``invalid_image``, or
``payload_too_large`` for media over the request's pixel budget).

Sizes are checked before anything big is built, because a few kilobytes can claim gigabytes: encoded
images and clips pass the one media check every protocol uses (:mod:`policy_server.media.media_check`:
headers, frame count, decoded bytes), a video upload's frame count and sides come from its container or
from ffmpeg's stream header, and the pixels they would decode to are checked against
:attr:`FrameLimits.max_decoded_bytes` before the first pixel is decoded.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from robot_clients.protocol import ErrorCode, FrameLimits

from ..media.image_decoding import InvalidImage, decode_clip, decode_image
from ..media.media_check import (
    CameraSize,
    DecodedTooLarge,
    check_clip_length,
    check_decoded_bytes,
    check_media,
    check_sides,
)
from ..videos.encoding import VideoEncodingError, read_video_bytes
from .codecs import Upload
from .errors import ApiError


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
    :mod:`policy_server.media.image_decoding`, the decoder the WebSocket sessions use)."""
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
