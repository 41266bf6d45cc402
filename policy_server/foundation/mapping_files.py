"""Operator mapping files: which keys of a client's observation feed the model (openpi's camera mapping,
``--openpi-cameras``; vla-eval's observation mapping, ``--vla-eval-mapping``), given as a path or as the
JSON text itself.

One loader for both, bounded before anything is parsed: a path must be a regular file (a FIFO or a device
such as ``/dev/zero`` would block or never end), read no further than :data:`MAX_MAPPING_BYTES`, and its
JSON may nest no deeper than :data:`~policy_server.foundation.json_text.MAX_JSON_DEPTH` (a deep file raises no
``RecursionError`` past the parser). Each mapping then checks its own parts.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from .json_text import JsonTextError, loads_bounded

# A mapping is a few hundred bytes; this bounds a hostile one before it is read whole.
MAX_MAPPING_BYTES = 64 * 1024


def load_mapping(source: str | Path, what: str, error: type[ValueError]) -> tuple[dict[str, Any], str]:
    """``source`` (a path, or JSON text: it starts with ``{``) parsed into its JSON object, and how messages
    name it; each refusal is an ``error`` naming it (``what``: "the camera mapping", say)."""
    text, where = str(source), what
    if not text.lstrip().startswith("{"):
        where = text
        text = _read_regular_file(Path(text), what, error)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_MAPPING_BYTES:
        raise error(f"{where} is larger than {MAX_MAPPING_BYTES // 1024} KiB")
    try:
        data = loads_bounded(text, None)  # the size is checked: a refusal for size is its depth
    except JsonTextError as exc:
        if exc.too_large:
            raise error(f"{where} is nested too deeply to be a mapping") from None
        raise error(f"{where} is not valid JSON: {exc.message}") from None
    if not isinstance(data, dict):
        raise error(f"{where} must be a JSON object")
    return data, where


def _read_regular_file(path: Path, what: str, error: type[ValueError]) -> str:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO would block a plain open
        with os.fdopen(descriptor, "rb") as handle:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise error(f"{what} {path} is not a regular file")
            data = handle.read(MAX_MAPPING_BYTES + 1)
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    if len(data) > MAX_MAPPING_BYTES:
        raise error(f"{path} is larger than {MAX_MAPPING_BYTES // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path} is not UTF-8 text") from None
