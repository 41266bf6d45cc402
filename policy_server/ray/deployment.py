"""Ray and Serve as the Ray backend uses them: one connection, and one Serve application per replica.

**Why one Serve application per replica.** Serve's own router spreads requests over a deployment's
replicas (power of two choices); a robot session must instead stay on one replica for its lifetime, since
its text prefix cache, its seed stream and its real-time chunking state live in that engine. So each
replica is its own application (``cosmos3-replica-0``, ``-1``, ...) running one
:class:`~policy_server.ray.replica.Cosmos3Replica` with ``num_gpus=1`` (0 on CPU-only clusters), and
its deployment handle addresses exactly that replica. Serve still does what we want from it: placement
on any node of the cluster, health checks, and replacing a replica that died. Plain Ray actors would give
pinning too, but then replacing, health checking and deploying onto a cluster would be ours to write.

**The connection** is made on a thread of its own that lives until :meth:`ReplicaDeployments.shutdown`:
a local Ray instance's processes die with the thread that started them (parent-death signal), so it
must not be a replica's worker thread, which ends when its replica is lost.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve

from .remote_engine import RemoteEngine
from .replica import Cosmos3Replica, EngineLoader

logger = logging.getLogger(__name__)

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
        self.num_gpus = gpus if gpus is not None else (1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0)

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
        application = Cosmos3Replica.options(ray_actor_options=options).bind(self.loader)
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
                serve.shutdown()
                ray.shutdown()
        self._release_driver.set()
