"""Who receives what the engine made of a request: the owner contract of the queue's items.

Every item in the request queue names its owner. The engine worker (or a backend's dispatcher) posts
the outcome back to that owner on the event loop; metrics label the request by the owner's
``request_kind``. Owners are sessions (native, openpi), the HTTP sidecar's action waiter, and the video
runner's tasks. These protocols are the whole of what the engine side may call on an owner, so nothing
probes an owner with ``getattr``/``hasattr``.

This module imports nothing from sessions or the HTTP sidecar: they depend on it, never the reverse.
"""

from __future__ import annotations

from typing import Any, Protocol

from .outcome import EngineOutcome

# The items are typed ``Any`` here: request_queue imports this module (its items' ``owner`` fields are
# typed with these protocols), so this one cannot import request_queue back, not even for annotations.


class ObservationOwner(Protocol):
    """The owner of a :class:`~policy_server.engine.request_queue.PendingObservation`.

    ``request_kind`` is the metrics label of its requests (``realtime``, ``openpi``,
    ``action_generation``, ...). ``on_result`` and ``on_dropped`` are called on the event loop, exactly one
    of them per observation that reached the queue, unless the owner cancelled it first.
    """

    request_kind: str

    def on_result(self, item: Any, outcome: EngineOutcome) -> None: ...

    def on_dropped(self, item: Any, reason: str) -> None: ...


class TaskOwner(Protocol):
    """The owner of a background :class:`~policy_server.engine.request_queue.EngineTask` (a video rollout).

    ``on_timeout`` is called instead of ``on_result`` when the watchdog abandoned the engine call that
    ran the task (``error`` is the coded ``engine_timeout`` error).
    """

    def on_result(self, task: Any, result: Any) -> None: ...

    def on_dropped(self, task: Any, reason: str) -> None: ...

    def on_timeout(self, task: Any, error: Any) -> None: ...
