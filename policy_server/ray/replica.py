"""One engine replica as a Ray Serve deployment: the Cosmos3 engine, loaded and warmed up in a Ray actor.

Imported only by :mod:`policy_server.ray.backend` (it imports Ray). The front end calls the replica's
methods through a Serve deployment handle: ``describe``, ``predict_actions``, ``predict_actions_batch``
and ``rollout_video`` are the engine's own API, so the replica adds no protocol of its own. Requests and
results travel as the runtime's dataclasses (numpy arrays inside), pickled by Ray; typed runtime errors
(``InvalidRequestError`` with its ``field``) survive the trip and reach the client unchanged.

``identity()`` names the Ray actor that answers (its name, id, node and threads): the backend uses the
actor name to notice that the replica died, and the id to tell a replacement apart.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ray import serve

from cosmos3_runtime.description import ModelDescription

# Serve's health check calls check_health() this often; a replica that fails it (or dies) is replaced.
HEALTH_CHECK_PERIOD_S = 2.0


@dataclass(frozen=True)
class ReplicaIdentity:
    """The Ray actor serving a replica, as it reports itself (pickled back to the front end)."""

    actor_name: str | None
    actor_id: str | None
    node_id: str
    threads: dict[str, object]  # the engine thread's torch settings (cpu_threads.configure_worker_threads)


@dataclass(frozen=True)
class EngineLoader:
    """How a replica loads its engine (pickled to the replica: paths must exist on its node)."""

    source: str
    device: str | None = None
    dtype: str | None = None
    profiles_path: str | None = None
    prefix_cache_mb: float = 256.0
    compile: bool = False
    torch_threads: int | None = None
    warmup: bool = True

    def load(self) -> Any:
        from cosmos3_runtime.engine import Cosmos3Engine

        return Cosmos3Engine.load(
            self.source,
            device=self.device,
            dtype=self.dtype,
            profiles_path=self.profiles_path,
            prefix_cache_mb=self.prefix_cache_mb,
            compile=self.compile,
        )


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

        from ..engine.cpu_threads import configure_worker_threads

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
        return self.engine.describe()

    def identity(self) -> ReplicaIdentity:
        return self._identity

    def predict_actions(self, request: Any) -> Any:
        return self.engine.predict_actions(request)

    def predict_actions_batch(self, requests: list[Any]) -> list[Any]:
        return self.engine.predict_actions_batch(requests)

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
