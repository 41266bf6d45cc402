"""Several policy sessions on one connection, each named by the client's ``session_id`` (sans-I/O).

A simulator that steps N environments in parallel drives N policies over one socket: NVIDIA's RoboLab puts
a ``session_id`` (``robolab-episode-{i}-env-{j}``) in every observation it sends. Each name is one
*policy session* of the connection: its own sequence, its own latest-wins slot in the request queue, its
own seeds and prefix actions, and its own recording episode. Observations without a name belong
to the connection's own session, as before. The unit of fairness is the connection: its names share its
rate limit, its outbox, and its turn in the request queue (served together in one engine call when they
can be), so 16 names weigh what one robot weighs when others wait (``--session-id-turns`` weights a trusted
connection more), and a peer address holds at most ``--max-sessions-per-peer`` sessions once it names some.

:class:`PolicySessionTable` holds the rules, without sockets: how many names one connection may hold
(``max_per_connection`` of :class:`~policy_server.server_settings.PolicySessionLimits`), that a new name
also needs a free session slot of the server (each name is charged like a connection against
``--max-sessions``: it costs a queue slot, a decode slot, a recording episode), and when a name unused for
its ``idle_timeout_s`` expires, freeing its slot and ending its episode. Past a bound a new name is refused
with ``too_many_sessions``; the connection and its other names go on. The session base (:mod:`.base`) does
the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from robot_clients.protocol import SESSION_ID, ErrorCode, ProtocolError

from ..server_settings import PolicySessionLimits

PolicySessionT = TypeVar("PolicySessionT")


class PolicySessionTable(Generic[PolicySessionT]):
    """One connection's named policy sessions: opened within the bounds, touched by each observation,
    expired when idle. ``PolicySessionT`` is whatever the caller keeps per name (a session)."""

    def __init__(self, limits: PolicySessionLimits) -> None:
        self.limits = limits
        self._sessions: dict[str, PolicySessionT] = {}
        self._used_at: dict[str, float] = {}
        self.refused = 0  # new names refused at a bound
        self.expired_count = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[PolicySessionT]:
        return iter(list(self._sessions.values()))

    def get(self, name: str) -> PolicySessionT | None:
        return self._sessions.get(name)

    def open(
        self,
        name: str,
        now: float,
        make: Callable[[], PolicySessionT],
        server_room: int,
        seq: int | None = None,
        peer_room: int | None = None,
    ) -> PolicySessionT:
        """The policy session ``name``, made by ``make()`` when the connection has none of that name yet;
        either way it was used ``now``. ``server_room``: session slots the server has free (a new name
        takes one); ``peer_room``: those the connection's peer address has left (None: unbounded). Raises
        :class:`ProtocolError` ``too_many_sessions`` (about ``seq``) past any bound."""
        session = self._sessions.get(name)
        if session is None:
            limit = self.limits.max_per_connection
            if len(self._sessions) >= limit:
                self.refused += 1
                raise ProtocolError(
                    ErrorCode.TOO_MANY_SESSIONS,
                    f"this connection already holds {limit} policy sessions (`{SESSION_ID}`s), the server's "
                    f"--max-session-ids; a name unused for {self.limits.idle_timeout_s:g} s is freed",
                    SESSION_ID,
                    seq,
                )
            if server_room <= 0:
                self.refused += 1
                raise ProtocolError(
                    ErrorCode.TOO_MANY_SESSIONS,
                    "the server holds as many sessions as --max-sessions allows; retry once one ends",
                    SESSION_ID,
                    seq,
                )
            if peer_room is not None and peer_room <= 0:
                self.refused += 1
                raise ProtocolError(
                    ErrorCode.TOO_MANY_SESSIONS,
                    "this connection's address holds as many sessions as --max-sessions-per-peer allows "
                    "(connections and `session_id`s together); retry once one ends",
                    SESSION_ID,
                    seq,
                )
            session = self._sessions[name] = make()
        self._used_at[name] = now
        return session

    def remove(self, name: str) -> PolicySessionT | None:
        self._used_at.pop(name, None)
        return self._sessions.pop(name, None)

    def expire(self, now: float, busy: Callable[[PolicySessionT], bool]) -> list[PolicySessionT]:
        """Take out and return the sessions unused for longer than the idle timeout, except those
        ``busy`` says still have work in flight (their answer is still wanted)."""
        timeout = self.limits.idle_timeout_s
        if timeout <= 0:
            return []
        idle = [
            name
            for name, used_at in self._used_at.items()
            if now - used_at > timeout and not busy(self._sessions[name])
        ]
        self.expired_count += len(idle)
        for name in idle:
            del self._used_at[name]
        return [self._sessions.pop(name) for name in idle]

    def clear(self) -> list[PolicySessionT]:
        """Take out and return every session (the connection closed)."""
        sessions = list(self._sessions.values())
        self._sessions.clear()
        self._used_at.clear()
        return sessions
