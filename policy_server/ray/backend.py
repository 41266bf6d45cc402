"""Engine replicas on Ray Serve, one per GPU, with sessions pinned to a replica and failover on loss.

``cosmos3-serve --backend ray --replicas N [--ray-address ADDR]``. The WebSocket front end, the
protocols and the clients are unchanged: sessions put observations in the server's queue as always;
here that queue is a :class:`~policy_server.ray.router.ReplicaRouter` (one queue per replica, a map
session -> replica) and every replica has a dispatcher that takes its sessions' work and calls it.

**Why one Serve application per replica.** Serve's own router spreads requests over a deployment's
replicas (power of two choices); a robot session must instead stay on one replica for its lifetime, since
its text prefix cache, its seed stream and its real-time chunking state live in that engine. So each
replica is its own application (``cosmos3-replica-0``, ``-1``, ...) running one
:class:`~policy_server.ray.replica.Cosmos3Replica` with ``num_gpus=1`` (0 on CPU-only clusters), and
its deployment handle addresses exactly that replica. Serve still does what we want from it: placement
on any node of the cluster, health checks, and replacing a replica that died. Plain Ray actors would give
pinning too, but then replacing, health checking and deploying onto a cluster would be ours to write.

**Dispatch.** Each replica's dispatcher is an :class:`~policy_server.engine.worker.EngineWorker` (the
local worker, unchanged: latest observation wins, fair turns, batching, deadlines, background lane)
whose "engine" is :class:`RemoteEngine`, a proxy that calls the replica through its handle. One call at
a time per replica, like the local engine.

**Failover.** A replica's death is noticed two ways: a call in flight raises ``RayActorError`` (the
proxy turns it into :class:`ReplicaLost`), or a watchdog finds the replica's actor name gone from
Ray (an idle replica). Then: its sessions move to the least-loaded live replica, the observation that
was running and those waiting are queued again there (the robot's next chunk comes from the new
replica; nothing is answered with an error), each moved native session gets a ``session_event``
frame (``replica_moved``), waiting and running video jobs are queued again on other replicas (a job
is only recorded by the runner once a replica returns its frames, and the job store stays the source
of truth across restarts). Serve starts a replacement; once it is up the replica takes new sessions.

Ray is imported here only (and in :mod:`policy_server.ray.replica`); the local backend never loads it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from robot_clients.protocol import DropReason

from ..engine.outcome import EngineOutcome
from ..engine.request_queue import BackgroundTask, PendingObservation, QueueClosed, RequestQueue
from ..engine.worker import BackgroundShare, BatchPolicy, EngineWorker, WorkerState
from .replica import Cosmos3Replica, EngineSpec
from .router import ReplicaRouter

if TYPE_CHECKING:
    from ..server import PolicyServer

logger = logging.getLogger(__name__)

SERVE_NAMESPACE = "serve"
APP_PREFIX = "cosmos3-replica"
# How often the watchdog looks for replicas that died while idle.
WATCHDOG_PERIOD_S = 0.5
REPLICA_MOVED = "replica_moved"


class ReplicaLost(BaseException):
    """The replica died under a call. A BaseException so that the worker's and the video task's
    ``except Exception`` (which turn engine failures into client errors) let it through to failover."""


@dataclass(frozen=True)
class RayBackendSettings:
    """Where and how the replicas run."""

    replicas: int = 1
    # None: start a local Ray instance in this process; "auto" or "ray://host:10001" or "host:6379": join one.
    address: str | None = None
    # Per replica. None: one GPU if the cluster has GPUs, else a CPU replica.
    num_gpus: float | None = None
    num_cpus: float = 1.0
    # CPUs of the local Ray instance (when address is None); None: Ray's default (all cores).
    local_num_cpus: int | None = None
    app_prefix: str = APP_PREFIX


class RemoteEngine:
    """The engine API over one replica's deployment handle (what the dispatcher's worker calls)."""

    def __init__(self, handle: Any, app_name: str) -> None:
        self.handle = handle
        self.app_name = app_name
        self.identity: dict[str, Any] = {}

    def _call(self, method: str, argument: Any) -> Any:
        try:
            return getattr(self.handle, method).remote(argument).result()
        except (RayActorError, ActorUnavailableError) as exc:
            raise ReplicaLost(f"replica {self.app_name} died: {exc}") from exc
        except RayTaskError as exc:
            # The engine raised: hand the runtime's own (typed) error to the worker, as the local one does.
            cause = getattr(exc, "cause", None)
            raise cause if isinstance(cause, Exception) else exc

    def describe(self) -> dict[str, Any]:
        try:
            description = dict(self.handle.describe.remote().result())
        except (RayActorError, ActorUnavailableError) as exc:
            raise ReplicaLost(f"replica {self.app_name} died: {exc}") from exc
        self.identity = description.pop("replica", {})
        return description

    def warmup(self) -> None:
        """The replica warmed up in its constructor, before Serve reported it running."""

    def predict_actions(self, request: Any) -> Any:
        return self._call("predict_actions", request)

    def predict_actions_batch(self, requests: list[Any]) -> list[Any]:
        return self._call("predict_actions_batch", requests)

    def rollout_video(self, request: Any) -> Any:
        return self._call("rollout_video", request)

    def start_video(self, request: Any) -> "RemoteVideoRollout":
        return RemoteVideoRollout(self, self._call("start_video", request))


class RemoteVideoRollout:
    """A video rollout running on a replica, advanced one denoising step per call (like the local one)."""

    def __init__(self, engine: RemoteEngine, rollout_id: str) -> None:
        self._engine = engine
        self._id = rollout_id
        self.done = False
        self.progress = 0.0

    def step(self) -> bool:
        self.done, self.progress = self._engine._call("video_step", self._id)
        return self.done

    def result(self) -> Any:
        return self._engine._call("video_result", self._id)


class ReplicaDispatcher(EngineWorker):
    """The local worker, taking one replica's sessions' work; on :class:`ReplicaLost` it hands the work
    in hand to ``on_lost`` (to be queued again elsewhere) instead of answering it."""

    def __init__(self, replica: int, on_lost: Callable[["ReplicaDispatcher", list[PendingObservation],
                                                        list[BackgroundTask]], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replica = replica
        self.engine: RemoteEngine | None = None
        self._on_lost = on_lost
        self._thread.name = f"replica-{replica}-dispatcher"

    def _predict(self, engine: Any, batch: list[PendingObservation]) -> list[EngineOutcome]:
        try:
            return super()._predict(engine, batch)
        except ReplicaLost as exc:
            logger.warning("replica %d lost with %d observation(s) in hand: %s", self.replica, len(batch), exc)
            self._on_lost(self, batch, [])
            return []  # nothing to answer: the batch is queued again on another replica

    def _run_background(self, engine: Any, task: BackgroundTask) -> None:
        try:
            super()._run_background(engine, task)
        except ReplicaLost as exc:
            logger.warning("replica %d lost while running a background task: %s", self.replica, exc)
            self._on_lost(self, [], [task])


@dataclass
class _Replica:
    """One replica slot: its Serve application and the dispatcher serving it now."""

    index: int
    app_name: str
    dispatcher: ReplicaDispatcher | None = None
    state: str = "loading"  # loading, live, replacing, failed, stopped
    identity: dict[str, Any] = field(default_factory=dict)
    failovers: int = 0
    # Counters of this slot's earlier dispatchers (a replacement starts its own from zero).
    retired: dict[str, float] = field(default_factory=dict)


_COUNTERS = ("completed", "failed", "dropped_deadline", "batches", "batched_items", "busy_s")


class RayBackend:
    """:class:`~policy_server.engine.backend.EngineBackend` over N Ray Serve replicas."""

    def __init__(self, settings: RayBackendSettings, spec: EngineSpec, server: "PolicyServer",
                 router: ReplicaRouter, loop: asyncio.AbstractEventLoop, batching: BatchPolicy,
                 background: BackgroundShare | None = None) -> None:
        self.settings = settings
        self.spec = spec
        self._server = server
        self.router = router
        self._loop = loop
        self._batching = batching
        self._background = background or BackgroundShare()
        self.state = WorkerState.STARTING
        self.description: dict[str, Any] | None = None
        self.thread_settings: dict[str, object] = {}
        self.on_batch_done: Callable[[list[PendingObservation], list[EngineOutcome]], None] | None = None
        self.failovers = 0
        self._replicas = [_Replica(i, f"{settings.app_prefix}-{i}") for i in range(settings.replicas)]
        self._lock = threading.RLock()
        # Ray is connected on a thread of its own that lives until stop(): a local instance's processes
        # die with the thread that started them (parent-death signal), so not on a dispatcher thread.
        self._connected = threading.Event()
        self._connect_error: BaseException | None = None
        self._release_driver = threading.Event()
        self._driver = threading.Thread(target=self._drive_ray, name="ray-driver", daemon=True)
        self._owns_ray = False
        self._num_gpus = 0.0
        self._stopping = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="ray-replica-watchdog", daemon=True)
        self._ready: asyncio.Future[dict[str, Any]] = loop.create_future()

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._driver.start()
        for replica in self._replicas:
            replica.dispatcher = self._new_dispatcher(replica.index, self.router.queue_of(replica.index), first=True)
            replica.dispatcher.start()
        self.state = WorkerState.LOADING
        self._loop.create_task(self._become_ready(), name="ray-backend-ready")

    async def _become_ready(self) -> None:
        try:
            descriptions = await asyncio.gather(*(r.dispatcher.wait_ready() for r in self._replicas))
        except BaseException as exc:  # noqa: BLE001 - reported through wait_ready
            self.state = WorkerState.FAILED
            self._ready.set_exception(exc)
            return
        for replica in self._replicas:
            replica.state = "live"
            replica.identity = dict(replica.dispatcher.engine.identity)
        self.description = descriptions[0]
        self.thread_settings = dict(self._replicas[0].identity.get("threads", {}))
        self.state = WorkerState.READY
        self._watchdog.start()
        logger.info("ray backend ready: %d replica(s) %s", len(self._replicas),
                    [r.identity.get("actor_name") for r in self._replicas])
        self._ready.set_result(self.description)

    async def wait_ready(self) -> dict[str, Any]:
        """Wait until every replica is deployed, loaded and warm; return the model's ``describe()``."""
        return await asyncio.shield(self._ready)

    def stop(self, timeout: float | None = None) -> bool:
        """Wait for the dispatchers (the queue is closed first), then delete this server's applications."""
        self._stopping.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        finished = True
        for replica in self._replicas:
            # A dispatcher still waiting for its replica (a replacement loading) has nothing to finish;
            # its thread is a daemon and gives up once the applications are deleted.
            if replica.dispatcher is not None and replica.dispatcher.state is WorkerState.READY:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                finished = replica.dispatcher.stop(left) and finished
            replica.state = "stopped"
        if ray.is_initialized():
            for replica in self._replicas:
                try:
                    serve.delete(replica.app_name, _blocking=False)
                except Exception:  # noqa: BLE001 - best effort: the cluster may be gone already
                    logger.warning("could not delete Serve application %s", replica.app_name, exc_info=True)
            if self._owns_ray:
                serve.shutdown()
                ray.shutdown()
        self._release_driver.set()
        self.state = WorkerState.STOPPED
        return finished

    # -- the EngineBackend counters, summed over replicas and their predecessors ----------------------------

    def _total(self, name: str) -> float:
        with self._lock:
            return sum(r.retired.get(name, 0) + (getattr(r.dispatcher, name) if r.dispatcher else 0)
                       for r in self._replicas)

    completed = property(lambda self: int(self._total("completed")))
    failed = property(lambda self: int(self._total("failed")))
    dropped_deadline = property(lambda self: int(self._total("dropped_deadline")))
    batches = property(lambda self: int(self._total("batches")))
    batched_items = property(lambda self: int(self._total("batched_items")))
    busy_s = property(lambda self: self._total("busy_s"))

    @property
    def busy_since(self) -> float | None:
        starts = [r.dispatcher.busy_since for r in self._replicas if r.dispatcher and r.dispatcher.busy_since]
        return min(starts) if starts else None

    @property
    def busy(self) -> bool:
        return any(r.dispatcher is not None and r.dispatcher.busy for r in self._replicas)

    def topology(self) -> dict[str, Any]:
        sessions = self.router.sessions_per_replica()
        replicas = []
        for r in self._replicas:
            d = r.dispatcher
            replicas.append({
                "replica": r.index,
                "app": r.app_name,
                "state": r.state,
                "actor_name": r.identity.get("actor_name"),
                "actor_id": r.identity.get("actor_id"),
                "node_id": r.identity.get("node_id"),
                "sessions": sessions[r.index],
                "completed": int(r.retired.get("completed", 0) + (d.completed if d else 0)),
                "failed": int(r.retired.get("failed", 0) + (d.failed if d else 0)),
                "busy_s": r.retired.get("busy_s", 0.0) + (d.busy_s if d else 0.0),
                "failovers": r.failovers,
            })
        return {"backend": "ray", "ray_address": self.settings.address or "local", "num_gpus_per_replica": self._num_gpus,
                "failovers": self.failovers, "replicas": replicas}

    # -- connecting to Ray and the replicas ----------------------------------------------------------------

    def _drive_ray(self) -> None:
        try:
            self._connect_ray_once()
        except BaseException as exc:  # noqa: BLE001 - every replica's loader reports it
            self._connect_error = exc
        finally:
            self._connected.set()
        self._release_driver.wait()

    def _connect_ray(self) -> None:
        """Wait for the driver thread to connect to Ray (raises what connecting raised)."""
        self._connected.wait()
        if self._connect_error is not None:
            raise RuntimeError(f"could not connect to Ray: {self._connect_error}") from self._connect_error

    def _connect_ray_once(self) -> None:
        if not ray.is_initialized():
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if self.settings.address is not None:
                options["address"] = self.settings.address
            elif self.settings.local_num_cpus is not None:
                options["num_cpus"] = self.settings.local_num_cpus
            ray.init(**options)
            self._owns_ray = True
        # No Serve HTTP proxy: our own front end is the only caller, through deployment handles.
        serve.start(proxy_location="Disabled")
        gpus = self.settings.num_gpus
        self._num_gpus = gpus if gpus is not None else (1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0)

    def _deploy(self, index: int) -> RemoteEngine:
        """Deploy replica ``index`` (or find it running) and wait until it answers. Runs on its dispatcher."""
        self._connect_ray()
        app_name = self._replicas[index].app_name
        options = {"num_gpus": self._num_gpus, "num_cpus": self.settings.num_cpus}
        application = Cosmos3Replica.options(ray_actor_options=options).bind(self.spec)
        handle = serve.run(application, name=app_name, route_prefix=None)
        return RemoteEngine(handle, app_name)

    def _reconnect(self, index: int, lost_actor_id: str | None) -> RemoteEngine:
        """Wait for Serve's replacement of replica ``index`` (redeploy if its application is gone)."""
        replica = self._replicas[index]
        while not self._stopping.is_set():
            try:
                handle = serve.get_app_handle(replica.app_name)
                engine = RemoteEngine(handle, replica.app_name)
                description = handle.describe.remote().result(timeout_s=60.0)
                if description.get("replica", {}).get("actor_id") != lost_actor_id:
                    return engine
            except Exception:  # noqa: BLE001 - not back yet, or the application is gone: deploy it again
                logger.info("replica %d not back yet; (re)deploying", index, exc_info=True)
                try:
                    return self._deploy(index)
                except Exception:  # noqa: BLE001
                    logger.warning("redeploying replica %d failed; retrying", index, exc_info=True)
            time.sleep(1.0)
        raise RuntimeError("the server is stopping")

    def _new_dispatcher(self, index: int, queue: RequestQueue, first: bool, lost_actor_id: str | None = None
                        ) -> ReplicaDispatcher:
        def load() -> RemoteEngine:
            engine = self._deploy(index) if first else self._reconnect(index, lost_actor_id)
            dispatcher.engine = engine
            return engine

        dispatcher = ReplicaDispatcher(index, self._replica_lost, load, queue, self._loop,
                                       torch_threads=1, warmup=False, batching=self._batching,
                                       background=self._background)
        dispatcher.on_batch_done = self._batch_done
        return dispatcher

    def _batch_done(self, batch: list[PendingObservation], outcomes: list[EngineOutcome]) -> None:
        if self.on_batch_done is not None and outcomes:
            self.on_batch_done(batch, outcomes)

    # -- failover ------------------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Notice replicas that died while idle (a call in flight notices by itself)."""
        while not self._stopping.wait(WATCHDOG_PERIOD_S):
            for replica in self._replicas:
                name = replica.identity.get("actor_name")
                if replica.state != "live" or not name:
                    continue
                try:
                    ray.get_actor(name, namespace=SERVE_NAMESPACE)
                except ValueError:  # the actor is gone: killed, crashed, or its node died
                    if not self._stopping.is_set():
                        self._replica_lost(replica.dispatcher, [], [])
                except Exception:  # noqa: BLE001 - Ray's control plane hiccuped; look again next round
                    logger.debug("watchdog lookup of %s failed", name, exc_info=True)

    def _replica_lost(self, dispatcher: ReplicaDispatcher | None, in_hand: list[PendingObservation],
                      tasks: list[BackgroundTask]) -> None:
        """Move a dead replica's sessions and work elsewhere, tell the sessions, await its replacement."""
        if dispatcher is None:
            return
        index = dispatcher.replica
        moved: dict[Any, int] = {}
        with self._lock:
            replica = self._replicas[index]
            first_notice = replica.dispatcher is dispatcher and replica.state == "live"
            if first_notice:
                failover = self.router.replica_lost(index)
                replica.state = "replacing"
                replica.failovers += 1
                self.failovers += 1
                moved = failover.moved
                in_hand = list(in_hand) + failover.observations
                tasks = list(tasks) + failover.background
        for item in in_hand:
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
        if not first_notice:
            return
        logger.warning("replica %d (%s) lost: %d session(s) moved, %d observation(s) and %d task(s) re-queued",
                       index, replica.identity.get("actor_name"), len(moved), len(in_hand), len(tasks))
        self._post(self._tell_sessions, moved, index)
        if not self._stopping.is_set():
            threading.Thread(target=self._replace, args=(index, dispatcher), name=f"replica-{index}-replace",
                             daemon=True).start()

    def _tell_sessions(self, moved: dict[Any, int], lost: int) -> None:
        """On the event loop: a ``session_event`` to every moved session that speaks the native protocol."""
        for session_id, target in moved.items():
            session = self._server.sessions.get(session_id)
            send = getattr(session, "send_session_event", None)
            if send is None:
                continue  # gone, or an openpi session (its protocol has no such frame): it just carries on
            send(REPLICA_MOVED, {
                "from_replica": lost,
                "to_replica": target,
                "message": (f"engine replica {lost} was lost; this session now runs on replica {target}. Its state "
                            "there (prefix cache, real-time chunking) starts afresh; observations are served as before"),
            })

    def _replace(self, index: int, lost: ReplicaDispatcher) -> None:
        """Wait for Serve's replacement, then put the replica back in service with a fresh dispatcher."""
        replica = self._replicas[index]
        lost.stop(timeout=60.0)  # its queue is closed: it exits once its call returned
        lost_actor_id = replica.identity.get("actor_id")
        queue = RequestQueue()
        dispatcher = self._new_dispatcher(index, queue, first=False, lost_actor_id=lost_actor_id)
        with self._lock:
            for name in _COUNTERS:
                replica.retired[name] = replica.retired.get(name, 0) + getattr(lost, name)
            replica.dispatcher = dispatcher
        dispatcher.start()
        while dispatcher.state in (WorkerState.STARTING, WorkerState.LOADING, WorkerState.WARMING_UP):
            if self._stopping.wait(0.05):
                return
        if dispatcher.state is not WorkerState.READY:
            replica.state = "failed"
            logger.error("replica %d could not be replaced", index)
            return
        with self._lock:
            replica.identity = dict(dispatcher.engine.identity)
            self.router.replica_back(index, queue)
            replica.state = "live"
        logger.info("replica %d back in service as %s", index, replica.identity.get("actor_name"))

    def _post(self, callback: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the event loop is closed: nobody is waiting


@dataclass(frozen=True)
class RayBackendFactory:
    """What ``PolicyServer(backend=...)`` needs to run on Ray: the replicas' settings and engine spec."""

    settings: RayBackendSettings
    spec: EngineSpec

    def make_queue(self) -> ReplicaRouter:
        return ReplicaRouter(self.settings.replicas)

    def make_backend(self, server: "PolicyServer", queue: ReplicaRouter, loop: asyncio.AbstractEventLoop) -> RayBackend:
        # Pinning counts open sessions only: sessions end without telling the queue.
        queue.set_open_sessions(lambda: list(server.sessions))
        batching = BatchPolicy(server.settings.max_batch, server.settings.max_batch_wait_ms)
        background = BackgroundShare(server.settings.video_step_interval_s)
        return RayBackend(self.settings, self.spec, server, queue, loop, batching, background)
