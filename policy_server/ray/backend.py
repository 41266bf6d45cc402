"""Engine replicas on Ray Serve, one per GPU, with sessions pinned to a replica and failover on loss.

``cosmos3-serve --backend ray --replicas N [--ray-address ADDR]``. The WebSocket front end, the
protocols and the clients are unchanged: sessions put observations in the server's queue as always;
here that queue is a :class:`ReplicaRouter` (one queue per replica, a map session -> replica) and every
replica has a worker that takes its sessions' work and calls it.

This module holds the replicas' lifecycle (start, ready, failover, replacement, stop), their counters,
and the router that pins sessions to them.

**Dispatch.** Each replica is served by the local :class:`~policy_server.engine.worker.EngineWorker`,
composed as it is (latest observation wins, fair turns, batching, deadlines, background lane), whose
engine is the replica's :class:`~policy_server.ray.deployment.RemoteEngine`; its ``on_engine_lost``
is this backend's failover. One call at a time per replica, like the local engine.

**Failover.** A replica's death is noticed two ways: a call in flight raises
:class:`~policy_server.ray.deployment.ReplicaLost` (the worker hands its work here instead of
answering it), or a watchdog finds the replica's actor name gone from Ray (an idle replica). Then: its
sessions move to the least-loaded live replica, the observation that was running and those waiting are
queued again there (the robot's next chunk comes from the new replica; nothing is answered with an
error), each moved native session gets a ``session_event`` frame (``replica_moved``, through the host's
``notify_sessions``), waiting and running video jobs are queued again on other replicas (a job is only
recorded by the runner once a replica returns its frames, and the job store stays the source of truth
across restarts). Serve starts a replacement; once it is up the replica takes new sessions.

Ray is imported only by :mod:`.deployment` (and so by this module); the local backend never loads it.

**The router.** :class:`ReplicaRouter`, the request queue of a multi-replica backend, has the interface
sessions and the HTTP sidecar already use on :class:`~policy_server.engine.request_queue.RequestQueue`
(``put``, ``put_background``, ``cancel``, ``close``, ``len``), so the front end does not know replicas
exist. Behind it is one ``RequestQueue`` per replica (latest observation wins, fair turns and batching
stay exactly as they are, per replica) and a map session -> replica:

* **Pinning.** A session is assigned at its first observation, to the live replica with the fewest
  open sessions, and stays there: its prefix cache, its seed stream and its real-time chunking state
  live in that replica's engine.
* **Failover.** :meth:`ReplicaRouter.replica_lost` takes a replica out: its queue is closed, its
  sessions are reassigned (each to the least-loaded live replica) and what waited in its queue comes
  back to the caller to re-queue (:meth:`requeue`, :meth:`put_background`). :meth:`replica_back` puts a
  replaced replica back in service with a fresh queue; it gets new sessions, moved ones stay put.
* **Background work** (video jobs) goes to the live replica with the least background work waiting, so
  jobs spread over replicas; a lost replica's waiting jobs are handed back for re-queueing.

The router itself calls no Ray API; the backend drives it. Thread-safe: one lock around the map; each
replica queue has its own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from cosmos3_runtime.description import ModelDescription
from robot_clients.protocol import DropReason

from ..engine.backend import BackendHost
from ..engine.loading import EngineLoader
from ..engine.request_queue import (
    ClosableQueue,
    EngineOutcome,
    EngineTask,
    PendingObservation,
    QueueClosed,
    RequestQueue,
)
from ..engine.worker import BackgroundShare, BatchPolicy, CounterReadouts, EngineCounters, EngineWorker, WorkerState
from .deployment import RayBackendSettings, RemoteEngine, ReplicaDeployments, ReplicaIdentity


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

    def holds_back_decoding(self, session_id: Hashable, turn: Hashable | None = None) -> bool:
        """Its replica's queue says (``RequestQueue.holds_back_decoding``); False before it has one."""
        with self._lock:
            replica = self._assignment.get(session_id)
            return replica is not None and self.queues[replica].holds_back_decoding(session_id, turn)

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


# -- the replicas' lifecycle -----------------------------------------------------------------------

logger = logging.getLogger(__name__)

# How often the watchdog looks for replicas that died while idle.
WATCHDOG_PERIOD_S = 0.5
REPLICA_MOVED = "replica_moved"


@dataclass
class _Replica:
    """One replica slot: its Serve application, the worker serving it now and that worker's engine."""

    index: int
    app_name: str
    dispatcher: EngineWorker | None = None
    engine: RemoteEngine | None = None
    state: str = "loading"  # loading, live, replacing, failed, stopped
    identity: ReplicaIdentity | None = None  # None until its actor first answered
    failovers: int = 0
    # Counters of this slot's earlier workers (a replacement starts its own from zero).
    retired: EngineCounters = field(default_factory=EngineCounters)

    @property
    def counters(self) -> EngineCounters:
        return self.retired + (self.dispatcher.counters if self.dispatcher is not None else EngineCounters())

    @property
    def actor_name(self) -> str | None:
        return self.identity.actor_name if self.identity is not None else None


class RayBackend(CounterReadouts):
    """:class:`~policy_server.engine.backend.EngineBackend` over N Ray Serve replicas."""

    def __init__(
        self,
        settings: RayBackendSettings,
        loader: EngineLoader,
        host: BackendHost,
        router: ReplicaRouter,
        loop: asyncio.AbstractEventLoop,
        batching: BatchPolicy,
        background: BackgroundShare | None = None,
    ) -> None:
        self.settings = settings
        self.loader = loader
        self._host = host
        self.router = router
        self._loop = loop
        self._batching = batching
        self._background = background or BackgroundShare()
        self.state = WorkerState.STARTING
        self.description: ModelDescription | None = None
        self.thread_settings: dict[str, object] = {}
        self.on_batch_done: Callable[[list[PendingObservation], list[EngineOutcome]], None] | None = None
        self.failovers = 0
        self._stopping = threading.Event()
        self._deployments = ReplicaDeployments(settings, loader, self._stopping)
        self._replicas = [_Replica(i, self._deployments.app_name(i)) for i in range(settings.replicas)]
        self._lock = threading.RLock()
        self._watchdog = threading.Thread(target=self._watch, name="ray-replica-watchdog", daemon=True)
        self._ready: asyncio.Future[ModelDescription] = loop.create_future()

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._deployments.start()
        for replica in self._replicas:
            replica.dispatcher = self._new_dispatcher(
                replica, self.router.queue_of(replica.index), partial(self._deployments.deploy, replica.index)
            )
            replica.dispatcher.start()
        self.state = WorkerState.LOADING
        self._loop.create_task(self._become_ready(), name="ray-backend-ready")

    @staticmethod
    def _dispatcher(replica: _Replica) -> EngineWorker:
        """The worker serving ``replica`` (every slot has one from :meth:`start` on)."""
        assert replica.dispatcher is not None, f"replica {replica.index} was never started"
        return replica.dispatcher

    async def _become_ready(self) -> None:
        try:
            descriptions = await asyncio.gather(*(self._dispatcher(r).wait_ready() for r in self._replicas))
        except BaseException as exc:  # noqa: BLE001 - reported through wait_ready
            self.state = WorkerState.FAILED
            self._ready.set_exception(exc)
            return
        for replica in self._replicas:
            replica.state = "live"
            replica.identity = replica.engine.identity if replica.engine is not None else None
        self.description = descriptions[0]
        first = self._replicas[0].identity
        self.thread_settings = dict(first.threads) if first is not None else {}
        self.state = WorkerState.READY
        self._watchdog.start()
        logger.info(
            "ray backend ready: %d replica(s) %s",
            len(self._replicas),
            [r.actor_name for r in self._replicas],
        )
        self._ready.set_result(self.description)

    async def wait_ready(self) -> ModelDescription:
        """Wait until every replica is deployed, loaded and warm; return the model's ``describe()``."""
        return await asyncio.shield(self._ready)

    def stop(self, timeout: float | None = None) -> bool:
        """Wait for the replicas' workers (the queue is closed first), then delete this server's applications."""
        self._stopping.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        finished = True
        for replica in self._replicas:
            # A worker still waiting for its replica (a replacement loading) has nothing to finish;
            # its thread is a daemon and gives up once the applications are deleted.
            if replica.dispatcher is not None and replica.dispatcher.state is WorkerState.READY:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                finished = replica.dispatcher.stop(left) and finished
            replica.state = "stopped"
        self._deployments.shutdown(len(self._replicas))
        self.state = WorkerState.STOPPED
        return finished

    def _new_dispatcher(
        self, replica: _Replica, queue: RequestQueue, connect: Callable[[], RemoteEngine]
    ) -> EngineWorker:
        """A worker for ``replica`` that takes from ``queue``; ``connect`` (on its thread) finds the replica."""

        def load() -> RemoteEngine:
            replica.engine = connect()
            return replica.engine

        dispatcher = EngineWorker(
            load,
            queue,
            self._loop,
            torch_threads=1,
            warmup=False,
            batching=self._batching,
            background=self._background,
            name=f"replica-{replica.index}-dispatcher",
            on_engine_lost=lambda items, tasks: self._replica_lost(replica, dispatcher, items, tasks),
        )
        dispatcher.on_batch_done = self._batch_done
        return dispatcher

    def _batch_done(self, batch: list[PendingObservation], outcomes: list[EngineOutcome]) -> None:
        if self.on_batch_done is not None:
            self.on_batch_done(batch, outcomes)

    # -- the EngineBackend counters, summed over replicas and their predecessors ----------------------------

    @property
    def counters(self) -> EngineCounters:  # type: ignore[override]  # summed over replicas: read-only
        with self._lock:
            return sum((r.counters for r in self._replicas), EngineCounters())

    @property
    def busy_since(self) -> float | None:
        starts = [r.dispatcher.busy_since for r in self._replicas if r.dispatcher and r.dispatcher.busy_since]
        return min(starts) if starts else None

    @property
    def busy(self) -> bool:
        return any(r.dispatcher is not None and r.dispatcher.busy for r in self._replicas)

    @property
    def orphaned(self) -> bool:
        """A replica finishes a call nobody waits for, and no replica runs wanted work."""
        return not self.busy and any(r.dispatcher is not None and r.dispatcher.orphaned for r in self._replicas)

    def topology(self) -> dict[str, Any]:
        sessions = self.router.sessions_per_replica()
        replicas = []
        for r in self._replicas:
            counters = r.counters
            replicas.append(
                {
                    "replica": r.index,
                    "app": r.app_name,
                    "state": r.state,
                    "actor_name": r.actor_name,
                    "actor_id": r.identity.actor_id if r.identity is not None else None,
                    "node_id": r.identity.node_id if r.identity is not None else None,
                    "sessions": sessions[r.index],
                    "completed": counters.completed,
                    "failed": counters.failed,
                    "busy_s": counters.busy_s,
                    "failovers": r.failovers,
                }
            )
        return {
            "backend": "ray",
            "ray_address": self.settings.address or "local",
            "num_gpus_per_replica": self._deployments.num_gpus,
            "failovers": self.failovers,
            "replicas": replicas,
        }

    # -- failover ------------------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Notice replicas that died while idle (a call in flight notices by itself)."""
        while not self._stopping.wait(WATCHDOG_PERIOD_S):
            for replica in self._replicas:
                name = replica.actor_name
                if replica.state != "live" or not name:
                    continue
                if self._deployments.actor_gone(name) and not self._stopping.is_set():
                    self._replica_lost(replica, replica.dispatcher, [], [])

    def _replica_lost(
        self,
        replica: _Replica,
        dispatcher: EngineWorker | None,
        in_hand: list[PendingObservation],
        tasks: list[EngineTask[Any]],
    ) -> None:
        """Move a dead replica's sessions and work elsewhere, tell the sessions, await its replacement.

        ``dispatcher`` is the worker that noticed (a late notice of an earlier worker only re-queues its work).
        """
        if dispatcher is None:
            return
        moved: dict[Hashable, int] = {}
        with self._lock:
            first_notice = replica.dispatcher is dispatcher and replica.state == "live"
            if first_notice:
                failover = self.router.replica_lost(replica.index)
                replica.state = "replacing"
                replica.failovers += 1
                self.failovers += 1
                moved = failover.moved
                in_hand = list(in_hand) + failover.observations
                tasks = list(tasks) + failover.background
        self._requeue(in_hand, tasks)
        if not first_notice:
            return
        logger.warning(
            "replica %d (%s) lost: %d session(s) moved, %d observation(s) and %d task(s) re-queued",
            replica.index,
            replica.actor_name,
            len(moved),
            len(in_hand),
            len(tasks),
        )
        self._post(
            self._host.notify_sessions,
            REPLICA_MOVED,
            {
                session_id: {
                    "from_replica": replica.index,
                    "to_replica": target,
                    "message": (
                        f"engine replica {replica.index} was lost; this session now runs on replica {target}. "
                        "Its state there (prefix cache, real-time chunking) starts afresh; observations are "
                        "served as before"
                    ),
                }
                for session_id, target in moved.items()
            },
        )
        if not self._stopping.is_set():
            threading.Thread(
                target=self._replace, args=(replica, dispatcher), name=f"replica-{replica.index}-replace", daemon=True
            ).start()

    def _requeue(self, observations: list[PendingObservation], tasks: list[EngineTask[Any]]) -> None:
        """Queue a lost replica's work again on the live ones (what cannot be queued is dropped ``shutdown``)."""
        for item in observations:
            if item.cancelled:
                continue
            try:
                older = self.router.requeue(item)
            except QueueClosed:
                self._post(item.owner.on_dropped, item, DropReason.SHUTDOWN)
                continue
            if older is not None:
                self._post(older.owner.on_dropped, older, DropReason.SUPERSEDED)
        for task in tasks:
            try:
                self.router.put_background(task)
            except QueueClosed:  # no replica left: the job goes back to queued in the store
                self._post(task.owner.on_dropped, task, DropReason.SHUTDOWN)

    def _replace(self, replica: _Replica, lost: EngineWorker) -> None:
        """Wait for Serve's replacement, then put the replica back in service with a fresh worker."""
        lost.stop(timeout=60.0)  # its queue is closed: it exits once its call returned
        lost_actor_id = replica.identity.actor_id if replica.identity is not None else None
        queue = RequestQueue()
        dispatcher = self._new_dispatcher(
            replica, queue, lambda: self._deployments.replacement(replica.index, lost_actor_id)
        )
        with self._lock:
            replica.retired = replica.retired + lost.counters
            replica.dispatcher = dispatcher
        dispatcher.start()
        while dispatcher.state in (WorkerState.STARTING, WorkerState.LOADING, WorkerState.WARMING_UP):
            if self._stopping.wait(0.05):
                return
        if dispatcher.state is not WorkerState.READY:
            replica.state = "failed"
            logger.error("replica %d could not be replaced", replica.index)
            return
        with self._lock:
            replica.identity = replica.engine.identity if replica.engine is not None else None
            self.router.replica_back(replica.index, queue)
            replica.state = "live"
        logger.info("replica %d back in service as %s", replica.index, replica.actor_name)

    def _post(self, callback: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the event loop is closed: nobody is waiting


@dataclass(frozen=True)
class RayBackendFactory:
    """What ``PolicyServer(backend=...)`` needs to run on Ray: the replicas' settings and how each loads its engine."""

    settings: RayBackendSettings
    loader: EngineLoader

    def make_queue(self) -> ReplicaRouter:
        return ReplicaRouter(self.settings.replicas)

    def make_backend(self, host: BackendHost, queue: ReplicaRouter, loop: asyncio.AbstractEventLoop) -> RayBackend:
        # Pinning counts open sessions only: sessions end without telling the queue.
        queue.set_open_sessions(lambda: list(host.sessions))
        batching = BatchPolicy(host.settings.max_batch, host.settings.max_batch_wait_ms)
        background = BackgroundShare(host.settings.video_step_interval_s)
        return RayBackend(self.settings, self.loader, host, queue, loop, batching, background)
