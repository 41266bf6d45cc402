"""``--video-storage-mib`` bounds everything the video store keeps, inputs included.

The attack run: with a 2 MiB limit, eight 58 KB PNG uploads (4096² flat frames) left 387 MB of raw
``.npy`` inputs on disk, because only finished MP4s were counted. Here the same uploads go to a real
server with a 512 KiB limit (room for those eight) whose engine holds every video job (so they all stay
queued), until the limit refuses them twice: the
store keeps each upload as received, refuses what does not fit with 507 ``storage_full``, and the
bytes on disk stay under the limit.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest
from server_fixtures import DOMAIN, tiny_checkpoint
from sidecar_fixtures import SidecarServer, actions, error_of
from test_faults_disk_full import Gate, GatedVideoEngine

from policy_server.sidecar_settings import RetentionPolicy

pytestmark = pytest.mark.timeout(180)

LIMIT = 512 * 1024


def _flat_png(side: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (90, 120, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def _bytes_under(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def test_stored_inputs_count_toward_the_storage_limit_and_are_kept_as_uploaded():
    gate = Gate()
    path = tiny_checkpoint("distilled")

    def load():
        from cosmos3_runtime.engine import Cosmos3Engine

        return GatedVideoEngine(Cosmos3Engine.load(path, device="cpu", dtype="float32"), gate)

    upload = _flat_png(4096)
    assert len(upload) < 64 * 1024  # 58 KB on the wire; 48 MiB as raw pixels
    # Sides up to the model's own 4096 (not --max-image-side's default): the attack's frames, as sent.
    with SidecarServer(load, retention=RetentionPolicy(max_bytes=LIMIT), max_image_side=4096) as server:
        try:
            jobs_dir = server.data_dir / "videos"
            accepted, refused = [], []
            for n in range(40):
                if len(refused) == 2:
                    break
                response = server.client.post(
                    "/v1/videos",
                    data={"domain_name": DOMAIN, "action": str(actions(8, seed=n)), "seed": str(n)},
                    files={"input_reference": ("frame.png", upload, "image/png")},
                )
                if response.status_code == 200:
                    accepted.append(response.json()["id"])
                else:
                    assert response.status_code == 507, response.text
                    error = error_of(response)
                    assert error["code"] == "storage_full" and "--video-storage-mib" in error["message"]
                    refused.append(n)
                assert _bytes_under(jobs_dir) <= LIMIT
            assert len(accepted) == 8  # the attack's eight fit now; a ninth would pass the limit
            assert refused == [len(accepted), len(accepted) + 1]  # refused once full, and from then on
            # Each stored first frame is the upload itself.
            stored = [jobs_dir / job_id / "input_reference.png" for job_id in accepted]
            assert all(frame.read_bytes() == upload for frame in stored)
        finally:
            gate.set()
