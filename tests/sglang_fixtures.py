"""Helpers for the SGLang compatibility tests: SGLang's recorded request bodies, its msgpack dialect, fake chunks.

``tests/sglang_requests/*.json`` hold the request bodies (and the assertions) of SGLang's own Cosmos3
unit tests, written down as data. :func:`materialize` turns their ``{"$ndarray": ...}`` placeholders back
into the numpy arrays SGLang's tests build; :func:`sglang_packb` packs a body the way SGLang's clients do
(``pack_msgpack``: openpi's array maps with *bytes* keys and tuple shapes), so decoding it exercises
our codec on SGLang's exact dialect.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.requests import ActionResult, ResolvedSettings

CASES_DIR = Path(__file__).parent / "sglang_requests"


def load_cases(name: str) -> list[dict[str, Any]]:
    return json.loads((CASES_DIR / f"{name}.json").read_text())["cases"]


def case(name: str, cases: str = "action_requests") -> dict[str, Any]:
    return next(c for c in load_cases(cases) if c["name"] == name)


def materialize(value: Any) -> Any:
    """A recorded body with its ``$ndarray`` placeholders as numpy arrays."""
    if isinstance(value, dict):
        if set(value) == {"$ndarray"}:
            spec = value["$ndarray"]
            return np.full(spec["shape"], spec["fill"], dtype=spec["dtype"])
        return {k: materialize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [materialize(v) for v in value]
    return value


def _sglang_default(obj: Any) -> Any:
    # SGLang's pack_numpy_payload, as its clients send arrays: bytes keys, the shape as a tuple.
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(type(obj).__name__)


def sglang_packb(body: Any) -> bytes:
    return msgpack.packb(body, default=_sglang_default, use_bin_type=True)


def sglang_unpackb(data: bytes) -> Any:
    """Decode a frame the way SGLang's clients do (``unpack_msgpack``), to prove they read our arrays."""

    def hook(obj: dict) -> Any:
        marker = obj.get("__ndarray__") or obj.get(b"__ndarray__")
        if marker:
            get = lambda k: obj.get(k, obj.get(k.encode()))  # noqa: E731
            return np.ndarray(buffer=get("data"), dtype=np.dtype(get("dtype")), shape=get("shape"))
        return obj

    return msgpack.unpackb(data, object_hook=hook, raw=False)


def chunk(
    actions: np.ndarray,
    *,
    domain_name: str = "droid_lerobot",
    domain_id: int = 8,
    mode: str = "policy",
    num_steps: int = 4,
    seed: int = 0,
) -> ActionResult:
    """An engine result as the worker hands it over (for reply tests that need no model)."""
    actions = np.asarray(actions, dtype=np.float32)
    settings = ResolvedSettings(
        domain_name=domain_name,
        action_mode=mode,
        action_horizon=int(actions.shape[0]),
        prompt="",
        resolution_tier=256,
        view_point="ego_view",
        fps=15.0,
        num_steps=num_steps,
        guidance_scale=1.0,
        guidance_interval=None,
        shift=None,
        seed=seed,
    )
    return ActionResult(
        actions=actions,
        settings=settings,
        domain_id=domain_id,
        raw_action_dim=int(actions.shape[-1]),
        transformer_forwards=num_steps,
    )


@pytest.fixture(scope="module")
def distilled(tiny_engine) -> ModelDescription:
    """The tiny distilled engine's description: what every SGLang request is checked against."""
    return tiny_engine("distilled").describe()


@pytest.fixture(scope="module")
def droid(tiny_engine) -> ModelDescription:
    """The tiny DROID-profile checkpoint's description: droid_lerobot conditions on an 8-wide state."""
    return tiny_engine("distilled", droid=True).describe()


@pytest.fixture(scope="module")
def base(tiny_engine) -> ModelDescription:
    """The tiny base (not distilled) engine's description: free step counts and guidance."""
    return tiny_engine("base").describe()
