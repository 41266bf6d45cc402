"""What weights a server serves: the quantization, the checkpoint's SHA-256 and, for a Hub checkpoint, the
commit it resolved to (:class:`ServedWeights`).

The checkpoint's SHA-256 (:func:`checkpoint_sha256`) is one digest over the whole folder: for every file,
in path order, its path relative to the folder, its size and its own SHA-256. Two folders with the same
files have the same digest wherever they lie. It costs no re-read of 30 GB at every start:

- a file in the Hugging Face cache is a link to a blob named by its SHA-256 (Git LFS files: every weight
  file), so its digest is read from the name;
- any other file is hashed once and remembered in a cache file (:func:`digest_cache_path`), keyed by its
  absolute path, size, modification time and inode; a changed file is hashed again.

``cosmos3-eval`` records the digest the server states, so an evaluation names the weights it measured.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .quantization import Quantization

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_BLOCK = 1 << 20
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class ServedWeights:
    """Which weights answer: what every hello, ``/readyz`` and a recording's info state."""

    quantization: Quantization | None  # None: the checkpoint's weights at the serving dtype
    sha256: str  # :func:`checkpoint_sha256` of the checkpoint folder
    revision: str | None  # the Hub commit the checkpoint resolved to (None: a local folder)

    def as_json(self) -> dict[str, Any]:
        return {"quantization": self.quantization or "none", "sha256": self.sha256, "revision": self.revision}


def checkpoint_sha256(folder: Path, cache_path: Path | None = None) -> str:
    """The SHA-256 of a checkpoint folder (see the module docstring). Files are hashed in 1 MiB blocks and
    remembered in ``cache_path`` (default :func:`digest_cache_path`)."""
    cache_path = cache_path or digest_cache_path()
    cache = _read_cache(cache_path)
    changed = False
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix().encode()
        file_digest, remembered = _file_sha256(path, cache)
        changed = changed or not remembered
        digest.update(len(name).to_bytes(8, "little") + name)
        digest.update(path.stat().st_size.to_bytes(8, "little") + bytes.fromhex(file_digest))
    if changed:
        _write_cache(cache_path, cache)
    return digest.hexdigest()


def hub_revision(folder: Path) -> str | None:
    """The commit of a folder inside the Hugging Face cache (``.../snapshots/<commit>[/subfolder]``)."""
    for part in (folder, *folder.parents):
        if part.parent.name == "snapshots" and _HEX40.match(part.name):
            return part.name
    return None


def digest_cache_path() -> Path:
    """Where file digests are remembered: ``$COSMOS3_DIGEST_CACHE``, else ``$XDG_CACHE_HOME`` (or
    ``~/.cache``) ``/cosmos3-policy-server/file-sha256.json``."""
    explicit = os.environ.get("COSMOS3_DIGEST_CACHE")
    if explicit:
        return Path(explicit)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cosmos3-policy-server" / "file-sha256.json"


def _file_sha256(path: Path, cache: dict[str, str]) -> tuple[str, bool]:
    """The file's SHA-256, and whether it came without reading the file (a blob name or the cache)."""
    if path.is_symlink():
        blob = Path(os.path.realpath(path)).name
        if _HEX64.match(blob):  # a Hugging Face cache blob of a Git LFS file is named by its SHA-256
            return blob, True
    stat = path.stat()
    key = f"{os.path.realpath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
    if key in cache:
        return cache[key], True
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(_BLOCK):
            digest.update(block)
    cache[key] = digest.hexdigest()
    return cache[key], False


def _read_cache(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return (
        {str(k): str(v) for k, v in data.items() if isinstance(v, str) and _HEX64.match(v)}
        if isinstance(data, dict)
        else {}
    )


def _write_cache(path: Path, cache: dict[str, str]) -> None:
    """Write the cache whole or not at all (a rename); a cache that cannot be written only costs a re-hash."""
    with _cache_lock:
        # Entries of files that are gone (a checkpoint deleted, a test's temporary folder) are dropped here.
        cache = {key: value for key, value in cache.items() if os.path.exists(key.split("|", 1)[0])}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps(cache, sort_keys=True))
            os.replace(temporary, path)
        except OSError:
            pass
