"""Every answer about what the server offers, built from the one typed
:class:`~cosmos3_runtime.description.ModelDescription` (its JSON form, ``as_json()``, where it is passed on).

* :func:`native_metadata`: the ``metadata`` frame a native session sends first;
* :func:`openpi_metadata`: the metadata dict an openpi session sends first;
* :func:`http_action_metadata`: the model's part of the sidecar's ``GET /v1/actions/metadata`` (the
  sidecar adds its own HTTP limits and capabilities);
* :func:`health`: the ``/healthz`` body, the same on the WebSocket port and the sidecar (the sidecar's
  ``status`` says whether the process is alive, ``engine`` what the engine is doing).

SGLang's keys are added to the native hello by its dialect and to the sidecar's answer by the sidecar
(``policy_server.sglang.lockstep_session.sglang_keys``). Nothing here imports FastAPI, a session or an
optional feature: the WebSocket-only server uses it too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.profiles import STATE_CONTRACT_FIELDS
from robot_clients import protocol

from .context import ServerContext
from .engine.backend import EngineBackend
from .foundation.camera_intake import ENCODED_FORMATS
from .openpi_settings import ALL_STATE_KEYS, OPENPI_SETTINGS, CameraMapping
from .session_config import SessionConfig

SERVER_NAME = "cosmos3-policy-server"

NATIVE_CAPABILITIES = {
    "streaming": True,
    "latest_observation_wins": True,
    "max_waiting_per_session": 1,
    "cancel": True,
    "reset": True,
    "deadlines": True,
    "prefix_actions": True,
    "session_controls": True,
    # A camera frame may be these formats' bytes in place of its array (a clip: a list of them).
    "encoded_images": sorted(ENCODED_FORMATS.values()),
}


def native_metadata(host: ServerContext[Any], session_id: str) -> protocol.MetadataFrame:
    """The native protocol's hello: the model, its domains and every limit a session is held to."""
    d = host.description
    assert d is not None, "sessions open once the model is ready"
    settings = host.settings
    described = d.as_json()
    limits = described["limits"]
    limits["max_image_side"] = host.frame_limits.max_image_side  # the --max-image-side cap, as enforced
    limits["max_decoded_bytes"] = host.frame_limits.max_decoded_bytes
    limits["max_message_bytes"] = settings.max_message_bytes
    limits["max_frame_values"] = settings.frame_budget.max_values
    limits["max_frame_depth"] = settings.frame_budget.max_depth
    limits["max_sessions"] = settings.max_sessions
    rate = settings.observation_rate
    limits["max_observations_per_s"] = rate.rate_hz if rate.enabled else None
    limits["observation_burst"] = rate.burst if rate.enabled else None
    session_limits = settings.session_limits
    limits["reply_timeout_s"] = session_limits.reply_timeout_s or None
    limits["idle_timeout_s"] = session_limits.idle_timeout_s or None
    limits["max_session_ids"] = settings.policy_sessions.max_per_connection  # `session_id`s per connection
    limits["session_id_idle_timeout_s"] = settings.policy_sessions.idle_timeout_s or None
    return protocol.MetadataFrame(
        session_id,
        {
            "server": SERVER_NAME,
            "model": public_model_name(d.model),
            "variant": d.variant,
            "modes": list(d.action_modes),
            "capabilities": dict(NATIVE_CAPABILITIES),
            "defaults": described["defaults"],
            "action_horizon": described["action_horizon"],
            "resolution_tiers": list(d.resolution_tiers),
            # Each served tier's canvases, so a robot can size its frames before sending
            # (robot_clients.camera_frames.canvas_bins).
            "canvases": described["canvases"],
            "view_points": list(d.view_points),
            "domains": {
                name: {
                    "domain_id": domain.domain_id,
                    "raw_action_dim": domain.raw_action_dim,
                    "default_horizon": domain.default_horizon,
                    "view_point": domain.view_point,
                    "max_prefix": domain.max_prefix,
                    **domain.state_contract,
                }
                for name, domain in d.domains.items()
            },
            "limits": limits,
            "device": d.device,
            "dtype": d.dtype,
            "weights": served_weights(d),
        },
    )


def openpi_metadata(
    d: ModelDescription | None,
    session_id: str,
    config: SessionConfig | None,
    cameras: CameraMapping,
    error: str | None,
    strict_state: bool = False,
) -> dict[str, Any]:
    """openpi's hello: what the server's ``--openpi-*`` settings resolved to, each setting openpi sessions take
    (``error``: why they do not fit).

    ``unused_state_keys``: the conventions' state keys this endpoint accepts and does not use (its domain has
    no ``state_dim``); empty where the domain conditions on state, or where ``strict_state`` refuses them.
    """
    assert d is not None, "sessions open once the model is ready"
    resolved = config.resolved(d) if config is not None else {}
    stateless = config is not None and resolved.get("state_dim") is None
    view_point = resolved.get("view_point")
    return {
        "server": SERVER_NAME,
        "protocol": "openpi",
        "session_id": session_id,
        "model": public_model_name(d.model),
        "variant": d.variant,
        **{name: resolved.get(name) for name in OPENPI_SETTINGS},
        "action_dim": resolved.get("raw_action_dim"),
        **{field: resolved.get(field) for field in STATE_CONTRACT_FIELDS},
        "unused_state_keys": list(ALL_STATE_KEYS) if stateless and not strict_state else [],
        "cameras": cameras.describe().get(view_point, []) if view_point is not None else [],
        "canvases": d.as_json()["canvases"],
        "encoded_images": sorted(ENCODED_FORMATS.values()),
        "weights": served_weights(d),
        "error": error,
    }


def http_action_metadata(
    host: ServerContext[Any], http_limits: Mapping[str, Any], http_capabilities: Mapping[str, Any]
) -> dict[str, Any]:
    """The fields of ``GET /v1/actions/metadata`` (the sidecar's ``ActionMetadata``): the model's, with
    the sidecar's own limits and capabilities (body sizes, formats, video retention) merged in."""
    d = host.description
    assert d is not None, "answered once the model is ready"
    settings = host.settings
    described = d.as_json()
    limits = described["limits"]
    limits["max_image_side"] = host.frame_limits.max_image_side
    limits.update(http_limits)
    limits["max_websocket_message_bytes"] = settings.max_message_bytes
    action_modes, video_modes = list(d.action_modes), list(d.video_modes)
    endpoints = {mode: "POST /v1/actions/generations" for mode in action_modes}
    endpoints.update({mode: "POST /v1/videos" for mode in video_modes})
    scheme = "wss" if settings.ssl_context is not None else "ws"
    endpoints["realtime"] = f"{scheme}://<host>:{host.port}/v1/actions/realtime"
    capabilities = {
        "realtime_websocket": True,
        "openpi_websocket": settings.openpi is not None,
        "action_generations": bool(action_modes),
        "video_jobs": bool(video_modes),
        "prefix_actions": "policy" in action_modes,
        "batching": settings.max_batch > 1,
        **http_capabilities,
    }
    return dict(
        model=public_model_name(d.model),
        variant=d.variant,
        is_distilled=d.is_distilled,
        is_edge=d.is_edge,
        modes=list(d.modes),
        action_modes=action_modes,
        video_modes=video_modes,
        endpoints=endpoints,
        domains=described["domains"],
        action_horizon=described["action_horizon"],
        resolution_tiers=list(d.resolution_tiers),
        view_points=list(d.view_points),
        defaults=described["defaults"],
        distilled_sigmas=described["distilled_sigmas"],
        limits=limits,
        capabilities=capabilities,
        device=d.device,
        dtype=d.dtype,
        weights=served_weights(d),
        topology=host.worker.topology() if host.worker is not None else {},
    )


def served_weights(d: ModelDescription | None) -> dict[str, Any] | None:
    """Which weights answer (quantization, checkpoint SHA-256, Hub commit), as every door states them; None
    before the model is loaded."""
    return d.weights.as_json() if d is not None and d.weights is not None else None


def engine_state(host: ServerContext[Any]) -> str:
    """``starting``, the worker's state (``loading``, ``warming_up``, ``ready``, ``restarting``, ``failed``,
    ...), or ``stopping``."""
    if host.stopping:
        return "stopping"
    return host.worker.state.value if host.worker is not None else "starting"


def engine_call(worker: EngineBackend | None) -> str:
    """What the engine runs now, for ``/healthz``: ``serving`` (work someone waits for: ``busy``), ``orphaned``
    (finishing a call whose every session closed or cancelled: it cannot be interrupted mid-forward, its
    result is discarded, and the engine is free once it returns), or ``idle``."""
    if worker is None:
        return "idle"
    if worker.busy:
        return "serving"
    return "orphaned" if worker.orphaned else "idle"


def public_model_name(model: str | None) -> str | None:
    """``model`` as anyone may see it: a Hub id as it is, a folder on the server by its last part only
    (its absolute path says how the server's disk is laid out)."""
    if model is None or not (os.path.isabs(model) or model.startswith((".", "~"))):
        return model
    return Path(model).name


def health(host: ServerContext[Any], liveness: bool = False, authorized: bool = False) -> tuple[int, dict[str, Any]]:
    """The ``/healthz`` answer: (HTTP status, body). Answered from the first millisecond, while loading.

    On the WebSocket port ``status`` is the engine's state and a failed or stopping server answers 503;
    on the sidecar (``liveness``) ``status`` is ``ok`` while the process serves (503 ``failed`` only when
    the engine failed to load). ``engine`` always carries the engine's state. ``/healthz`` is open to
    everyone; only a request with a valid token (``authorized``) sees where on the server the model lies.
    """
    worker, d = host.worker, host.description
    engine = engine_state(host)
    model = d.model if d is not None else None
    body = {
        "status": engine,
        "engine": engine,
        "model": model if authorized else public_model_name(model),
        "variant": d.variant if d is not None else None,
        "weights": served_weights(d),
        "protocol_version": protocol.PROTOCOL_VERSION,
        "sessions": len(host.sessions),
        "queue_depth": len(host.queue),
        "busy": bool(worker and worker.busy),
        "engine_call": engine_call(worker),
        "completed": worker.completed if worker else 0,
        "uptime_s": round(time.monotonic() - host.started_at, 3),
        "worker": worker.thread_settings if worker else {},
    }
    for name, part in host.health_parts.items():  # what the attached features report (the recording's state)
        body[name] = part()
    if liveness:
        body["status"] = "ok" if engine != "failed" else "failed"
        return (200 if engine != "failed" else 503), body
    return (200 if engine not in ("failed", "stopping") else 503), body
