"""VideoJobStore on real SQLite and real files: states, recovery after a crash, retention, safe paths."""

from __future__ import annotations

import numpy as np
import pytest

from policy_server.video_jobs import (
    MAX_ATTEMPTS,
    JobNotFound,
    RetentionPolicy,
    VideoJobInputs,
    VideoJobStatus,
    VideoJobStore,
)


def _inputs() -> VideoJobInputs:
    return VideoJobInputs(image=np.zeros((8, 8, 3), np.uint8), action=np.ones((4, 2), np.float32))


def _finish(store: VideoJobStore, job_id: str, size: int, completed_at: float) -> None:
    store.video_path(job_id).write_bytes(b"x" * size)
    store.complete(job_id, result_bytes=size, frames=5, width=8, height=8, timing={})
    store._update(job_id, completed_at=completed_at)  # backdate, as if it finished then


def test_lifecycle_and_inputs_round_trip(tmp_path):
    store = VideoJobStore(tmp_path)
    job = store.create({"domain_name": "d"}, _inputs())
    assert store.get(job.id).status is VideoJobStatus.QUEUED
    claimed = store.claim_next()
    assert claimed.id == job.id and claimed.status is VideoJobStatus.IN_PROGRESS and claimed.attempts == 1
    assert store.claim_next() is None
    inputs = store.load_inputs(job.id)
    assert inputs.image.dtype == np.uint8 and inputs.action.dtype == np.float32
    np.testing.assert_array_equal(inputs.action, np.ones((4, 2)))
    store.fail(job.id, "invalid_request", "bad", "action")
    failed = store.get(job.id)
    assert (failed.status, failed.error_code, failed.error_field) == (VideoJobStatus.FAILED, "invalid_request", "action")
    assert store.count_by_status()["failed"] == 1


def test_recover_requeues_interrupted_jobs_and_removes_strays(tmp_path):
    store = VideoJobStore(tmp_path)
    first, second = store.create({}, _inputs()), store.create({}, _inputs())
    store.claim_next()
    (store.jobs_dir / ".staging-video_deadbeef").mkdir()  # a submission that never committed
    (store.job_dir(second.id) / "video.mp4.partial").write_bytes(b"half")
    store.close()

    reopened = VideoJobStore(tmp_path)  # as after a crash
    report = reopened.recover()
    assert report == {"requeued": 1, "failed": 0, "strays": 1}
    assert reopened.get(first.id).status is VideoJobStatus.QUEUED and reopened.get(first.id).attempts == 1
    assert not (reopened.job_dir(second.id) / "video.mp4.partial").exists()
    assert reopened.claim_next().id == first.id  # oldest first, still


def test_a_job_that_keeps_killing_the_server_fails_instead_of_looping(tmp_path):
    store = VideoJobStore(tmp_path)
    job = store.create({}, _inputs())
    for _ in range(MAX_ATTEMPTS):
        assert store.claim_next().id == job.id
        store.recover()  # the process died while it ran
    assert store.claim_next() is None
    assert store.get(job.id).status is VideoJobStatus.FAILED and store.get(job.id).error_code == "interrupted"


def test_release_does_not_count_an_attempt(tmp_path):
    store = VideoJobStore(tmp_path)
    job = store.create({}, _inputs())
    store.claim_next()
    assert store.release(job.id)
    assert store.get(job.id).status is VideoJobStatus.QUEUED and store.get(job.id).attempts == 0


def test_recover_fails_queued_jobs_whose_inputs_are_gone(tmp_path):
    store = VideoJobStore(tmp_path)
    job = store.create({}, _inputs())
    (store.job_dir(job.id) / "action.npy").unlink()
    assert store.recover()["failed"] == 1
    assert store.get(job.id).error_code == "inputs_lost"


def test_retention_by_age_then_by_size_oldest_first(tmp_path):
    store = VideoJobStore(tmp_path, RetentionPolicy(max_age_s=100.0, max_bytes=250))
    now = 10_000.0
    expired, old, new = (store.create({}, _inputs()) for _ in range(3))
    waiting = store.create({}, _inputs())
    for job, size, at in ((expired, 10, now - 101), (old, 200, now - 50), (new, 100, now - 10)):
        store.claim_next()
        _finish(store, job.id, size, at)
    assert sorted(store.sweep(now)) == sorted([expired.id, old.id])  # too old; then over 250 bytes
    assert [job.id for job in store.list(newest_first=False)] == [new.id, waiting.id]
    assert not store.job_dir(old.id).exists()
    assert store.expires_at(store.get(new.id)) == pytest.approx(now - 10 + 100)
    assert store.expires_at(store.get(waiting.id)) is None  # queued jobs never expire


@pytest.mark.parametrize("bad", ["../video_jobs.sqlite3", "video_../../x", "VIDEO_" + "a" * 32, "", "video_" + "g" * 32])
def test_ids_that_could_name_a_path_are_refused(tmp_path, bad):
    store = VideoJobStore(tmp_path)
    with pytest.raises(JobNotFound):
        store.get(bad)
    with pytest.raises(JobNotFound):
        store.delete(bad)
    assert (tmp_path / "video_jobs.sqlite3").exists()
