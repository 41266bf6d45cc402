"""SGLang's image and video value forms, turned into the forms our codecs decode.

SGLang takes an observation image as:

* ``{"b64_json": "..."}`` or ``{"base64": "..."}`` (a ``data:image/...;base64,`` URL is fine);
* ``{"values": [...], "dtype": "uint8", "shape": [H, W, 3]}`` (``"data"`` for ``"values"``);
* nested lists, or a numpy array in msgpack bodies;
* a list of any of these, an array of shape B×H×W×3, or a ``values`` payload of that shape: a batch;
* a plain string, which SGLang reads as a file path or URL on the server.

Our codecs (:mod:`policy_server.http.codecs`) decode base64 strings, encoded bytes, nested lists,
uint8 arrays and uploads, and check sizes against the model before any pixel is decoded. So this module
only unwraps SGLang's containers and splits batches; the pixels are checked where every other request's
are. Two things are refused here: strings that name a path or URL (the server never reads its own files
or fetches URLs for a client), and containers with keys we would otherwise ignore.

Grayscale (H×W) and RGBA (H×W×4) arrays, which SGLang passes to PIL, become RGB here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from robot_clients.protocol import ErrorCode

from ..http.errors import ApiError
from .parameters import integer

B64_KEYS = ("b64_json", "base64")
TENSOR_VALUE_KEYS = ("values", "data")
TENSOR_KEYS = (*TENSOR_VALUE_KEYS, "dtype", "shape")


def _refuse(path: str, message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_IMAGE, message, path)


def looks_like_path(value: str) -> bool:
    """True for a file path or URL; False for base64 (whose alphabet has no ``.``, ``:`` or ``\\``)."""
    return not value.startswith("data:") and any(mark in value for mark in (".", ":", "\\"))


def refuse_paths(value: str, path: str) -> str:
    """``value`` unchanged, unless it names a path or URL: those are refused."""
    if looks_like_path(value):
        raise _refuse(
            path,
            f"`{path}` looks like a file path or URL; this server never reads its own files or fetches "
            "URLs for a client: send the image itself (base64, pixels, or a multipart upload)",
        )
    return value


def _rgb(array: np.ndarray) -> np.ndarray:
    """H×W gray and H×W×1 / H×W×4 arrays as H×W×3, the only layout the model takes; others unchanged."""
    if array.dtype == np.uint8 and array.ndim == 2:
        return np.repeat(array[:, :, None], 3, axis=2)
    if array.dtype == np.uint8 and array.ndim == 3 and array.shape[-1] in (1, 4):
        return np.repeat(array, 3, axis=2) if array.shape[-1] == 1 else array[:, :, :3]
    return array


def tensor_payload(value: dict[str, Any], path: str) -> np.ndarray:
    """SGLang's ``{"values"|"data", "dtype", "shape"}`` as a uint8 array.

    ``values`` are nested lists of integers in [0, 255] (or, in msgpack, the raw bytes of the array);
    ``shape``, when given, must hold exactly that many values.
    """
    unknown = sorted(set(value) - set(TENSOR_KEYS))
    if unknown:
        raise _refuse(
            f"{path}.{unknown[0]}",
            f"`{path}` has unknown key `{unknown[0]}`; an array payload has `values` (or `data`), `dtype` and `shape`",
        )
    if all(k in value for k in TENSOR_VALUE_KEYS):
        raise _refuse(path, f"`{path}` has both `values` and `data`; send one")
    values = value.get("values", value.get("data"))
    dtype = value.get("dtype", "uint8")
    try:
        uint8 = np.dtype(dtype) == np.uint8
    except (TypeError, ValueError):
        uint8 = False
    if not uint8:
        raise _refuse(f"{path}.dtype", f"`{path}.dtype` must be uint8 (RGB pixels in [0, 255]), got {dtype!r}")
    shape = value.get("shape")
    if shape is not None:
        if not isinstance(shape, (list, tuple)) or not 1 <= len(shape) <= 5:
            raise _refuse(f"{path}.shape", f"`{path}.shape` must be a list of 1 to 5 sizes")
        shape = [integer(n, f"{path}.shape", low=1) for n in shape]
    if isinstance(values, (bytes, bytearray, memoryview)):
        array = np.frombuffer(values, dtype=np.uint8)
    else:
        try:
            array = np.asarray(values)
        except (ValueError, TypeError):
            raise _refuse(path, f"`{path}` values must be nested lists of equal lengths") from None
        if array.dtype.kind not in "iu" or (array.size and (array.min() < 0 or array.max() > 255)):
            raise _refuse(path, f"`{path}` values must be integers in [0, 255]")
        array = array.astype(np.uint8)
    if shape is not None:
        if math.prod(shape) != array.size:
            raise _refuse(
                f"{path}.shape", f"`{path}` holds {array.size} values but its shape {shape} needs {math.prod(shape)}"
            )
        array = array.reshape(shape)
    return array


def _container(value: dict[str, Any], path: str) -> Any:
    """An image given as one of SGLang's dicts: base64 text or an array payload."""
    b64 = [k for k in B64_KEYS if k in value]
    if b64:
        extra = sorted(set(value) - {b64[0]})
        if extra:
            raise _refuse(
                path, f"`{path}` has `{b64[0]}` and `{extra[0]}`; a base64 image has only `b64_json` (or `base64`)"
            )
        data = value[b64[0]]
        if not isinstance(data, str) or not data:
            raise _refuse(f"{path}.{b64[0]}", f"`{path}.{b64[0]}` must be a non-empty base64 string")
        return refuse_paths(data, f"{path}.{b64[0]}")
    if any(k in value for k in TENSOR_VALUE_KEYS):
        return tensor_payload(value, path)
    raise _refuse(
        path, f'`{path}` must be `{{"b64_json": ...}}` or `{{"values": ..., "dtype": "uint8", "shape": [H, W, 3]}}}}`'
    )


def _single(value: Any, path: str) -> Any:
    """One image in a form :func:`policy_server.http.codecs.to_image` decodes (it checks the pixels)."""
    if isinstance(value, str):
        return refuse_paths(value, path)
    if isinstance(value, dict):
        value = _container(value, path)
    if isinstance(value, np.ndarray):
        return _rgb(value)
    return value  # bytes, nested lists, an upload: the codec decides


def _nesting(value: Any) -> int:
    """How deep a nested list of numbers goes (H×W×3 -> 3), following the first elements."""
    depth = 0
    while isinstance(value, (list, tuple)) and value:
        depth, value = depth + 1, value[0]
    numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    return depth if numeric else 0


def image_batch(value: Any, path: str, *, max_items: int) -> list[tuple[Any, str]]:
    """The images one SGLang image field holds, each with the path to name in errors.

    A single image gives one; a list, a B×H×W×3 array or a ``values`` payload of that shape gives a
    batch. An H×W×3 nested list of numbers is one image (SGLang would read its rows as a batch); so is
    an H×W one, which the codec then refuses as not RGB.
    """
    if isinstance(value, dict):
        value = _container(value, path)
    if isinstance(value, np.ndarray) and value.ndim == 4:
        items: list[Any] = list(value)
    elif isinstance(value, (list, tuple)) and _nesting(value) not in (2, 3):
        items = list(value)
        if not items:
            raise _refuse(path, f"`{path}` is an empty list; send at least one image")
    else:
        return [(_single(value, path), path)]
    if len(items) > max_items:
        raise ApiError(
            ErrorCode.INVALID_FIELD,
            f"`{path}` holds {len(items)} images; this server takes at most {max_items} per request",
            path,
        )
    return [(_single(item, f"{path}[{i}]"), f"{path}[{i}]") for i, item in enumerate(items)]


def video_clip(value: Any, path: str) -> Any:
    """One clip in a form :func:`policy_server.http.codecs.to_video` decodes: frames, not a file."""
    if isinstance(value, str):
        refuse_paths(value, path)  # a path or URL is refused; anything else is not a clip either
        raise _refuse(
            path,
            f"`{path}` must be the clip's frames: a list of base64 images, T×H×W×3 pixels, or a "
            "video file as a multipart upload",
        )
    if isinstance(value, dict):
        if any(k in value for k in B64_KEYS):
            raise _refuse(
                path,
                f"`{path}`: an encoded video file is accepted as a multipart upload; in JSON or "
                "msgpack send its frames (a list of base64 images or T×H×W×3 pixels)",
            )
        value = _container(value, path)
    if isinstance(value, np.ndarray) and value.ndim != 4:
        raise _refuse(path, f"`{path}` must be one T×H×W×3 clip, got shape {list(value.shape)}")
    if isinstance(value, (list, tuple)):
        return [_single(frame, f"{path}[{i}]") for i, frame in enumerate(value)]
    return value
