"""How any field of a decoded client frame is read: its Python type checked, its map's keys made strings.

The checks every frame type shares, beneath :mod:`robot_clients.client_frames` (which parses whole
frames) and :mod:`robot_clients.session_settings` (the settings a frame may carry). Each raises
:class:`~robot_clients.protocol.ProtocolError` naming the offending field. It imports numpy and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .protocol import ErrorCode, ProtocolError

__all__ = ["check_field_type", "str_keys"]


def _type_name(types: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def check_field_type(frame: Mapping[str, Any], name: str, types: tuple[type, ...], seq: int | None = None) -> Any:
    """``frame[name]`` if it is one of ``types`` (a finite one, for a number), else ``invalid_field``."""
    value = frame[name]
    # bool is an int subclass in Python; a `true` is never a valid count, seed or tier.
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if isinstance(value, (np.integer, np.floating)) and (int in types or float in types):
        value = value.item()  # numpy scalars from openpi-style senders are accepted as numbers
        ok = isinstance(value, types)
    if not ok:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{name}` must be {_type_name(types)}, got {type(value).__name__}",
            name,
            seq,
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"`{name}` must be finite, got {value}", name, seq)
    return value


def str_keys(frame: dict[Any, Any], where: str | None, seq: int | None = None) -> dict[str, Any]:
    """The map with ``bytes`` keys decoded: the wire codec lets a sender write keys either way."""
    if all(isinstance(key, str) for key in frame):
        return frame
    decoded: dict[str, Any] = {}
    for key, value in frame.items():
        name = key.decode("utf-8", errors="backslashreplace") if isinstance(key, bytes) else str(key)
        if name in decoded:
            inside = f" in `{where}`" if where else ""
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`{name}` is sent twice{inside} (once as bytes)",
                f"{where}/{name}" if where else name,
                seq,
            )
        decoded[name] = value
    return decoded
