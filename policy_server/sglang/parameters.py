"""SGLang's parameter names and values, checked and mapped onto our own request fields.

Both SGLang endpoints this server speaks (``/v1/actions/generations`` and ``/v1/videos``) name some
settings differently from ours and identify some things differently. A setting that only has another
name is renamed; what SGLang expresses another way is resolved here against the loaded model's
``describe()``:

* an embodiment by ``domain_id`` + ``raw_action_dim`` instead of ``domain_name``;
* a resolution by pixel size (``height``/``width``, ``size``) instead of a ``resolution_tier``;
* a normalization by SGLang's short name (``meanstd``) instead of the profile's (``mean_std``);
* a second frame rate (``action_fps``) that the runtime does not have.

Each becomes one of our fields or is refused, naming the client's own field path. Everything else is
left to our own request checks, which name our fields: :meth:`Mapped.relabel` puts the client's name
back into such an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos3_runtime.description import ModelDescription
from robot_clients.protocol import ErrorCode

from ..http.errors import ApiError

# SGLang's normalization names (and ours) -> the runtime's profile kinds (``PolicyProfile.normalization.kind``).
NORMALIZATION_KINDS = {
    "quantile": "quantile",
    "meanstd": "mean_std",
    "mean_std": "mean_std",
    "minmax": "min_max",
    "min_max": "min_max",
}
# Request ids end up in replies and logs: long enough for any id scheme, short enough to bound both.
MAX_REQUEST_ID_CHARS = 256


@dataclass
class Mapped:
    """Our request fields, and the path in the client's request that each one came from."""

    fields: dict[str, Any] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)

    def put(self, name: str, value: Any, path: str) -> None:
        self.fields[name] = value
        self.paths[name] = path

    def relabel(self, error: ApiError) -> ApiError:
        """``error`` (raised by our checks, naming our field) as the client should read it."""
        path = self.paths.get(error.field or "")
        if path is None or path == error.field:
            return error
        message = error.message.replace(f"`{error.field}`", f"`{path}`")
        return ApiError(error.code, message, path, status=error.status, headers=error.headers)


def invalid(path: str, message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_FIELD, message, path)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def integer(value: Any, path: str, *, low: int | None = None, high: int | None = None) -> int:
    """An integer, also from an integral float (``16.0``) or the decimal text of a form field.

    SGLang calls ``int()`` on its values, which would turn ``16.9`` into 16; a fraction is refused here.
    """
    if isinstance(value, np.integer):
        value = int(value)
    elif isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        value = int(value)
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(path, f"`{path}` must be an integer, got {_shown(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (
            f"between {low} and {high}"
            if low is not None and high is not None
            else (f">= {low}" if low is not None else f"<= {high}")
        )
        raise invalid(path, f"`{path}` must be {bounds}, got {value}")
    return value


def number(value: Any, path: str, *, positive: bool = False) -> float:
    """A finite number, also from the decimal text of a form field."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(path, f"`{path}` must be a finite number, got {_shown(value)}")
    if positive and value <= 0:
        raise invalid(path, f"`{path}` must be > 0, got {value}")
    return float(value)


def text(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise invalid(path, f"`{path}` must be a string, got {_shown(value)}")
    return value


def flag(value: Any, path: str) -> bool:
    """A boolean, also from the text SGLang's forms send (``"true"``, ``"0"``, ...)."""
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    if not isinstance(value, bool):
        raise invalid(path, f"`{path}` must be true or false, got {_shown(value)}")
    return value


def request_id(value: Any, path: str) -> str:
    """A client's request id, echoed as the reply's ``id``: a string or an integer, bounded."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    checked = text(value, path)
    if not checked or len(checked) > MAX_REQUEST_ID_CHARS:
        raise invalid(path, f"`{path}` must be 1 to {MAX_REQUEST_ID_CHARS} characters")
    return checked


def one_of(values: Mapping[str, Any], names: tuple[str, str], prefix: str) -> tuple[Any, str | None]:
    """The value of whichever of two synonymous keys the client used (``request_id`` | ``id``).

    Both with different values is refused: SGLang silently takes the first.
    """
    first, second = names
    path_first, path_second = f"{prefix}{first}", f"{prefix}{second}"
    if values.get(first) is not None and values.get(second) is not None and values[first] != values[second]:
        raise invalid(path_second, f"`{path_first}` and `{path_second}` mean the same thing; send one of them")
    if values.get(first) is not None:
        return values[first], path_first
    if values.get(second) is not None:
        return values[second], path_second
    return None, None


# -- embodiment ------------------------------------------------------------------------------------------


def resolve_domain(
    description: ModelDescription,
    *,
    name: Any = None,
    domain_id: Any = None,
    raw_action_dim: Any = None,
    paths: Mapping[str, str],
) -> str:
    """The ``domain_name`` a request means, from a name, or from SGLang's ``domain_id`` + ``raw_action_dim``.

    Every value the client gives must agree with the loaded model's profile: a width the profile does
    not have would give the robot actions of the wrong size. Several names can share one domain id (one
    action head); the id and width then name the domain only when those profiles are the same.
    ``paths`` maps ``domain_name``, ``domain_id`` and ``raw_action_dim`` to the client's field paths.
    """
    domains = description.domains
    known = ", ".join(f"{n} (domain_id {d.domain_id})" for n, d in sorted(domains.items())) or "none"
    if domain_id is not None:
        domain_id = integer(domain_id, paths["domain_id"], low=0)
    if raw_action_dim is not None:
        raw_action_dim = integer(raw_action_dim, paths["raw_action_dim"], low=1)
    if name is not None:
        name = text(name, paths["domain_name"])
        if name not in domains:
            raise ApiError(
                ErrorCode.UNKNOWN_DOMAIN, f"unknown domain {name!r}; this model knows: {known}", paths["domain_name"]
            )
        profile = domains[name]
        if domain_id is not None and domain_id != profile.domain_id:
            raise invalid(paths["domain_id"], f"domain {name!r} has domain_id {profile.domain_id}, not {domain_id}")
        if raw_action_dim is not None and raw_action_dim != profile.raw_action_dim:
            raise invalid(
                paths["raw_action_dim"],
                f"domain {name!r} acts with {profile.raw_action_dim} values per step, not {raw_action_dim}",
            )
        return str(name)
    if domain_id is None:
        raise ApiError(
            ErrorCode.MISSING_FIELD,
            f"name the embodiment: `{paths['domain_name']}`, or `{paths['domain_id']}` with "
            f"`{paths['raw_action_dim']}`; this model knows: {known}",
            paths["domain_name"],
        )
    sharing = [n for n, d in sorted(domains.items()) if d.domain_id == domain_id]
    if not sharing:
        raise ApiError(
            ErrorCode.UNKNOWN_DOMAIN,
            f"no domain of this model has domain_id {domain_id}; it knows: {known}",
            paths["domain_id"],
        )
    if raw_action_dim is None:
        raise ApiError(
            ErrorCode.MISSING_FIELD,
            f"`{paths['raw_action_dim']}` is required with `{paths['domain_id']}` (as in SGLang), or send "
            f"`{paths['domain_name']}`: domain_id {domain_id} is {', '.join(sharing)}",
            paths["raw_action_dim"],
        )
    matching = [n for n in sharing if domains[n].raw_action_dim == raw_action_dim]
    if not matching:
        widths = ", ".join(f"{n}: {domains[n].raw_action_dim}" for n in sharing)
        raise invalid(
            paths["raw_action_dim"], f"domain_id {domain_id} acts with another width ({widths}), not {raw_action_dim}"
        )
    if any(description.domain_json(n) != description.domain_json(matching[0]) for n in matching[1:]):
        raise invalid(
            paths["domain_id"],
            f"domain_id {domain_id} with raw_action_dim {raw_action_dim} is any of {', '.join(matching)}, "
            f"whose profiles differ (view point, horizon or normalization); send `{paths['domain_name']}`",
        )
    return matching[0]


def check_normalization(value: Any, domain_name: str, description: ModelDescription, path: str) -> None:
    """SGLang's ``action_normalization``: it must name the statistics the domain's profile denormalizes with.

    The server denormalizes with the profile's statistics (checkpoint or operator), so the client can
    only confirm which kind they are, never choose another one.
    """
    kind = NORMALIZATION_KINDS.get(value.strip().lower()) if isinstance(value, str) else None
    if kind is None:
        raise invalid(path, f"`{path}` must be one of quantile, meanstd, minmax, got {_shown(value)}")
    domain = description.domain(domain_name)
    actual = domain.normalization.kind if domain is not None and domain.normalization is not None else None
    if actual is None:
        raise invalid(
            path,
            f"domain {domain_name!r} has no normalization statistics on this server: its actions are "
            f"the model's normalized values; leave `{path}` out",
        )
    if kind != actual:
        raise invalid(
            path,
            f"domain {domain_name!r} is denormalized with its {actual} statistics on this server; "
            f"`{path}` must name those or be left out",
        )


def frame_rate(fps: Any, action_fps: Any, fps_path: str, action_fps_path: str) -> tuple[float, str] | None:
    """SGLang's two rates as the runtime's one ``fps``: the video's rate and the actions' are the same.

    Returns the rate and the path it came from, or None when neither was given.
    """
    rates = [
        (number(v, p, positive=True), p) for v, p in ((fps, fps_path), (action_fps, action_fps_path)) if v is not None
    ]
    if len(rates) == 2 and rates[0][0] != rates[1][0]:
        raise invalid(
            action_fps_path,
            f"this runtime conditions actions and video frames at one rate: "
            f"`{action_fps_path}` must equal `{fps_path}` or be left out",
        )
    return rates[0] if rates else None


# -- resolution -----------------------------------------------------------------------------------------


def parse_size(value: Any, path: str) -> tuple[int, int]:
    """SGLang's (and OpenAI's) ``size``, ``"WIDTHxHEIGHT"``, as ``(height, width)``."""
    parts = text(value, path).lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise invalid(path, f"`{path}` must be WIDTHxHEIGHT, e.g. 832x480, got {_shown(value)}")
    width, height = (int(p) for p in parts)
    return height, width


def canvas_tier(
    height: Any, width: Any, description: ModelDescription, *, height_path: str, width_path: str
) -> int | None:
    """The tier a ``height`` + ``width`` pair names (:func:`tier_for_size`), None when neither is given."""
    if height is None and width is None:
        return None
    if height is None or width is None:
        missing = height_path if height is None else width_path
        raise ApiError(
            ErrorCode.MISSING_FIELD,
            f"`{height_path}` and `{width_path}` name a canvas together; `{missing}` is missing",
            missing,
        )
    size = integer(height, height_path, low=1), integer(width, width_path, low=1)
    return tier_for_size(*size, description, height_path)


def tier_for_size(height: int, width: int, description: ModelDescription, path: str) -> int:
    """The resolution tier whose canvas a pixel size names.

    When the engine describes its canvases (``canvases``: tier -> its canvas bins)
    the size must be one of them (two tiers with the same canvas: the smaller, the same work); otherwise
    a tier is named by its canvas's short side (480 for 480×832), as the runtime's tiers are.
    """
    tiers = list(description.resolution_tiers)
    canvases = {tier: [(b.height, b.width) for b in bins] for tier, bins in description.canvases.items()}
    if canvases:
        matches = [t for t, sizes in canvases.items() if t in tiers and (height, width) in sizes]
        if matches:
            return min(matches)
        offered = sorted({f"{w}x{h}" for t, sizes in canvases.items() if t in tiers for h, w in sizes})
        raise ApiError(
            ErrorCode.UNSUPPORTED_TIER,
            f"{width}x{height} is not a canvas of this model; choose one of {', '.join(offered)} (WIDTHxHEIGHT)",
            path,
        )
    if min(height, width) in tiers:
        return min(height, width)
    raise ApiError(
        ErrorCode.UNSUPPORTED_TIER,
        f"{width}x{height} names no resolution tier of this model: a tier is "
        f"named by its canvas's short side, one of {tiers}",
        path,
    )


def refuse_guardrails(value: Any, path: str) -> None:
    """SGLang's ``use_guardrails``: false (nothing runs) is honoured; true cannot be."""
    if value is not None and flag(value, path):
        raise invalid(path, f"this server runs no guardrail models; `{path}` must be false or left out")


# -- extra_params / extra_body ---------------------------------------------------------------------------


def json_object(value: Any, path: str) -> dict[str, Any]:
    """A JSON object, or the text of one (as forms carry it)."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise invalid(path, f"`{path}` is not valid JSON") from None
    if not isinstance(value, dict):
        raise invalid(path, f"`{path}` must be a JSON object")
    return value


def merge_extra(fields: dict[str, Any], extra: Any, path: str) -> None:
    """Promote the keys of an ``extra_params`` / ``extra_body`` object into ``fields``.

    A key the request already has is refused unless both values are equal: SGLang would silently take
    one of them (which one depends on the endpoint and the body's format).
    """
    for key, value in json_object(extra, path).items():
        if key in fields and fields[key] != value:
            raise invalid(f"{path}.{key}", f"`{key}` is given twice with different values (in `{path}` and elsewhere)")
        fields[key] = value
