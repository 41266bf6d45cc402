"""The HTTP API's typed errors: one exception type, one JSON shape, stable codes.

They are the sidecar's (``policy_server.http``) and those of SGLang's dialect (``policy_server.sglang``), on
the sidecar's routes and in its lock-step mode on the WebSocket port; they live outside both packages so
that SGLang's needs nothing of the sidecar. Every error the sidecar answers has the same body, whatever went
wrong::

    {"error": {"code": "unknown_domain", "message": "unknown domain 'x'; ...", "field": "domain_name"}}

``code`` is stable (clients branch on it; never rename one, only add), ``message`` says what to fix,
``field`` names the offending request field when there is one. :class:`ApiError` is the protocol's
:class:`~robot_clients.protocol.CodedError` with an HTTP status. The codes of the native protocol
(:class:`robot_clients.protocol.ErrorCode`) keep their meaning here; :class:`HttpErrorCode` adds the
ones only HTTP has. Internals (tracebacks, paths, exception names) never reach the client: an
unexpected failure is logged with a reference the client gets instead.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from robot_clients.protocol import CodedError, ErrorCode


class HttpErrorCode:
    """Error codes of the HTTP API beyond the native protocol's :class:`ErrorCode`."""

    BAD_BODY = "bad_body"  # the body is not valid JSON / msgpack / multipart, or not an object
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # Content-Type (of the body or of an upload) refused
    # The body is bigger than the sidecar accepts, or its media would decode to more than it decodes.
    PAYLOAD_TOO_LARGE = ErrorCode.PAYLOAD_TOO_LARGE
    NOT_FOUND = "not_found"  # no such route, or no such video job
    METHOD_NOT_ALLOWED = "method_not_allowed"
    NOT_ACCEPTABLE = "not_acceptable"  # Accept names no format this endpoint can answer in
    NOT_READY = "not_ready"  # the model is still loading (retry after Retry-After seconds)
    SHUTTING_DOWN = "shutting_down"
    QUEUE_FULL = "queue_full"  # too many video jobs are waiting; retry later
    VIDEO_NOT_READY = "video_not_ready"  # content asked for before the job completed
    VIDEO_FAILED = "video_failed"  # content asked for a job that failed
    TIMEOUT = "timeout"  # a one-shot request waited longer than the server allows
    INTERNAL_ERROR = "internal_error"  # a bug of ours; the server log has details under the reference
    UNAUTHORIZED = "unauthorized"  # no valid bearer token (only with --auth-token/--auth-token-file)
    STORAGE_FULL = "storage_full"  # the data directory's disk is full: the job or its result was not stored
    TOO_MANY_IN_FLIGHT = "too_many_in_flight"  # this client already has its most action generations in flight
    REQUEST_TIMEOUT = "request_timeout"  # the request's headers or body came too slowly (connection closed)
    TOO_MANY_CONNECTIONS = "too_many_connections"  # the sidecar's or this address's connection cap (closed)
    SERVER_BUSY = "server_busy"  # other requests' bodies fill --http-max-buffered-mib; retry shortly


# The HTTP status each code is answered with. Codes not listed are client errors (400).
_STATUS: dict[str, int] = {
    HttpErrorCode.UNSUPPORTED_MEDIA_TYPE: HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
    HttpErrorCode.PAYLOAD_TOO_LARGE: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    HttpErrorCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    HttpErrorCode.METHOD_NOT_ALLOWED: HTTPStatus.METHOD_NOT_ALLOWED,
    HttpErrorCode.NOT_ACCEPTABLE: HTTPStatus.NOT_ACCEPTABLE,
    HttpErrorCode.NOT_READY: HTTPStatus.SERVICE_UNAVAILABLE,
    HttpErrorCode.SHUTTING_DOWN: HTTPStatus.SERVICE_UNAVAILABLE,
    HttpErrorCode.QUEUE_FULL: HTTPStatus.TOO_MANY_REQUESTS,
    HttpErrorCode.TOO_MANY_IN_FLIGHT: HTTPStatus.TOO_MANY_REQUESTS,
    ErrorCode.RATE_LIMITED: HTTPStatus.TOO_MANY_REQUESTS,
    HttpErrorCode.VIDEO_NOT_READY: HTTPStatus.CONFLICT,
    HttpErrorCode.VIDEO_FAILED: HTTPStatus.CONFLICT,
    HttpErrorCode.TIMEOUT: HTTPStatus.GATEWAY_TIMEOUT,
    HttpErrorCode.INTERNAL_ERROR: HTTPStatus.INTERNAL_SERVER_ERROR,
    ErrorCode.ENGINE_ERROR: HTTPStatus.INTERNAL_SERVER_ERROR,
    ErrorCode.ENGINE_TIMEOUT: HTTPStatus.GATEWAY_TIMEOUT,
    HttpErrorCode.UNAUTHORIZED: HTTPStatus.UNAUTHORIZED,
    HttpErrorCode.STORAGE_FULL: HTTPStatus.INSUFFICIENT_STORAGE,
    HttpErrorCode.REQUEST_TIMEOUT: HTTPStatus.REQUEST_TIMEOUT,
    HttpErrorCode.TOO_MANY_CONNECTIONS: HTTPStatus.SERVICE_UNAVAILABLE,
    HttpErrorCode.SERVER_BUSY: HTTPStatus.SERVICE_UNAVAILABLE,
}


def status_for(code: str) -> int:
    """The HTTP status a code is answered with (400 for every client-side mistake)."""
    return int(_STATUS.get(code, HTTPStatus.BAD_REQUEST))


class ApiError(CodedError):
    """An error to answer the client with, and the HTTP status (and headers) it goes with. Raise it
    anywhere in a request's handling."""

    def __init__(
        self,
        code: str,
        message: str,
        field: str | None = None,
        *,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(code, message, field)
        self.status = status if status is not None else status_for(code)
        self.headers = headers or {}

    @classmethod
    def of(cls, error: CodedError) -> ApiError:
        """``error`` (a protocol or settings check's) as an HTTP answer: same code, message and field."""
        return error if isinstance(error, ApiError) else cls(error.code, error.message, error.field)

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}
