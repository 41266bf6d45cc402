"""/v1/videos against a real server and the tiny model: jobs, MP4 results, deletion, every error."""

from __future__ import annotations

import json

import numpy as np
import pytest
import websockets.sync.client as ws_client
from server_fixtures import DOMAIN
from sidecar_fixtures import (
    ACTION_DIM,
    SidecarServer,
    actions,
    engine_loader,
    error_of,
    png_bytes,
    rgb,
    video_body,
    wait_for_job,
)

from policy_server.videos.encoding import read_mp4
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(120)

JOB_KEYS = {
    "id",
    "object",
    "status",
    "progress",
    "created_at",
    "started_at",
    "completed_at",
    "expires_at",
    "model",
    "prompt",
    "domain_name",
    "action_shape",
    "fps",
    "seed",
    "num_steps",
    "guidance_scale",
    "resolution_tier",
    "size",
    "frames",
    "seconds",
    "bytes",
    "attempts",
    "error",
    "url",
}


@pytest.fixture(scope="module")
def server():
    # Each rollout starts 0.4 s late: long enough to see a job queued or running, short for the suite.
    with SidecarServer(engine_loader(video_delay_s=0.4)) as running:
        yield running


def test_json_job_runs_to_a_real_mp4(server):
    client = server.client
    created = client.post("/v1/videos", json=video_body(steps=8, prompt="push the block", fps=12))
    assert created.status_code == 200, created.text
    job = created.json()
    assert set(job) == JOB_KEYS
    assert job["object"] == "video" and job["status"] == "queued" and job["progress"] == 0
    assert job["id"].startswith("video_") and isinstance(job["created_at"], int)
    assert job["action_shape"] == [8, ACTION_DIM] and job["seed"] == 7 and job["fps"] == 12
    assert job["num_steps"] == 4 and job["guidance_scale"] == 1.0  # the distilled defaults, resolved

    # Before it completes, the content is a typed 409.
    early = client.get(f"/v1/videos/{job['id']}/content")
    assert early.status_code == 409 and error_of(early)["code"] == "video_not_ready"

    done = wait_for_job(client, job["id"])
    assert done["status"] == "completed", done
    assert done["progress"] == 100 and done["attempts"] == 1 and done["error"] is None
    assert done["frames"] == 9 and done["size"] == "64x64" and done["seconds"] == pytest.approx(9 / 12, abs=1e-3)
    assert done["expires_at"] > done["completed_at"]

    content = client.get(f"/v1/videos/{job['id']}/content")
    assert content.status_code == 200
    assert content.headers["content-type"] == "video/mp4"
    assert len(content.content) == done["bytes"]
    assert content.content[4:8] == b"ftyp"  # an ISO media file
    path = server.data_dir / "check.mp4"
    path.write_bytes(content.content)
    frames = read_mp4(path)
    assert frames.shape == (9, 64, 64, 3) and frames.dtype == np.uint8


def test_multipart_upload_and_listing_and_delete(server):
    client = server.client
    files = {"input_reference": ("../../etc/passwd.png", png_bytes(rgb(48, seed=3)), "image/png")}
    data = {"action": json.dumps(actions(4)), "domain_name": DOMAIN, "seed": "11", "fps": "8"}
    created = client.post("/v1/videos", data=data, files=files)
    assert created.status_code == 200, created.text
    job_id = created.json()["id"]
    assert created.json()["seed"] == 11 and created.json()["fps"] == 8.0
    # The client's file name is never used as a path: only the job's own folder exists.
    assert sorted(p.name for p in server.data_dir.rglob("*passwd*")) == []

    listed = client.get("/v1/videos", params={"limit": 100}).json()
    assert listed["object"] == "list" and job_id in [job["id"] for job in listed["data"]]
    page = client.get("/v1/videos", params={"limit": 1}).json()
    assert len(page["data"]) == 1 and page["data"][0]["id"] == listed["data"][0]["id"]  # newest first
    assert page["has_more"] == (len(listed["data"]) > 1)
    if page["has_more"]:
        second = client.get("/v1/videos", params={"limit": 1, "after": page["last_id"]}).json()
        assert second["data"][0]["id"] == listed["data"][1]["id"]

    wait_for_job(client, job_id)
    folder = server.data_dir / "videos" / job_id
    assert (folder / "video.mp4").is_file()
    deleted = client.delete(f"/v1/videos/{job_id}")
    assert deleted.status_code == 200 and deleted.json() == {"id": job_id, "object": "video.deleted", "deleted": True}
    assert not folder.exists()
    for method, path in (
        ("GET", f"/v1/videos/{job_id}"),
        ("GET", f"/v1/videos/{job_id}/content"),
        ("DELETE", f"/v1/videos/{job_id}"),
    ):
        gone = client.request(method, path)
        assert gone.status_code == 404 and error_of(gone) == {
            "code": "not_found",
            "message": f"no video job {job_id!r}",
            "field": "video_id",
        }


def test_msgpack_body_and_delete_while_running(server):
    client = server.client
    body = {"action": np.asarray(actions(8), np.float32), "input_reference": rgb(40), "domain_name": DOMAIN}
    created = client.post("/v1/videos", content=packb(body), headers={"content-type": "application/msgpack"})
    assert created.status_code == 200, created.text
    job_id = created.json()["id"]
    wait_for_job(client, job_id, statuses=("in_progress",))
    assert client.delete(f"/v1/videos/{job_id}").status_code == 200
    # The running rollout finishes on the engine, and its result is discarded, not resurrected.
    follow = client.post("/v1/videos", json=video_body(steps=4))
    wait_for_job(client, follow.json()["id"])
    assert client.get(f"/v1/videos/{job_id}").status_code == 404
    assert not (server.data_dir / "videos" / job_id).exists()


def test_a_robot_waits_for_at_most_the_running_video_job(server):
    """Three queued jobs of >= 0.4 s each: a robot's observation goes before the two still waiting."""
    client = server.client
    jobs = [client.post("/v1/videos", json=video_body(steps=4, seed=i)).json()["id"] for i in range(3)]
    wait_for_job(client, jobs[0], statuses=("in_progress",))
    with ws_client.connect(server.url, compression=None, proxy=None, max_size=2**24) as ws:
        unpackb(ws.recv())  # metadata
        ws.send(packb({"type": "configure", "domain_name": DOMAIN}))
        assert unpackb(ws.recv())["type"] == "session"
        ws.send(packb({"type": "observation", "seq": 1, "image": rgb(64)}))
        reply = unpackb(ws.recv(timeout=30))
        assert reply["type"] == "action_chunk", reply
        statuses = [client.get(f"/v1/videos/{job_id}").json()["status"] for job_id in jobs]
    assert statuses[2] == "queued", f"the robot waited behind the video backlog: {statuses}"
    for job_id in jobs:
        assert wait_for_job(client, job_id)["status"] == "completed"


@pytest.mark.parametrize(
    ("change", "code", "field"),
    [
        ({"action_mode": "policy"}, "unsupported_mode", "action_mode"),
        ({"action_mode": "inverse_dynamics"}, "unsupported_mode", "action_mode"),
        ({"domain_name": "no_such_robot"}, "unknown_domain", "domain_name"),
        ({"action": actions(8, dim=ACTION_DIM + 1)}, "invalid_field", "action"),
        ({"action": actions(6)}, "invalid_field", "action"),  # not a multiple of the VAE's 4
        ({"action": [[1.0, 2.0], [3.0]]}, "invalid_field", "action"),
        ({"action": "fast"}, "invalid_field", "action"),
        ({"resolution_tier": 123}, "unsupported_tier", "resolution_tier"),
        ({"num_steps": 9}, "invalid_field", "num_steps"),  # distilled: the fixed schedule only
        ({"guidance_scale": 3.0}, "invalid_field", "guidance_scale"),
        ({"fps": 0}, "invalid_field", "fps"),
        ({"seed": -1}, "invalid_field", "seed"),
        ({"view_point": "from_mars"}, "invalid_field", "view_point"),
        ({"input_reference": "not base64!"}, "invalid_image", "input_reference"),
        ({"input_reference": "aGVsbG8="}, "invalid_image", "input_reference"),  # base64 of "hello"
        ({"input_reference": rgb(4).tolist()}, "invalid_image", "input_reference"),  # below the minimum side (8)
        ({"colour": "red"}, "invalid_field", "colour"),
        ({"model": "someone/else"}, "invalid_field", "model"),
    ],
)
def test_bad_video_requests_are_typed_400s(server, change, code, field):
    response = server.client.post("/v1/videos", json={**video_body(), **change})
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert (error["code"], error["field"]) == (code, field), error


def test_policy_request_on_videos_names_the_action_endpoint(server):
    error = error_of(server.client.post("/v1/videos", json={**video_body(), "action_mode": "policy"}))
    assert "/v1/actions/generations" in error["message"]


def test_missing_fields_and_bad_bodies(server):
    client = server.client
    body = video_body()
    del body["action"]
    missing = client.post("/v1/videos", json=body)
    assert missing.status_code == 400 and error_of(missing)["code"] == "missing_field"
    assert error_of(missing)["field"] == "action"
    not_json = client.post("/v1/videos", content=b"{nope", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and error_of(not_json)["code"] == "bad_body"
    not_object = client.post("/v1/videos", json=[1, 2])
    assert not_object.status_code == 400 and error_of(not_object)["code"] == "bad_body"
    bad_msgpack = client.post("/v1/videos", content=b"\xc1\xc1", headers={"content-type": "application/msgpack"})
    assert bad_msgpack.status_code == 400 and error_of(bad_msgpack)["code"] == "bad_body"
    text = client.post("/v1/videos", content=b"hello", headers={"content-type": "text/plain"})
    assert text.status_code == 415 and error_of(text)["code"] == "unsupported_media_type"


def test_upload_content_type_and_size_limits(server):
    client = server.client
    data = {"action": json.dumps(actions(4)), "domain_name": DOMAIN}
    wrong_type = client.post(
        "/v1/videos", data=data, files={"input_reference": ("x.png", png_bytes(rgb()), "application/octet-stream")}
    )
    assert wrong_type.status_code == 415 and error_of(wrong_type)["field"] == "input_reference"
    lying = client.post(
        "/v1/videos", data=data, files={"input_reference": ("x.png", b"GIF89a" + b"0" * 64, "image/png")}
    )
    assert lying.status_code == 400 and error_of(lying)["code"] == "invalid_image"
    not_a_file_field = client.post(
        "/v1/videos",
        data=data,
        files={"input_reference": ("x.png", png_bytes(rgb()), "image/png"), "action": ("a.json", b"[]", "image/png")},
    )
    assert not_a_file_field.status_code == 400 and error_of(not_a_file_field)["field"] == "action"
    bad_action_text = client.post(
        "/v1/videos",
        data={**data, "action": "[[1, 2"},
        files={"input_reference": ("x.png", png_bytes(rgb()), "image/png")},
    )
    assert bad_action_text.status_code == 400 and error_of(bad_action_text)["field"] == "action"


def test_bodies_over_the_limit_are_413_and_the_server_carries_on():
    with SidecarServer(engine_loader(), max_body_bytes=64 * 1024) as small:
        client = small.client
        big = client.post("/v1/videos", json=video_body(input_reference=rgb(128).tolist()))
        assert big.status_code == 413 and error_of(big)["code"] == "payload_too_large"

        def chunks():  # no Content-Length: the limit is enforced while reading
            for _ in range(40):
                yield b" " * 4096

        streamed = client.post("/v1/videos", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413 and error_of(streamed)["code"] == "payload_too_large"
        ok = client.post("/v1/videos", json=video_body(steps=4))
        assert ok.status_code == 200
        assert wait_for_job(client, ok.json()["id"])["status"] == "completed"
