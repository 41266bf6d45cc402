"""The chunker's inference thread: runs ``policy.infer_chunk`` off the control thread, one request at a time.

The control loop submits a request and polls for its outcome; it never blocks on inference. Imports only
numpy and the standard library: it runs on the robot.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .chunk_policy import ChunkPolicy
from .chunker_config import ChunkerError


@dataclass
class ChunkRequest:
    generation: int
    step: int
    observation: Mapping[str, Any]
    prefix: np.ndarray | None
    sent_at: float = 0.0


@dataclass
class ChunkOutcome:
    request: ChunkRequest
    actions: np.ndarray | None
    error: BaseException | None
    latency_s: float


class InferenceThread:
    """Runs ``policy.infer_chunk`` off the control thread, one request at a time."""

    def __init__(self, policy: ChunkPolicy) -> None:
        self._policy = policy
        self._cv = threading.Condition()
        self._inbox: ChunkRequest | None = None
        self._outbox: deque[ChunkOutcome] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="chunk-inference", daemon=True)
        self._thread.start()

    def submit(self, request: ChunkRequest) -> None:
        with self._cv:
            if self._closed:
                raise ChunkerError("the chunker is closed")
            request.sent_at = time.monotonic()
            self._inbox = request
            self._cv.notify_all()

    def poll(self) -> ChunkOutcome | None:
        with self._cv:
            return self._outbox.popleft() if self._outbox else None

    def wait(self, timeout: float) -> ChunkOutcome | None:
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._outbox and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cv.wait(remaining)
            return self._outbox.popleft() if self._outbox else None

    def close(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._inbox is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                request, self._inbox = self._inbox, None
            actions, error = None, None
            try:
                actions = np.asarray(self._policy.infer_chunk(request.observation, request.prefix), dtype=np.float32)
                if actions.ndim != 2 or actions.shape[0] < 1:
                    raise ValueError(f"a chunk must be H x D, got shape {list(actions.shape)}")
            except Exception as exc:  # noqa: BLE001 - reported to the control thread, which counts it
                actions, error = None, exc
            outcome = ChunkOutcome(request, actions, error, time.monotonic() - request.sent_at)
            with self._cv:
                self._outbox.append(outcome)
                self._cv.notify_all()
