"""The request queue of a multi-replica backend: each session pinned to one replica, failover on loss.

:class:`ReplicaRouter` has the interface sessions and the HTTP sidecar already use on
:class:`~policy_server.engine.request_queue.RequestQueue` (``put``, ``put_background``, ``cancel``, ``close``,
``len``), so the front end does not know replicas exist. Behind it is one ``RequestQueue`` per replica
(latest observation wins, fair turns and batching stay exactly as they are, per replica) and a map
session -> replica:

* **Pinning.** A session is assigned at its first observation, to the live replica with the fewest
  open sessions, and stays there: its prefix cache, its seed stream and its real-time chunking state
  live in that replica's engine.
* **Failover.** :meth:`ReplicaRouter.replica_lost` takes a replica out: its queue is closed, its
  sessions are reassigned (each to the least-loaded live replica) and what waited in its queue comes
  back to the caller to re-queue (:meth:`requeue`, :meth:`put_background`). :meth:`replica_back` puts a
  replaced replica back in service with a fresh queue; it gets new sessions, moved ones stay put.
* **Background work** (video jobs) goes to the live replica with the least background work waiting, so
  jobs spread over replicas; a lost replica's waiting jobs are handed back for re-queueing.

This module knows nothing about Ray; the Ray backend drives it. Thread-safe: one lock around the map;
each replica queue has its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field
from typing import Any

from ..engine.request_queue import ClosableQueue, EngineTask, PendingObservation, QueueClosed, RequestQueue


class NoReplicaAvailable(QueueClosed):
    """Every replica is lost or being replaced: nothing can be queued right now."""


@dataclass
class Failover:
    """What :meth:`ReplicaRouter.replica_lost` did: sessions moved (id -> new replica) and work to re-queue."""

    replica: int
    moved: dict[Hashable, int] = field(default_factory=dict)
    observations: list[PendingObservation] = field(default_factory=list)
    background: list[EngineTask[Any]] = field(default_factory=list)


class ReplicaRouter(ClosableQueue):
    """One request queue per replica behind the single-queue interface; sessions pinned to replicas."""

    def __init__(self, num_replicas: int, open_sessions: Callable[[], Collection[Hashable]] | None = None) -> None:
        if num_replicas < 1:
            raise ValueError("at least one replica")
        self._lock = threading.Lock()
        self.queues: list[RequestQueue] = [RequestQueue() for _ in range(num_replicas)]
        self._live = [True] * num_replicas
        self._assignment: dict[Hashable, int] = {}
        # Which sessions still exist; assignments of others are forgotten when loads are counted
        # (sessions only tell the queue that they ended by cancelling, which is not a reliable signal).
        self._open_sessions = open_sessions

    def set_open_sessions(self, open_sessions: Callable[[], Collection[Hashable]]) -> None:
        """Tell the router which sessions are open (assignments of others are forgotten)."""
        with self._lock:
            self._open_sessions = open_sessions

    # -- pinning ---------------------------------------------------------------------------------------

    @property
    def num_replicas(self) -> int:
        return len(self.queues)

    def replica_of(self, session_id: Hashable) -> int | None:
        with self._lock:
            return self._assignment.get(session_id)

    def sessions_per_replica(self) -> list[int]:
        """Open sessions pinned to each replica (index = replica)."""
        with self._lock:
            self._forget_closed_sessions()
            counts = [0] * self.num_replicas
            for replica in self._assignment.values():
                counts[replica] += 1
            return counts

    def _forget_closed_sessions(self) -> None:
        if self._open_sessions is None:
            return
        open_now = set(self._open_sessions())
        for session_id in [s for s in self._assignment if s not in open_now]:
            del self._assignment[session_id]

    def _least_loaded(self, exclude: int | None = None) -> int:
        counts = [0] * self.num_replicas
        for replica in self._assignment.values():
            counts[replica] += 1
        live = [i for i in range(self.num_replicas) if self._live[i] and i != exclude]
        if not live:
            raise NoReplicaAvailable("no engine replica is available right now; retry shortly")
        return min(live, key=lambda i: (counts[i], i))

    def _replica_for(self, session_id: Hashable) -> int:
        replica = self._assignment.get(session_id)
        if replica is None or not self._live[replica]:
            self._forget_closed_sessions()
            replica = self._least_loaded()
            self._assignment[session_id] = replica
        return replica

    # -- the queue interface ---------------------------------------------------------------------------

    def put(self, item: PendingObservation) -> PendingObservation | None:
        """Queue ``item`` on its session's replica (assigning one first); return what it replaced."""
        with self._lock:
            self._refuse_if_closed()
            return self.queues[self._replica_for(item.session_id)].put(item)

    def requeue(self, item: PendingObservation) -> PendingObservation | None:
        """Queue an observation again after its replica was lost; never let it replace a newer one.

        Returns the observation that lost its place (the older of the two), for the caller to report
        ``superseded``, or None.
        """
        with self._lock:
            self._refuse_if_closed()
            queue = self.queues[self._replica_for(item.session_id)]
            replaced = queue.put(item)
            if replaced is not None and replaced.seq > item.seq:
                queue.put(replaced)  # the newer one waited first: it keeps the slot
                return item
            return replaced

    def holds_back_decoding(self, session_id: Hashable) -> bool:
        """Its replica's queue says (``RequestQueue.holds_back_decoding``); False before it has one."""
        with self._lock:
            replica = self._assignment.get(session_id)
            return replica is not None and self.queues[replica].holds_back_decoding(session_id)

    def put_background(self, task: EngineTask[Any]) -> None:
        """Queue a background task on the live replica with the least background work waiting."""
        with self._lock:
            self._refuse_if_closed()
            live = [i for i in range(self.num_replicas) if self._live[i]]
            if not live:
                raise NoReplicaAvailable("no engine replica is available right now")
            target = min(live, key=lambda i: (self.queues[i].background_waiting, i))
            self.queues[target].put_background(task)

    def cancel(self, session_id: Hashable, seq: int | None = None) -> PendingObservation | None:
        with self._lock:
            replica = self._assignment.get(session_id)
            if replica is None:
                return None
            return self.queues[replica].cancel(session_id, seq)

    def close(self) -> list[PendingObservation | EngineTask[Any]]:
        with self._lock:
            self._closed = True
            left: list[PendingObservation | EngineTask[Any]] = []
            for queue in self.queues:
                left.extend(queue.close())
            return left

    @property
    def background_waiting(self) -> int:
        return sum(queue.background_waiting for queue in self.queues)

    def __len__(self) -> int:
        return sum(len(queue) for queue in self.queues)

    # -- replicas coming and going ---------------------------------------------------------------------

    def replica_lost(self, replica: int) -> Failover:
        """Take ``replica`` out of service; move its sessions; hand back what waited in its queue.

        Closing its queue also ends the dispatcher taking from it. Idempotent: a second call for the
        same loss moves nothing. If no other replica is live the sessions stay unassigned and get one
        at their next observation, once a replica is back.
        """
        with self._lock:
            failover = Failover(replica)
            if not self._live[replica]:
                return failover
            self._live[replica] = False
            for entry in self.queues[replica].close():
                if isinstance(entry, PendingObservation):
                    failover.observations.append(entry)
                else:
                    failover.background.append(entry)
            self._forget_closed_sessions()
            for session_id in [s for s, r in self._assignment.items() if r == replica]:
                try:
                    target = self._least_loaded(exclude=replica)
                except NoReplicaAvailable:
                    del self._assignment[session_id]
                    continue
                self._assignment[session_id] = target
                failover.moved[session_id] = target
            return failover

    def replica_back(self, replica: int, queue: RequestQueue | None = None) -> RequestQueue:
        """Put a replaced replica back in service with a fresh queue (``queue``, or a new one; returned)."""
        with self._lock:
            queue = queue if queue is not None else RequestQueue()
            if self._closed:
                queue.close()
            self.queues[replica] = queue
            self._live[replica] = True
            return queue

    def queue_of(self, replica: int) -> RequestQueue:
        with self._lock:
            return self.queues[replica]

    def snapshot(self) -> list[dict[str, Any]]:
        """Per replica: live or not, sessions pinned, observations and background tasks waiting."""
        sessions = self.sessions_per_replica()
        with self._lock:
            return [
                {
                    "live": self._live[i],
                    "sessions": sessions[i],
                    "waiting": len(q),
                    "background_waiting": q.background_waiting,
                }
                for i, q in enumerate(self.queues)
            ]
