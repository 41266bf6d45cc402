"""The model side: loads Cosmos3 checkpoints through diffusers and answers action and video requests.

No networking lives here. The public API is the engine and its request/result types::

    from cosmos3_runtime import Cosmos3Engine, ActionRequest
    engine = Cosmos3Engine.load("nvidia/Cosmos3-...")   # or a local folder
    result = engine.predict_actions(ActionRequest(domain_name="bridge_orig_lerobot", image=frame))

Heavy imports (torch, diffusers) happen when the engine module is first used, so importing the
request types stays cheap.
"""

from .description import EngineLimits, ModelDescription, RequestDefaults
from .errors import (
    CheckpointError,
    EngineError,
    InvalidFieldError,
    InvalidRequestError,
    MissingFieldError,
    MissingMediumError,
    RuntimeErrorBase,
    UnknownDomainError,
    UnsupportedModeError,
    UnsupportedTierError,
)
from .requests import ActionRequest, ActionResult, Timing, VideoRequest, VideoResult

__all__ = [
    "ActionRequest",
    "ActionResult",
    "CheckpointError",
    "Cosmos3Engine",
    "EngineError",
    "EngineLimits",
    "InvalidFieldError",
    "InvalidRequestError",
    "MissingFieldError",
    "MissingMediumError",
    "ModelDescription",
    "RequestDefaults",
    "RuntimeErrorBase",
    "Timing",
    "UnknownDomainError",
    "UnsupportedModeError",
    "UnsupportedTierError",
    "VideoRequest",
    "VideoResult",
    "build_tiny_checkpoint",
    "inspect_checkpoint",
]


def __getattr__(name: str) -> object:
    if name == "Cosmos3Engine":
        from .engine import Cosmos3Engine

        return Cosmos3Engine
    if name == "build_tiny_checkpoint":
        from .random_checkpoints import build_tiny_checkpoint

        return build_tiny_checkpoint
    if name == "inspect_checkpoint":
        from .checkpoints import inspect_checkpoint

        return inspect_checkpoint
    raise AttributeError(name)
