"""Engine replicas as Ray Serve applications: the replica that holds the engine, deploying it, and the
engine API over its handle.

**One Serve application per replica.** Serve's own router spreads requests over a deployment's
replicas (power of two choices); a robot session must instead stay on one replica for its lifetime, since
its text prefix cache, its seed stream and its real-time chunking state live in that engine. So each
replica is its own application (``cosmos3-replica-0``, ``-1``, ...) running one :class:`Cosmos3Replica`
with ``num_gpus=1`` (0 on CPU-only clusters), and its deployment handle addresses exactly that replica.
Serve still does what we want from it: placement on any node of the cluster, health checks, and
replacing a replica that died. Plain Ray actors would give pinning too, but then replacing, health
checking and deploying onto a cluster would be ours to write.

**The replica** loads and warms up the Cosmos3 engine in its Ray actor. Its methods are the engine's own
API (``describe``, ``predict_actions``, ``predict_actions_batch``, ``rollout_video``, and a video rollout
step by step), so it adds no protocol of its own: requests and results travel as the runtime's
dataclasses, pickled by Ray, and typed runtime errors (``InvalidRequestError`` with its ``field``) reach
the client unchanged. ``identity()`` names the Ray actor that answers (its name, id, node and threads):
the backend uses its name to notice that the replica died, and its id to tell a replacement apart.

**The remote engine** (:class:`RemoteEngine`) is the engine of the local worker that serves a replica:
every call goes through the handle and waits for its answer, one at a time. A replica that dies under a
call raises :class:`ReplicaLost`, an ``EngineLost``: the worker hands the call's work back to be queued
again on another replica.

**The connection** is made on a thread of its own that lives until :meth:`ReplicaDeployments.shutdown`:
a local Ray instance's processes die with the thread that started them (parent-death signal), so it
must not be a replica's worker thread, which ends when its replica is lost.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from cosmos3_runtime.description import ModelDescription

from ..engine.loading import EngineLoader
from ..engine.request_queue import EngineLost

logger = logging.getLogger(__name__)

# Serve's health check calls check_health() this often; a replica that fails it (or dies) is replaced.
HEALTH_CHECK_PERIOD_S = 2.0


@dataclass(frozen=True)
class ReplicaIdentity:
    """The Ray actor serving a replica, as it reports itself (pickled back to the front end)."""

    actor_name: str | None
    actor_id: str | None
    node_id: str
    threads: dict[str, object]  # the engine thread's torch settings (thread_policy.configure_worker_threads)


@serve.deployment(
    num_replicas=1,  # one application per replica, so that sessions can be pinned to it (see policy_server.ray.backend)
    # The dispatcher sends one call at a time; a second can only be a describe(), identity() or a health probe.
    max_ongoing_requests=4,
    health_check_period_s=HEALTH_CHECK_PERIOD_S,
)
class Cosmos3Replica:
    """The engine in a Serve replica. The constructor loads and warms it up; Serve reports ready after."""

    def __init__(self, loader: EngineLoader) -> None:
        import ray

        import policy_server  # noqa: F401  (OMP_WAIT_POLICY=PASSIVE before torch loads in this process)

        from ..engine.thread_policy import configure_worker_threads

        self.thread_settings = configure_worker_threads(loader.torch_threads)
        self.engine = loader.load()
        if loader.warmup:
            self.engine.warmup()
        self.rollouts: dict[str, Any] = {}
        context = ray.get_runtime_context()
        self._identity = ReplicaIdentity(
            context.get_actor_name(), context.get_actor_id(), context.get_node_id(), self.thread_settings
        )

    def describe(self) -> ModelDescription:
        description: ModelDescription = self.engine.describe()
        return description

    def identity(self) -> ReplicaIdentity:
        return self._identity

    def predict_actions(self, request: Any) -> Any:
        return self.engine.predict_actions(request)

    def predict_actions_batch(self, requests: list[Any]) -> list[Any]:
        return list(self.engine.predict_actions_batch(requests))

    def rollout_video(self, request: Any) -> Any:
        return self.engine.rollout_video(request)

    # A video rollout step by step, so the dispatcher can serve robots between steps (as the local
    # worker does). The rollout lives here, under an id; a replica's death loses it, and the job is
    # queued again elsewhere from its stored request.
    def start_video(self, request: Any) -> str:
        rollout_id = uuid.uuid4().hex
        self.rollouts[rollout_id] = self.engine.start_video(request)
        return rollout_id

    def video_step(self, rollout_id: str) -> tuple[bool, float]:
        rollout = self.rollouts[rollout_id]
        done = rollout.step()
        return done, rollout.progress

    def video_result(self, rollout_id: str) -> Any:
        return self.rollouts.pop(rollout_id).result()

    def check_health(self) -> None:
        """Serve's health probe: the replica answers, so the engine is there (a dead actor cannot)."""


class ReplicaLost(EngineLost):
    """The replica died under a call: the work in hand is queued again on another replica."""


class RemoteEngine:
    """The engine API over one replica's deployment handle."""

    def __init__(self, handle: Any, app_name: str) -> None:
        self.handle = handle
        self.app_name = app_name
        # The Ray actor that answered the last describe() (name, id, node, threads): how the backend watches it.
        self.identity: ReplicaIdentity | None = None

    def call(self, method: Any, *arguments: Any) -> Any:
        """Call ``method`` (an attribute of the handle: ``self.handle.predict_actions``) and wait for it."""
        try:
            return method.remote(*arguments).result()
        except (RayActorError, ActorUnavailableError) as exc:
            raise ReplicaLost(f"replica {self.app_name} died: {exc}") from exc
        except RayTaskError as exc:
            # The engine raised: hand the runtime's own (typed) error to the worker, as the local one does.
            raise (exc.cause if isinstance(exc.cause, Exception) else exc) from None

    def describe(self) -> ModelDescription:
        identity: ReplicaIdentity = self.call(self.handle.identity)
        self.identity = identity
        description: ModelDescription = self.call(self.handle.describe)
        return description

    def warmup(self) -> None:
        """The replica warmed up in its constructor, before Serve reported it running."""

    def predict_actions(self, request: Any) -> Any:
        return self.call(self.handle.predict_actions, request)

    def predict_actions_batch(self, requests: list[Any]) -> list[Any]:
        return list(self.call(self.handle.predict_actions_batch, requests))

    def rollout_video(self, request: Any) -> Any:
        return self.call(self.handle.rollout_video, request)

    def start_video(self, request: Any) -> RemoteVideoRollout:
        return RemoteVideoRollout(self, self.call(self.handle.start_video, request))


class RemoteVideoRollout:
    """A video rollout running on a replica, advanced one denoising step per call (like the local one)."""

    def __init__(self, engine: RemoteEngine, rollout_id: str) -> None:
        self._engine = engine
        self._id = rollout_id
        self.done = False
        self.progress = 0.0

    def step(self) -> bool:
        self.done, self.progress = self._call(self._engine.handle.video_step)
        return self.done

    def result(self) -> Any:
        return self._call(self._engine.handle.video_result)

    def _call(self, method: Any) -> Any:
        try:
            return self._engine.call(method, self._id)
        except KeyError as exc:
            # The replica answering does not hold this rollout: the one that started it died between two
            # steps and Serve replaced it. The rollout went with it, like in a death mid-step.
            raise ReplicaLost(f"replica {self._engine.app_name} lost video rollout {self._id}") from exc


SERVE_NAMESPACE = "serve"
APP_PREFIX = "cosmos3-replica"


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


class ReplicaDeployments:
    """Deploys replicas as Serve applications, finds their replacements, and watches their actors."""

    def __init__(self, settings: RayBackendSettings, loader: EngineLoader, stopping: threading.Event) -> None:
        self.settings = settings
        self.loader = loader
        self._stopping = stopping
        self._connected = threading.Event()
        self._connect_error: BaseException | None = None
        self._release_driver = threading.Event()
        self._driver = threading.Thread(target=self._drive_ray, name="ray-driver", daemon=True)
        self._owns_ray = False
        self.num_gpus = 0.0

    def app_name(self, index: int) -> str:
        return f"{self.settings.app_prefix}-{index}"

    def start(self) -> None:
        """Connect to Ray in the background (:meth:`deploy` waits for it)."""
        self._driver.start()

    def _drive_ray(self) -> None:
        try:
            self._connect_once()
        except BaseException as exc:  # noqa: BLE001 - every replica's loader reports it
            self._connect_error = exc
        finally:
            self._connected.set()
        self._release_driver.wait()

    def _connect_once(self) -> None:
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
        self.num_gpus = gpus if gpus is not None else (1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0)  # type: ignore[no-untyped-call]

    def _wait_connected(self) -> None:
        """Wait for the driver thread to connect to Ray (raises what connecting raised)."""
        self._connected.wait()
        if self._connect_error is not None:
            raise RuntimeError(f"could not connect to Ray: {self._connect_error}") from self._connect_error

    def deploy(self, index: int) -> RemoteEngine:
        """Deploy replica ``index`` (or find it running) and wait until it answers. Runs on its worker thread."""
        self._wait_connected()
        app_name = self.app_name(index)
        options = {"num_gpus": self.num_gpus, "num_cpus": self.settings.num_cpus}
        # serve.deployment made the class a Deployment; Ray's annotations still say it is the class.
        application = Cosmos3Replica.options(ray_actor_options=options).bind(self.loader)  # type: ignore[attr-defined]
        handle = serve.run(application, name=app_name, route_prefix=None)
        return RemoteEngine(handle, app_name)

    def replacement(self, index: int, lost_actor_id: str | None) -> RemoteEngine:
        """Wait for Serve's replacement of replica ``index`` (redeploy if its application is gone)."""
        app_name = self.app_name(index)
        while not self._stopping.is_set():
            try:
                handle = serve.get_app_handle(app_name)
                engine = RemoteEngine(handle, app_name)
                identity = handle.identity.remote().result(timeout_s=60.0)
                if identity.actor_id != lost_actor_id:
                    return engine
            except Exception:  # noqa: BLE001 - not back yet, or the application is gone: deploy it again
                logger.info("replica %d not back yet; (re)deploying", index, exc_info=True)
                try:
                    return self.deploy(index)
                except Exception:  # noqa: BLE001
                    logger.warning("redeploying replica %d failed; retrying", index, exc_info=True)
            time.sleep(1.0)
        raise RuntimeError("the server is stopping")

    def actor_gone(self, actor_name: str) -> bool:
        """Whether the replica actor ``actor_name`` is gone from Ray (killed, crashed, or its node died).

        A hiccup of Ray's control plane is not a death: it answers False, and the watchdog looks again."""
        try:
            ray.get_actor(actor_name, namespace=SERVE_NAMESPACE)
        except ValueError:
            return True
        except Exception:  # noqa: BLE001
            logger.debug("watchdog lookup of %s failed", actor_name, exc_info=True)
        return False

    def shutdown(self, replicas: int) -> None:
        """Delete this server's applications; stop Ray if this process started it; release the driver."""
        if ray.is_initialized():
            for index in range(replicas):
                try:
                    serve.delete(self.app_name(index), _blocking=False)
                except Exception:  # noqa: BLE001 - best effort: the cluster may be gone already
                    logger.warning("could not delete Serve application %s", self.app_name(index), exc_info=True)
            if self._owns_ray:
                serve.shutdown()  # type: ignore[no-untyped-call]
                ray.shutdown()
        self._release_driver.set()
