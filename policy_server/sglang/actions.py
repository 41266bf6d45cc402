"""SGLang's action API over HTTP: the ``POST /v1/actions/generations`` envelope parsed into our requests and
answered in its reply, and the metadata keys its clients read first. ``docs/sglang.md`` is the reference
for each ("The action envelope", "The reply", "Metadata"), with examples and SGLang's own defaults.

The request is JSON or msgpack, or SGLang's multipart form, which :func:`envelope_from_form` rebuilds into
the same envelope so that one parser checks both. Its sections: ``request_id`` (or ``id``, echoed as the
reply's ``id``), ``input`` (the text and the observation, :data:`INPUT_KEYS`), ``parameters`` (the
request settings under SGLang's names, :data:`~.parameters.SGLANG_NAMES`, and the others of
:data:`PARAMETER_KEYS`) and ``runtime`` (how to answer, :data:`RUNTIME_KEYS`).

:func:`parse_action_envelope` checks it and returns an :class:`ActionCall` with one :class:`ActionItem`
per image of a batch and per candidate. An item holds the fields of our own flat request (the names of
``ActionGenerationParams``), so the route builds each engine request with the checks it already makes
(:func:`policy_server.http.requests.action_request`), and :meth:`ActionItem.relabel` turns an error
about one of our fields into one about the client's. :func:`build_reply` answers with SGLang's envelope
(``object: "action.generation"``) or its ``raw`` form; ``values`` are nested lists, or float32 arrays when
the client asked for ``output_format: numpy`` (then packed as msgpack).

SGLang's defaults are literals in its code; here an unset value takes the loaded checkpoint's default, as
every other request to this server does.

**Metadata**: :func:`sglang_metadata` answers the keys SGLang's ``GET /v1/actions/metadata`` (and its
realtime WebSocket) starts with (``policy_family``, ``input``, ``output``, ``defaults``, ``capabilities``),
where SGLang fills in literals, from the loaded checkpoint's description (``ModelDescription``) and the
server's own settings, which the caller passes in. :func:`merge_metadata` adds these keys to one of our
metadata answers without changing any key it already has (except ``object``, which becomes SGLang's).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.requests import ActionResult
from robot_clients.protocol import ErrorCode

from ..api_errors import ApiError
from ..json_text import JsonTextError, loads_bounded
from ..metadata import public_model_name, served_weights
from .parameters import (
    SGLANG_NAMES,
    TENSOR_VALUE_KEYS,
    Mapped,
    canvas_tier,
    check_normalization,
    flag,
    frame_rate,
    image_batch,
    integer,
    invalid,
    merge_extra,
    number,
    one_of,
    refuse_guardrails,
    request_id,
    resolve_domain,
    text,
    video_clip,
)

ENVELOPE_KEYS = ("request_id", "id", "input", "parameters", "runtime", "model")
MEDIA_KEYS = ("image", "images", "input_reference", "video", "state")
INPUT_KEYS = ("task", "prompt", "observation", *MEDIA_KEYS)
# SGLang's names of our settings (but those an action request's `input` holds, and `size`, the videos' way to
# say width and height), then its parameters that are no setting.
PARAMETER_KEYS = (
    *(key for keys in SGLANG_NAMES.values() for key in keys if key not in INPUT_KEYS and key != "size"),
    "action_normalization",
    "candidate_count",
    "candidate_reducer",
    "return_candidates",
    "use_guardrails",
    "output_format",
)
RUNTIME_KEYS = ("response_format", "output_format", "return_timing", "prefix_cache", "cuda_graph")
# SGLang reads these as files on its own disk or URLs to fetch; this server never does either.
UNREAD_KEYS = ("image_path", "video_path", "video_url", "reference_url")
RESPONSE_FORMATS = ("envelope", "raw")
OUTPUT_FORMATS = ("list", "numpy")
REDUCTION_REFUSED = (
    "this server returns every candidate as its own data[] item (candidate_index) and never averages "
    "them: the mean of two good trajectories can be a bad one, e.g. between passing an obstacle on the "
    "left and on the right"
)


@dataclass
class ActionItem(Mapped):
    """One engine request of an envelope: our request fields, and which input and candidate it is."""

    input_index: int = 0
    candidate_index: int = 0


@dataclass(frozen=True)
class ActionCall:
    """A checked SGLang envelope: its items, and how the reply must look."""

    request_id: str | None
    items: tuple[ActionItem, ...]
    response_format: str = "envelope"
    output_format: str = "list"
    return_timing: bool = False
    # Fields accepted as SGLang does but not used: reported back in `warnings` (none today).
    unused: tuple[str, ...] = ()


def is_sglang_envelope(body: Mapping[str, Any]) -> bool:
    """Whether a decoded JSON / msgpack body is SGLang's envelope rather than our flat request.

    Our flat request has none of these keys, and SGLang's envelope always has ``input``.
    """
    return any(key in body for key in ("input", "parameters", "runtime", "request_id", "id"))


# -- parsing ---------------------------------------------------------------------------------------------


def _section(parent: Mapping[str, Any], name: str, prefix: str = "", *, required: bool = False) -> dict[str, Any]:
    path = f"{prefix}{name}"
    value = parent.get(name)
    if value is None:
        if required:
            raise ApiError(ErrorCode.MISSING_FIELD, f"`{path}` is required (an object)", path)
        return {}
    if not isinstance(value, dict):
        raise invalid(path, f"`{path}` must be an object, got {type(value).__name__}")
    return value


def check_known_keys(section: Mapping[str, Any], known: Sequence[str], prefix: str) -> None:
    for key in section:
        path = f"{prefix}{key}"
        if key in UNREAD_KEYS:
            raise invalid(
                path,
                f"SGLang reads `{key}` as a path or URL on the server; this server never reads its "
                "own files or fetches URLs for a client: send the image or the frames themselves",
            )
        if key not in known:
            raise invalid(path, f"unknown field `{path}`; known here: {', '.join(known)}")


def _media(inputs: Mapping[str, Any], observation: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """Observation values by name, from ``input.observation`` or (as SGLang also takes them) ``input``."""
    media = {}
    for name in MEDIA_KEYS:
        if inputs.get(name) is not None and observation.get(name) is not None:
            raise invalid(f"input.{name}", f"`input.{name}` and `input.observation.{name}` are both given; send one")
        if inputs.get(name) is not None:
            media[name] = (inputs[name], f"input.{name}")
        elif observation.get(name) is not None:
            media[name] = (observation[name], f"input.observation.{name}")
    return media


def _one_camera(value: Any, path: str) -> tuple[Any, str]:
    """SGLang's ``images`` map for Cosmos3: exactly one named camera, which is the observation image."""
    if not isinstance(value, dict) or len(value) != 1 or not all(isinstance(k, str) for k in value):
        raise invalid(
            path,
            f"`{path}` must map exactly one camera name to its image: Cosmos3 conditions on one "
            "camera (send it as `image`, or compose cameras over the native WebSocket protocol)",
        )
    ((name, image),) = value.items()
    return image, f"{path}.{name}"


def _state(value: Any, path: str) -> Any:
    """SGLang's state as our ``state`` field reads it: numbers, or its tensor form (``values`` + ``shape``).

    Whether it is a finite float array, and one the domain conditions on, is checked with every other
    field when the item becomes a request (errors name ``path``)."""
    if not (isinstance(value, dict) and any(k in value for k in TENSOR_VALUE_KEYS)):
        return value
    values, shape = value.get("values", value.get("data")), value.get("shape")
    try:
        return (
            values
            if shape is None
            else np.asarray(values, dtype=np.float64).reshape([integer(n, f"{path}.shape", low=1) for n in shape])
        )
    except (ValueError, TypeError):
        raise invalid(path, f"`{path}` must hold numbers matching its `shape`") from None


def _prompts(value: Any, path: str | None, count: int) -> list[tuple[str, str]]:
    """One prompt (and its path) per input: a string is shared, a list gives one per image."""
    path = path or "input.task"
    if value is None:
        return [("", path)] * count
    if isinstance(value, str):
        return [(value, path)] * count
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise invalid(path, f"`{path}` must be a string, or a non-empty list of strings (one per image)")
    if len(value) == 1:
        return [(value[0], f"{path}[0]")] * count
    if len(value) != count:
        raise invalid(
            path, f"`{path}` has {len(value)} prompts for {count} image(s); send one prompt per image, or one for all"
        )
    return [(v, f"{path}[{i}]") for i, v in enumerate(value)]


def _auto_only(runtime: Mapping[str, Any], name: str, what: str) -> None:
    value = runtime.get(name)
    if value is not None and not (isinstance(value, str) and value.strip().lower() == "auto"):
        raise invalid(
            f"runtime.{name}",
            f'this server decides {what} for every request itself; `runtime.{name}` must be "auto" or left out',
        )


def _choice(value: Any, path: str, choices: Sequence[str]) -> str:
    choice = text(value, path).strip().lower()
    if choice not in choices:
        raise invalid(path, f"`{path}` must be one of {', '.join(choices)}, got {value!r}")
    return choice


def _settings(
    parameters: Mapping[str, Any], body: Mapping[str, Any], description: ModelDescription, mode: str
) -> Mapped:
    """The settings every item of the envelope shares, in our field names."""
    common = Mapped()
    common.put("action_mode", mode, "parameters.action_mode")

    horizon, horizon_path = parameters.get("action_horizon"), "parameters.action_horizon"
    if horizon is not None:
        horizon = integer(horizon, horizon_path, low=1)
    if parameters.get("num_frames") is not None:
        frames = integer(parameters["num_frames"], "parameters.num_frames", low=2)
        if horizon is None:
            horizon, horizon_path = frames - 1, "parameters.num_frames"
        elif frames != horizon + 1:
            raise invalid(
                "parameters.num_frames",
                f"a chunk of {horizon} actions spans {horizon + 1} frames: "
                f"`parameters.num_frames` must be action_horizon + 1 = {horizon + 1}, got {frames}",
            )
    if horizon is not None:
        common.put("action_horizon", horizon, horizon_path)

    paths = {k: f"parameters.{k}" for k in ("domain_name", "domain_id", "raw_action_dim")}
    domain = resolve_domain(
        description,
        name=parameters.get("domain_name"),
        domain_id=parameters.get("domain_id"),
        raw_action_dim=parameters.get("raw_action_dim"),
        paths=paths,
    )
    by_name = parameters.get("domain_name") is not None
    common.put("domain_name", domain, paths["domain_name" if by_name else "domain_id"])
    if parameters.get("action_normalization") is not None:
        check_normalization(parameters["action_normalization"], domain, description, "parameters.action_normalization")

    if parameters.get("num_inference_steps") is not None:
        common.put(
            "num_steps",
            integer(parameters["num_inference_steps"], "parameters.num_inference_steps", low=1),
            "parameters.num_inference_steps",
        )
    if parameters.get("guidance_scale") is not None:
        common.put(
            "guidance_scale",
            number(parameters["guidance_scale"], "parameters.guidance_scale"),
            "parameters.guidance_scale",
        )
    rate = frame_rate(parameters.get("fps"), parameters.get("action_fps"), "parameters.fps", "parameters.action_fps")
    if rate is not None:
        common.put("fps", *rate)
    if parameters.get("action_view_point") is not None:
        common.put(
            "view_point",
            text(parameters["action_view_point"], "parameters.action_view_point"),
            "parameters.action_view_point",
        )
    tier = canvas_tier(
        parameters.get("height"),
        parameters.get("width"),
        description,
        height_path="parameters.height",
        width_path="parameters.width",
    )
    if tier is not None:
        common.put("resolution_tier", tier, "parameters.height")
    refuse_guardrails(parameters.get("use_guardrails"), "parameters.use_guardrails")
    if body.get("model") is not None:
        common.put("model", body["model"], "model")
    return common


def parse_action_envelope(
    body: Mapping[str, Any],
    description: ModelDescription,
    *,
    max_items: int,
    msgpack_reply: bool = False,
) -> ActionCall:
    """Check SGLang's envelope against the loaded model's description and split it into items.

    ``max_items`` bounds the engine requests one envelope may become (images × candidates).
    ``msgpack_reply``: the reply goes out as msgpack, where ``output_format`` defaults to ``numpy`` (as
    in SGLang); a JSON reply has lists whatever was asked, JSON having no other arrays. Raises
    :class:`~policy_server.api_errors.ApiError` naming the client's field.
    """
    check_known_keys(body, ENVELOPE_KEYS, "")
    rid_value, rid_path = one_of(body, ("request_id", "id"), "")
    rid = request_id(rid_value, rid_path) if rid_path else None
    inputs = _section(body, "input", required=True)
    check_known_keys(inputs, INPUT_KEYS, "input.")
    observation = _section(inputs, "observation", "input.")
    check_known_keys(observation, MEDIA_KEYS, "input.observation.")
    parameters = _section(body, "parameters")
    check_known_keys(parameters, PARAMETER_KEYS, "parameters.")
    runtime = _section(body, "runtime")
    check_known_keys(runtime, RUNTIME_KEYS, "runtime.")

    mode = parameters.get("action_mode")
    mode = "policy" if mode is None else text(mode, "parameters.action_mode").strip().lower()
    if mode == "forward_dynamics":
        raise ApiError(
            ErrorCode.UNSUPPORTED_MODE,
            "forward_dynamics produces video, not actions: submit it to "
            "POST /v1/videos (SGLang's field names are accepted there)",
            "parameters.action_mode",
        )
    common = _settings(parameters, body, description, mode)
    prompt, prompt_path = one_of(inputs, ("task", "prompt"), "input.")
    if mode != "policy" and isinstance(prompt, list):  # checked before the media, as SGLang does
        raise invalid(
            prompt_path or "input.task",
            f"the {mode} prompt must be a string (`{prompt_path}`): only policy requests are batched",
        )

    media = _media(inputs, observation)
    if "state" in media:  # the robot's, shared by every image of a batch
        common.put("state", _state(*media["state"]), media["state"][1])
    else:  # a domain that needs one says where SGLang's clients put it
        common.paths["state"] = "input.observation.state"
    image_names = [name for name in ("image", "input_reference", "images") if name in media]
    if len(image_names) > 1:
        raise invalid(
            media[image_names[1]][1],
            f"`{media[image_names[0]][1]}` and `{media[image_names[1]][1]}` "
            "both hold the observation image; send it once",
        )
    images: list[tuple[Any, str]] = []
    if image_names:
        value, path = media[image_names[0]]
        if image_names[0] == "images":
            value, path = _one_camera(value, path)
        images = image_batch(value, path, max_items=max_items)
    video = (video_clip(*media["video"]), media["video"][1]) if "video" in media else None
    if images and video:
        raise invalid(video[1], "send either an observation image or a video, not both")
    if mode == "inverse_dynamics" and images:
        raise invalid(
            images[0][1],
            "inverse_dynamics infers actions from a clip: send `input.observation.video` "
            "(action_horizon + 1 frames), not an image",
        )
    if not images and video is None:
        missing = "input.observation.video" if mode == "inverse_dynamics" else "input.observation.image"
        raise ApiError(ErrorCode.MISSING_FIELD, f"`{missing}` is required for {mode}", missing)
    observations = images or ([video] if video is not None else [])

    prompts = _prompts(prompt, prompt_path, len(observations))

    count = integer(parameters.get("candidate_count", 1), "parameters.candidate_count", low=1)
    if count > 1 and len(observations) > 1:
        raise invalid(
            "parameters.candidate_count",
            "candidates are alternatives for one observation: "
            "candidate_count > 1 takes exactly one image (as in SGLang)",
        )
    if len(observations) * count > max_items:
        raise invalid(
            "parameters.candidate_count" if count > 1 else observations[0][1],
            f"this request asks for {len(observations) * count} action chunks; this server computes at "
            f"most {max_items} per request",
        )
    reducer = parameters.get("candidate_reducer")
    if reducer is not None and (count > 1 or text(reducer, "parameters.candidate_reducer") != "none"):
        raise invalid("parameters.candidate_reducer", f"{REDUCTION_REFUSED}; leave `parameters.candidate_reducer` out")
    if (
        parameters.get("return_candidates") is not None
        and count > 1
        and not flag(parameters["return_candidates"], "parameters.return_candidates")
    ):
        raise invalid(
            "parameters.return_candidates",
            f"{REDUCTION_REFUSED}; `parameters.return_candidates` must be true or left out",
        )
    seed = parameters.get("seed")
    if seed is not None:
        seed = integer(seed, "parameters.seed", low=0)

    items = []
    for index, ((value, path), (prompt_text, prompt_item_path)) in enumerate(zip(observations, prompts)):
        for candidate in range(count):
            item = ActionItem(dict(common.fields), dict(common.paths), input_index=index, candidate_index=candidate)
            item.put("prompt", prompt_text, prompt_item_path)
            item.put("image" if images else "video", value, path)
            if seed is not None:  # candidates differ by their noise, so each gets its own seed
                item.put("seed", seed + candidate, "parameters.seed")
            items.append(item)

    formats = {
        path: _choice(value, path, OUTPUT_FORMATS)
        for path, value in (
            ("runtime.output_format", runtime.get("output_format")),
            ("parameters.output_format", parameters.get("output_format")),
        )
        if value is not None
    }
    if len(set(formats.values())) > 1:
        raise invalid(
            "parameters.output_format", "`runtime.output_format` and `parameters.output_format` differ; send one"
        )
    output_format = next(iter(formats.values()), "numpy") if msgpack_reply else "list"
    response_format = _choice(runtime.get("response_format", "envelope"), "runtime.response_format", RESPONSE_FORMATS)
    _auto_only(runtime, "prefix_cache", "whether to use its prefix cache")
    _auto_only(runtime, "cuda_graph", "how to run its engine")
    return_timing = runtime.get("return_timing") is not None and flag(runtime["return_timing"], "runtime.return_timing")
    return ActionCall(rid, tuple(items), response_format, output_format, return_timing)


class FormUpload(Protocol):
    """A file part of the form (such as :class:`policy_server.http.codecs.Upload`)."""

    data: bytes
    content_type: str


FORM_UPLOADS = ("image_reference", "video_reference", "input_reference")
FORM_RUNTIME_FIELDS = ("response_format", "output_format", "return_timing")


def is_sglang_form(names: Iterable[str], native_fields: Iterable[str]) -> bool:
    """Whether a multipart form is SGLang's: it has a field our flat form does not (``input_reference``, ...)."""
    return bool(set(names) - set(native_fields))


def _form_value(name: str, value: str) -> Any:
    """A form field's text as SGLang reads it: JSON when it parses (``30``, ``true``), else the text; JSON
    nested past :data:`~policy_server.json_text.MAX_JSON_DEPTH` is refused unparsed (``payload_too_large``)."""
    if not value.strip():
        return None
    try:
        return loads_bounded(value, max_bytes=None)  # the body's limit bounds its size
    except JsonTextError as exc:
        if exc.too_large:
            raise ApiError(ErrorCode.PAYLOAD_TOO_LARGE, f"`{name}`: {exc.message}", name) from None
        return value


def envelope_from_form(items: Sequence[tuple[str, str | FormUpload]]) -> dict[str, Any]:
    """SGLang's multipart action form as the envelope :func:`parse_action_envelope` reads.

    ``items`` are ``(name, value)`` pairs: text, or a :class:`FormUpload`. ``request_id``/``id`` and
    ``prompt``/``task`` are the envelope's; ``image_reference``, ``video_reference`` and
    ``input_reference`` (an image, or a video for inverse_dynamics or a ``video/*`` upload) are the
    observation; ``extra_body``/``extra_params`` are JSON objects of parameters; every other field is a
    parameter, its text read as JSON when it parses.
    """
    body: dict[str, Any] = {}
    inputs: dict[str, Any] = {}
    observation: dict[str, Any] = {}
    parameters: dict[str, Any] = {}
    runtime: dict[str, Any] = {}
    uploads: list[tuple[str, FormUpload]] = []
    extras: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, value in items:
        if name in seen:
            raise invalid(name, f"field `{name}` appears more than once")
        seen.add(name)
        if not isinstance(value, str):
            if name not in FORM_UPLOADS:
                raise invalid(
                    name, f"`{name}` cannot be a file upload; files are accepted for {', '.join(FORM_UPLOADS)}"
                )
            uploads.append((name, value))
        elif name in ("request_id", "id"):
            body[name] = value
        elif name in ("prompt", "task"):
            inputs[name] = value
        elif name in ("extra_body", "extra_params"):
            extras.append((name, value))
        elif name in FORM_RUNTIME_FIELDS:
            runtime[name] = _form_value(name, value)
        elif name == "input_reference":
            observation["input_reference"] = value  # text: base64 (a path is refused when parsed)
        elif name in UNREAD_KEYS:
            check_known_keys({name: value}, (), "")
        elif name in PARAMETER_KEYS:
            parameters[name] = _form_value(name, value)
        else:
            raise invalid(
                name,
                f"unknown field `{name}`; this form takes request_id, prompt, the uploads "
                f"{', '.join(FORM_UPLOADS)}, extra_body, extra_params and the parameters "
                f"{', '.join(PARAMETER_KEYS)}",
            )
    for name, value in sorted(extras):  # extra_body, then extra_params
        merge_extra(parameters, value, name)
    if len(uploads) > 1:
        raise invalid(uploads[1][0], f"one observation per request: send one of {', '.join(FORM_UPLOADS)}")
    mode = str(parameters.get("action_mode", "policy")).strip().lower()
    for name, upload in uploads:
        is_video = (upload.content_type or "").lower().startswith("video/")
        if name == "video_reference" or (name == "input_reference" and (is_video or mode == "inverse_dynamics")):
            observation["video"] = upload
        else:
            observation["image" if name == "image_reference" else "input_reference"] = upload
    body.update(input={**inputs, "observation": observation}, parameters=parameters)
    if runtime:
        body["runtime"] = runtime
    return body


def build_reply(
    call: ActionCall,
    chunks: Sequence[ActionResult],
    *,
    model: str | None,
    created: float | None = None,
    prefix_cache_hit: bool | None = None,
    timings: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """SGLang's answer for ``call``, given one chunk per item (in :attr:`ActionCall.items` order).

    ``values`` are float32 arrays for ``output_format: numpy`` (to be packed as msgpack), nested lists
    otherwise. ``prefix_cache_hit`` is ``None`` (null) when the engine does not report it.
    """
    if len(chunks) != len(call.items) or not chunks:
        raise ValueError(f"expected {len(call.items)} chunks, one per item, got {len(chunks)}")
    numpy_values = call.output_format == "numpy"

    def values(actions: np.ndarray) -> Any:
        array = np.ascontiguousarray(actions, dtype=np.float32)
        return array if numpy_values else array.tolist()

    first = chunks[0]
    if call.response_format == "raw":
        actions = first.actions if len(chunks) == 1 else np.stack([chunk.actions for chunk in chunks])
        return {
            "request_id": call.request_id,
            "actions": values(actions),
            "action_mode": first.action_mode,
            "domain_id": first.domain_id,
            "raw_action_dim": first.raw_action_dim,
            "parameters": {"num_inference_steps": first.num_steps},
            "seeds": [chunk.seed for chunk in chunks],
        }
    data = [
        {
            "index": index,
            "input_index": item.input_index,
            "candidate_index": item.candidate_index,
            "action": {
                "type": "continuous",
                "dtype": "float32",
                "shape": list(chunk.actions.shape),
                "values": values(chunk.actions),
                "action_mode": chunk.action_mode,
                "domain_id": chunk.domain_id,
                "raw_action_dim": chunk.raw_action_dim,
                "domain_name": chunk.domain_name,
                "seed": chunk.seed,
            },
        }
        for index, (item, chunk) in enumerate(zip(call.items, chunks))
    ]
    horizon, width = first.actions.shape
    reply: dict[str, Any] = {
        "id": call.request_id or f"actgen_{uuid.uuid4().hex}",
        "object": "action.generation",
        "created": int(time.time() if created is None else created),
        "model": model,
        "data": data,
        "usage": {
            "batch_size": len(data),
            "action_horizon": int(horizon),
            "action_dim": int(width),
            "denoise_steps": first.num_steps,
            "prefix_cache_hit": prefix_cache_hit,
        },
    }
    if call.return_timing and timings is not None:
        reply["timings"] = dict(timings)
    if call.unused:
        reply["warnings"] = [
            {"field": path, "message": "accepted and not used: this server does not pass it to the model yet"}
            for path in call.unused
        ]
    return reply


# -- metadata --------------------------------------------------------------------------------------

# The runtime (cosmos3_runtime) serves Cosmos3 checkpoints only.
POLICY_FAMILY = "cosmos3"
# The wire dtype of every action array this server sends.
ACTION_DTYPE = "float32"


def supported_resolutions(description: ModelDescription) -> list[list[int]]:
    """``[width, height]`` canvases of the model's tiers, when the engine describes them (SGLang's order)."""
    tiers = description.resolution_tiers
    sizes: list[list[int]] = []
    for tier, bins in sorted(description.canvases.items()):
        for canvas in bins if tier in tiers else ():
            if [canvas.width, canvas.height] not in sizes:
                sizes.append([canvas.width, canvas.height])
    return sizes


def sglang_metadata(
    description: ModelDescription,
    *,
    max_batch_size: int,
    openpi_websocket: bool,
    default_fps: float | None,
) -> dict[str, Any]:
    """SGLang's metadata keys for the loaded model.

    ``max_batch_size``: the most action chunks one request may ask for (images × candidates);
    ``openpi_websocket``: whether the server answers openpi clients; ``default_fps``: the rate a
    request without ``fps`` runs at. The rest is the loaded model's description.
    """
    action_modes = list(description.action_modes)
    defaults = description.defaults
    domains = description.domains.values()
    widths = {domain.raw_action_dim for domain in domains}
    state_dims = {domain.state_dim for domain in domains}
    modalities = (["image"] if "policy" in action_modes else []) + (["video"] if action_modes else [])
    return {
        "object": "action.metadata",
        "model": public_model_name(description.model),
        "weights": served_weights(description),
        "policy_family": POLICY_FAMILY,
        "input": {
            "modalities": modalities,
            "supported_resolutions": supported_resolutions(description),
            "resolution_tiers": list(description.resolution_tiers),
            # One state width for every domain, or None: none (images only) or the requested domain's.
            "state_dim": state_dims.pop() if len(state_dims) == 1 else None,
        },
        "output": {
            "action_type": "continuous",
            "action_horizon": defaults.action_horizon,
            # One width for every domain, or None: it is the requested domain's raw_action_dim.
            "action_dim": widths.pop() if len(widths) == 1 else None,
            "padded_action_dim": description.action_dim,
            "dtype": ACTION_DTYPE,
        },
        "defaults": {
            "action_mode": "policy" if "policy" in action_modes else next(iter(action_modes), None),
            "action_horizon": defaults.action_horizon,
            "num_inference_steps": defaults.num_steps,
            "guidance_scale": defaults.guidance_scale,
            "resolution_tier": defaults.resolution_tier,
            "fps": default_fps,
        },
        "capabilities": {
            "action_modes": action_modes,
            "realtime_websocket": True,
            "openpi_websocket": openpi_websocket,
            "batch_inputs": max_batch_size > 1 and "policy" in action_modes,
            "max_batch_size": max_batch_size,
            "batched_action_modes": ["policy"] if max_batch_size > 1 and "policy" in action_modes else [],
            "multiple_candidates": max_batch_size > 1 and bool(action_modes),
        },
    }


def merge_metadata(ours: Mapping[str, Any], sglang: Mapping[str, Any]) -> dict[str, Any]:
    """``ours`` with SGLang's keys added: objects (``defaults``, ``capabilities``) merged key by key.

    A key both have keeps our value (they agree where both exist); ``object`` becomes SGLang's
    ``"action.metadata"``, the one value SGLang clients compare.
    """
    merged = dict(ours)
    for key, value in sglang.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **{k: v for k, v in value.items() if k not in merged[key]}}
        elif key == "object" or key not in merged:
            merged[key] = value
    return merged
