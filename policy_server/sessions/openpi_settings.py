"""What openpi clients cannot say for themselves: the server's ``--openpi-*`` settings for them.

Kept apart from the session (:mod:`.openpi`) so that the server's settings, and the host's view of them
(:mod:`.host`), can name this type without importing a session.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.description import ModelDescription
from .config import SessionConfig, merge_session_config
from .openpi_observation import CameraMapping


@dataclass(frozen=True)
class OpenpiSettings:
    """What openpi clients cannot say for themselves. ``None``: the model's default for the domain."""

    domain_name: str | None = None
    action_horizon: int | None = None
    action_mode: str = "policy"
    view_point: str | None = None
    prompt: str = ""  # used when an observation has no `prompt`
    resolution_tier: int | None = None
    seed: int | None = None
    cameras: CameraMapping = field(default_factory=CameraMapping)
    # A state sent to a domain that does not condition on it: refused (True), or accepted and counted unused.
    strict_state: bool = False

    def session_config(self, description: ModelDescription) -> SessionConfig:
        """Resolve against the loaded model; raises :class:`ProtocolError` naming a bad setting."""
        domain = self.domain_name or description.defaults.domain_name
        settings = {
            "domain_name": domain,
            "action_mode": self.action_mode.strip().lower(),
            "action_horizon": self.action_horizon,
            "view_point": self.view_point,
            "prompt": self.prompt,
            "resolution_tier": self.resolution_tier,
            "seed": self.seed,
        }
        return merge_session_config(None, {k: v for k, v in settings.items() if v is not None}, description)
