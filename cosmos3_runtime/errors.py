"""Typed errors raised by the runtime.

Every error a caller can cause carries a stable ``code`` (for protocols and logs), a human ``message``
and the ``field`` of the request it is about, so the network side can answer a robot precisely without
ever showing it a traceback.
"""

from __future__ import annotations


class RuntimeErrorBase(Exception):
    """Base of every error the runtime raises on purpose."""

    code = "runtime_error"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return f"{self.message} (field: {self.field})" if self.field else self.message


class InvalidRequestError(RuntimeErrorBase, ValueError):
    """A request value is malformed: wrong type, dtype, rank, size or range."""

    code = "invalid_request"


class MissingFieldError(InvalidRequestError):
    """A field this request needs is absent (for example ``state``, for a domain that conditions on it)."""

    code = "missing_field"


class MissingMediumError(InvalidRequestError):
    """A request lacks the camera input its mode needs: an image (``policy``), a clip (``inverse_dynamics``).

    Its runtime code is ``invalid_request``, as the engine has always answered it; the server's protocols name
    it a missing field (``missing_field``), as they did when each door found it itself."""


class InvalidFieldError(InvalidRequestError):
    """A field has the wrong type, shape or value for this domain (for example a ``state`` of the wrong width)."""

    code = "invalid_field"


class UnknownDomainError(InvalidRequestError):
    """The requested embodiment ``domain_name`` is not one the loaded model knows."""

    code = "unknown_domain"


class UnsupportedModeError(InvalidRequestError):
    """The loaded checkpoint cannot serve this ``action_mode`` (for example it has no action head)."""

    code = "unsupported_mode"


class UnsupportedTierError(InvalidRequestError):
    """The requested resolution tier is not one this variant supports."""

    code = "unsupported_tier"


class CheckpointError(RuntimeErrorBase):
    """A checkpoint could not be found, downloaded or understood."""

    code = "checkpoint_error"


class EngineError(RuntimeErrorBase):
    """The model failed while running a valid request."""

    code = "engine_error"
