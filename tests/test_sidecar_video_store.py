"""VideoJobStore on real SQLite and real files: states, recovery after a crash, retention, safe paths."""

from __future__ import annotations

import numpy as np
import pytest

from policy_server.videos.job_store import (
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
    assert (failed.status, failed.error_code, failed.error_field) == (
        VideoJobStatus.FAILED,
        "invalid_request",
        "action",
    )
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
    store = VideoJobStore(tmp_path, RetentionPolicy(max_age_s=100.0))
    now = 10_000.0
    expired, old, new = (store.create({}, _inputs()) for _ in range(3))
    waiting = store.create({}, _inputs())
    for job, size, at in ((expired, 10, now - 101), (old, 200, now - 50), (new, 100, now - 10)):
        store.claim_next()
        _finish(store, job.id, size, at)
    # The waiting job's inputs count too (and stay): 250 bytes for results beside them.
    store.retention = RetentionPolicy(max_age_s=100.0, max_bytes=250 + waiting.input_bytes)
    assert sorted(store.sweep(now)) == sorted([expired.id, old.id])  # too old; then over the limit
    assert [job.id for job in store.list(newest_first=False)] == [new.id, waiting.id]
    assert not store.job_dir(old.id).exists()
    assert store.expires_at(store.get(new.id)) == pytest.approx(now - 10 + 100)
    assert store.expires_at(store.get(waiting.id)) is None  # queued jobs never expire


@pytest.mark.parametrize(
    "bad", ["../video_jobs.sqlite3", "video_../../x", "VIDEO_" + "a" * 32, "", "video_" + "g" * 32]
)
def test_ids_that_could_name_a_path_are_refused(tmp_path, bad):
    store = VideoJobStore(tmp_path)
    with pytest.raises(JobNotFound):
        store.get(bad)
    with pytest.raises(JobNotFound):
        store.delete(bad)
    assert (tmp_path / "video_jobs.sqlite3").exists()


def test_inputs_are_stored_as_uploaded_counted_and_dropped_when_the_job_finishes(tmp_path):
    from sidecar_fixtures import png_bytes, rgb

    upload = png_bytes(rgb(64))
    store = VideoJobStore(tmp_path)
    job = store.create({}, VideoJobInputs(image=rgb(64), action=np.ones((4, 2), np.float32), encoded_image=upload))
    folder = store.job_dir(job.id)
    assert (folder / "input_reference.png").read_bytes() == upload  # as received, not as raw pixels
    assert store.get(job.id).input_bytes == job.input_bytes == upload.__len__() + (folder / "action.npy").stat().st_size
    np.testing.assert_array_equal(store.load_inputs(job.id).image, rgb(64))
    pixels = store.create({}, VideoJobInputs(image=rgb(64, seed=1), action=np.ones((4, 2), np.float32)))
    np.testing.assert_array_equal(store.load_inputs(pixels.id).image, rgb(64, seed=1))  # lossless PNG
    assert store.stored_bytes() == job.input_bytes + pixels.input_bytes
    store.claim_next()
    _finish(store, job.id, 1000, 1.0)
    assert sorted(p.name for p in folder.iterdir()) == ["video.mp4"]  # the inputs went with the run
    assert store.stored_bytes() == 1000 + pixels.input_bytes


def test_a_submission_over_the_limit_first_retires_finished_jobs_then_is_refused(tmp_path):
    from policy_server.videos.job_store import StorageFull

    first = VideoJobStore(tmp_path).create({}, _inputs())
    size = first.input_bytes
    store = VideoJobStore(tmp_path, RetentionPolicy(max_bytes=3 * size + size // 2))
    store.claim_next()
    _finish(store, first.id, size, 1.0)  # a finished result as big as one job's inputs
    second, third = store.create({}, _inputs()), store.create({}, _inputs())
    fourth = store.create({}, _inputs())  # fits only once the finished job is retired
    assert [job.id for job in store.list(newest_first=False)] == [second.id, third.id, fourth.id]
    with pytest.raises(StorageFull) as refused:  # three queued jobs fill it: nothing left to retire
        store.create({}, _inputs())
    assert refused.value.cap and "--video-storage-mib" in refused.value.message
    assert store.stored_bytes() <= store.retention.max_bytes
    assert sorted(p.name for p in store.jobs_dir.iterdir()) == sorted([second.id, third.id, fourth.id])


def test_a_store_of_schema_1_is_migrated_and_its_inputs_counted(tmp_path):
    import sqlite3

    store = VideoJobStore(tmp_path)
    job = store.create({}, _inputs())
    store.close()
    db = sqlite3.connect(tmp_path / "video_jobs.sqlite3")  # as schema 1 left it: no input_bytes column
    db.executescript("ALTER TABLE video_jobs DROP COLUMN input_bytes; PRAGMA user_version=1;")
    db.close()
    reopened = VideoJobStore(tmp_path)
    assert reopened.get(job.id).input_bytes == job.input_bytes > 0
