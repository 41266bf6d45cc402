"""How the engine worker shares the engine: which observations run together, and how much background work gets.

Two policies, both pure and both read by :class:`~policy_server.engine.worker.EngineWorker` (and by every
replica's worker of the Ray backend) on its thread:

* :class:`BatchPolicy`: which waiting observations of different sessions may share one engine call, and
  how long the first may be held for others to join it;
* :class:`BackgroundShare`: how often background work (video rollouts) gets a step while robots wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .request_queue import PendingObservation


@dataclass(frozen=True)
class BatchPolicy:
    """How the worker groups waiting observations of different sessions into one engine call.

    ``max_batch`` 1 turns batching off. ``max_wait_ms`` is the longest an observation may be held so
    others can join it; the default 0 only batches what is already waiting, so batching never adds
    latency, it only shares forwards when several robots wait at once.

    ``overlap_host_prep``: while a batch runs, a host thread prepares the next ``max_batch`` waiting
    observations (validation, frames into the model's canvas), so the engine does not wait for that
    work between batches (``HostPrep`` in :mod:`policy_server.engine.worker`).
    """

    max_batch: int = 4
    max_wait_ms: float = 0.0
    overlap_host_prep: bool = True

    @staticmethod
    def compatible(a: PendingObservation, b: PendingObservation) -> bool:
        """Same schedule (steps, guidance, interval): the engine can run them through shared forwards.

        The requests carry an observation's own settings merged over its session's, so this compares
        what each will actually run with. The schedule is all that must match: every other setting
        (mode, domain, horizon, tier, view point, prompt, fps, seed, prefix) is per item in a packed
        forward, and a batched chunk equals its unbatched run.

        And the same kind of owner: a robot session's observation never carries a one-shot HTTP request
        (one that waits for a shared turn) in its engine call. Where a batch costs more than one request
        (CPUs), that would make the robot pay for the client's work on top of waiting for its turn.
        """
        ra, rb = a.request, b.request
        return (ra.num_steps, ra.guidance_scale, ra.guidance_interval) == (
            rb.num_steps,
            rb.guidance_scale,
            rb.guidance_interval,
        ) and (a.turn is None) == (b.turn is None)


# Under continuous robot load, a video rollout still gets one denoising step at least this often.
DEFAULT_VIDEO_STEP_INTERVAL_S = 1.0


@dataclass(frozen=True)
class BackgroundShare:
    """The engine's share for background work (video rollouts) while observations wait.

    Robots go first, but not forever. Once background work has waited ``interval_s`` for the engine
    (since its last step ended, or since it was queued), the worker gives it one step (a denoising
    step; at the end of a rollout, the decode) and then goes back to the waiting robots. So under any
    robot load a video advances at least one step per ``interval_s`` (plus the robot batch running when
    it fell due) and finishes, and a robot waits at most one extra step per ``interval_s``.
    ``interval_s`` 0: no share; background work runs only while no observation waits, and can starve.
    """

    interval_s: float = DEFAULT_VIDEO_STEP_INTERVAL_S

    def due_at(self, waiting_since: float) -> float | None:
        """When work that has waited since ``waiting_since`` is owed a turn; None: never (no share)."""
        return waiting_since + self.interval_s if self.interval_s > 0 else None
