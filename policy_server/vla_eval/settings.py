"""What a vla-eval harness does not say for itself: the server's ``--vla-eval-*`` settings.

vla-eval's ``episode_start`` carries the task (its text becomes the prompt) and the mode, not an
embodiment or a horizon. Those come from here, unless the ``episode_start`` payload carries a
``settings`` map of its own (:data:`EPISODE_SETTINGS`), which then holds for that episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from cosmos3_runtime.description import ModelDescription
from robot_clients.protocol import ErrorCode, ProtocolError

from ..sessions.config import SessionConfig, merge_session_config
from .chunks import ChunkPlan
from .mapping import ObservationMapping

VLA_EVAL_PATH = "/v1/vla-eval"
# The session settings an episode may set for itself, and the chunk plan's.
SESSION_KEYS = ("domain_name", "action_horizon", "view_point", "prompt", "resolution_tier", "seed", "num_steps")
PLAN_KEYS = ("chunk", "ask_ahead", "execute")
EPISODE_SETTINGS = SESSION_KEYS + PLAN_KEYS


@dataclass(frozen=True)
class VlaEvalSettings:
    """``None``: the model's default for the domain."""

    domain_name: str | None = None
    action_horizon: int | None = None
    view_point: str | None = None
    prompt: str = ""  # when neither the observation nor the task has a text
    resolution_tier: int | None = None
    seed: int | None = None
    plan: ChunkPlan = field(default_factory=ChunkPlan)
    mapping: ObservationMapping = field(default_factory=ObservationMapping)
    strict_state: bool = False  # refuse a state sent to a domain that does not condition on it

    def episode(self, description: ModelDescription, overrides: dict[str, Any]) -> tuple[SessionConfig, ChunkPlan]:
        """The session config and chunk plan of one episode: these settings, then the episode's own
        ``settings`` over them; :class:`ProtocolError` naming a bad one."""
        for key in overrides:
            if key not in EPISODE_SETTINGS:
                raise ProtocolError(
                    ErrorCode.INVALID_FIELD,
                    f"unknown episode setting `{key}`; an episode may set {', '.join(EPISODE_SETTINGS)}",
                    f"settings/{key}",
                )
        values = {
            "domain_name": self.domain_name or description.defaults.domain_name,
            "action_mode": "policy",
            "action_horizon": self.action_horizon,
            "view_point": self.view_point,
            "prompt": self.prompt,
            "resolution_tier": self.resolution_tier,
            "seed": self.seed,
        }
        values = {k: v for k, v in values.items() if v is not None}
        values.update({k: v for k, v in overrides.items() if k in SESSION_KEYS})
        config = merge_session_config(None, values, description)
        plan = self.plan
        for key in PLAN_KEYS:
            if key in overrides:
                value = overrides[key]
                if key != "chunk" and value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise ProtocolError(ErrorCode.INVALID_FIELD, f"`{key}` must be an integer", f"settings/{key}")
                plan = replace(plan, **{key: value})
        horizon = config.resolved(description)["action_horizon"]
        return config, plan.checked(int(horizon))
