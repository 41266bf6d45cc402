"""The engine watchdog: a hung engine call is abandoned and the engine reloaded.

The watchdog (:class:`EngineWatchdog`, a task on the event loop) notices such a call. A model can hang
(a driver stuck on a GPU, a deadlock in a native library, an infinite loop in a custom kernel); without
it every robot waits forever on a server that still answers ``/healthz``. It looks at the worker's
``call_started_at`` every ``interval_s``; a call (one inference, or one denoising step of a video job)
older than ``timeout_s`` is abandoned: its requests are answered ``engine_timeout`` (a video job fails
with it), the worker reports ``restarting`` (``/readyz`` 503, ``/healthz`` ``"status": "restarting"``; new
robot handshakes get 503 + ``Retry-After`` until the fresh engine is ready), and a new worker thread loads
a fresh engine. The stuck thread's late result is discarded, and it holds its engine's memory until then,
so the limit is generous (minutes: the slowest legitimate call on the slowest device, times a few). Only
the local worker is watched; a Ray backend's replicas are replaced by Serve.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .worker import EngineWorker

logger = logging.getLogger(__name__)

DEFAULT_ENGINE_TIMEOUT_S = 300.0


class EngineWatchdog:
    """Polls ``worker.call_started_at``; trips when a call is older than ``timeout_s``."""

    def __init__(self, worker: EngineWorker | None, timeout_s: float, interval_s: float | None = None) -> None:
        self.worker = worker
        self.timeout_s = float(timeout_s)
        # Check often enough that the trip comes within ~10% of the limit, never busier than 20 Hz.
        self.interval_s = interval_s if interval_s is not None else min(1.0, max(0.05, self.timeout_s / 10))
        self.trips = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.timeout_s > 0 and self.worker is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-watchdog")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def check(self, now: float | None = None) -> bool:
        """Trip if the running call is over the limit. True when it tripped."""
        if self.worker is None:
            return False
        started = self.worker.call_started_at
        now = time.monotonic() if now is None else now
        if started is None or now - started <= self.timeout_s:
            return False
        self.trips += 1
        self.worker.abandon_hung_call(self.timeout_s)
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watchdog must outlive its own bugs
                logger.exception("engine watchdog check failed")
