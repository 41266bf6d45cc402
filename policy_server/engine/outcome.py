"""What the engine made of one observation, as its owner receives it: a chunk, or a coded error.

The engine raises the runtime's typed errors (``cosmos3_runtime.errors``: a ``code``, a ``message`` and the
``field`` at fault); they become protocol error codes here, in one place, for every way a request came in.
"""

from __future__ import annotations

from dataclasses import dataclass

from cosmos3_runtime.requests import ActionChunk
from robot_clients.protocol import ErrorCode


def engine_error_code(runtime_code: str, field: str | None) -> str:
    """The protocol code for an error the engine raised (``cosmos3_runtime.errors``).

    A value is wrong whoever finds it: the engine's ``invalid_request`` naming a field is the same
    ``invalid_field`` the server answers when it finds the value wrong first. A checkpoint problem at
    request time is the server's failure, not the client's.
    """
    if runtime_code == ErrorCode.INVALID_REQUEST and field is not None:
        return ErrorCode.INVALID_FIELD
    if runtime_code == "checkpoint_error":
        return ErrorCode.ENGINE_ERROR
    return runtime_code


@dataclass
class EngineOutcome:
    """What the engine made of one observation: a chunk, or an error to send to the client."""

    chunk: ActionChunk | None = None
    error_code: str | None = None
    error_message: str | None = None
    error_field: str | None = None
    engine_ms: float = 0.0
    done_at: float = 0.0
