"""Reading request bodies: the bytes all requests may hold together, and the fields each body carries.

:func:`read_fields` turns a request's body (JSON, msgpack or multipart) into plain fields with the
decoders of :mod:`.codecs`, holding its bytes against one :class:`BodyBudget` while it does;
:func:`body_schema` describes such a body in the OpenAPI schema.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from pydantic import BaseModel

from ..foundation.api_errors import ApiError, HttpErrorCode
from . import codecs as http_codecs
from .codecs import Upload
from .schemas import ErrorResponse

# The error answers most routes share, for the OpenAPI schema.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "invalid request (see `error.code` and `error.field`)"},
    503: {"model": ErrorResponse, "description": "the model is loading or the server is stopping"},
}


def content_length(scope: Mapping[str, Any]) -> int | None:
    """The request's declared ``Content-Length``; None when it has none (or not a number)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyBudget:
    """Bytes of request bodies (and uploads) the sidecar holds at once, over all requests.

    Each request is bounded by ``--max-body-mib``; this bounds them together, so that uploads stalled
    mid-body (each held until its body deadline) cannot add up to gigabytes. A request whose next chunk
    would pass the budget is answered 503 ``server_busy`` and its bytes are let go at once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> None:
        if self.held + size > self.limit:
            raise ApiError(
                HttpErrorCode.SERVER_BUSY,
                f"the server is holding {self.held / 2**20:.0f} MiB of other requests' bodies, its limit "
                f"(--http-max-buffered-mib {self.limit / 2**20:.0f}); retry shortly",
                headers={"Retry-After": "5"},
            )
        self.held += size

    def give_back(self, size: int) -> None:
        self.held = max(0, self.held - size)


class _BodyReader:
    """Reads a request's body into one buffer that grows with what arrives (never pre-sized from
    ``Content-Length``: a stalled upload holds only what it sent), taking its bytes from ``budget`` and
    counting JSON element marks chunk by chunk (``json_limit``), so 60 MiB of nested lists is refused
    after its first few megabytes. Give the bytes back with :meth:`release` once the body is parsed."""

    def __init__(self, budget: BodyBudget, json_limit: int | None = None) -> None:
        self.budget = budget
        self.json_limit = json_limit
        self.held = 0
        self.marks = 0

    def take(self, size: int) -> None:
        self.budget.take(size)
        self.held += size

    async def read(self, request: Request) -> bytearray:
        declared = content_length(request.scope)
        buffer = bytearray()
        async for chunk in request.stream():
            self.take(len(chunk))
            if self.json_limit is not None:
                self.marks += http_codecs.count_json_marks(chunk)
                if self.marks > self.json_limit:  # "more than" the limit: the rest of the body is not read
                    raise http_codecs.too_many_json_values(self.json_limit, "the body")
            buffer += chunk
        if declared is not None and len(buffer) != declared:
            raise ApiError(HttpErrorCode.BAD_BODY, f"the body ended after {len(buffer)} of {declared} bytes")
        return buffer

    def release(self) -> None:
        self.budget.give_back(self.held)
        self.held = 0


async def read_fields(
    request: Request, file_fields: dict[str, tuple[str, ...]], max_values: int, budget: BodyBudget
) -> tuple[dict[str, Any], str]:
    """The request's fields, whatever its format; also returns the body's media type. ``max_values``
    bounds the elements a JSON/msgpack body (or a multipart JSON text field) may hold; ``budget`` the
    body bytes held by all requests together."""
    kind = http_codecs.media_type(request.headers.get("content-type"))
    if kind == http_codecs.JSON_TYPE or kind in http_codecs.MSGPACK_TYPES:
        reader = _BodyReader(budget, max_values if kind == http_codecs.JSON_TYPE else None)
        try:
            body = await reader.read(request)
            decode = http_codecs.decode_json_body if kind == http_codecs.JSON_TYPE else http_codecs.decode_msgpack_body
            return await asyncio.to_thread(decode, body, max_values), kind
        finally:
            reader.release()
    if kind == http_codecs.MULTIPART_TYPE:
        # Starlette spools file parts beyond 1 MiB to disk while it parses; the uploads' bytes are taken
        # from the budget when they are read back (the caller decodes them before this request ends).
        form = await request.form(
            max_files=http_codecs.MAX_MULTIPART_FILES,
            max_fields=http_codecs.MAX_MULTIPART_FIELDS,
            max_part_size=http_codecs.MAX_MULTIPART_TEXT_BYTES,
        )
        reader = _BodyReader(budget)
        try:
            items: list[tuple[str, Any]] = []
            for name, value in form.multi_items():
                if isinstance(value, str):
                    items.append((name, value))
                else:  # an UploadFile: keep the bytes and the declared type, drop the client's file name
                    reader.take(value.size or 0)
                    items.append((name, Upload(await value.read(), value.content_type or "")))
        finally:
            await form.close()
            reader.release()
        return http_codecs.decode_multipart_fields(items, file_fields, max_values), kind
    raise ApiError(
        HttpErrorCode.UNSUPPORTED_MEDIA_TYPE,
        f"Content-Type {kind or '(none)'!r} is not accepted; send application/json, application/msgpack or "
        "multipart/form-data",
    )


def body_schema(model: type[BaseModel], files: dict[str, str]) -> dict[str, Any]:
    """OpenAPI requestBody for an endpoint that takes JSON, msgpack and multipart with file uploads."""
    schema = model.model_json_schema()
    multipart = {
        "type": "object",
        "properties": {
            **{
                name: {"type": "string", "description": f"{prop.get('description', '')} (as text)"}
                for name, prop in schema["properties"].items()
            },
            **{
                name: {"type": "string", "format": "binary", "description": description}
                for name, description in files.items()
            },
        },
        "required": schema.get("required", []),
    }
    return {
        "requestBody": {
            "required": True,
            "content": {
                http_codecs.JSON_TYPE: {"schema": schema},
                http_codecs.MSGPACK_TYPE: {"schema": schema},
                http_codecs.MULTIPART_TYPE: {"schema": multipart},
            },
        }
    }
