"""SGLang's multipart ``POST /v1/actions/generations`` form, turned into the envelope :mod:`.actions` parses.

SGLang's form flattens its envelope: ``request_id``, ``prompt``, the observation as one of the uploads
:data:`FORM_UPLOADS`, ``extra_body``/``extra_params`` as JSON objects, and every parameter as a text field.
:func:`envelope_from_form` rebuilds the envelope, so a form is checked by the same parser as a JSON body.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from .actions import PARAMETER_KEYS, UNREAD_KEYS, check_known_keys
from .parameters import invalid, merge_extra


class FormUpload(Protocol):
    """A file part of the form (such as :class:`policy_server.http.codecs.Upload`)."""

    data: bytes
    content_type: str


FORM_UPLOADS = ("image_reference", "video_reference", "input_reference")
FORM_RUNTIME_FIELDS = ("response_format", "output_format", "return_timing")


def is_sglang_form(names: Iterable[str], native_fields: Iterable[str]) -> bool:
    """Whether a multipart form is SGLang's: it has a field our flat form does not (``input_reference``, ...)."""
    return bool(set(names) - set(native_fields))


def _form_value(value: str) -> Any:
    """A form field's text as SGLang reads it: JSON when it parses (``30``, ``true``), else the text."""
    if not value.strip():
        return None
    try:
        return json.loads(value)
    except ValueError:
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
            runtime[name] = _form_value(value)
        elif name == "input_reference":
            observation["input_reference"] = value  # text: base64 (a path is refused when parsed)
        elif name in UNREAD_KEYS:
            check_known_keys({name: value}, (), "")
        elif name in PARAMETER_KEYS:
            parameters[name] = _form_value(value)
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
