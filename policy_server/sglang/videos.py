"""SGLang's ``POST /v1/videos`` field names, mapped onto ours.

SGLang (and OpenAI's Videos API, which it extends) sends a flat body, JSON or multipart, whose Cosmos3
``forward_dynamics`` fields are::

    prompt, input_reference (the first frame), action (T×D), action_mode, domain_name | domain_id +
    raw_action_dim, action_fps, action_view_point, action_normalization, num_inference_steps,
    guidance_scale, num_frames, fps, seed, size ("WIDTHxHEIGHT") | width + height, seconds,
    negative_prompt, n, extra_params / extra_body (JSON objects of more of these)

:func:`video_fields` turns such a body into the fields of our ``VideoCreateParams`` (our own names pass
through unchanged), so the route runs its own checks (:func:`policy_server.http.requests.video_submission`)
and :meth:`~policy_server.sglang.parameters.Mapped.relabel` names the client's field in their errors.
What only describes the video (``num_frames``, ``seconds``, ``size``) must agree with what the actions
and the first frame already decide; what this runtime cannot do (a negative prompt, several outputs,
guardrails, video-to-video inputs) is refused rather than ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cosmos3_runtime.description import ModelDescription

from .media import refuse_paths
from .parameters import (
    Mapped,
    canvas_tier,
    check_normalization,
    frame_rate,
    integer,
    invalid,
    merge_extra,
    number,
    parse_size,
    refuse_guardrails,
    resolve_domain,
    tier_for_size,
)

# Our VideoCreateParams fields: they keep their meaning.
NATIVE_FIELDS = (
    "action",
    "input_reference",
    "domain_name",
    "prompt",
    "action_mode",
    "fps",
    "seed",
    "num_steps",
    "guidance_scale",
    "resolution_tier",
    "view_point",
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
    ``seconds`` is checked against it. Raises :class:`~policy_server.http.errors.ApiError` naming the
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
