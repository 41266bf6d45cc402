"""SGLang's request fields, checked and mapped onto ours: parameter names and values, image and video value
forms, and the ``POST /v1/videos`` body.

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

**Image and video values**, turned into the forms our codecs decode. SGLang takes an observation image as:

* ``{"b64_json": "..."}`` or ``{"base64": "..."}`` (a ``data:image/...;base64,`` URL is fine);
* ``{"values": [...], "dtype": "uint8", "shape": [H, W, 3]}`` (``"data"`` for ``"values"``);
* nested lists, or a numpy array in msgpack bodies;
* a list of any of these, an array of shape B×H×W×3, or a ``values`` payload of that shape: a batch;
* a plain string, which SGLang reads as a file path or URL on the server.

Our codecs (:mod:`policy_server.http.codecs`) decode base64 strings, encoded bytes, nested lists,
uint8 arrays and uploads, and check sizes against the model before any pixel is decoded. So SGLang's
containers are only unwrapped here and batches split; the pixels are checked where every other request's
are. Two things are refused here: strings that name a path or URL (the server never reads its own files
or fetches URLs for a client), and containers with keys we would otherwise ignore.

Grayscale (H×W) and RGBA (H×W×4) arrays, which SGLang passes to PIL, become RGB here.

**The** ``POST /v1/videos`` **body**, its field names mapped onto ours. SGLang (and OpenAI's Videos API,
which it extends) sends a flat body, JSON or multipart: the Cosmos3 ``forward_dynamics`` fields of
:data:`KNOWN_FIELDS` (``docs/sglang.md``, "/v1/videos", says what becomes of each).
:func:`video_fields` turns such a body into the fields of our ``VideoCreateParams`` (our own names pass
through unchanged), so the route runs its own checks (:func:`policy_server.http.requests.video_submission`)
and :meth:`Mapped.relabel` names the client's field in their errors.
What only describes the video (``num_frames``, ``seconds``, ``size``) must agree with what the actions
and the first frame already decide; what this runtime cannot do (``negative_prompt``, several outputs,
guardrails, video-to-video inputs) is refused rather than ignored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.requests import VideoRequest
from robot_clients.client_frames import ACTION_MODE, REQUEST_SETTINGS
from robot_clients.protocol import ErrorCode

from ..foundation.api_errors import ApiError
from ..foundation.json_text import JsonTextError, loads_bounded

# SGLang's names of our request settings: each setting and the keys SGLang's bodies carry it under (one setting
# may be told by several: a tier by height and width, or by `size`). SGLang has no flow shift; control_hz is
# ours alone. SGLang's spelling, not ours: a renamed setting keeps SGLang's keys.
SGLANG_NAMES: dict[str, tuple[str, ...]] = {
    "action_mode": ("action_mode",),
    "domain_name": ("domain_name", "domain_id", "raw_action_dim"),
    "action_horizon": ("action_horizon", "num_frames"),
    "prompt": ("prompt", "task"),
    "resolution_tier": ("height", "width", "size"),
    "view_point": ("action_view_point",),
    "seed": ("seed",),
    "num_steps": ("num_inference_steps",),
    "guidance_scale": ("guidance_scale",),
    "fps": ("fps", "action_fps"),
}
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
            value = loads_bounded(value, max_bytes=None)  # the body's limit bounds its size
        except JsonTextError as exc:
            why = f"`{path}`: {exc.message}" if exc.too_large else f"`{path}` is not valid JSON"
            raise invalid(path, why) from None
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


# -- image and video values ------------------------------------------------------------------------

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


# -- the /v1/videos body ---------------------------------------------------------------------------

# Our VideoCreateParams fields: they keep their meaning (the media; the mode and the settings of the engine's
# VideoRequest, in the table's order; the model).
_VIDEO_REQUEST_FIELDS = frozenset(video_field.name for video_field in dataclasses.fields(VideoRequest))
NATIVE_FIELDS = (
    "action",
    "input_reference",
    *(setting.name for setting in REQUEST_SETTINGS if setting is ACTION_MODE or setting.name in _VIDEO_REQUEST_FIELDS),
    "model",
)
# SGLang's names for two of them.
RENAMED = {"num_inference_steps": "num_steps", "action_view_point": "view_point"}
# SGLang's fields that are resolved or checked here, never passed on.
CHECKED_FIELDS = (
    "action_fps",
    "domain_id",
    "raw_action_dim",
    "action_normalization",
    "num_frames",
    "seconds",
    "size",
    "width",
    "height",
    "negative_prompt",
    "n",
    "num_outputs_per_prompt",
    "use_guardrails",
    "guardrails",
)
EXTRA_FIELDS = ("extra_body", "extra_json", "extra_params")  # extra_json: how OpenAI's SDK may send extra_body
# SGLang reads these as server paths or URLs (or takes a video to continue): never read here.
UNREAD_FIELDS = ("reference_url", "video_path", "video_url", "video_reference")
KNOWN_FIELDS = (*NATIVE_FIELDS, *RENAMED, *CHECKED_FIELDS, *EXTRA_FIELDS)


def _promote_extras(fields: dict[str, Any]) -> None:
    """Fold ``extra_body`` / ``extra_json`` / ``extra_params`` (also when nested in one another) into ``fields``."""
    for _ in range(len(EXTRA_FIELDS) + 1):  # bounded: each round removes at least one key
        present = [name for name in EXTRA_FIELDS if name in fields]
        if not present:
            return
        for name in present:
            extra = fields.pop(name)
            if extra not in (None, ""):
                merge_extra(fields, extra, name)
    raise invalid("extra_params", "`extra_params` / `extra_body` are nested too deeply")


def _rows(action: Any) -> int | None:
    """How many actions (rows) the ``action`` field holds, when it is an array or a list."""
    if isinstance(action, np.ndarray) and action.ndim >= 1:
        return int(action.shape[0])
    return len(action) if isinstance(action, list) else None


def video_fields(fields: Mapping[str, Any], description: ModelDescription, *, default_fps: float) -> Mapped:
    """A ``POST /v1/videos`` body, with SGLang's names or ours, as our ``VideoCreateParams`` fields.

    ``default_fps`` is the rate a request without ``fps`` runs at (``VideoCreateParams.fps``'s default):
    ``seconds`` is checked against it. Raises :class:`~policy_server.foundation.api_errors.ApiError` naming the
    client's field.
    """
    body = dict(fields)
    _promote_extras(body)
    for name in body:
        if name in UNREAD_FIELDS:
            raise invalid(
                name,
                f"`{name}` is not read here: this server never reads its own files or fetches URLs "
                "for a client, and forward_dynamics starts from one image (`input_reference`)",
            )
        if name not in KNOWN_FIELDS:
            raise invalid(name, f"unknown field `{name}`; known fields: {', '.join(KNOWN_FIELDS)}")

    if isinstance(body.get("input_reference"), str):  # SGLang reads a string here as a server path or URL
        refuse_paths(body["input_reference"], "input_reference")
    mapped = Mapped()
    for name in NATIVE_FIELDS:
        if body.get(name) is not None:
            mapped.put(name, body[name], name)
    for sglang_name, ours in RENAMED.items():
        if body.get(sglang_name) is None:
            continue
        if ours in mapped.fields and mapped.fields[ours] != body[sglang_name]:
            raise invalid(sglang_name, f"`{sglang_name}` and `{ours}` are the same setting; send one")
        mapped.put(ours, body[sglang_name], sglang_name)

    paths = {"domain_name": "domain_name", "domain_id": "domain_id", "raw_action_dim": "raw_action_dim"}
    named, domain_id, width = body.get("domain_name"), body.get("domain_id"), body.get("raw_action_dim")
    if named is None and domain_id is None:
        named = description.defaults.domain_name  # our /v1/videos default; width still checked
    if named is not None or domain_id is not None:
        domain = resolve_domain(description, name=named, domain_id=domain_id, raw_action_dim=width, paths=paths)
        mapped.put(
            "domain_name",
            domain,
            "domain_name" if body.get("domain_name") is not None or domain_id is None else "domain_id",
        )
        if body.get("action_normalization") is not None:
            check_normalization(body["action_normalization"], domain, description, "action_normalization")

    rate = frame_rate(body.get("fps"), body.get("action_fps"), "fps", "action_fps")
    if rate is not None:
        mapped.put("fps", *rate)
    fps = rate[0] if rate is not None else default_fps

    rows = _rows(body.get("action"))
    if body.get("num_frames") is not None and rows is not None:
        frames = integer(body["num_frames"], "num_frames", low=2)
        if frames != rows + 1:
            raise invalid(
                "num_frames",
                f"{rows} actions roll out {rows + 1} frames (the first frame plus one per "
                f"action): `num_frames` must be {rows + 1} or left out, got {frames}",
            )
    if body.get("seconds") is not None and rows is not None:
        seconds = number(body["seconds"], "seconds", positive=True)
        if abs(seconds * fps - (rows + 1)) >= 1.0:
            raise invalid(
                "seconds",
                f"the video's length is set by `action`: {rows + 1} frames at {fps:g} fps = "
                f"{(rows + 1) / fps:.3f} s; `seconds` must agree or be left out, got {seconds:g}",
            )

    tiers = (
        [(tier_for_size(*parse_size(body["size"], "size"), description, "size"), "size")]
        if body.get("size") not in (None, "")
        else []
    )
    tier = canvas_tier(body.get("height"), body.get("width"), description, height_path="height", width_path="width")
    if tier is not None:
        tiers.append((tier, "height"))
    if len(tiers) == 2 and tiers[0][0] != tiers[1][0]:
        raise invalid("size", "`size` and `height`/`width` disagree; send one of them")
    if tiers:
        tier, path = tiers[0]
        if mapped.fields.get("resolution_tier", tier) != tier:
            raise invalid(
                path,
                f"`{path}` is a canvas of resolution tier {tier}, not of `resolution_tier` "
                f"{mapped.fields['resolution_tier']}",
            )
        mapped.put("resolution_tier", tier, path)

    if body.get("negative_prompt") not in (None, ""):
        raise invalid("negative_prompt", "this runtime takes no negative prompt; leave `negative_prompt` out")
    for name in ("n", "num_outputs_per_prompt"):
        if body.get(name) is not None and integer(body[name], name, low=1) != 1:
            raise invalid(name, f"one video per job here: `{name}` must be 1 or left out (submit more jobs)")
    for name in ("use_guardrails", "guardrails"):
        refuse_guardrails(body.get(name), name)
    return mapped
