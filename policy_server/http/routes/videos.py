"""``/v1/videos``: forward_dynamics rollouts as persistent asynchronous jobs.

A submission is checked against the model at once (:func:`~policy_server.http.requests.video_submission`),
stored in SQLite with its inputs (:mod:`policy_server.videos.job_store`) and run by the video runner in
the engine's background lane; clients poll the job and fetch its MP4 once it completed.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse

from cosmos3_runtime.description import ModelDescription
from robot_clients.client_frames import SETTINGS_BY_NAME
from robot_clients.protocol import ErrorCode, FrameLimits

from ...foundation.api_errors import ApiError, HttpErrorCode
from ...sglang.parameters import video_fields
from ...videos.encoding import MP4_MEDIA_TYPE
from ...videos.job_store import JobNotFound, StorageFull, VideoJob, VideoJobStatus, VideoJobStore
from .. import codecs as http_codecs
from .. import requests as http_requests
from ..bodies import ERROR_RESPONSES, body_schema, read_fields
from ..parts import SidecarParts
from ..schemas import (
    ErrorDetail,
    ErrorResponse,
    VideoCreateParams,
    VideoDeleted,
    VideoJobList,
    VideoJobObject,
    VideoJobStatusName,
)


def job_object(job: VideoJob, store: VideoJobStore) -> VideoJobObject:
    """The API's view of a stored job."""
    params = job.params
    # Each setting the job object declares, as the job stored it: the engine's resolved value where it has one.
    stored = {**params, **params.get("resolved", {})}
    settings = {
        name: stored[name] for name in VideoJobObject.model_fields if name in SETTINGS_BY_NAME and name in stored
    }
    expires = store.expires_at(job)
    return VideoJobObject(
        id=job.id,
        status=cast(VideoJobStatusName, job.status.value),
        progress=job.progress,
        created_at=int(job.created_at),
        started_at=int(job.started_at) if job.started_at else None,
        completed_at=int(job.completed_at) if job.completed_at else None,
        expires_at=int(expires) if expires else None,
        model=params.get("model"),
        action_shape=params["action_shape"],
        **settings,
        size=f"{job.width}x{job.height}" if job.width else None,
        frames=job.result_frames or None,
        seconds=round(job.result_frames / params["fps"], 3) if job.result_frames else None,
        bytes=job.result_bytes or None,
        attempts=job.attempts,
        error=ErrorDetail(code=job.error_code, message=job.error_message or "", field=job.error_field)
        if job.error_code
        else None,
        # SGLang's clients download the video from `url` once it is set.
        url=f"/v1/videos/{job.id}/content" if job.status is VideoJobStatus.COMPLETED else None,
    )


def _submission(
    fields: dict[str, Any], description: ModelDescription, limits: FrameLimits
) -> http_requests.VideoSubmission:
    """A submission with SGLang's field names or ours (:func:`~policy_server.sglang.parameters.video_fields`),
    checked by our own rules; an error names the field as the client wrote it."""
    mapped = video_fields(fields, description, default_fps=VideoCreateParams.model_fields["fps"].default)
    try:
        return http_requests.video_submission(mapped.fields, description, limits)
    except ApiError as exc:
        raise mapped.relabel(exc) from None


async def _stored_job(store: VideoJobStore, video_id: str) -> VideoJob:
    try:
        return await asyncio.to_thread(store.get, video_id)
    except JobNotFound:
        raise ApiError(HttpErrorCode.NOT_FOUND, f"no video job {video_id!r}", "video_id") from None


def router(parts: SidecarParts) -> APIRouter:
    """The ``/v1/videos`` routes over ``parts.store``, whose jobs ``parts.runner`` runs."""
    routes = APIRouter(tags=["videos"])
    store = parts.store

    @routes.post(
        "/v1/videos",
        response_model=VideoJobObject,
        status_code=200,
        summary="Submit a forward_dynamics rollout (asynchronous job)",
        responses={**ERROR_RESPONSES, 429: {"model": ErrorResponse, "description": "too many queued jobs"}},
        openapi_extra=body_schema(VideoCreateParams, {"input_reference": "first frame: PNG, JPEG or WebP"}),
    )
    async def create_video(request: Request) -> VideoJobObject:
        description = parts.require_ready()
        fields, _ = await read_fields(
            request,
            {"input_reference": http_codecs.IMAGE_UPLOAD_TYPES},
            parts.settings.max_json_values,
            parts.body_budget,
        )
        submission = await asyncio.to_thread(_submission, fields, description, parts.media_limits(description))
        if await asyncio.to_thread(store.queued_count) >= store.retention.max_queued:
            raise ApiError(
                HttpErrorCode.QUEUE_FULL,
                f"{store.retention.max_queued} video jobs are already queued; retry later",
                headers={"Retry-After": "10"},
            )
        try:
            job = await asyncio.to_thread(store.create, submission.params, submission.inputs)
        except StorageFull as exc:  # store.create removed its half-written files; nothing was recorded
            message = (
                exc.message
                if exc.cap
                else (
                    "the server's disk for video jobs is full; the job was not stored. Retry after finished jobs "
                    "expire or are deleted"
                )
            )
            raise ApiError(HttpErrorCode.STORAGE_FULL, message, headers={"Retry-After": "60"}) from None
        parts.runner.notify()
        return job_object(job, store)

    @routes.get("/v1/videos", response_model=VideoJobList, summary="List video jobs")
    async def list_videos(
        limit: int = Query(20, ge=1, le=100, description="how many jobs to return"),
        after: str | None = Query(None, description="continue after this job id (from `last_id`)"),
        order: str = Query("desc", pattern="^(asc|desc)$", description="by creation time"),
    ) -> VideoJobList:
        try:
            jobs = await asyncio.to_thread(store.list, limit=limit + 1, after=after, newest_first=order == "desc")
        except JobNotFound:
            raise ApiError(ErrorCode.INVALID_FIELD, f"`after`: no video job {after!r}", "after") from None
        page = jobs[:limit]
        return VideoJobList(
            data=[job_object(job, store) for job in page],
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
            has_more=len(jobs) > limit,
        )

    video_id_param = PathParam(description="the job's id, as returned by POST /v1/videos")

    @routes.get(
        "/v1/videos/{video_id}",
        response_model=VideoJobObject,
        summary="One video job",
        responses={404: {"model": ErrorResponse}},
    )
    async def get_video(video_id: str = video_id_param) -> VideoJobObject:
        return job_object(await _stored_job(store, video_id), store)

    @routes.get(
        "/v1/videos/{video_id}/content",
        summary="The finished video (MP4, H.264)",
        response_class=FileResponse,
        responses={
            200: {"content": {MP4_MEDIA_TYPE: {}}, "description": "the MP4"},
            404: {"model": ErrorResponse},
            409: {"model": ErrorResponse, "description": "not completed"},
        },
    )
    async def video_content(video_id: str = video_id_param) -> FileResponse:
        job = await _stored_job(store, video_id)
        if job.status is VideoJobStatus.FAILED:
            raise ApiError(
                HttpErrorCode.VIDEO_FAILED,
                f"video job {video_id} failed ({job.error_code}): {job.error_message}",
                "video_id",
            )
        path = store.video_path(video_id)
        if job.status is not VideoJobStatus.COMPLETED or not path.is_file():
            raise ApiError(
                HttpErrorCode.VIDEO_NOT_READY,
                f"video job {video_id} is {job.status.value} ({job.progress}%); poll GET /v1/videos/{video_id}",
                "video_id",
                headers={"Retry-After": "2"},
            )
        return FileResponse(path, media_type=MP4_MEDIA_TYPE, filename=f"{video_id}.mp4")

    @routes.delete(
        "/v1/videos/{video_id}",
        response_model=VideoDeleted,
        summary="Delete a job and its files (a running job's result is discarded)",
        responses={404: {"model": ErrorResponse}},
    )
    async def delete_video(video_id: str = video_id_param) -> VideoDeleted:
        try:
            deleted = await asyncio.to_thread(store.delete, video_id)
        except JobNotFound:
            deleted = False
        if not deleted:
            raise ApiError(HttpErrorCode.NOT_FOUND, f"no video job {video_id!r}", "video_id")
        return VideoDeleted(id=video_id)

    return routes
