"""Serving the sidecar's app with uvicorn, inside the server's own event loop, on a socket bound here.

The socket is bound before uvicorn starts, so port 0 works and a taken port fails at once; uvicorn runs
with ``startup()``/``main_loop()`` rather than ``serve()``, which would install its own signal handlers
(the CLI owns SIGINT/SIGTERM); its HTTP protocol carries the sidecar's header and body deadlines and
connection caps (:mod:`.connections`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import Any

from ..connection_limits import ACCEPT_BURST, PeerCounter
from .connections import ConnectionLimits, guarded_protocol


def bound_socket(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (IPv6 when ``host`` is an IPv6 address)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(ACCEPT_BURST)
    sock.setblocking(False)
    return sock


class UvicornServing:
    """One uvicorn server for ``app`` on ``sock``: :meth:`start`, then :meth:`stop`."""

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        *,
        limits: ConnectionLimits,
        counter: PeerCounter,
        on_refused: Callable[[str], None],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        import uvicorn
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        self.socket = sock
        config = uvicorn.Config(
            # log_config=None: uvicorn's records go through the process's handlers (and their filters,
            # policy_server.log_hygiene), not a handler of its own.
            app,
            lifespan="off",
            log_level="warning",
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=5,
            backlog=ACCEPT_BURST,
            http=guarded_protocol(AutoHTTPProtocol, limits, counter, on_refused=on_refused),
        )
        config.load()
        if tls is not None:  # https with the WebSocket port's certificate (uvicorn reads config.ssl at startup)
            config.ssl = tls
        self._server = uvicorn.Server(config)
        self._server.lifespan = config.lifespan_class(config)
        self._main_loop: asyncio.Task | None = None

    async def start(self) -> None:
        await self._server.startup(sockets=[self.socket])
        self._main_loop = asyncio.create_task(self._server.main_loop(), name="http-sidecar")

    def connections(self) -> list[Any]:
        """The open connections: uvicorn's protocol objects, each with its ``transport``."""
        return list(self._server.server_state.connections)

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish (up to uvicorn's graceful timeout), close."""
        self._server.should_exit = True
        if self._main_loop is not None:
            await self._main_loop
        await self._server.shutdown(sockets=[self.socket])
