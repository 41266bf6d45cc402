"""SGLang's request bodies on the sidecar's routes: telling them from ours, and turning them into engine requests.

The translation itself is :mod:`policy_server.sglang` (pure functions); this module is where the sidecar
meets it: which uploads a ``POST /v1/actions/generations`` form may carry (ours and SGLang's), whether a
decoded body is SGLang's envelope or our flat form (``docs/sglang.md``, "Telling the dialects apart"),
and the engine requests of an envelope, built by the same checks as our own requests
(:func:`policy_server.http.requests.action_request`), their errors naming the client's fields.
"""

from __future__ import annotations

from typing import Any

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.requests import ActionRequest
from robot_clients.protocol import FrameLimits

from ..sglang.actions import (
    FORM_UPLOADS,
    ActionCall,
    envelope_from_form,
    is_sglang_envelope,
    is_sglang_form,
    parse_action_envelope,
)
from . import codecs as http_codecs
from .errors import ApiError
from .requests import action_request
from .schemas import ActionGenerationParams

# The uploads an action generation form may carry: ours (`image`, `video`) and SGLang's (FORM_UPLOADS),
# each with the content types it may declare.
ACTION_UPLOADS = {
    "image": http_codecs.IMAGE_UPLOAD_TYPES,
    "video": http_codecs.VIDEO_UPLOAD_TYPES,
    **{name: http_codecs.IMAGE_UPLOAD_TYPES + http_codecs.VIDEO_UPLOAD_TYPES for name in FORM_UPLOADS},
}


def sglang_envelope(fields: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """SGLang's envelope if the decoded body (``kind``: its media type) is SGLang's, else None (ours).

    A JSON or msgpack body is SGLang's when it has the envelope's keys (``input``, ``parameters``, ...);
    a form when it has a field our flat form does not know (``image_reference``, ``task``, ...), and is
    then rebuilt as the envelope it flattens.
    """
    if kind == http_codecs.MULTIPART_TYPE:
        if not is_sglang_form(fields, ActionGenerationParams.model_fields):
            return None
        return envelope_from_form(list(fields.items()))
    return dict(fields) if is_sglang_envelope(fields) else None


def sglang_requests(
    envelope: dict[str, Any], description: ModelDescription, limits: FrameLimits, max_items: int, msgpack_reply: bool
) -> tuple[ActionCall, list[ActionRequest]]:
    """The checked envelope and one engine request per item (images × candidates, at most ``max_items``).

    Raises :class:`ApiError` naming the client's field (``parameters.num_inference_steps``, not ``num_steps``).
    """
    call = parse_action_envelope(envelope, description, max_items=max_items, msgpack_reply=msgpack_reply)
    return call, item_requests(call, description, limits)


def item_requests(
    call: ActionCall, description: ModelDescription, limits: FrameLimits | None = None
) -> list[ActionRequest]:
    """One engine request per item of a checked envelope, by our own checks; an error names the client's field."""
    requests = []
    for item in call.items:
        try:
            requests.append(action_request(item.fields, description, limits))
        except ApiError as exc:
            raise item.relabel(exc) from None
    return requests
