"""The rules every robot session keeps about its observations, without sockets (sans-I/O, as in websockets).

:class:`ObservationRules` decides; the session does the I/O (encodes and queues the replies, puts items
in the request queue). The rules:

* **sequence order**: an observation's ``seq`` must increase within a session (:meth:`~ObservationRules.check_order`;
  a ``reset`` starts over);
* **one terminal reply per observation**: each observation in flight ends exactly once, as a chunk, a drop
  or an error. An outcome for an observation that is no longer expected (the client cancelled, reset or
  left, or the observation was already answered) is discarded, never answered twice;
* **latest wins**: a newer observation replacing the waiting one in the queue makes that one a drop
  (``superseded``), and an unread chunk replaced in the outbox by a newer chunk becomes a drop in its place;
* **a rate per session** (:mod:`policy_server.foundation.rate_limit`): an observation beyond it is answered
  ``rate_limited`` before it is decoded and is never queued, so it cannot replace the one that waits.

What a reply is before a protocol encodes it lives here too: :class:`Drop` and :class:`ChunkReply`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robot_clients.protocol import DropReason, ErrorCode, ProtocolError

from ..engine.request_queue import PendingObservation

DROP_MESSAGES = {
    DropReason.SUPERSEDED: "a newer observation of this session replaced it before the engine reached it",
    DropReason.DEADLINE: "its deadline_ms passed before the engine reached it",
    DropReason.CANCELLED: "cancelled by the client",
    DropReason.SHUTDOWN: "the server is shutting down",
    DropReason.PAUSED: "an operator paused this session; hold until it is resumed",
    DropReason.STOPPED: "an operator stopped this session",
}
# An unread chunk replaced by a newer one in the outbox (the client is behind on its replies).
UNREAD_CHUNK_MESSAGE = "a newer chunk of this session replaced it before the client read it"


@dataclass(frozen=True)
class Drop:
    """An observation answered without actions: ``reason`` as in the ``dropped`` frame."""

    seq: int
    reason: str
    message: str


@dataclass
class ChunkReply:
    """An action chunk on its way out. It is packed when it leaves (the session's ``pack_chunk``), so its
    ``observation_age_ms`` is measured then; until then a newer chunk may replace it."""

    seq: int
    actions: np.ndarray
    seed: int | None
    timing: dict[str, float | None]  # the server's breakdown; observation_age_ms is set as it leaves
    received_at: float
    body: object  # what the protocol packs (the native frame, openpi's packed reply)
    nbytes: int
    # The policy session it answers (its `session_id`), None for the connection's own: set as it is queued.
    policy_session: str | None = None


class ObservationRules:
    """One session's observations in flight, its counters, and the decisions the rules make about them."""

    def __init__(self) -> None:
        # Observations waiting in the queue or running in the engine, by seq.
        self.in_flight: dict[int, PendingObservation] = {}
        self.last_seq: int | None = None
        self.answered = 0
        self.dropped = 0
        self.closed = False

    # -- sequence order -------------------------------------------------------------------------------

    def check_order(self, seq: int) -> None:
        """Accept ``seq`` as the next observation's, or refuse it (``invalid_field``) when it does not increase."""
        if self.last_seq is not None and seq <= self.last_seq:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`seq` must increase within a session: got {seq} after {self.last_seq} (send `reset` to restart)",
                "seq",
                seq,
            )
        self.last_seq = seq

    def restart(self) -> None:
        """A ``reset``: any seq may come next."""
        self.last_seq = None

    # -- admission and latest wins --------------------------------------------------------------------

    def admitted(self, item: PendingObservation, replaced: PendingObservation | None) -> Drop | None:
        """``item`` is in the queue; the one it replaced there (latest wins), if any, ends as a drop."""
        self.in_flight[item.seq] = item
        return self.end_in_flight(replaced, DropReason.SUPERSEDED) if replaced is not None else None

    def unread_chunk_replaced(self, reply: ChunkReply) -> Drop:
        """A chunk the client had not read was replaced by a newer one: its seq ends as a drop instead."""
        self.answered -= 1
        self.dropped += 1
        return Drop(reply.seq, DropReason.SUPERSEDED, UNREAD_CHUNK_MESSAGE)

    # -- terminal replies ------------------------------------------------------------------------------

    def drop(self, seq: int, reason: str, message: str | None = None) -> Drop:
        """``seq`` ends without actions (it never reached, or left, the engine)."""
        self.dropped += 1
        return Drop(seq, reason, message or DROP_MESSAGES.get(reason, reason))

    def end_in_flight(self, item: PendingObservation, reason: str) -> Drop:
        """An observation in flight ends as a drop (replaced, cancelled, paused)."""
        self.in_flight.pop(item.seq, None)
        return self.drop(item.seq, reason)

    def expects(self, item: PendingObservation) -> bool:
        """Whether an outcome for ``item`` is still wanted: the session is open, the observation not
        cancelled and still the one in flight under its seq (not answered already)."""
        return not self.closed and not item.cancelled and self.in_flight.get(item.seq) is item

    def engine_dropped(self, item: PendingObservation, reason: str) -> Drop | None:
        """The queue or the engine dropped ``item``: a drop, or None when nobody expects it any more."""
        return self.end_in_flight(item, reason) if self.expects(item) else None

    def engine_answered(self, item: PendingObservation) -> bool:
        """The engine answered ``item`` (a chunk or an error): True if that answer is its terminal reply."""
        if not self.expects(item):
            return False
        del self.in_flight[item.seq]
        return True

    def chunk_made(self) -> None:
        self.answered += 1

    def cancel(self, seq: int | None) -> list[PendingObservation]:
        """Observations in flight under ``seq`` (None: all), marked cancelled so that a late outcome is
        discarded; the caller takes them out of the queue and ends each (:meth:`end_in_flight`)."""
        items = [item for s, item in self.in_flight.items() if seq is None or s == seq]
        for item in items:
            item.cancelled = True
        return items

    def close(self) -> None:
        """The session ended: nothing in flight is expected any more. Each observation in flight is marked
        cancelled, so the engine worker skips one it has taken but not started (an orphan) and ``/healthz``
        does not count one already running as work a session waits for."""
        self.closed = True
        for item in self.in_flight.values():
            item.cancelled = True
        self.in_flight.clear()
