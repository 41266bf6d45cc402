"""How the clients reach the server: the endpoint URL, the handshake options, and connecting with backoff.

:func:`open_session` is the one place a connection is made, for the first connect and for every
reconnect alike: it retries while the server is loading (HTTP 502/503/504, refused connections), reads
the ``metadata`` frame, checks the protocol version and re-sends the client's configuration. Imports
only numpy, msgpack (through the wire codec) and websockets: it runs on the robot.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from . import protocol
from .protocol import REALTIME_PATH
from .results import ServerError
from .wire_codec import packb, unpackb

logger = logging.getLogger(__name__)

SUPPORTED_PROTOCOL_VERSION = protocol.PROTOCOL_VERSION


def realtime_url(url: str) -> str:
    """Accept ``ws://host:port`` as well as the full endpoint URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"policy server URL must start with ws:// or wss://, got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path=REALTIME_PATH)
    return urlunsplit(parts)


def connect_options(
    *,
    headers: Mapping[str, str] | None,
    token: str | None,
    ssl: Any,
    connect_timeout: float,
    ping_interval: float | None,
    ping_timeout: float | None,
    max_message_bytes: int,
    proxy: str | bool | None,
) -> dict[str, Any]:
    """The keyword arguments of ``websockets.connect`` for these client options."""
    handshake_headers = dict(headers or {})
    if token is not None:
        handshake_headers["Authorization"] = f"Bearer {token}"
    options: dict[str, Any] = dict(
        additional_headers=handshake_headers,
        # Compression costs 30-40 ms per camera frame and gains nothing on pixels.
        compression=None,
        proxy=proxy,
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        max_size=max_message_bytes,
        open_timeout=min(10.0, connect_timeout),
    )
    if ssl is not None:
        options["ssl"] = ssl
    return options


@dataclass
class OpenedSession:
    """A connection that has read its metadata and (when there was one) re-sent the configuration."""

    ws: ClientConnection
    metadata: dict[str, Any]
    session: dict[str, Any] | None  # the server's resolved configuration; None when nothing was re-sent


@dataclass(frozen=True)
class Backoff:
    """Reconnect delays, doubling from ``initial`` to ``maximum`` (with ±20 % jitter)."""

    initial: float
    maximum: float

    def delay(self, attempt: int) -> float:
        return min(self.maximum, self.initial * 2**attempt) * random.uniform(0.8, 1.2)


async def open_session(
    url: str,
    options: Mapping[str, Any],
    settings: Mapping[str, Any],
    backoff: Backoff,
    deadline: float | None,
    closing: Callable[[], bool],
) -> OpenedSession:
    """Connect with backoff until ``deadline`` (None: forever), read metadata, re-send ``settings``.

    Gives up at once on what retrying cannot fix (HTTP 401, another HTTP status, a bad URL, another
    protocol version), and when ``closing()`` says the client is being closed.
    """
    attempt = 0
    while True:
        try:
            return await _handshake(url, options, settings)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status == 401:  # retrying cannot help: the token is missing or wrong
                raise ConnectionError(
                    f"{url}: the server requires a valid bearer token (HTTP 401); pass token=..."
                ) from None
            if status not in (502, 503, 504):
                raise ConnectionError(f"{url}: the server answered HTTP {status}") from None
            error: Exception = exc
        except (OSError, asyncio.TimeoutError, ConnectionClosed, ConnectionError) as exc:
            error = exc
        except InvalidURI:
            raise
        delay = backoff.delay(attempt)
        attempt += 1
        if closing() or (deadline is not None and time.monotonic() + delay > deadline):
            raise ConnectionError(f"could not connect to {url}: {error}") from None
        logger.debug("connect attempt %d failed (%s); retrying in %.2f s", attempt, error, delay)
        await asyncio.sleep(delay)


async def _handshake(url: str, options: Mapping[str, Any], settings: Mapping[str, Any]) -> OpenedSession:
    ws = await connect(url, **options)
    frame = unpackb(await ws.recv())
    if frame.get("type") != protocol.METADATA:
        raise ConnectionError(f"expected a metadata frame first, got {frame.get('type')!r}")
    if frame.get("protocol_version") != SUPPORTED_PROTOCOL_VERSION:
        await ws.close()
        raise ServerError(
            "protocol_version",
            f"server speaks protocol {frame.get('protocol_version')}, this client {SUPPORTED_PROTOCOL_VERSION}",
        )
    session = None
    if settings:
        await ws.send(packb(protocol.configure_frame(settings)))
        reply = unpackb(await ws.recv())
        if reply.get("type") == protocol.SESSION:
            session = reply.get("config", {})
        else:
            logger.warning("the server refused the configuration on reconnect: %s", reply.get("message"))
    return OpenedSession(ws, frame, session)
