"""What a session answers an observation with, before a protocol encodes it: a chunk on its way out, and
the messages of drops.

Every observation ``seq`` gets exactly one terminal reply: a chunk, a drop or an error. A chunk waits in
the outbox as a :class:`ChunkReply` and is packed only as it leaves, so a newer chunk can still replace it
(that one's seq is then answered with a drop, :data:`UNREAD_CHUNK_MESSAGE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_clients.protocol import DropReason

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


@dataclass
class ChunkReply:
    """An action chunk on its way out. It is packed when it leaves (:meth:`~.base.Session.pack_chunk`), so
    its ``observation_age_ms`` is measured then; until then a newer chunk may replace it."""

    seq: int
    actions: np.ndarray
    seed: int | None
    timing: dict[str, float | None]  # the server's breakdown; observation_age_ms is set as it leaves
    received_at: float
    body: Any  # what the subclass packs (the native frame, openpi's packed reply)
    nbytes: int


def payload_size(payload: bytes | str) -> int:
    """The bytes an encoded reply holds in the outbox."""
    return len(payload) if isinstance(payload, bytes) else len(payload.encode())
