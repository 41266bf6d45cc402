"""One engine call for one batch of observations: the call, its one-by-one fallback, an outcome each.

The engine worker decides *when* a batch runs (turns, deadlines, the watchdog's clock, background
work); this module is *how* it runs: ``predict_actions`` for one observation, ``predict_actions_batch``
for several, and, when a batched call fails, each request alone, so that only the request at fault gets
the error. Every failure becomes that observation's :class:`~policy_server.engine.outcome.EngineOutcome`
except :class:`~policy_server.engine.outcome.EngineLost` (the engine went away), which propagates.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cosmos3_runtime.requests import ActionChunk, ActionRequest

from .outcome import EngineLost, EngineOutcome, engine_failure

if TYPE_CHECKING:
    from .request_queue import PendingObservation

logger = logging.getLogger(__name__)


class Predictor(Protocol):
    """The part of an engine that serves observations (the worker's ``ActionEngine`` extends it)."""

    def predict_actions(self, request: ActionRequest) -> ActionChunk: ...

    def predict_actions_batch(self, requests: list[ActionRequest]) -> list[ActionChunk | Exception]: ...


@dataclass
class EngineCounters:
    """What a worker has done since it started (the backend interface reads them one by one)."""

    completed: int = 0
    failed: int = 0
    dropped_deadline: int = 0
    batches: int = 0
    batched_items: int = 0
    # Seconds spent running the engine (observations and background tasks), for the busy fraction.
    busy_s: float = 0.0
    # Host inputs of observations (engine.prepare_actions): made while an earlier call ran (overlapped),
    # or on the engine thread just before their own call (inline, the device idle meanwhile).
    overlapped_preps: int = 0
    inline_preps: int = 0
    # Times the engine sat idle between two calls while an observation waited, and those seconds.
    idle_gaps: int = 0
    idle_gap_s: float = 0.0

    def __add__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(*(mine + theirs for mine, theirs in zip(astuple(self), astuple(other))))


class CounterReadouts:
    """The counters of :class:`~policy_server.engine.backend.EngineBackend`, read from ``self.counters``."""

    counters: EngineCounters

    completed = property(lambda self: self.counters.completed)
    failed = property(lambda self: self.counters.failed)
    dropped_deadline = property(lambda self: self.counters.dropped_deadline)
    batches = property(lambda self: self.counters.batches)
    batched_items = property(lambda self: self.counters.batched_items)
    busy_s = property(lambda self: self.counters.busy_s)


def predict_batch(
    engine: Predictor, batch: list[PendingObservation], counters: EngineCounters, prepared: list[Any] | None = None
) -> list[EngineOutcome]:
    """Run ``batch`` (one observation or more) through ``engine``; an outcome per observation, in order.

    ``prepared``: each observation's ``engine.prepare_actions`` (an engine that splits its work,
    :class:`~policy_server.engine.host_prep.PreparingEngine`), run with ``predict_prepared``; None: the
    requests go to ``predict_actions`` / ``predict_actions_batch``.
    Raises :class:`~policy_server.engine.outcome.EngineLost`, and nothing else.
    """
    t0 = time.monotonic()
    if prepared is None:
        run_one, run_all, inputs = engine.predict_actions, engine.predict_actions_batch, [i.request for i in batch]
    else:
        run_all, inputs = engine.predict_prepared, prepared

        def run_one(one: Any) -> Any:
            return engine.predict_prepared([one])[0]

    if len(batch) == 1:
        results: list[Any] = [_call(run_one, inputs[0])]
    else:
        try:
            results = run_all(inputs)
            counters.batches += 1
            counters.batched_items += len(batch)
        except EngineLost:
            raise
        except Exception:  # noqa: BLE001 - one bad request must not fail its batch mates:
            # run each alone, so only the request that fails gets the error.
            logger.warning("a batch of %d failed in the engine; running its requests one by one", len(batch))
            results = [_call(run_one, one) for one in inputs]
    done = time.monotonic()
    return [_outcome(item, result, (done - t0) * 1e3, done, counters) for item, result in zip(batch, results)]


def _outcome(
    item: PendingObservation, result: Any, engine_ms: float, done: float, counters: EngineCounters
) -> EngineOutcome:
    if isinstance(result, BaseException):
        counters.failed += 1
        error = engine_failure(result, "observation", f"seq {item.seq} of session {item.session_id}")
        return EngineOutcome(error=error, engine_ms=engine_ms, done_at=done)
    counters.completed += 1
    return EngineOutcome(chunk=result, engine_ms=engine_ms, done_at=done)


def _call(fn: Callable[[Any], Any], arg: Any) -> Any:
    """``fn(arg)``, or the exception it raised, so single and batched calls report the same way.

    :class:`EngineLost` is not the request's failure: it propagates."""
    try:
        return fn(arg)
    except EngineLost:
        raise
    except Exception as exc:  # noqa: BLE001 - turned into an outcome by the caller
        return exc
