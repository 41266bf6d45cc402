"""The disk under the recordings fills up: recording stops with a logged error and a counter, the
session calling the recorder goes on unaffected, nothing half-written is published, and once space is
freed recording resumes by itself (the cut episode is published up to its last committed segment).

A real full disk: the 6 MiB tmpfs of tests/test_faults_disk_full.py (needs root and mount(8); skipped
otherwise), filled with a plain file while a session is recording, with no free-space margin
(``min_free_bytes=0``), so that the writes themselves fail with ENOSPC.
"""

from __future__ import annotations

import json
import logging
import time

import pyarrow.parquet as pq
import pytest
from recording_fixtures import CONFIG, MODEL, leftovers, record_traffic, recorders  # noqa: F401
from test_faults_disk_full import fill, small_disk  # noqa: F401 - the same real tmpfs and filler

from policy_server.recording import RecordingStore
from policy_server.recording.replay import RecordedEpisode

pytestmark = pytest.mark.timeout(120)
CAMERA = {"front": (240, 320)}  # with random pixels a 4-frame segment is far bigger than what is left


def wait_for(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_a_full_disk_stops_recording_not_the_session_and_recording_resumes_when_space_is_freed(
    small_disk, recorders, caplog
):
    root = small_disk / "recordings"
    recorder = recorders(root, segment_frames=4, min_free_bytes=0, disk_retry_s=0.5)
    earlier = recorder.session("earlier")
    earlier.start_episode(CONFIG, MODEL)
    record_traffic(earlier, 6)
    earlier.end_episode("closed")
    live = recorder.session("live")
    live.start_episode(CONFIG, MODEL)
    record_traffic(live, 4, drop_every=0, cameras=CAMERA)  # one committed segment before the disk fills
    assert recorder.sync()
    assert wait_for(lambda: len(list((root / ".partial").rglob("segment.json"))) == 1)

    filler = fill(small_disk, 16 * 1024)
    with caplog.at_level(logging.ERROR, logger="policy_server.recording"):
        traffic = record_traffic(live, 8, start_seq=4, drop_every=0, cameras=CAMERA, noise=True)
        assert recorder.sync()
        assert wait_for(lambda: recorder.stats()["state"] == "disk_full")
    assert any("recording stopped: the disk" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    stats = recorder.stats()
    assert stats["disk_full"] == 1 and stats["write_errors"] == 0 and stats["frames_not_recorded"] > 0
    assert all(s.queued for s in traffic.sent[:4])  # the caller's calls went through, none raised
    # While the disk is full a frame is not even queued: it costs the session nothing.
    assert record_traffic(live, 1, start_seq=50, drop_every=0, cameras=CAMERA).sent[0].queued is False
    assert recorder.stats()["frames_refused"] == 1
    published = [info.name for info in RecordingStore(root).list()]
    assert len(published) == 1 and "_earlier_" in published[0]

    filler.unlink()
    assert wait_for(lambda: recorder.stats()["state"] == "recording")
    record_traffic(live, 4, start_seq=100, drop_every=0, cameras=CAMERA)  # it goes on, in a new episode
    live.end_episode("closed")
    assert recorder.sync()
    names = sorted(info.name for info in RecordingStore(root).list())
    assert sorted(n.split("_", 1)[1] for n in names) == ["earlier_000", "live_000", "live_001"]
    cut = next(root.glob("*_live_000"))
    session = json.loads((cut / "meta/cosmos3/session.json").read_text())
    assert session["frames"] == 4 and session["end_reason"] in ("disk_full", "interrupted")
    resumed = next(root.glob("*_live_001"))
    resumed_rows = pq.read_table(resumed / "data/chunk-000/file-000.parquet").to_pydict()
    assert resumed_rows["observation.seq"] == [100, 101, 102, 103]
    assert resumed_rows["observation.received_at"][0] == 0.0  # the new episode starts with its first frame
    for path in (cut, resumed, next(root.glob("*_earlier_000"))):
        episode = RecordedEpisode(path)
        assert len(list(episode.frames())) == episode.num_frames
    assert leftovers(root) == []
    assert recorder.stats()["episodes_recovered"] == 1
