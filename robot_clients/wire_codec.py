"""The wire codec: msgpack frames carrying numpy arrays, shared by the robot and the server.

Both ends of every protocol in this project encode frames with :func:`packb` and decode them with
:func:`unpackb`. The module lives in the light client package and imports only numpy and msgpack, so a
robot can install it without torch or the server's dependencies; the server imports it from here.

Arrays travel in openpi's form, so openpi clients and servers interoperate::

    {"__ndarray__": True, "data": <bytes>, "dtype": "<f4", "shape": [224, 224, 3]}

and numpy scalars as ``{"__npgeneric__": True, "data": <python value>, "dtype": "<f4"}``. Keys may
arrive as ``str`` or ``bytes`` (older msgpack packers write raw strings).

What is refused, and why:

* pickle, in any form, and msgpack extension types: a frame is data, never code.
* object, void (structured), complex, string and datetime dtypes: none is a robot observation or an
  action, and object/void are how pickled payloads and memory tricks get in.
* a ``shape`` whose element count does not match the length of ``data``: numpy would otherwise read
  past the buffer or silently truncate.

Decoded arrays are read-only views on the received bytes (no copy, as in openpi). Copy one before
writing to it.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

__all__ = ["WireFormatError", "WireLimitError", "packb", "unpackb", "ALLOWED_DTYPE_KINDS"]

# numpy dtype kinds a frame may carry: bool, signed and unsigned integers, floats.
ALLOWED_DTYPE_KINDS = frozenset("biuf")

_NDARRAY = "__ndarray__"
_NPGENERIC = "__npgeneric__"


class WireFormatError(ValueError):
    """A frame could not be encoded or decoded. ``field`` names the offending key when known."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class WireLimitError(WireFormatError):
    """A frame is well-formed so far but holds more elements than the caller accepts (``max_values``)."""


class _ElementBudget:
    """Counts the elements of the lists and maps msgpack builds, and stops the parse past ``limit``.

    msgpack calls the hooks as each container is finished, so at most ``limit`` elements (plus the one
    list being filled, itself at most ``limit`` long) exist before the parse is abandoned.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen = 0

    def _count(self, size: int) -> None:
        self.seen += size + 1
        if self.seen > self.limit:
            raise WireLimitError(f"frame holds more than {self.limit} elements (lists, maps and their items)")

    def list_hook(self, items: list[Any]) -> list[Any]:
        self._count(len(items))
        return items

    def object_hook(self, obj: dict[Any, Any]) -> Any:
        self._count(len(obj))
        return _object_hook(obj)


def _checked_dtype(spec: Any, field: str) -> np.dtype:
    if isinstance(spec, bytes):
        spec = spec.decode("ascii", errors="replace")
    if not isinstance(spec, str):
        raise WireFormatError(f"array dtype must be a string such as '<f4', got {type(spec).__name__}", field)
    try:
        dtype = np.dtype(spec)
    except (TypeError, ValueError) as exc:
        raise WireFormatError(f"array dtype {spec!r} is not a numpy dtype ({exc})", field) from None
    if dtype.kind not in ALLOWED_DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise WireFormatError(
            f"array dtype {spec!r} is not allowed: only bool, integer and float arrays travel on the wire",
            field,
        )
    return dtype


def _check_encodable(obj: np.ndarray | np.generic) -> None:
    if obj.dtype.kind not in ALLOWED_DTYPE_KINDS or obj.dtype.fields is not None:
        raise WireFormatError(
            f"cannot send a numpy value of dtype {obj.dtype}: only bool, integer and float travel on the wire"
        )


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        _check_encodable(obj)
        return {
            _NDARRAY: True,
            "data": np.ascontiguousarray(obj).tobytes(),
            "dtype": obj.dtype.str,
            "shape": list(obj.shape),
        }
    if isinstance(obj, np.generic):
        _check_encodable(obj)
        return {_NPGENERIC: True, "data": obj.item(), "dtype": obj.dtype.str}
    raise TypeError(f"cannot encode an object of type {type(obj).__name__} in a frame")


def _get(obj: dict[Any, Any], key: str) -> Any:
    """Read a key that the sender may have written as ``str`` or as ``bytes``."""
    if key in obj:
        return obj[key]
    return obj.get(key.encode("ascii"))


def _decode_ndarray(obj: dict[Any, Any]) -> np.ndarray:
    dtype = _checked_dtype(_get(obj, "dtype"), "dtype")
    shape = _get(obj, "shape")
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise WireFormatError(f"array shape must be a list of non-negative integers, got {shape!r}", "shape")
    data = _get(obj, "data")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireFormatError(f"array data must be bytes, got {type(data).__name__}", "data")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise WireFormatError(
            f"array data is {len(data)} bytes but shape {list(shape)} of dtype {dtype.str} needs {expected}",
            "shape",
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _decode_npgeneric(obj: dict[Any, Any]) -> np.generic:
    dtype = _checked_dtype(_get(obj, "dtype"), "dtype")
    data = _get(obj, "data")
    if not isinstance(data, (bool, int, float)):
        raise WireFormatError(f"numpy scalar data must be a number, got {type(data).__name__}", "data")
    try:
        scalar: np.generic = dtype.type(data)
        return scalar
    except (OverflowError, ValueError) as exc:
        raise WireFormatError(f"numpy scalar {data!r} does not fit dtype {dtype.str} ({exc})", "data") from None


def _object_hook(obj: dict[Any, Any]) -> Any:
    if _get(obj, _NDARRAY) is True:
        return _decode_ndarray(obj)
    if _get(obj, _NPGENERIC) is True:
        return _decode_npgeneric(obj)
    return obj


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireFormatError(f"msgpack extension type {code} is not part of the protocol")


def packb(obj: Any) -> bytes:
    """Encode ``obj`` (maps, lists, str, bytes, numbers, numpy arrays and scalars) as one msgpack frame."""
    try:
        frame: bytes = msgpack.packb(obj, default=_pack_default, use_bin_type=True)
        return frame
    except WireFormatError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireFormatError(f"cannot encode frame: {exc}") from None


def unpackb(data: bytes | bytearray | memoryview, max_values: int | None = None) -> Any:
    """Decode one msgpack frame, turning openpi array maps back into numpy arrays.

    Raises :class:`WireFormatError` for anything that is not a well-formed frame: bytes that are not
    msgpack, trailing data, a disallowed dtype, or an array whose shape does not match its data.
    ``max_values`` bounds the lists, maps and their elements the frame may hold (each one a Python object
    once decoded; an array's bytes count as one): beyond it, :class:`WireLimitError`.
    """
    hooks: dict[str, Any] = {"object_hook": _object_hook}
    if max_values is not None:
        budget = _ElementBudget(max_values)
        hooks = {
            "object_hook": budget.object_hook,
            "list_hook": budget.list_hook,
            "max_array_len": max_values,
            "max_map_len": max_values,
        }
    try:
        return msgpack.unpackb(data, ext_hook=_refuse_ext, raw=False, strict_map_key=True, **hooks)
    except WireFormatError:
        raise
    except msgpack.ExtraData:
        raise WireFormatError("frame has trailing bytes after one msgpack object") from None
    except ValueError as exc:
        if max_values is not None and "exceeds max_" in str(exc):  # one list or map longer than the budget
            raise WireLimitError(f"frame holds more than {max_values} elements (lists, maps and their items)") from None
        raise WireFormatError(f"frame is not valid msgpack ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # msgpack raises a zoo of types (ValueError, FormatError, StackError, ...)
        raise WireFormatError(f"frame is not valid msgpack ({type(exc).__name__}: {exc})") from None
