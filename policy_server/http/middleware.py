"""Every request's outer layer, and every error's one JSON shape.

:class:`SidecarMiddleware` bounds request bodies, times every request for the metrics and turns a bug of
ours into a typed 500; :func:`install_error_handlers` answers FastAPI's and Starlette's own errors
(validation, unknown path, wrong method) in the shape of :class:`~.errors.ApiError`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from robot_clients.protocol import ErrorCode

from ..metrics import ServerMetrics
from .bodies import content_length
from .errors import ApiError, HttpErrorCode

logger = logging.getLogger(__name__)

# The endpoint label of a request no route matched (and of connections refused before any route).
UNMATCHED = "(unmatched)"


def endpoint(scope: dict) -> str:
    """The route template (``/v1/videos/{video_id}``), never the raw path: bounded label cardinality."""
    route = scope.get("route")
    return getattr(route, "path", None) or UNMATCHED


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class SidecarMiddleware:
    """Pure ASGI: bounds request bodies, times every request for the metrics, and turns a bug of ours
    into a typed 500 (with a log reference) instead of a traceback."""

    def __init__(self, app: Callable, *, metrics: ServerMetrics, max_body_bytes: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        state = {"status": 500, "sent": False}
        limit = self.max_body_bytes

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                state["status"], state["sent"] = message["status"], True
            await send(message)

        received = 0

        async def receive_wrapper() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(HttpErrorCode.PAYLOAD_TOO_LARGE, f"the body is larger than {limit} bytes")
            return message

        try:
            declared = content_length(scope)
            if declared is not None and declared > limit:
                error = ApiError(
                    HttpErrorCode.PAYLOAD_TOO_LARGE,
                    f"the body is {declared} bytes; this server accepts at most {limit}",
                )
                self.metrics.observe_http_error(endpoint(scope), error.code)
                await error_response(error)(scope, receive, send_wrapper)
            else:
                await self.app(scope, receive_wrapper, send_wrapper)
        except ClientDisconnect:  # the client went away mid-body (or its body deadline closed it): nobody to answer
            state["status"] = 499
        except Exception:  # noqa: BLE001 - a bug of ours: log it, answer with a reference only
            reference = uuid.uuid4().hex[:12]
            logger.exception("HTTP %s %s failed (ref %s)", scope.get("method"), scope.get("path"), reference)
            if not state["sent"]:
                error = ApiError(
                    HttpErrorCode.INTERNAL_ERROR,
                    f"the server failed on this request; the log has details (ref {reference})",
                )
                self.metrics.observe_http_error(endpoint(scope), error.code)
                await error_response(error)(scope, receive, send_wrapper)
        finally:
            self.metrics.observe_http(
                endpoint(scope), scope.get("method", ""), state["status"], time.monotonic() - started
            )


def install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Answer every error of ``app`` in one JSON shape, counting each in ``metrics``."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        metrics.observe_http_error(endpoint(request.scope), exc.code)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(part) for part in first.get("loc", ()) if part not in ("query", "path", "body")]
        field_name = ".".join(loc) or None
        return await api_error(
            request,
            ApiError(ErrorCode.INVALID_FIELD, f"`{field_name}`: {first.get('msg', 'invalid value')}", field_name),
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {
            404: HttpErrorCode.NOT_FOUND,
            405: HttpErrorCode.METHOD_NOT_ALLOWED,
            413: HttpErrorCode.PAYLOAD_TOO_LARGE,
        }.get(exc.status_code, HttpErrorCode.BAD_BODY)
        message = {
            HttpErrorCode.NOT_FOUND: f"no endpoint at {request.url.path}; see /docs or /openapi.json",
            HttpErrorCode.METHOD_NOT_ALLOWED: f"{request.method} is not allowed on {request.url.path}",
        }.get(code, str(exc.detail))
        return await api_error(request, ApiError(code, message, status=exc.status_code, headers=exc.headers))
