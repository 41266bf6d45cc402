"""Runs stored video jobs through the engine worker, one at a time, behind the robots' observations.

:class:`VideoJobRunner` is a task on the event loop. It claims the oldest queued job in the
:class:`~policy_server.videos.job_store.VideoJobStore`, hands it to the engine worker as a
:class:`VideoRolloutTask` in the request queue's background lane (which the worker serves while no
observation waits, and under robot load one step per ``--video-step-interval-s``: see
:class:`~policy_server.engine.worker.BackgroundShare`), and when the frames come back encodes the MP4
on a helper thread (never on the engine worker, which goes straight back to robots) and records the
outcome. Only one job is in the queue at a time; the rest wait in SQLite, so a backlog of jobs costs no
memory and survives restarts.

Progress is coarse until the runtime reports denoising steps: 0 while queued, 10 once the engine starts
the rollout, 90 while the MP4 is encoded, 100 when the file is in place.

On a graceful stop the running rollout finishes (the worker never abandons one) and is recorded; a job
that never reached the engine is put back in the queue without counting an attempt. A job cut short by
a crash stays ``in_progress`` in the store until :meth:`VideoJobStore.recover` re-queues it at the next
start.

A full disk never leaves a job ``in_progress`` for good. When its MP4 cannot be written the job fails
with ``storage_full``; when even that cannot be written (SQLite cannot grow its log), the runner keeps
the outcome, claims nothing new, and writes it once the disk has room again (checked every
:data:`RECHECK_INTERVAL_S`). The recovery at start is retried the same way, so a server can start on a
full disk and catch up when space is freed.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from cosmos3_runtime.requests import DomainRequest, VideoRequest
from robot_clients.protocol import CodedError, ErrorCode

from ..engine.backend import QueueLike
from ..engine.request_queue import EngineLost, EngineTask, QueueClosed, TaskOwner, engine_failure, queued_for_s
from ..metrics import ServerMetrics
from .encoding import VideoEncodingError, encode_mp4
from .job_store import JobNotFound, VideoJob, VideoJobStore, disk_full

logger = logging.getLogger(__name__)

KIND = "video"
PROGRESS_STARTED = 10
PROGRESS_ENCODING = 90
# How often finished jobs are checked against the retention policy while the runner is idle.
SWEEP_INTERVAL_S = 60.0
# Stable code of a job whose result could not be written because the data directory's disk is full.
STORAGE_FULL = "storage_full"
# After a failed write, less free space than this on the data directory's disk means "the disk is full"
# (ffmpeg reports ENOSPC as a broken pipe or an exit status, not always as an OSError we can read).
STORAGE_FULL_MARGIN_BYTES = 1 << 20
# How often outcomes the disk refused (and a recovery it refused at start) are tried again.
RECHECK_INTERVAL_S = 5.0


def storage_full(exc: BaseException, directory: Any) -> bool:
    """Whether a failed write of a result was the disk's fault (ENOSPC/EDQUOT, SQLite's "disk is full",
    or no free space left after it)."""
    if disk_full(exc):
        return True
    try:
        return shutil.disk_usage(directory).free < STORAGE_FULL_MARGIN_BYTES
    except OSError:
        return False


@dataclass
class VideoRolloutResult:
    """What the engine made of one job: frames, or a typed error."""

    frames: np.ndarray | None = None
    fps: float = 0.0
    seed: int | None = None
    timing: dict[str, float] = field(default_factory=dict)
    error: CodedError | None = None
    engine_s: float = 0.0


def video_request(params: dict[str, Any], image: np.ndarray, action: np.ndarray) -> VideoRequest:
    """The engine request of a stored job (params as resolved and stored at submission): each setting the
    job stored, the others at the engine's default."""
    settings = {f.name: params[f.name] for f in fields(DomainRequest) if f.name in params}
    settings["fps"] = float(params.get("fps", 24.0))
    return VideoRequest(image=image, actions=action, **settings)


class VideoRolloutTask:
    """One job's rollout, as a background task of the request queue (runs on the engine worker)."""

    def __init__(
        self, job_id: str, request: VideoRequest, loop: asyncio.AbstractEventLoop, on_started: Callable[[str], None]
    ) -> None:
        self.job_id = job_id
        self.request = request
        self.owner: TaskOwner[VideoRolloutResult] = (
            self  # the queue reports back to the task's owner, like to a session
        )
        self.request_kind = "video"  # its metrics label
        self.enqueued_at = time.monotonic()
        self.started_at: float | None = None
        self._loop = loop
        self._on_started = on_started
        self.done: asyncio.Future[VideoRolloutResult | None] = loop.create_future()

    def run(self, engine: Any, between_steps: Callable[[], None] = lambda: None) -> VideoRolloutResult:
        """Called on the worker thread; raises only EngineLost (any other failure is the result).

        The rollout advances one denoising step at a time and calls ``between_steps`` after each, where
        the worker serves any robot that is waiting.
        """
        self.started_at = time.monotonic()
        try:
            self._loop.call_soon_threadsafe(self._on_started, self.job_id)
        except RuntimeError:
            pass  # the loop is gone; nobody will read the progress
        t0 = time.monotonic()
        try:
            rollout = engine.start_video(self.request)
            while not rollout.step():
                between_steps()
            result = rollout.result()
        except EngineLost:
            raise  # not the job's failure: the worker queues the job again on another engine
        except Exception as exc:  # noqa: BLE001 - a failure is the result (the client's, or ours with a reference)
            return VideoRolloutResult(
                error=engine_failure(exc, "job", f"video job {self.job_id}"), engine_s=time.monotonic() - t0
            )
        return VideoRolloutResult(
            frames=result.frames,
            fps=result.fps,
            seed=result.seed,
            timing=result.timing.as_dict(),
            engine_s=time.monotonic() - t0,
        )

    # The queue's owner interface, called on the event loop.
    def on_result(self, task: EngineTask[Any], result: VideoRolloutResult) -> None:
        if not self.done.done():
            self.done.set_result(result)

    def on_dropped(self, task: EngineTask[Any], reason: str) -> None:
        if not self.done.done():
            self.done.set_result(None)  # never ran (the queue closed): the job goes back to queued

    def on_timeout(self, task: EngineTask[Any], error: CodedError) -> None:
        """The watchdog abandoned the hung engine call of this rollout: the job fails (not re-queued, so a
        job that hangs the engine cannot do it again and again)."""
        if not self.done.done():
            engine_s = time.monotonic() - self.started_at if self.started_at is not None else 0.0
            self.done.set_result(VideoRolloutResult(error=error, engine_s=engine_s))


class VideoJobRunner:
    """Feeds the store's queued jobs to the engine worker, one at a time, and records their outcomes."""

    def __init__(
        self,
        store: VideoJobStore,
        queue: QueueLike,
        metrics: ServerMetrics | None = None,
        sweep_interval_s: float = SWEEP_INTERVAL_S,
        recover_pending: bool = False,
    ) -> None:
        self.store = store
        self.queue = queue
        self.metrics = metrics
        self.sweep_interval_s = sweep_interval_s
        self.current: VideoRolloutTask | None = None
        self.completed = 0
        self.failed = 0
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._next_sweep = 0.0
        # Writes the disk refused, kept until it has room: the recovery at start, and final outcomes
        # (job id -> error code, message, field) of jobs that are still `in_progress` in the store.
        self.recover_pending = recover_pending
        self.unrecorded: dict[str, tuple[str, str, str | None]] = {}
        self._disk_full_since: float | None = None

    def start(self, engine_ready: Awaitable[Any]) -> None:
        """Start working once ``engine_ready`` resolves (the worker has loaded the model)."""
        self._task = asyncio.create_task(self._main(engine_ready), name="video-job-runner")

    def notify(self) -> None:
        """A job was submitted: look at the store now rather than at the next sweep."""
        self._wake.set()

    async def stop(self, timeout: float) -> None:
        """Claim nothing more; wait up to ``timeout`` for the job in hand to be recorded."""
        self._stopping = True
        self._wake.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except asyncio.TimeoutError:
            logger.warning(
                "video job %s did not finish before shutdown; it will run again at the next start",
                self.current.job_id if self.current else "?",
            )
            self._task.cancel()
        except Exception:  # noqa: BLE001 - already logged by _main
            pass
        if self.unrecorded:
            logger.warning(
                "%d video job(s) failed while the disk was full and could not be recorded so; they "
                "stay in_progress and run again at the next start",
                len(self.unrecorded),
            )

    async def _main(self, engine_ready: Awaitable[Any]) -> None:
        try:
            await engine_ready
        except Exception:  # noqa: BLE001 - the model failed to load; jobs stay queued for the next start
            return
        while not self._stopping:
            try:
                if not await self._settle():  # the disk is still full: run nothing new meanwhile
                    await self._idle(RECHECK_INTERVAL_S)
                    continue
                await self._maybe_sweep()
                job = await asyncio.to_thread(self.store.claim_next)
                if job is None:
                    await self._idle(self.sweep_interval_s)
                    continue
                self._room_again()  # claiming it was a write, and it went through
                await self._run(job)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug of ours must not stop every later job
                if disk_full(exc):  # SQLite could not claim or sweep: wait for room, quietly
                    self._disk_is_full(exc)
                    await self._idle(RECHECK_INTERVAL_S)
                    continue
                logger.exception("video job runner failed; continuing")
                await asyncio.sleep(1.0)

    async def _idle(self, seconds: float) -> None:
        """Wait ``seconds``, or less if a job is submitted (or the runner stops)."""
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _settle(self) -> bool:
        """Write what the disk refused before: final outcomes first, then the recovery at start (which
        would otherwise put those jobs back in the queue). True once nothing is left to write."""
        for job_id, (code, message, field_name) in list(self.unrecorded.items()):
            try:
                await asyncio.to_thread(self.store.fail, job_id, code, message, field_name)
            except (sqlite3.Error, OSError) as exc:
                self._disk_is_full(exc)
                return False
            del self.unrecorded[job_id]
            logger.info("video job %s: its failure (%s) is recorded now that the disk has room", job_id, code)
            self._room_again()
        if self.recover_pending:
            try:
                await asyncio.to_thread(self.store.recover)
            except (sqlite3.Error, OSError) as exc:
                self._disk_is_full(exc)
                return False
            self.recover_pending = False
            self._room_again()
        return True

    def _room_again(self) -> None:
        """A write went through: if the disk was full, say it has room again (once). Only after a write:
        having nothing left to write says nothing about the disk (a claim may still be refused)."""
        if self._disk_full_since is not None:
            logger.info(
                "the data directory %s has room again after %.0f s",
                self.store.data_dir,
                time.monotonic() - self._disk_full_since,
            )
            self._disk_full_since = None

    def _disk_is_full(self, exc: BaseException) -> None:
        """Log the moment the store stops accepting writes (once, not at every retry)."""
        if self._disk_full_since is None:
            self._disk_full_since = time.monotonic()
            logger.warning(
                "the data directory %s refuses writes (%s): video jobs wait, and %d outcome(s) will be "
                "recorded once it has room (retried every %.0f s)",
                self.store.data_dir,
                exc,
                len(self.unrecorded),
                RECHECK_INTERVAL_S,
            )

    async def _fail(self, job_id: str, code: str, message: str, field: str | None = None) -> None:
        """Record a job's failure; if the disk refuses even that, keep it for :meth:`_settle` (a job always
        reaches a final state, never stays ``in_progress``)."""
        try:
            await asyncio.to_thread(self.store.fail, job_id, code, message, field)
        except (sqlite3.Error, OSError) as exc:
            logger.error("video job %s: its failure (%s) cannot be recorded yet: %s", job_id, code, exc)
            self.unrecorded[job_id] = (code, message, field)
            self._disk_is_full(exc)

    async def _maybe_sweep(self) -> None:
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + self.sweep_interval_s
            await asyncio.to_thread(self.store.sweep)

    def _started(self, job_id: str) -> None:
        asyncio.ensure_future(asyncio.to_thread(self._set_progress, job_id, PROGRESS_STARTED))

    def _set_progress(self, job_id: str, progress: int) -> None:
        """Progress is informative only: a full disk (SQLite cannot grow its log) must not stop the job."""
        try:
            self.store.set_progress(job_id, progress)
        except (sqlite3.Error, OSError) as exc:
            logger.warning("video job %s: progress %d%% not recorded: %s", job_id, progress, exc)

    async def _run(self, job: VideoJob) -> None:
        try:
            inputs = await asyncio.to_thread(self.store.load_inputs, job.id)
        except (OSError, ValueError, JobNotFound):
            if await self._exists(job.id):
                await self._fail(
                    job.id, "inputs_lost", "this job's input files could not be read from the data directory"
                )
                self.failed += 1
            return
        request = video_request(job.params, inputs.image, inputs.action)
        task = VideoRolloutTask(job.id, request, asyncio.get_running_loop(), self._started)
        self.current = task
        try:
            try:
                self.queue.put_background(task)
            except QueueClosed:
                await asyncio.to_thread(self.store.release, job.id)
                return
            result = await task.done
            if result is None:  # dropped before it ran: the server is stopping
                await asyncio.to_thread(self.store.release, job.id)
                return
            await self._record(job, task, result)
        finally:
            self.current = None

    async def _exists(self, job_id: str) -> bool:
        try:
            await asyncio.to_thread(self.store.get, job_id)
            return True
        except JobNotFound:
            return False

    async def _record(self, job: VideoJob, task: VideoRolloutTask, result: VideoRolloutResult) -> None:
        queue_s = queued_for_s(task.enqueued_at, task.started_at)
        if result.frames is None:
            self.failed += 1
            error = result.error or CodedError(ErrorCode.ENGINE_ERROR, "the model failed on this job")
            await self._fail(job.id, error.code, error.message, error.field)
            self._observe(job, queue_s, result, error.code)
            return
        await asyncio.to_thread(self._set_progress, job.id, PROGRESS_ENCODING)
        try:
            encode_started = time.monotonic()
            encoded = await asyncio.to_thread(encode_mp4, result.frames, result.fps, self.store.video_path(job.id))
            timing = dict(
                result.timing, encode_mp4_ms=(time.monotonic() - encode_started) * 1e3, queue_ms=queue_s * 1e3
            )
        except (VideoEncodingError, OSError) as exc:
            if not await self._exists(job.id):
                return  # deleted while it ran: its folder is gone, nothing to record
            reference = uuid.uuid4().hex[:12]
            self.failed += 1
            if storage_full(exc, self.store.data_dir):
                # encode_mp4 removed its partial file: no half-written result is left behind.
                logger.error(
                    "video job %s: the data directory %s is full (ref %s): %s",
                    job.id,
                    self.store.data_dir,
                    reference,
                    exc,
                )
                code, message = (
                    STORAGE_FULL,
                    (
                        f"the server's disk for results is full; the video was not stored "
                        f"(ref {reference}). Resubmit once space is freed"
                    ),
                )
            else:
                logger.error("video job %s: encoding failed (ref %s): %s", job.id, reference, exc)
                code, message = (
                    ErrorCode.ENGINE_ERROR,
                    f"the video could not be encoded; the server log has details (ref {reference})",
                )
            await self._fail(job.id, code, message)
            self._observe(job, queue_s, result, code)
            return
        try:
            recorded = await asyncio.to_thread(
                self.store.complete,
                job.id,
                result_bytes=encoded.num_bytes,
                frames=encoded.frames,
                width=encoded.width,
                height=encoded.height,
                timing=timing,
            )
        except (sqlite3.Error, OSError) as exc:
            # The disk filled up between the MP4 and its record: drop the unrecorded file (it frees the
            # space the failure record needs) and fail the job (later, if even that cannot be written).
            reference = uuid.uuid4().hex[:12]
            logger.error("video job %s: could not record the finished video (ref %s): %s", job.id, reference, exc)
            self.store.video_path(job.id).unlink(missing_ok=True)
            self.failed += 1
            code = STORAGE_FULL if storage_full(exc, self.store.data_dir) else ErrorCode.ENGINE_ERROR
            await self._fail(
                job.id,
                code,
                f"the result could not be stored (ref {reference}); the server's disk is full"
                if code == STORAGE_FULL
                else f"the result could not be stored (ref {reference})",
            )
            self._observe(job, queue_s, result, code)
            return
        if not recorded:  # deleted while it was being encoded: drop the file the delete missed
            await asyncio.to_thread(self.store.delete, job.id)
            return
        self.completed += 1
        self._observe(job, queue_s, result, None)
        await asyncio.to_thread(self.store.sweep)  # a new result may push the store over its size limit

    def _observe(self, job: VideoJob, queue_s: float, result: VideoRolloutResult, error_code: str | None) -> None:
        if self.metrics is not None:
            total_s = time.time() - job.created_at  # from submission, restarts included
            self.metrics.observe_request(KIND, queue_s, result.engine_s, total_s, error_code)
