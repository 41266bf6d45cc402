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

**The element budget** (:func:`count_elements`, ``unpackb(..., max_values=, max_depth=)``). A few bytes of
msgpack declare a container of millions of entries, and one empty map costs a byte on the wire but some
60 bytes once built: a 45 MiB frame of empty maps made a server take 3.3 GiB. Before anything is built,
the frame's structure is walked from its type bytes alone (lengths read, nothing allocated): every value
counts one (a map's keys included), a container counts its declared entries the moment its header is
read, and nesting counts its depth. Past either bound the frame is refused (:class:`WireLimitError`)
without having built anything; the walk itself stops there, so it costs at most ``max_values`` steps.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

__all__ = [
    "WireFormatError",
    "WireLimitError",
    "packb",
    "unpackb",
    "count_elements",
    "ALLOWED_DTYPE_KINDS",
    "FRAME_MAX_VALUES",
    "FRAME_MAX_DEPTH",
]

# numpy dtype kinds a frame may carry: bool, signed and unsigned integers, floats.
ALLOWED_DTYPE_KINDS = frozenset("biuf")

# The element budget of one WebSocket frame (see the module docstring). The largest observation a robot
# sends holds a few thousand elements: 8 cameras x a 64-frame clip as array maps (9 elements each) is 4,608,
# a 64-step state history of 64 floats sent as lists 4,160, a 64 x 64 prefix of actions 4,160. Frames
# that carry pixels as nested lists rather than arrays are what this refuses.
FRAME_MAX_VALUES = 100_000
# No protocol nests deeper than about 5 (a frame, its images map, a camera's array map, its shape).
FRAME_MAX_DEPTH = 32

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


# What each msgpack type byte is, for :func:`count_elements`: (kind, argument).
_SCALAR, _FIXMAP, _FIXARRAY, _SIZED, _MAP, _ARRAY, _REFUSED = range(7)


def _type_table() -> tuple[tuple[int, int], ...]:
    """For a scalar: its whole size in bytes; for a str/bin: the width of its length; for a fixmap or a
    fixarray: its entries; for map16/32 and array16/32: the width of the count."""
    table: list[tuple[int, int]] = [(_REFUSED, 0)] * 256
    for b in range(0x00, 0x80):
        table[b] = (_SCALAR, 1)  # positive fixint
    for b in range(0xE0, 0x100):
        table[b] = (_SCALAR, 1)  # negative fixint
    for b in range(0x80, 0x90):
        table[b] = (_FIXMAP, b & 0x0F)
    for b in range(0x90, 0xA0):
        table[b] = (_FIXARRAY, b & 0x0F)
    for b in range(0xA0, 0xC0):
        table[b] = (_SCALAR, 1 + (b & 0x1F))  # fixstr
    fixed = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9}
    fixed.update({0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9})
    for b, size in fixed.items():
        table[b] = (_SCALAR, size)
    for b, width in {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}.items():
        table[b] = (_SIZED, width)  # bin8/16/32, str8/16/32
    table[0xDC], table[0xDD] = (_ARRAY, 2), (_ARRAY, 4)
    table[0xDE], table[0xDF] = (_MAP, 2), (_MAP, 4)
    return tuple(table)  # 0xC1 (never used) and the ext types 0xC7-0xC9, 0xD4-0xD8 stay refused


_TYPES = _type_table()
# Each type byte's whole size when it is a scalar, else 0: the common case of the count in one lookup.
_SCALAR_SIZES = bytes(arg if kind == _SCALAR else 0 for kind, arg in _TYPES)


def count_elements(
    data: bytes | bytearray | memoryview, max_values: int = FRAME_MAX_VALUES, max_depth: int = FRAME_MAX_DEPTH
) -> int:
    """The elements of the one msgpack object ``data`` holds (every value, a map's keys included), read from
    its type bytes without building anything; see the module docstring.

    Raises :class:`WireLimitError` past ``max_values`` elements or ``max_depth`` nested containers (as soon
    as a container's header declares too many), and :class:`WireFormatError` for a frame that is truncated,
    has trailing bytes, or holds a type byte the protocol refuses (extension types, 0xC1). Costs one step
    per element read, so at most ``max_values`` steps.
    """
    view = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")
    end = len(view)
    types, sizes = _TYPES, _SCALAR_SIZES
    pos = 0
    total = 1  # elements declared so far: the top-level object, then every container's entries
    pending = [1]  # the entries still to read of each open container, the innermost last
    while pending:
        left = pending.pop()
        while left:  # the entries of one container, until it ends or a nested one begins
            left -= 1
            if pos >= end:
                raise WireFormatError("frame is not valid msgpack (truncated)")
            byte = view[pos]
            size = sizes[byte]
            if size:  # a scalar (most entries): one lookup
                pos += size
                continue
            kind, arg = types[byte]
            if kind == _SIZED:
                pos += 1 + arg + int.from_bytes(view[pos + 1 : pos + 1 + arg], "big")
                continue
            if kind == _REFUSED:
                raise WireFormatError(f"msgpack type byte 0x{byte:02x} is not part of the protocol (extension types)")
            if kind == _FIXMAP or kind == _FIXARRAY:
                entries = arg
                pos += 1
            else:
                entries = int.from_bytes(view[pos + 1 : pos + 1 + arg], "big")
                pos += 1 + arg
            if kind == _FIXMAP or kind == _MAP:
                entries *= 2
            total += entries
            if total > max_values:
                raise WireLimitError(f"frame holds more than {max_values} elements (values, map keys and entries)")
            if entries > end - pos:  # every entry takes a byte at least: a header claiming more lies
                raise WireFormatError(f"frame is not valid msgpack (a container declares {entries} entries)")
            pending.append(left)  # the outer container's rest, read once this one ends
            if len(pending) > max_depth:
                raise WireLimitError(f"frame nests containers more than {max_depth} deep")
            left = entries
    if pos > end:
        raise WireFormatError("frame is not valid msgpack (truncated)")
    if pos < end:
        raise WireFormatError("frame has trailing bytes after one msgpack object")
    return total


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


def unpackb(
    data: bytes | bytearray | memoryview, max_values: int | None = None, max_depth: int = FRAME_MAX_DEPTH
) -> Any:
    """Decode one msgpack frame, turning openpi array maps back into numpy arrays.

    Raises :class:`WireFormatError` for anything that is not a well-formed frame: bytes that are not
    msgpack, trailing data, a disallowed dtype, or an array whose shape does not match its data. With
    ``max_values``, the frame is first counted (:func:`count_elements`, nothing built): more than
    ``max_values`` elements or containers nested more than ``max_depth`` deep are a
    :class:`WireLimitError`.
    """
    limits: dict[str, int] = {}
    if max_values is not None:
        count_elements(data, max_values, max_depth)
        limits = {"max_array_len": max_values, "max_map_len": max_values}
    try:
        return msgpack.unpackb(
            data, ext_hook=_refuse_ext, object_hook=_object_hook, raw=False, strict_map_key=True, **limits
        )
    except WireFormatError:
        raise
    except msgpack.ExtraData:
        raise WireFormatError("frame has trailing bytes after one msgpack object") from None
    except Exception as exc:  # msgpack raises a zoo of types (ValueError, FormatError, StackError, ...)
        raise WireFormatError(f"frame is not valid msgpack ({type(exc).__name__}: {exc})") from None
