"""The engine API over one replica's Serve deployment handle: the "engine" of that replica's worker.

Each replica of the Ray backend is served by the local :class:`~policy_server.engine.worker.EngineWorker`
(fair turns, batching, deadlines, the background lane), whose engine is a :class:`RemoteEngine`: every
call goes through the replica's deployment handle and waits for its answer, one call at a time per
replica, like the local engine.

A replica that dies under a call (``RayActorError``, ``ActorUnavailableError``) raises
:class:`ReplicaLost`, an :class:`~policy_server.engine.outcome.EngineLost`: the worker hands the call's
work to the backend, which queues it again on another replica. An error the engine itself raised reaches
the worker as the runtime's own typed error, as with the local engine.
"""

from __future__ import annotations

from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from cosmos3_runtime.description import ModelDescription

from ..engine.outcome import EngineLost
from .replica import ReplicaIdentity


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
        return self.call(self.handle.predict_actions_batch, requests)

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
