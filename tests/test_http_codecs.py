"""The HTTP sidecar's pure codec mappings, in process (no server): bodies to fields, fields to arrays.

:mod:`policy_server.http.codecs` decodes JSON, msgpack and multipart bodies into plain fields, action
arrays, and image and clip fields with their sizes checked before any pixel is decoded. Each refusal is a
typed :class:`ApiError` naming its code and field.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

from policy_server.foundation.api_errors import ApiError, HttpErrorCode
from policy_server.http import codecs
from policy_server.http.codecs import Upload, decode_image_bytes, encoded_image, to_image, to_video
from robot_clients.protocol import ErrorCode, FrameLimits
from robot_clients.wire_codec import packb

LIMITS = FrameLimits(min_image_side=8, max_image_side=64, max_clip_frames=4, max_decoded_bytes=64 * 64 * 3 * 4)


def png(height: int, width: int, value: int = 7) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), value, dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def refused(call, *args) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)
    return caught.value


# -- media types and response format ---------------------------------------------------------------------


def test_media_type_drops_parameters_and_case():
    assert codecs.media_type("Application/JSON; charset=utf-8") == codecs.JSON_TYPE
    assert codecs.media_type(None) == ""


@pytest.mark.parametrize(
    "accept, request_type, expected",
    [
        ("application/msgpack", codecs.JSON_TYPE, True),
        ("application/json, application/msgpack", codecs.MSGPACK_TYPE, False),  # the first one named wins
        ("application/x-msgpack;q=0.9", codecs.JSON_TYPE, True),
        (None, codecs.MSGPACK_TYPE, True),  # Accept says nothing: answer in the request's own format
        ("*/*", codecs.JSON_TYPE, False),
    ],
)
def test_wants_msgpack_reads_accept_then_the_request_format(accept, request_type, expected):
    assert codecs.wants_msgpack(accept, request_type) is expected


# -- bodies ------------------------------------------------------------------------------------------------


def test_a_json_body_becomes_its_fields():
    assert codecs.decode_json_body(b'{"domain_name": "d", "seed": 3}') == {"domain_name": "d", "seed": 3}


@pytest.mark.parametrize(
    "body, code",
    [
        (b"{not json", HttpErrorCode.BAD_BODY),
        (b"[1, 2]", HttpErrorCode.BAD_BODY),  # not an object
        (b"[" * 5000 + b"]" * 5000, HttpErrorCode.BAD_BODY),  # nested too deeply for Python's parser
    ],
)
def test_bad_json_bodies_are_refused_as_bad_body(body, code):
    assert refused(codecs.decode_json_body, body).code == code


def test_json_with_more_elements_than_allowed_is_refused_before_parsing():
    body = json.dumps({"action": [[0.0] * 10] * 10}).encode()
    error = refused(codecs.decode_json_body, body, 50)
    assert error.code == HttpErrorCode.PAYLOAD_TOO_LARGE and error.status == 413


def test_count_json_marks_bounds_the_elements_from_above():
    text = json.dumps({"a": [1, 2, 3], "b": {"c": [4]}})
    assert codecs.count_json_marks(text) == codecs.count_json_marks(text.encode()) >= 7


def test_a_msgpack_body_keeps_arrays_as_numpy():
    fields = codecs.decode_msgpack_body(packb({"action": np.ones((2, 3), dtype=np.float32), "seed": 1}))
    assert fields["seed"] == 1 and fields["action"].shape == (2, 3) and fields["action"].dtype == np.float32


@pytest.mark.parametrize(
    "body, code",
    [
        (b"\xc1", HttpErrorCode.BAD_BODY),  # never a valid msgpack byte
        (packb([1, 2]), HttpErrorCode.BAD_BODY),  # a list, not a map
    ],
)
def test_bad_msgpack_bodies_are_refused(body, code):
    assert refused(codecs.decode_msgpack_body, body).code == code


def test_msgpack_with_more_elements_than_allowed_is_payload_too_large():
    assert (
        refused(codecs.decode_msgpack_body, packb({"a": list(range(100))}), 10).code == HttpErrorCode.PAYLOAD_TOO_LARGE
    )


def test_multipart_fields_parse_json_text_and_check_upload_types():
    upload = Upload(b"png bytes", "image/png; charset=binary")
    fields = codecs.decode_multipart_fields(
        [("domain_name", "d"), ("action", "[[1, 2]]"), ("image", upload)], {"image": codecs.IMAGE_UPLOAD_TYPES}
    )
    assert fields == {"domain_name": "d", "action": [[1, 2]], "image": upload}


@pytest.mark.parametrize(
    "items, code, field",
    [
        ([("seed", "1"), ("seed", "2")], ErrorCode.INVALID_FIELD, "seed"),
        ([("prompt", Upload(b"x", "image/png"))], ErrorCode.INVALID_FIELD, "prompt"),  # no uploads there
        ([("image", Upload(b"x", "text/plain"))], HttpErrorCode.UNSUPPORTED_MEDIA_TYPE, "image"),
        ([("action", "not json")], ErrorCode.INVALID_FIELD, "action"),
        ([("state", "[" * 12_000 + "]" * 12_000)], HttpErrorCode.PAYLOAD_TOO_LARGE, "state"),  # RecursionError once
    ],
)
def test_multipart_refusals_name_their_field(items, code, field):
    error = refused(codecs.decode_multipart_fields, items, {"image": codecs.IMAGE_UPLOAD_TYPES})
    assert (error.code, error.field) == (code, field)


# -- action arrays -----------------------------------------------------------------------------------------


def test_actions_become_contiguous_float32():
    out = codecs.to_actions([[1, 2], [3, 4]], "action")
    assert out.dtype == np.float32 and out.shape == (2, 2) and out.flags.c_contiguous
    assert codecs.to_actions(np.arange(6, dtype=np.int64).reshape(3, 2), "action").dtype == np.float32


@pytest.mark.parametrize("value", [[1, 2], [[1, 2], [3]], [[float("nan"), 1.0]], "text", np.array([["a"]]), [[]]])
def test_actions_that_are_not_finite_t_by_d_numbers_are_refused(value):
    error = refused(codecs.to_actions, value, "prefix_actions")
    assert (error.code, error.field) == (ErrorCode.INVALID_FIELD, "prefix_actions")


# -- images and clips --------------------------------------------------------------------------------------


def test_every_image_form_decodes_to_the_same_pixels():
    data = png(16, 12)
    forms = [
        base64.b64encode(data).decode(),
        "data:image/png;base64," + base64.b64encode(data).decode(),
        data,
        Upload(data, "image/png"),
        np.full((16, 12, 3), 7, dtype=np.uint8),
        [[[7, 7, 7]] * 12] * 16,
    ]
    for form in forms:
        image = to_image(form, "image", LIMITS)
        assert image.shape == (16, 12, 3) and image.dtype == np.uint8 and int(image[0, 0, 0]) == 7


def test_encoded_image_is_none_for_pixel_arrays():
    assert encoded_image(np.zeros((8, 8, 3), np.uint8), "image") is None
    assert encoded_image(b"abc", "image") == b"abc"


@pytest.mark.parametrize(
    "value, code",
    [
        ("not base64!", ErrorCode.INVALID_IMAGE),
        ("data:image/png,plain", ErrorCode.INVALID_IMAGE),  # a data URL that is not base64
        (base64.b64encode(b"not an image").decode(), ErrorCode.INVALID_IMAGE),
        (np.zeros((16, 16, 3), dtype=np.float32), ErrorCode.INVALID_IMAGE),  # not uint8
        ([[[300, 0, 0]] * 8] * 8, ErrorCode.INVALID_IMAGE),  # out of [0, 255]
        (np.zeros((16, 16), dtype=np.uint8), ErrorCode.INVALID_IMAGE),  # not H×W×3
        (np.zeros((4, 16, 3), dtype=np.uint8), ErrorCode.INVALID_IMAGE),  # a side under min_image_side
        (42, ErrorCode.INVALID_IMAGE),
    ],
)
def test_bad_images_are_refused_as_invalid_image(value, code):
    error = refused(to_image, value, "image", LIMITS)
    assert (error.code, error.field) == (code, "image")


def test_an_image_over_the_side_limit_is_refused_from_its_header():
    error = refused(decode_image_bytes, png(8, 80), "image", LIMITS)
    assert error.code == ErrorCode.INVALID_IMAGE and "80" in error.message


def test_pixels_over_the_decoding_budget_are_payload_too_large():
    small_budget = FrameLimits(min_image_side=8, max_image_side=64, max_clip_frames=4, max_decoded_bytes=1000)
    error = refused(decode_image_bytes, png(32, 32), "image", small_budget)
    assert (error.code, error.status) == (HttpErrorCode.PAYLOAD_TOO_LARGE, 413)


def test_a_clip_of_encoded_frames_decodes_frame_by_frame():
    clip = to_video([png(16, 16, value) for value in (1, 2, 3)], "video", LIMITS)
    assert clip.shape == (3, 16, 16, 3) and [int(clip[i, 0, 0, 0]) for i in range(3)] == [1, 2, 3]


@pytest.mark.parametrize(
    "value",
    [
        [png(16, 16)] * 5,  # more frames than max_clip_frames
        [png(16, 16), png(16, 8)],  # frames of different sizes
        [png(16, 16), [[0]]],  # a frame that is not encoded
        np.zeros((2, 16, 16), dtype=np.uint8),  # not T×H×W×3
        "a path",  # a string is not a clip
    ],
)
def test_bad_clips_are_refused_as_invalid_image(value):
    error = refused(to_video, value, "video", LIMITS)
    assert (error.code, error.field) == (ErrorCode.INVALID_IMAGE, "video")
