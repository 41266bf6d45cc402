"""The disk for video results fills up: the job fails with ``storage_full``, nothing half-written stays,
new submissions are refused with 507 ``storage_full`` (never 500), and the server keeps serving; once
space is freed, jobs run again. When even the job's failure cannot be written (SQLite cannot grow its
log), the job still reaches a final state: once space returns, or after a restart (which must work on
the full disk too).

A real full disk: a 6 MiB tmpfs mounted for the test as the sidecar's data directory (needs root and
``mount``; skipped otherwise), filled with a plain file while a job waits on the engine. The engine is
the real tiny engine whose ``start_video`` waits for a gate (:class:`GatedVideoEngine`), so the disk
can be filled after the job was accepted and before its MP4 is written.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import http_get, tiny_checkpoint
from sidecar_fixtures import SidecarServer, error_of, png_b64, rgb, video_body, wait_for_job

from policy_server.videos.runner import RECHECK_INTERVAL_S

# What is left free after filling: less than a 128x128 job's inputs (48 KiB) or the MP4 need, enough for
# SQLite to record the job's failure (a few WAL pages).
LEFT_FREE_BYTES = 24 * 1024


class GatedVideoEngine:
    """A real engine whose ``start_video`` waits until ``gate`` is set (at most 60 s); ``gate.entered`` is
    set once a rollout is waiting at the gate (its job claimed: ``in_progress`` in the store)."""

    def __init__(self, engine: Any, gate: threading.Event) -> None:
        self.engine = engine
        self.gate = gate

    def start_video(self, request):
        self.gate.entered.set()
        self.gate.wait(60)
        return self.engine.start_video(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


@pytest.fixture
def small_disk():
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    mountpoint = Path(tempfile.mkdtemp(prefix="disk-full-"))
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mountpoint)], capture_output=True)
    if result.returncode != 0:
        mountpoint.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        mountpoint.rmdir()


def fill(directory: Path, leave: int) -> Path:
    """Write until the disk refuses (ENOSPC), then give back ``leave`` bytes."""
    filler = directory / "filler.bin"
    with open(filler, "wb", buffering=0) as handle:
        chunk = b"\1" * 4096
        try:
            while True:
                handle.write(chunk)
        except OSError:
            pass
        size = handle.seek(0, os.SEEK_END)
        handle.truncate(max(0, size - leave))
    return filler


class Gate(threading.Event):
    """The event a :class:`GatedVideoEngine` waits for, and the one it sets on reaching it."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()


def gated_loader(gate: Gate):
    path = tiny_checkpoint("distilled")

    def load():
        from cosmos3_runtime.engine import Cosmos3Engine

        return GatedVideoEngine(Cosmos3Engine.load(path, device="cpu", dtype="float32"), gate)

    return load


@contextmanager
def gated_sidecar(disk: Path) -> Iterator[tuple[SidecarServer, Gate]]:
    """A sidecar keeping its data on ``disk``, whose engine starts a video only once the gate is set; the
    gate is set on the way out, so a job left waiting does not hold the shutdown."""
    gate = Gate()
    with SidecarServer(gated_loader(gate), data_dir=disk / "data") as server:
        try:
            yield server, gate
        finally:
            gate.set()


def assert_serving_robots(server: SidecarServer) -> None:
    """Health checks answer ready and a one-shot action request is answered."""
    assert http_get(server.health_url)[1]["status"] == "ready"
    generation = server.client.post(
        "/v1/actions/generations", json={"domain_name": "bridge_orig_lerobot", "image": video_body()["input_reference"]}
    )
    assert generation.status_code == 200, generation.text


def test_a_full_results_disk_fails_the_job_with_storage_full_and_the_server_carries_on(small_disk):
    with gated_sidecar(small_disk) as (server, gate):
        client = server.client
        job = client.post("/v1/videos", json=video_body(steps=8)).json()
        assert job["status"] in ("queued", "in_progress"), job
        filler = fill(small_disk, LEFT_FREE_BYTES)
        # A new job cannot be stored: a clear 507, and no half-created job left behind.
        refused = client.post("/v1/videos", json=video_body(steps=8, seed=1, input_reference=png_b64(rgb(128))))
        assert refused.status_code == 507, refused.text
        assert error_of(refused)["code"] == "storage_full"
        assert [j["id"] for j in client.get("/v1/videos").json()["data"]] == [job["id"]]

        gate.set()  # the accepted job runs; its MP4 cannot be written
        failed = wait_for_job(client, job["id"], timeout=60)
        assert failed["status"] == "failed", failed
        assert failed["error"]["code"] == "storage_full" and "full" in failed["error"]["message"]
        assert client.get(f"/v1/videos/{job['id']}/content").status_code == 409
        leftovers = [
            p.name
            for p in (small_disk / "data" / "videos").rglob("*")
            if p.name.endswith(".partial") or p.name.startswith(".staging-")
        ]
        assert leftovers == []

        assert_serving_robots(server)  # meanwhile

        # Space freed: the store is consistent and jobs run to completion again.
        filler.unlink()
        again = client.post("/v1/videos", json=video_body(steps=8, seed=2)).json()
        done = wait_for_job(client, again["id"], timeout=60)
        assert done["status"] == "completed", done
        assert client.get(f"/v1/videos/{again['id']}/content").content[4:8] == b"ftyp"
        statuses = {j["id"]: j["status"] for j in client.get("/v1/videos").json()["data"]}
        assert statuses == {job["id"]: "failed", again["id"]: "completed"}


def test_a_submission_with_little_free_space_is_refused_with_507_not_500(small_disk):
    """3 MiB free and a first frame that does not compress to less (random pixels): once a 500."""
    with gated_sidecar(small_disk) as (server, _):
        fill(small_disk, 3 * 2**20)
        refused = server.client.post("/v1/videos", json=video_body(steps=8, input_reference=png_b64(rgb(1100))))
        assert refused.status_code == 507, refused.text
        assert error_of(refused)["code"] == "storage_full"
        assert server.client.get("/v1/videos").json()["data"] == []
        assert [p.name for p in (small_disk / "data" / "videos").iterdir()] == []  # no half-written job


def _fail_unrecordably(server: SidecarServer, gate: Gate, disk: Path) -> tuple[dict[str, Any], Path]:
    """Submit a job, wait until the runner has claimed it and its rollout waits at the engine's gate, fill
    the disk to the last page, let the job run: its MP4 cannot be written, nor its failure (SQLite cannot
    grow its log). Returns the job and the filler file, once the runner holds the failure it could not
    record.

    The disk is filled only once the job is claimed: a runner that finds the disk full before it claims
    the job (a busy machine delays it) cannot mark it ``in_progress`` and rightly runs nothing until
    there is room (:func:`test_a_job_queued_when_the_disk_fills_waits_for_room_and_the_runner_says_so_once`)."""
    job = server.client.post("/v1/videos", json=video_body(steps=8)).json()
    assert gate.entered.wait(60), "the job never reached the engine"
    filler = fill(disk, 0)
    gate.set()
    deadline = time.monotonic() + 60
    while job["id"] not in server.sidecar.runner.unrecorded:
        assert time.monotonic() < deadline, "the job's outcome never reached the runner"
        time.sleep(0.1)
    return job, filler


def test_a_failure_the_disk_refused_is_recorded_once_space_returns(small_disk):
    with gated_sidecar(small_disk) as (server, gate):
        job, filler = _fail_unrecordably(server, gate, small_disk)
        assert server.client.get(f"/v1/videos/{job['id']}").json()["status"] == "in_progress"
        assert http_get(server.health_url)[1]["status"] == "ready"  # robots are served meanwhile
        filler.unlink()
        failed = wait_for_job(server.client, job["id"], timeout=30)
        assert failed["status"] == "failed" and failed["error"]["code"] == "storage_full", failed


def test_a_server_restarted_on_a_full_disk_serves_and_finishes_the_job_once_space_returns(small_disk):
    with gated_sidecar(small_disk) as (server, gate):
        job, filler = _fail_unrecordably(server, gate, small_disk)
    # Stopped while the disk is full: the job is still in_progress in the store. The gate stays open.
    with SidecarServer(gated_loader(gate), data_dir=small_disk / "data") as restarted:  # starts on the full disk
        assert_serving_robots(restarted)
        assert restarted.client.get(f"/v1/videos/{job['id']}").json()["status"] == "in_progress"
        filler.unlink()
        done = wait_for_job(restarted.client, job["id"], timeout=60)
        assert done["status"] == "completed", done  # re-queued by the recovery, run again, stored
        assert restarted.client.get(f"/v1/videos/{job['id']}/content").content[4:8] == b"ftyp"


def test_a_job_queued_when_the_disk_fills_waits_for_room_and_the_runner_says_so_once(small_disk, caplog):
    """A job still queued when the disk fills cannot be claimed (marking it ``in_progress`` is a write):
    it waits, and the runner says once that the disk refuses writes. It used to say so at every recheck,
    each time after claiming the disk had room again (it merely had nothing else to write). Once space
    is freed the job is claimed and completes."""
    caplog.set_level(logging.INFO, logger="policy_server.videos.runner")
    with gated_sidecar(small_disk) as (server, gate):
        first = server.client.post("/v1/videos", json=video_body(steps=8)).json()
        assert gate.entered.wait(60), "the job never reached the engine"
        second = server.client.post("/v1/videos", json=video_body(steps=8, seed=3)).json()  # the runner is busy
        # The first job is deleted while it runs: its outcome needs no write, so the runner goes on to
        # claim the second one on a full disk.
        assert server.client.delete(f"/v1/videos/{first['id']}").status_code == 200
        filler = fill(small_disk, 0)
        gate.set()
        time.sleep(2.5 * RECHECK_INTERVAL_S)  # rechecks while the disk stays full
        assert server.client.get(f"/v1/videos/{second['id']}").json()["status"] == "queued"
        said = [r.getMessage() for r in caplog.records if "refuses writes" in r.getMessage()]
        assert len(said) == 1, said
        assert not [r for r in caplog.records if "has room again" in r.getMessage()]
        filler.unlink()
        done = wait_for_job(server.client, second["id"], timeout=60)
        assert done["status"] == "completed", done
        assert len([r for r in caplog.records if "has room again" in r.getMessage()]) == 1
