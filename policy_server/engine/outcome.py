"""What the engine made of one request, as its owner receives it: a chunk, or a coded error.

The engine raises the runtime's typed errors (``cosmos3_runtime.errors``: a ``code``, a ``message`` and the
``field`` at fault). :func:`engine_failure` turns whatever an engine call raised into the
:class:`~robot_clients.protocol.CodedError` a client sees, in one place for every way a request came in
(a robot's observation, an HTTP action generation, a video job). One exception is not a failure of the
request at all: :class:`EngineLost` (the engine itself went away under the call) is handed back, not answered.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from cosmos3_runtime.errors import RuntimeErrorBase
from cosmos3_runtime.requests import ActionResult
from robot_clients.protocol import CodedError, ErrorCode

logger = logging.getLogger(__name__)


class EngineLost(Exception):
    """The engine went away under a call (a remote replica died): the work in hand was not done.

    It is not the request's failure, so it is never turned into a client error: whoever catches engine
    failures (the worker's calls, a video task's ``run``) lets it through, and the worker hands the
    observations and tasks of that call to its ``on_engine_lost`` (the Ray backend queues them again
    on another replica). Raised only by engines that can be lost; the local engine never raises it.
    """


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


def engine_failure(exc: BaseException, what: str, context: str) -> CodedError:
    """The error a client sees for an engine call that raised ``exc`` on its ``what`` (``observation``,
    ``job``). The runtime's typed errors are the client's to see (a stable code, a message, a field); any
    other failure is ours: its traceback goes to the log (about ``context``), the client gets a reference."""
    if isinstance(exc, RuntimeErrorBase):
        return CodedError(engine_error_code(exc.code, exc.field), exc.message, exc.field)
    reference = uuid.uuid4().hex[:12]
    logger.error("the engine failed on %s (ref %s)", context, reference, exc_info=exc)
    return CodedError(
        ErrorCode.ENGINE_ERROR, f"the model failed on this {what}; the server log has details (ref {reference})"
    )


@dataclass
class EngineOutcome:
    """What the engine made of one observation: a chunk, or (``chunk`` None) the error to send to the client."""

    chunk: ActionResult | None = None
    error: CodedError | None = None
    engine_ms: float = 0.0
    done_at: float = 0.0
