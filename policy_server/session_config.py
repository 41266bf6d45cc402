"""A session's settings: what a ``configure`` frame sets and every later observation inherits.

Settings are checked here against the loaded model's ``describe()`` as soon as they arrive, so a robot
learns that its domain or tier is wrong from the ``configure`` reply, not from the first observation.
The engine checks requests again (it is the authority); this is the early, cheap answer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cosmos3_runtime.requests import ActionRequest

from .camera_composition import compose_named
from .protocol import ErrorCode, ObservationFrame, ProtocolError

# Modes the realtime endpoint serves. forward_dynamics (video rollouts) belongs to the HTTP job API.
REALTIME_MODES = ("policy", "inverse_dynamics")


@dataclass(frozen=True)
class SessionConfig:
    """Settings of one session. ``None`` means "the model's default for this variant and domain"."""

    domain_name: str
    action_mode: str = "policy"
    action_horizon: int | None = None
    prompt: str = ""
    resolution_tier: int | None = None
    view_point: str | None = None
    seed: int | None = None
    num_steps: int | None = None
    guidance_scale: float | None = None
    fps: float = 24.0
    # The robot's control rate, as the robot declares it: shown to operators, never used by the model.
    control_hz: float | None = None

    def resolved(self, description: dict[str, Any]) -> dict[str, Any]:
        """The values the engine will use, defaults filled in: what the ``session`` reply shows."""
        defaults = description.get("defaults", {})
        domain = description.get("domains", {}).get(self.domain_name, {})
        values = dataclasses.asdict(self)
        values["action_horizon"] = self.action_horizon or domain.get("default_horizon") or defaults.get(
            "action_horizon"
        )
        values["view_point"] = self.view_point or domain.get("view_point") or defaults.get("view_point")
        for name in ("resolution_tier", "num_steps", "guidance_scale"):
            if values[name] is None:
                values[name] = defaults.get(name)
        values["domain_id"] = domain.get("domain_id")
        values["raw_action_dim"] = domain.get("raw_action_dim")
        return values

    def action_request(self, obs: ObservationFrame, description: dict[str, Any] | None = None) -> ActionRequest:
        """The engine request for one observation of this session (per-frame overrides win).

        Named ``images`` are composed into one frame per the view point (the session's, else the
        domain's from ``description``): :mod:`policy_server.camera_composition`.
        """
        values = {
            "domain_name": self.domain_name,
            "action_mode": self.action_mode,
            "prompt": self.prompt,
            "action_horizon": self.action_horizon,
            "resolution_tier": self.resolution_tier,
            "view_point": self.view_point,
            "seed": self.seed,
            "num_steps": self.num_steps,
            "guidance_scale": self.guidance_scale,
            "fps": self.fps,
        }
        values.update(obs.overrides)
        image = obs.image
        if obs.images is not None:
            domain = (description or {}).get("domains", {}).get(self.domain_name, {})
            image = compose_named(obs.images, values["view_point"] or domain.get("view_point"))
        return ActionRequest(image=image, video=obs.video, prefix_actions=obs.prefix_actions, **values)


def _reject(code: str, message: str, field: str) -> ProtocolError:
    return ProtocolError(code, message, field)


def merge_session_config(
    current: SessionConfig | None, settings: dict[str, Any], description: dict[str, Any]
) -> SessionConfig:
    """Apply a ``configure`` frame's settings over the current config, checking each against the model."""
    if current is None:
        if "domain_name" not in settings:
            raise _reject(
                ErrorCode.MISSING_FIELD,
                "the first `configure` of a session needs `domain_name` (see `domains` in the metadata)",
                "domain_name",
            )
        config = SessionConfig(domain_name=settings["domain_name"])
    else:
        config = current
    config = dataclasses.replace(config, **settings)

    domains = description.get("domains", {})
    if config.domain_name not in domains:
        raise _reject(
            ErrorCode.UNKNOWN_DOMAIN,
            f"unknown domain {config.domain_name!r}; this model knows: {', '.join(sorted(domains)) or 'none'}",
            "domain_name",
        )
    modes = [m for m in description.get("modes", []) if m in REALTIME_MODES]
    if config.action_mode not in modes:
        if config.action_mode == "forward_dynamics":
            hint = "forward_dynamics produces video; use the HTTP /v1/videos API"
        else:
            hint = f"this model serves {', '.join(modes) or 'no action modes'} here"
        raise _reject(
            ErrorCode.UNSUPPORTED_MODE, f"action_mode {config.action_mode!r} is not supported: {hint}", "action_mode"
        )
    tiers = description.get("resolution_tiers") or []
    if config.resolution_tier is not None and tiers and config.resolution_tier not in tiers:
        raise _reject(
            ErrorCode.UNSUPPORTED_TIER,
            f"resolution_tier {config.resolution_tier} is not supported by this "
            f"{description.get('variant', '')} model; choose one of {tiers}",
            "resolution_tier",
        )
    view_points = description.get("view_points") or []
    if config.view_point is not None and view_points and config.view_point not in view_points:
        raise _reject(
            ErrorCode.INVALID_FIELD,
            f"unknown view_point {config.view_point!r}; choose one of {view_points}",
            "view_point",
        )
    horizon = description.get("action_horizon") or {}
    if config.action_horizon is not None:
        low, high, multiple = horizon.get("min", 1), horizon.get("max"), horizon.get("multiple_of", 1) or 1
        if config.action_horizon < low or (high is not None and config.action_horizon > high) or (
            config.action_horizon % multiple
        ):
            raise _reject(
                ErrorCode.INVALID_FIELD,
                f"action_horizon {config.action_horizon} is out of range: between {low} and {high}, "
                f"a multiple of {multiple}",
                "action_horizon",
            )
    if config.num_steps is not None and config.num_steps < 1:
        raise _reject(ErrorCode.INVALID_FIELD, f"num_steps must be >= 1, got {config.num_steps}", "num_steps")
    if config.guidance_scale is not None and config.guidance_scale < 0:
        raise _reject(
            ErrorCode.INVALID_FIELD, f"guidance_scale must be >= 0, got {config.guidance_scale}", "guidance_scale"
        )
    if config.fps <= 0:
        raise _reject(ErrorCode.INVALID_FIELD, f"fps must be > 0, got {config.fps}", "fps")
    if config.control_hz is not None and config.control_hz <= 0:
        raise _reject(ErrorCode.INVALID_FIELD, f"control_hz must be > 0, got {config.control_hz}", "control_hz")
    return config

