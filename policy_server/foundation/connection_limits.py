"""How many connections one peer, and everyone together, may hold open before a server answers them.

A TCP connection costs a file descriptor from the moment it is accepted, long before a request or a
token is read. Without a bound, one client opening connections and never finishing its request (a
slowloris) exhausts the process's descriptors, and then nobody can connect: not the robots, not
``/healthz``. :class:`PeerCounter` is the bound, shared by the two ports' guards:

* the HTTP sidecar counts every connection it holds (:mod:`policy_server.http.connections`);
* the WebSocket port counts connections whose handshake request has not arrived yet
  (:func:`handshake_limited_connection`); sessions, once open, are bounded by ``max_sessions``.

A connection past a cap is closed at once, so it costs its descriptor only for that moment.

:func:`descriptor_budget` reads the process's descriptor limit (raising the soft limit to the hard one
when it is lower) so the sidecar can keep its cap below what the robots' port needs.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import Counter
from typing import Any

from websockets.asyncio.server import ServerConnection

logger = logging.getLogger(__name__)

# The WebSocket port's handshake bounds (ServerSettings): seconds to complete one (websockets'
# open_timeout), and how many may be waiting for their request, in all and per peer address.
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_MAX_PENDING_HANDSHAKES = 128
DEFAULT_MAX_PENDING_HANDSHAKES_PER_PEER = 16
# Connections a listening socket accepts in one go: its backlog, asyncio's default of 100 (asyncio accepts
# up to that many per wake-up before any of them is looked at, so each wake-up can hold that many more
# descriptors, even of connections about to be refused). Both ports listen with it; the sidecar used
# uvicorn's 2,048, a burst that alone could exhaust a 1,024-descriptor limit.
ACCEPT_BURST = 100
# Descriptors kept for everything that is not a client connection: the model's and libraries' files,
# SQLite, ffmpeg's pipes, temporary uploads, the listening sockets.
RESERVED_DESCRIPTORS = 128


def peer_address(transport: asyncio.BaseTransport) -> str:
    """The peer's IP address (an IPv4-mapped IPv6 address as plain IPv4), or ``"?"`` if unknown."""
    peer = transport.get_extra_info("peername")
    if not peer:
        return "?"
    host = str(peer[0]) if isinstance(peer, (tuple, list)) else str(peer)
    return host[7:] if host.startswith("::ffff:") else host


class PeerCounter:
    """Connections held per peer address and in total, against two caps. Event-loop only (no locks)."""

    def __init__(self, max_total: int, max_per_peer: int) -> None:
        self.max_total = max(1, max_total)
        self.max_per_peer = max(1, max_per_peer)
        self.total = 0
        self.per_peer: Counter[str] = Counter()

    def admit(self, peer: str) -> str | None:
        """Count the connection and return None, or return why it is refused (and count nothing)."""
        if self.total >= self.max_total:
            return f"{self.max_total} connections are open, the most this server holds"
        if self.per_peer[peer] >= self.max_per_peer:
            return f"{self.max_per_peer} connections from {peer} are open, the most one address may hold"
        self.total += 1
        self.per_peer[peer] += 1
        return None

    def release(self, peer: str) -> None:
        self.total = max(0, self.total - 1)
        self.per_peer[peer] -= 1
        if self.per_peer[peer] <= 0:
            del self.per_peer[peer]


def handshake_limited_connection(counter: PeerCounter) -> type[ServerConnection]:
    """A websockets :class:`ServerConnection` that counts itself in ``counter`` until its handshake
    request has arrived (or it closes), and is aborted at once when ``counter`` refuses it.

    Pass it as ``serve(..., create_connection=...)``. The handshake's deadline is ``serve``'s
    ``open_timeout``; this bounds how many may be waiting for it.
    """

    class HandshakeLimitedConnection(ServerConnection):
        _pending_peer: str | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peer = peer_address(transport)
            refusal = counter.admit(peer)
            super().connection_made(transport)
            if refusal is not None:
                logger.debug("refused a WebSocket connection from %s: %s", peer, refusal)
                transport.abort()  # type: ignore[attr-defined]
                return
            self._pending_peer = peer
            self.request_rcvd.add_done_callback(lambda _: self._handshake_arrived())

        def _handshake_arrived(self) -> None:
            if self._pending_peer is not None:
                counter.release(self._pending_peer)
                self._pending_peer = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._handshake_arrived()
            super().connection_lost(exc)

    return HandshakeLimitedConnection


def descriptor_budget() -> int:
    """File descriptors this process may open: the soft limit, first raised to the hard one if lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            logger.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def capped_to_descriptors(requested: int, reserved: int, what: str, **context: Any) -> int:
    """``requested``, lowered (with a warning) so that it and ``reserved`` others fit the descriptor limit,
    with room for both ports' accept bursts and the process's own files."""
    budget = descriptor_budget() - RESERVED_DESCRIPTORS - 2 * ACCEPT_BURST - reserved
    if requested <= budget:
        return requested
    allowed = max(8, budget)
    logger.warning(
        "the open-file limit (%d) leaves room for %d %s, not %d, after %d kept for %s; raise it "
        "(ulimit -n) to allow more",
        descriptor_budget(),
        allowed,
        what,
        requested,
        reserved,
        ", ".join(f"{name} {value}" for name, value in context.items()) or "the robots",
    )
    return allowed
