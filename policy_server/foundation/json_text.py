"""JSON text from a client, bounded before it is parsed: its size, its nesting depth, its elements.

Python's parser recurses once per nested container: ``[[[[...]]]]`` twelve thousand deep (24 kB) raised
``RecursionError``, which no ``except ValueError`` catches, and closed the observer channel with 1011 and a
traceback. Every door that parses a client's JSON text field by field (the observer channel's frames, the
sidecar's multipart JSON fields, SGLang's form fields and ``extra_params``) goes through
:func:`loads_bounded`: the text's bytes, then its depth (brackets counted outside
strings, vectorised), then an upper bound on its elements (one per comma or bracket) are checked, and only
then is it parsed. Each refusal is a :class:`JsonTextError` saying which bound, never a traceback.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

# A client's control frames and form fields nest a few levels; no legitimate one comes near this.
MAX_JSON_DEPTH = 32

# A JSON string: what lies between its quotes is never structure (escaped quotes included). An unterminated
# one runs to the end: the pattern never fails once started, so the scan stays linear in the text.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.?)*+(?:"|\Z)', re.DOTALL)


class JsonTextError(ValueError):
    """The text is refused; ``too_large`` when a bound (size, depth, elements) and not its syntax refused it."""

    def __init__(self, message: str, too_large: bool) -> None:
        super().__init__(message)
        self.message = message
        self.too_large = too_large


def json_depth(text: bytes) -> int:
    """The deepest nesting of brackets in ``text``, strings left out (an unterminated string runs to the end,
    as the parser reads it: it fails there, before recursing into anything the string holds)."""
    structure = np.frombuffer(_STRING.sub(b"", text), dtype=np.uint8)
    steps = np.zeros(structure.shape, dtype=np.int32)
    steps[(structure == ord("[")) | (structure == ord("{"))] = 1
    steps[(structure == ord("]")) | (structure == ord("}"))] = -1
    return int(np.cumsum(steps).max(initial=0))


def loads_bounded(
    text: str | bytes, max_bytes: int | None, max_depth: int = MAX_JSON_DEPTH, max_values: int | None = None
) -> Any:
    """``text`` parsed, once it is known to hold at most ``max_bytes`` bytes (None: bounded by the caller
    already), nest at most ``max_depth`` containers deep and (``max_values``) hold at most that many
    elements; else :class:`JsonTextError`."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if max_bytes is not None and len(data) > max_bytes:
        raise JsonTextError(f"the JSON text is {len(data)} bytes; at most {max_bytes} are accepted", True)
    depth = json_depth(data)
    if depth > max_depth:
        raise JsonTextError(f"the JSON text nests {depth} deep; at most {max_depth} levels are accepted", True)
    if max_values is not None:
        bound = sum(data.count(mark) for mark in (b"[", b"{", b","))
        if bound > max_values:
            raise JsonTextError(f"the JSON text holds up to {bound} elements; at most {max_values} are accepted", True)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError cannot happen past the depth check; kept as a net
        raise JsonTextError(f"not valid JSON ({type(exc).__name__})", False) from None
