"""SGLang action envelopes for the tests: build one, parse it, and turn it into engine requests as the route does.

Shared by ``test_sglang_actions.py`` (what the envelope carries) and ``test_sglang_parameters.py`` (its
parameters and the multipart form).
"""

from __future__ import annotations

import pytest
from sidecar_fixtures import png_b64, rgb

from policy_server.foundation.api_errors import ApiError
from policy_server.http.requests import action_request
from policy_server.sglang.actions import parse_action_envelope

POLICY = {"action_mode": "policy", "domain_name": "droid_lerobot"}


def envelope(image=None, *, parameters=None, **inputs):
    observation = {} if image is None else {"image": image}
    return {
        "input": {"task": "pick up the block", "observation": observation, **inputs},
        "parameters": {**POLICY, **(parameters or {})},
    }


def parse(body, description, max_items=4, **options):
    return parse_action_envelope(body, description, max_items=max_items, **options)


def requests_of(body, description, max_items=4):
    """The engine requests an envelope becomes, as the route will build them."""
    call = parse(body, description, max_items)
    built = []
    for item in call.items:
        try:
            built.append(action_request(item.fields, description))
        except ApiError as exc:
            raise item.relabel(exc) from None
    return call, built


def refused(body, description, max_items=4):
    """The ApiError an envelope is refused with, parsed or built (its code, field and message)."""
    with pytest.raises(ApiError) as info:
        requests_of(body, description, max_items)
    return info.value


IMAGE = rgb(32)


def settings(description, **parameters):
    """The engine request of a one-image envelope with these parameters."""
    _, (request,) = requests_of(envelope(png_b64(IMAGE), parameters=parameters), description)
    return request
