"""The HTTP sidecar's connections: ``TCP_NODELAY``, deadlines for headers and bodies, and caps.

uvicorn's HTTP protocol (httptools, or h11 without it) gives a connection as long as it likes to send
its request: there is a keep-alive timeout between requests but none for headers or a body, and no cap
that closes connections. A client that opens hundreds of connections and sends a few header bytes now
and then (a slowloris) held them for minutes, before any token was checked; a thousand exhausted the
process's file descriptors, so robots could not connect either. :func:`guarded_protocol` wraps the
protocol class uvicorn would use, adding, before the application sees anything:

* a cap on connections per sidecar and per peer address (:class:`~policy_server.foundation.connection_limits.
  PeerCounter`): one past it is answered ``503`` ``too_many_connections`` and closed at once;
* a deadline for a request's headers (from the connection's start, or from the previous response on
  a kept-alive connection) and a byte bound on them: ``408`` / ``431`` and closed;
* a deadline for its body, counted from the end of its headers: ``408`` ``request_timeout`` and closed
  (the handler, if it was reading, sees the client disconnect);
* ``TCP_NODELAY``. asyncio sets it itself only on sockets whose protocol number is ``IPPROTO_TCP``; the
  sidecar's sockets were accepted from a listening socket made with protocol 0, so every response
  written in two pieces (headers, then body) waited for the client's delayed ACK: about 40 ms on every
  reused keep-alive connection.

Responses written here are complete HTTP/1.1 responses with the sidecar's JSON error body, written
straight to the transport, because the application has not been called (or must be cut off).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from ..foundation.api_errors import HttpErrorCode
from ..foundation.connection_limits import PeerCounter, peer_address
from ..sidecar_settings import SidecarConnectionLimits

logger = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole ``Connection: close`` HTTP/1.1 response carrying the sidecar's error body."""
    body = json.dumps({"error": {"code": code, "message": message, "field": None}}).encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the peer already went away
            pass


def guarded_protocol(
    base: type,
    limits: SidecarConnectionLimits,
    counter: PeerCounter,
    on_refused: Callable[[str], None] = lambda code: None,
) -> type:
    """A subclass of uvicorn's HTTP protocol class ``base`` with the deadlines and caps of ``limits``.

    It relies on what uvicorn's two HTTP/1.1 protocols (httptools and h11) share: ``cycle`` (the
    request in hand; a new object once a request's headers are complete), its ``more_body`` (False
    once the body is complete) and ``response_started``, and ``on_response_complete``.
    ``on_refused`` is told the error code of every connection closed here (for the metrics).
    """

    class GuardedHttpProtocol(base):  # type: ignore[misc]
        _peer: str | None = None  # counted in `counter` while set
        _timer: asyncio.TimerHandle | None = None
        _phase = "headers"  # "headers" -> "body" -> "app" (-> "headers" on a kept-alive connection)
        _seen_cycle: Any = None
        _header_bytes = 0

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            if limits.tcp_nodelay:
                set_nodelay(transport)
            peer = peer_address(transport)
            refusal = counter.admit(peer)
            super().connection_made(transport)
            if refusal is not None:
                logger.debug("refused an HTTP connection from %s: %s", peer, refusal)
                self._refuse(
                    HTTPStatus.SERVICE_UNAVAILABLE,
                    HttpErrorCode.TOO_MANY_CONNECTIONS,
                    f"too many connections: {refusal}; retry later",
                    {"retry-after": "5"},
                )
                return
            self._peer = peer
            self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._peer is not None:
                counter.release(self._peer)
                self._peer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._phase == "headers":
                self._header_bytes += len(data)
            super().data_received(data)
            self._follow()
            if self._phase == "headers" and self._header_bytes > limits.max_header_bytes:
                self._refuse(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                    HttpErrorCode.BAD_BODY,
                    f"the request line and headers are longer than {limits.max_header_bytes} bytes",
                )

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._follow()

        # -- the request's phases ------------------------------------------------------------------

        def _follow(self) -> None:
            """Move to the phase the parser has reached, arming that phase's deadline."""
            if self._phase == "closed":
                return
            cycle = self.cycle
            if cycle is not None and cycle is not self._seen_cycle:  # a new request's headers are complete
                self._seen_cycle = cycle
                self._phase = ""
            if cycle is None or (cycle.response_complete and not cycle.more_body):
                if self._phase != "headers":
                    self._await_headers()
            elif cycle.more_body:
                if self._phase != "body":
                    self._phase = "body"
                    self._arm(limits.body_timeout_s, self._body_late)
            elif self._phase != "app":
                self._phase = "app"  # the handler's own time is bounded by the handler (action timeout)
                self._disarm()

        def _await_headers(self) -> None:
            self._phase = "headers"
            self._header_bytes = 0
            self._arm(limits.header_timeout_s, self._headers_late)

        def _headers_late(self) -> None:
            self._refuse(
                HTTPStatus.REQUEST_TIMEOUT,
                HttpErrorCode.REQUEST_TIMEOUT,
                f"the request's headers did not arrive within {limits.header_timeout_s:g} s",
            )

        def _body_late(self) -> None:
            if self.cycle is not None and self.cycle.response_started:
                self._close(HttpErrorCode.REQUEST_TIMEOUT)  # answered already; the client is still sending
                return
            self._refuse(
                HTTPStatus.REQUEST_TIMEOUT,
                HttpErrorCode.REQUEST_TIMEOUT,
                f"the request's body did not arrive within {limits.body_timeout_s:g} s of its headers",
            )

        # -- deadlines and refusals ----------------------------------------------------------------

        def _arm(self, seconds: float, callback: Callable[[], None]) -> None:
            self._disarm()
            if seconds > 0:
                self._timer = self.loop.call_later(seconds, callback)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _refuse(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
            if not self.transport.is_closing():
                self.transport.write(error_response(status, code, message, headers))
            self._close(code)

        def _close(self, code: str) -> None:
            self._disarm()
            self._phase = "closed"
            on_refused(code)
            if not self.transport.is_closing():
                self.transport.close()

    GuardedHttpProtocol.__name__ = GuardedHttpProtocol.__qualname__ = f"Guarded{base.__name__}"
    return GuardedHttpProtocol
