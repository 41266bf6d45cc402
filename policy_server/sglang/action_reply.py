"""SGLang's answer to ``POST /v1/actions/generations``: its ``action.generation`` envelope or its ``raw`` form.

:func:`build_reply` takes the checked call (:class:`.actions.ActionCall`) and one engine chunk per item;
``values`` are nested lists, or float32 arrays when the client asked for ``output_format: numpy`` (then
packed as msgpack).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cosmos3_runtime.requests import ActionResult

from .actions import ActionCall


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
