"""Prometheus metrics of one server process, served by the HTTP sidecar at ``/metrics``.

Everything lives in a registry of its own (:class:`ServerMetrics` owns it), not in prometheus_client's
global one, so two servers in one process (tests, benchmarks) never mix their numbers.

Two kinds of metrics:

* **Events**, recorded where they happen: HTTP requests and errors by endpoint and code (by the sidecar's
  middleware and error handler), engine latency histograms by request kind (by the engine worker's
  per-batch hook for observations, by the video runner for video jobs).
* **State**, read when Prometheus scrapes (a custom collector calling the functions given to
  :class:`ServerMetrics`): queue depth, open sessions, dropped observations, engine busy time and busy
  fraction, video jobs by status. Reading state at scrape time costs nothing on the request path.

Request kinds (label ``kind``): ``realtime`` (WebSocket observations, native and openpi),
``action_generation`` (``POST /v1/actions/generations``) and ``video`` (``/v1/videos`` jobs).
Latencies: ``queue`` from entering the request queue to reaching the engine, ``model`` the engine call,
``total`` from receipt to the result being ready to send.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .engine.request_queue import EngineOutcome, PendingObservation

# The `*_created` timestamp series double every metric's output and Prometheus itself ignores them.
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NAMESPACE = "cosmos3"

# From a 10 ms realtime chunk on a GPU to a minutes-long video rollout on a CPU.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
# The busy fraction is averaged over this window (long enough to smooth single requests).
BUSY_WINDOW_S = 60.0

# The ``kind`` label of WebSocket observations (native and openpi sessions); every owner names its own
# (its ``request_kind``, policy_server.engine.request_queue.ObservationOwner).
REALTIME = "realtime"


@dataclass
class ServerStateReaders:
    """Functions the collector calls at scrape time (on the event loop or a helper thread)."""

    queue_depth: Callable[[], int]
    background_depth: Callable[[], int]
    sessions_open: Callable[[], int]
    dropped_observations: Callable[[], int]
    engine_busy_seconds: Callable[[], float]
    video_jobs_by_status: Callable[[], dict[str, int]]
    ready: Callable[[], bool]
    # Per engine replica (the backend's topology()["replicas"]): one entry for the local worker.
    replicas: Callable[[], list[dict[str, Any]]] = lambda: []
    # The recorder's counters and state (Recorder.stats()); None while the server records nothing.
    recording: Callable[[], dict[str, Any] | None] = lambda: None
    # Observations accepted with a robot state their domain does not condition on, by protocol.
    unused_state: Callable[[], dict[str, int]] = lambda: {}


class BusyFraction:
    """Fraction of the last :data:`BUSY_WINDOW_S` seconds the engine spent running, from a busy clock.

    ``busy_seconds()`` is a monotonic total (including the call running now). Each reading is kept with
    its time; the fraction is the busy time gained since the oldest reading inside the window, over the
    time elapsed since it. Before the first window has passed, it is measured since construction.
    """

    def __init__(self, busy_seconds: Callable[[], float], window_s: float = BUSY_WINDOW_S) -> None:
        self._busy_seconds = busy_seconds
        self._window_s = window_s
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float]] = deque([(time.monotonic(), busy_seconds())])

    def read(self) -> float:
        now, busy = time.monotonic(), self._busy_seconds()
        with self._lock:
            # Keep one sample at or before the window's start as the anchor.
            while len(self._samples) > 1 and self._samples[1][0] <= now - self._window_s:
                self._samples.popleft()
            anchor_t, anchor_busy = self._samples[0]
            self._samples.append((now, busy))
        elapsed = now - anchor_t
        if elapsed <= 0:
            return 0.0
        return max(0.0, min(1.0, (busy - anchor_busy) / elapsed))


class _StateCollector(Collector):
    def __init__(self, readers: ServerStateReaders) -> None:
        self._readers = readers
        self._busy = BusyFraction(readers.engine_busy_seconds)

    def collect(self) -> Iterable[Any]:
        r = self._readers
        yield GaugeMetricFamily(f"{NAMESPACE}_ready", "1 once the model is loaded and warmed up", value=int(r.ready()))
        depth = GaugeMetricFamily(f"{NAMESPACE}_queue_depth", "requests waiting for the engine", labels=["lane"])
        depth.add_metric(["observations"], r.queue_depth())
        depth.add_metric(["background"], r.background_depth())
        yield depth
        yield GaugeMetricFamily(f"{NAMESPACE}_sessions_open", "open WebSocket sessions", value=r.sessions_open())
        yield CounterMetricFamily(
            f"{NAMESPACE}_dropped_observations",
            "observations answered `dropped` (superseded, deadline, cancelled, shutdown)",
            value=r.dropped_observations(),
        )
        yield CounterMetricFamily(
            f"{NAMESPACE}_engine_busy_seconds",
            "seconds the engine worker spent running requests",
            value=r.engine_busy_seconds(),
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_engine_busy_fraction",
            f"fraction of the last {BUSY_WINDOW_S:.0f} s the engine worker spent running requests",
            value=self._busy.read(),
        )
        unused = CounterMetricFamily(
            f"{NAMESPACE}_unused_state_observations",
            "observations whose robot state was accepted and not used (the domain does not condition on state)",
            labels=["protocol"],
        )
        for protocol, count in sorted(r.unused_state().items()):
            unused.add_metric([protocol], count)
        yield unused
        yield from _replica_metrics(r.replicas())
        yield from _recording_metrics(r.recording())
        jobs = GaugeMetricFamily(f"{NAMESPACE}_video_jobs", "video jobs in the store, by status", labels=["status"])
        for status, count in sorted(r.video_jobs_by_status().items()):
            jobs.add_metric([status], count)
        yield jobs


# The recorder's counters (policy_server.recording.writer.RecorderCounters) exported as such; the rest are gauges.
_RECORDING_GAUGES = {"used_bytes", "queue_frames", "queue_bytes", "queue_events", "episodes_open"}


def _recording_metrics(stats: dict[str, Any] | None) -> Iterable[Any]:
    """``cosmos3_recording_*``: what the recorder wrote, dropped and holds, and its state (1 for the current one)."""
    if stats is None:
        return
    state = GaugeMetricFamily(
        f"{NAMESPACE}_recording_state", "the recorder's state (1: the current one)", labels=["state"]
    )
    for name in ("recording", "disk_full", "stopped"):
        state.add_metric([name], int(stats.get("state") == name))
    yield state
    for name, value in sorted(stats.items()):
        if name == "state" or not isinstance(value, (int, float)):
            continue
        family = GaugeMetricFamily if name in _RECORDING_GAUGES else CounterMetricFamily
        yield family(f"{NAMESPACE}_recording_{name}", f"recorder: {name.replace('_', ' ')}", value=value)


def _replica_metrics(replicas: list[dict[str, Any]]) -> Iterable[Any]:
    """Per-replica series, labelled ``replica`` (its index): up, pinned sessions, work done, failovers."""
    up = GaugeMetricFamily(f"{NAMESPACE}_replica_up", "1 while the engine replica is in service", labels=["replica"])
    sessions = GaugeMetricFamily(f"{NAMESPACE}_replica_sessions", "sessions pinned to the replica", labels=["replica"])
    completed = CounterMetricFamily(
        f"{NAMESPACE}_replica_completed", "requests the replica answered", labels=["replica"]
    )
    busy = CounterMetricFamily(
        f"{NAMESPACE}_replica_busy_seconds", "seconds the replica spent running requests", labels=["replica"]
    )
    failovers = CounterMetricFamily(
        f"{NAMESPACE}_replica_failovers", "times the replica was lost and its sessions moved", labels=["replica"]
    )
    for replica in replicas:
        label = [str(replica.get("replica", 0))]
        up.add_metric(label, int(replica.get("state") in ("live", "ready")))
        sessions.add_metric(label, replica.get("sessions", 0))
        completed.add_metric(label, replica.get("completed", 0))
        busy.add_metric(label, replica.get("busy_s", 0.0))
        failovers.add_metric(label, replica.get("failovers", 0))
    yield from (up, sessions, completed, busy, failovers)


class ServerMetrics:
    """The server's metrics and their registry. Thread-safe: the engine worker records into it too."""

    def __init__(self, readers: ServerStateReaders) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "http_requests",
            "HTTP requests answered by the sidecar, by route, method and status",
            ["endpoint", "method", "status"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.http_errors = Counter(
            "http_errors",
            "HTTP error answers by route and error code",
            ["endpoint", "code"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.http_duration = Histogram(
            "http_request_duration_seconds",
            "time to answer an HTTP request, by route",
            ["endpoint"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=LATENCY_BUCKETS_S,
        )
        self.queue_seconds = Histogram(
            "request_queue_seconds",
            "time a request waited for the engine",
            ["kind"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=LATENCY_BUCKETS_S,
        )
        self.model_seconds = Histogram(
            "request_model_seconds",
            "time the engine spent on a request (its batch's engine call)",
            ["kind"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=LATENCY_BUCKETS_S,
        )
        self.total_seconds = Histogram(
            "request_total_seconds",
            "time from receiving a request to its result being ready",
            ["kind"],
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=LATENCY_BUCKETS_S,
        )
        self.engine_errors = Counter(
            "engine_errors",
            "requests the engine answered with an error, by kind and code",
            ["kind", "code"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(readers))

    # -- events ------------------------------------------------------------------------------------

    def observe_http(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(endpoint, method, str(status)).inc()
        self.http_duration.labels(endpoint).observe(seconds)

    def observe_http_error(self, endpoint: str, code: str) -> None:
        self.http_errors.labels(endpoint, code).inc()

    def observe_request(
        self, kind: str, queue_s: float, model_s: float, total_s: float, error_code: str | None = None
    ) -> None:
        self.queue_seconds.labels(kind).observe(max(0.0, queue_s))
        self.model_seconds.labels(kind).observe(max(0.0, model_s))
        self.total_seconds.labels(kind).observe(max(0.0, total_s))
        if error_code is not None:
            self.engine_errors.labels(kind, error_code).inc()

    def observe_batch(self, batch: list[PendingObservation], outcomes: list[EngineOutcome]) -> None:
        """The engine worker's per-batch hook (runs on the worker thread)."""
        for item, outcome in zip(batch, outcomes):
            self.observe_request(
                item.owner.request_kind,
                queue_s=item.queue_s,
                model_s=outcome.engine_ms / 1e3,
                total_s=(outcome.done_at or time.monotonic()) - item.received_at,
                error_code=outcome.error.code if outcome.error is not None else None,
            )

    # -- exposition --------------------------------------------------------------------------------

    def render(self) -> bytes:
        return generate_latest(self.registry)
