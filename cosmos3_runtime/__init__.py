"""The model side: loads Cosmos3 checkpoints through diffusers and answers action and video requests.

No networking lives here. The public API is the engine and its request/result types::

    from cosmos3_runtime import Cosmos3Engine, ActionRequest
    engine = Cosmos3Engine.load("nvidia/Cosmos3-...")   # or a local folder
    result = engine.predict_actions(ActionRequest(domain_name="bridge_orig_lerobot", image=frame))

Heavy imports (torch, diffusers) happen when the engine module is first used, so importing the
request types stays cheap.
"""

import logging as _logging

from .description import EngineLimits, ModelDescription, RequestDefaults
from .errors import (
    CheckpointError,
    EngineError,
    InvalidFieldError,
    InvalidRequestError,
    MissingFieldError,
    RuntimeErrorBase,
    UnknownDomainError,
    UnsupportedModeError,
    UnsupportedTierError,
)
from .requests import ActionRequest, ActionResult, Timing, VideoRequest, VideoResult

# diffusers imports torchao (for --quantization) whenever it is installed, and on a CPU-only torch that import
# warns: torchao's CUDA kernels (.so files) cannot load, torch's pytree notes torchao's enums, and diffusers
# finds no classes for checkpoints saved already quantized. None concerns a load through TorchAoConfig, and
# each would stand before a refusal's one line and in every server's log.
for _name in ("torchao", "torch.utils._pytree", "diffusers.quantizers.torchao.torchao_quantizer"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)

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
