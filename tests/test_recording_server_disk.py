"""A full disk under ``--record-dir`` stops recording, never serving: every observation of a recorded
session is still answered with its chunk, the session stays open, and ``/healthz`` says why nothing is
recorded.

A real full disk: the 6 MiB tmpfs of tests/test_faults_disk_full.py (needs root and mount(8); skipped
otherwise), filled with a plain file before the server starts. The recorder keeps a free-space margin
(64 MiB by default), so it finds the disk full at once and stops before any write.
"""

from __future__ import annotations

import pytest
from server_fixtures import DOMAIN, http_get
from test_faults_disk_full import fill, small_disk  # noqa: F401 - the same real tmpfs and filler
from test_recording_server import Robot, recording_server

pytestmark = pytest.mark.timeout(300)


async def test_a_full_recording_disk_stops_recording_and_every_chunk_still_comes(small_disk):
    root = small_disk / "recordings"
    root.mkdir()
    fill(small_disk, leave=64 * 1024)
    with recording_server(root) as server:
        robot = await Robot.open(server)
        await robot.send({"type": "configure", "domain_name": DOMAIN, "control_hz": 10})
        session = await robot.recv()
        assert session["type"] == "session" and session["recording"] is True
        for seq in range(8):
            reply = await robot.observe(seq)
            assert reply["type"] == "action_chunk" and reply["seq"] == seq, reply
        status, health, _ = http_get(server.health_url)
        assert status == 200 and health["status"] == "ready"
        recording = health["recording"]
        assert recording["state"] == "disk_full", recording
        assert recording["frames_recorded"] == 0 and recording["disk_full"] >= 1, recording
        assert health["sessions"] == 1  # the robot's session is still open
        await robot.ws.close()
