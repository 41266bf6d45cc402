"""/healthz, /readyz, /metrics and /openapi.json of the HTTP sidecar, against a real server."""

from __future__ import annotations

import re
import threading

import httpx
import pytest
import websockets.sync.client as ws_client
from server_fixtures import DOMAIN
from sidecar_fixtures import SidecarServer, engine_loader, error_of, png_b64, rgb, video_body, wait_for_job

from policy_server.metadata import public_model_name
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    with SidecarServer(engine_loader()) as running:
        yield running


def _sample(text: str, name: str, **labels: str) -> float:
    """One sample's value from Prometheus text (0 when the series does not exist yet)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(3) or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            return float(match.group(4))
    return 0.0


def test_health_and_readiness_while_loading_and_after():
    gate = threading.Event()
    with SidecarServer(engine_loader(gate=gate), wait_ready=False) as loading:
        client = loading.client
        health = client.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["ready"] is False
        assert ready.json()["status"] in ("starting", "loading")
        refused = client.post("/v1/videos", json=video_body())
        assert refused.status_code == 503 and error_of(refused)["code"] == "not_ready"
        assert refused.headers["retry-after"] == "1"
        assert client.get("/v1/actions/metadata").status_code == 503
        metrics = client.get("/metrics").text
        assert _sample(metrics, "cosmos3_ready") == 0
        gate.set()
        loading.run(lambda: None)
        import time

        deadline = time.monotonic() + 60
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.05)
        assert client.get("/readyz").json() == {
            "ready": True,
            "status": "ready",
            # The model by its folder's name, never the server's path (policy_server.metadata).
            "model": public_model_name(loading.server.context.description.model),
            "variant": "distilled",
            # Which weights answer: full precision, the checkpoint folder's SHA-256, no Hub commit.
            "weights": loading.server.context.description.weights.as_json(),
        }
        assert client.get("/readyz").json()["weights"]["quantization"] == "none"


def test_metrics_move_when_requests_are_made(server):
    client = server.client
    before = client.get("/metrics")
    assert before.status_code == 200 and before.headers["content-type"].startswith("text/plain")
    text = before.text
    assert _sample(text, "cosmos3_ready") == 1
    generations_ok = _sample(text, "cosmos3_http_requests_total", endpoint="/v1/actions/generations", status="200")
    unknown_domain = _sample(
        text, "cosmos3_http_errors_total", endpoint="/v1/actions/generations", code="unknown_domain"
    )
    action_latencies = _sample(text, "cosmos3_request_total_seconds_count", kind="action_generation")
    realtime_latencies = _sample(text, "cosmos3_request_model_seconds_count", kind="realtime")
    video_latencies = _sample(text, "cosmos3_request_queue_seconds_count", kind="video")
    completed_jobs = _sample(text, "cosmos3_video_jobs", status="completed")
    busy = _sample(text, "cosmos3_engine_busy_seconds_total")
    dropped = _sample(text, "cosmos3_dropped_observations_total")

    assert (
        client.post("/v1/actions/generations", json={"domain_name": DOMAIN, "image": png_b64(rgb())}).status_code == 200
    )
    assert (
        client.post("/v1/actions/generations", json={"domain_name": "nope", "image": png_b64(rgb())}).status_code == 400
    )
    job = client.post("/v1/videos", json=video_body(steps=4)).json()
    wait_for_job(client, job["id"])
    with ws_client.connect(server.url, compression=None, proxy=None, max_size=2**24) as ws:
        unpackb(ws.recv())
        ws.send(packb({"type": "configure", "domain_name": DOMAIN}))
        unpackb(ws.recv())
        ws.send(packb({"type": "observation", "seq": 1, "image": rgb()}))
        ws.send(packb({"type": "cancel", "seq": 1}))  # answered `dropped` (cancelled), or raced by its chunk
        first = unpackb(ws.recv(timeout=30))
        ws.send(packb({"type": "observation", "seq": 2, "image": rgb()}))
        replies = [first, unpackb(ws.recv(timeout=30))]
        assert replies[-1]["type"] == "action_chunk" or first["type"] == "action_chunk"
        assert client.get("/metrics").text and _sample(client.get("/metrics").text, "cosmos3_sessions_open") == 1
        cancelled = sum(reply["type"] == "dropped" for reply in replies)

    after = client.get("/metrics").text
    assert (
        _sample(after, "cosmos3_http_requests_total", endpoint="/v1/actions/generations", status="200")
        == generations_ok + 1
    )
    assert (
        _sample(after, "cosmos3_http_errors_total", endpoint="/v1/actions/generations", code="unknown_domain")
        == unknown_domain + 1
    )
    assert _sample(after, "cosmos3_request_total_seconds_count", kind="action_generation") == action_latencies + 1
    assert _sample(after, "cosmos3_request_model_seconds_count", kind="realtime") >= realtime_latencies + 1
    assert _sample(after, "cosmos3_request_queue_seconds_count", kind="video") == video_latencies + 1
    assert _sample(after, "cosmos3_video_jobs", status="completed") == completed_jobs + 1
    assert _sample(after, "cosmos3_engine_busy_seconds_total") > busy
    assert 0 < _sample(after, "cosmos3_engine_busy_fraction") <= 1
    assert _sample(after, "cosmos3_dropped_observations_total") == dropped + cancelled
    assert _sample(after, "cosmos3_queue_depth", lane="observations") == 0
    assert "cosmos3_request_total_seconds_bucket" in after


def test_unknown_routes_and_methods_get_typed_errors(server):
    missing = server.client.get("/v2/nothing")
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
    wrong_method = server.client.put("/v1/videos")
    assert wrong_method.status_code == 405 and error_of(wrong_method)["code"] == "method_not_allowed"
    bad_query = server.client.get("/v1/videos", params={"limit": 0})
    assert bad_query.status_code == 400 and error_of(bad_query)["field"] == "limit"
    traversal = server.client.get("/v1/videos/..%2F..%2Fvideo_jobs.sqlite3")
    assert traversal.status_code == 404


def test_openapi_schema_describes_what_is_served(server):
    schema = server.client.get("/openapi.json").json()
    paths = schema["paths"]
    expected = {
        "/v1/videos": {"get", "post"},
        "/v1/videos/{video_id}": {"get", "delete"},
        "/v1/videos/{video_id}/content": {"get"},
        "/v1/actions/generations": {"post"},
        "/v1/actions/metadata": {"get"},
        "/healthz": {"get"},
        "/readyz": {"get"},
        "/metrics": {"get"},
        # Recordings (404 on a server started without --record-dir).
        "/v1/recordings": {"get"},
        "/v1/recordings/{name}": {"get"},
        "/v1/recordings/{name}/frames": {"get"},
    }
    assert {path: set(ops) for path, ops in paths.items()} == expected
    for path in ("/v1/videos", "/v1/actions/generations"):
        content = paths[path]["post"]["requestBody"]["content"]
        assert set(content) == {"application/json", "application/msgpack", "multipart/form-data"}
    video_body_schema = paths["/v1/videos"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(video_body_schema["required"]) == {"action", "input_reference"}
    assert (
        paths["/v1/videos"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"][
            "input_reference"
        ]["format"]
        == "binary"
    )
    assert "video/mp4" in paths["/v1/videos/{video_id}/content"]["get"]["responses"]["200"]["content"]

    # The documented job object is exactly what the API returns.
    job_schema = schema["components"]["schemas"]["VideoJobObject"]
    job = server.client.post("/v1/videos", json=video_body(steps=4)).json()
    assert set(job) == set(job_schema["properties"])
    assert set(job_schema["required"]) <= set(job)
    generation_schema = schema["components"]["schemas"]["ActionGeneration"]
    generation = server.client.post("/v1/actions/generations", json={"domain_name": DOMAIN, "image": png_b64(rgb())})
    assert set(generation.json()) == set(generation_schema["properties"])
    error_schema = schema["components"]["schemas"]["ErrorDetail"]
    assert set(error_schema["properties"]) == {"code", "message", "field"}
    wait_for_job(server.client, job["id"])
    assert httpx.get(f"{server.http_url}/docs", trust_env=False).status_code == 200
