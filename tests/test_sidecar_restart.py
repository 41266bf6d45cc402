"""Video jobs survive the server being killed: SIGKILL a real ``cosmos3-serve`` mid-job, restart it on the
same data directory, and every accepted job completes; finished ones are still downloadable."""

from __future__ import annotations

import signal
import sqlite3
import time

import httpx
import pytest
from server_fixtures import ServerProcess
from sidecar_fixtures import video_body, wait_for_job

from policy_server.videos.encoding import read_mp4

pytestmark = pytest.mark.timeout(180)


def _serve(data_dir) -> tuple[ServerProcess, httpx.Client]:
    process = ServerProcess("--tiny", "distilled", "--data-dir", str(data_dir), "--no-warmup", "--log-level", "info")
    process.start(timeout=120)
    assert process.http_port, process.log
    client = httpx.Client(base_url=f"http://127.0.0.1:{process.http_port}", trust_env=False, timeout=30)
    deadline = time.monotonic() + 120
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline and process.proc.poll() is None, process.log
        time.sleep(0.05)
    return process, client


def test_sigkill_mid_job_then_restart_runs_every_job_to_completion(tmp_path):
    data_dir = tmp_path / "data"
    first, client = _serve(data_dir)
    try:
        finished = client.post("/v1/videos", json=video_body(steps=4)).json()["id"]
        wait_for_job(client, finished)
        finished_bytes = client.get(f"/v1/videos/{finished}/content").content
        # 64 actions at 64x64: long enough (~0.5 s of engine time each here) to be caught running.
        jobs = [client.post("/v1/videos", json=video_body(steps=64, seed=i)).json()["id"] for i in range(3)]
        deadline = time.monotonic() + 60
        while True:
            running = client.get(f"/v1/videos/{jobs[0]}").json()
            if running["status"] == "in_progress" and running["progress"] >= 10:  # on the engine now
                break
            assert running["status"] != "completed", "the job finished before it could be interrupted"
            assert time.monotonic() < deadline, running
            time.sleep(0.01)
        first.signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
    finally:
        client.close()
        first.kill()

    # What the killed process left behind: the interrupted job is still marked as running.
    with sqlite3.connect(data_dir / "video_jobs.sqlite3") as db:
        left = dict(db.execute("SELECT id, status FROM video_jobs").fetchall())
    assert left[jobs[0]] == "in_progress" and left[finished] == "completed"
    assert {left[job] for job in jobs[1:]} <= {"queued", "in_progress", "completed"}

    second, client = _serve(data_dir)
    try:
        for job_id in jobs:
            job = wait_for_job(client, job_id, timeout=90)
            assert job["status"] == "completed", job
            assert job["frames"] == 65
            content = client.get(f"/v1/videos/{job_id}/content")
            assert content.status_code == 200
            path = tmp_path / f"{job_id}.mp4"
            path.write_bytes(content.content)
            assert read_mp4(path).shape == (65, 64, 64, 3)
        assert client.get(f"/v1/videos/{jobs[0]}").json()["attempts"] == 2  # started again after the kill
        assert client.get(f"/v1/videos/{finished}/content").content == finished_bytes
        assert "re-queued" in second.log
        second.signal(signal.SIGTERM)
        assert second.wait(60) == 0
    finally:
        client.close()
        second.kill()
