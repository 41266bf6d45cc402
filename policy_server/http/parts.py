"""The parts every route of the sidecar works with, handed to each router by the app factory."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cosmos3_runtime.description import ModelDescription
from robot_clients.protocol import FrameLimits

from ..context import ServerContext
from ..foundation.api_errors import ApiError, HttpErrorCode
from ..foundation.camera_intake import model_frame_limits
from ..metrics import ServerMetrics
from ..sidecar_settings import SidecarSettings
from ..videos.job_store import VideoJobStore
from ..videos.runner import VideoJobRunner
from .bodies import BodyBudget
from .turns import InFlightLimit


@dataclass(frozen=True)
class SidecarParts:
    """The sidecar's settings, the server it serves beside, and what the routes share."""

    settings: SidecarSettings
    host: ServerContext[Any]
    metrics: ServerMetrics
    # Body bytes held by all requests together (.bodies), and each client's action generations in flight.
    body_budget: BodyBudget
    turns: InFlightLimit
    store: VideoJobStore
    runner: VideoJobRunner

    def require_ready(self) -> ModelDescription:
        """The loaded model's description, or the 503 that says why there is none (yet)."""
        if self.host.stopping:
            raise ApiError(HttpErrorCode.SHUTTING_DOWN, "the server is shutting down")
        if not self.host.ready or self.host.description is None:
            raise ApiError(HttpErrorCode.NOT_READY, "the model is loading; retry shortly", headers={"Retry-After": "1"})
        return self.host.description

    def media_limits(self, description: ModelDescription) -> FrameLimits:
        """The bounds the server's sessions are checked against (the model's, the --max-image-side cap)
        with this sidecar's decoding budget."""
        limits = self.host.frame_limits if self.host.ready else model_frame_limits(description.limits)
        return dataclasses.replace(limits, max_decoded_bytes=self.settings.max_decoded_bytes)
