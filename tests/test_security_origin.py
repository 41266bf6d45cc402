"""Issue 18, item 10: cross-site WebSocket hijacking and cross-site requests, and the dashboard's headers.

A page of another site can make the user's browser open a WebSocket to the server (read a robot's camera
and prompt, pause it) or send a "no-cors" POST (create a video job); the browser names that site in the
``Origin`` header. Against a real server with its sidecar:

* every WebSocket upgrade (native, openpi, observer, vla-eval) with a foreign ``Origin`` is refused with 403,
  and so is vla-eval's ``/config`` on the same port (its ``/health`` stays open, like ``/healthz``), while
  no ``Origin`` (robots), the server's own origin (either port) and ``--allowed-origin`` entries pass;
* state-changing HTTP requests of the sidecar with a foreign ``Origin`` get 403 before anything runs;
  reads stay open (a browser cannot read a cross-origin answer without CORS headers, never sent here);
* the dashboard comes with a Content-Security-Policy, ``X-Frame-Options`` and ``X-Content-Type-Options``
  on both ports (``tests/test_dashboard_browser.py`` checks that the page works under that policy).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from server_fixtures import ServerThread, tiny_engine_loader
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from policy_server.foundation.auth import OriginConfigError, OriginPolicy
from policy_server.sidecar_settings import SidecarSettings
from robot_clients.wire_codec import packb, unpackb

ALLOWED = "https://ops.example.com"
FOREIGN = "http://evil.example"
WEBSOCKET_PATHS = ("/v1/actions/realtime", "/openpi", "/v1/observe", "/v1/vla-eval")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sidecar = SidecarSettings(data_dir=tmp_path_factory.mktemp("sidecar-data"), host="127.0.0.1", port=0)
    with ServerThread(
        tiny_engine_loader("distilled"), warmup=False, http=sidecar, allowed_origins=(ALLOWED,)
    ) as running:
        running.http_port = running.sidecar.port
        yield running


def request(
    url: str,
    method: str = "GET",
    origin: str | None = None,
    body: bytes | None = None,
    content_type: str = "application/json",
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": content_type} if body is not None else {}
    if origin is not None:
        headers["Origin"] = origin
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, data=body, method=method, headers=headers), timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.mark.parametrize("path", WEBSOCKET_PATHS)
@pytest.mark.parametrize("origin", [FOREIGN, "null", "http://127.0.0.1.evil.example", "file://"])
async def test_a_foreign_origin_cannot_open_any_websocket(server, path, origin):
    with pytest.raises(InvalidStatus) as caught:
        await connect(f"ws://127.0.0.1:{server.port}{path}", origin=origin, proxy=None)
    assert caught.value.response.status_code == 403
    assert b"--allowed-origin" in caught.value.response.body or b"origin" in caught.value.response.body


@pytest.mark.parametrize("path", WEBSOCKET_PATHS)
async def test_robots_the_servers_own_pages_and_allowed_origins_can(server, path):
    own = [
        None,
        f"http://127.0.0.1:{server.port}",
        f"http://127.0.0.1:{server.http_port}",
        ALLOWED,
        "HTTPS://OPS.EXAMPLE.COM:443",
    ]
    for origin in own:
        async with connect(f"ws://127.0.0.1:{server.port}{path}", origin=origin, proxy=None, max_size=None) as ws:
            if path == "/v1/vla-eval":  # the harness speaks first
                await ws.send(packb({"type": "hello", "payload": {"protocol_version": 1}, "seq": 1, "timestamp": 0.0}))
            first = await ws.recv()
            assert first, origin
            if path == "/v1/observe":
                assert json.loads(first)["type"] == "hello"
            else:
                assert unpackb(first)


@pytest.mark.parametrize(
    "method,path",
    [("POST", "/v1/videos"), ("POST", "/v1/actions/generations"), ("DELETE", "/v1/videos/video_0123456789abcdef")],
)
def test_state_changing_requests_from_a_foreign_origin_get_403_before_anything_runs(server, method, path):
    url = f"http://127.0.0.1:{server.http_port}{path}"
    # A "no-cors" form POST: text/plain or multipart, no preflight; the browser still sends Origin.
    status, _, body = request(url, method, origin=FOREIGN, body=b"anything", content_type="text/plain")
    assert status == 403 and json.loads(body)["error"]["code"] == "forbidden_origin"
    # The same request from the server's own page or a robot reaches the application (its own answer).
    for origin in (None, f"http://127.0.0.1:{server.http_port}"):
        status, _, _ = request(url, method, origin=origin, body=b"anything", content_type="text/plain")
        assert status != 403, origin


@pytest.mark.parametrize("path", ["/config", "/v1/vla-eval/config"])
def test_vla_eval_config_from_a_foreign_origin_gets_403(server, path):
    """vla-eval's ``/config`` on the WebSocket port is checked like its upgrades (issue 36.6): a page of
    another site gets nothing; a harness (no Origin) and the server's own pages read it."""
    status, _, body = request(f"http://127.0.0.1:{server.port}{path}", origin=FOREIGN)
    assert status == 403 and b"config" not in body, body
    for origin in (None, f"http://127.0.0.1:{server.port}", ALLOWED):
        status, _, body = request(f"http://127.0.0.1:{server.port}{path}", origin=origin)
        assert status == 200 and "config" in json.loads(body), (origin, body)


@pytest.mark.parametrize("path", ["/health", "/v1/vla-eval/health"])
def test_vla_eval_health_stays_open_to_any_origin(server, path):
    """A readiness probe, like ``/healthz``: it says only the engine's state."""
    status, _, body = request(f"http://127.0.0.1:{server.port}{path}", origin=FOREIGN)
    assert status == 200 and json.loads(body) == {"status": "ok"}, body


def test_reads_from_a_foreign_origin_stay_open(server):
    status, _, body = request(f"http://127.0.0.1:{server.http_port}/healthz", origin=FOREIGN)
    assert status == 200 and json.loads(body)["status"] == "ok"


@pytest.mark.parametrize("port_name", ["port", "http_port"])
@pytest.mark.parametrize("name", ["", "dashboard.js", "config.json"])
def test_the_dashboard_comes_with_its_security_headers_on_both_ports(server, port_name, name):
    status, headers, _ = request(f"http://127.0.0.1:{getattr(server, port_name)}/dashboard/{name}")
    headers = {k.lower(): v for k, v in headers.items()}
    assert status == 200
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"


def test_the_origin_policy():
    policy = OriginPolicy([ALLOWED, "http://[::1]:9000"])
    own = [8000, 8001]
    assert policy.refusal(None, "robot.lan:8000", own) is None  # robots send no Origin
    assert policy.refusal("http://robot.lan:8000", "robot.lan:8000", own) is None  # same origin
    assert policy.refusal("http://robot.lan:8001", "robot.lan:8000", own) is None  # the dashboard's port
    assert policy.refusal("http://ROBOT.lan", "robot.lan:80", own) is None  # default ports, case
    assert policy.refusal("https://ops.example.com:443", "robot.lan:8000", own) is None
    assert policy.refusal("http://[::1]:9000", "robot.lan:8000", own) is None
    assert policy.refusal("http://robot.lan:9999", "robot.lan:8000", own) is not None  # another service
    assert policy.refusal("http://other.lan:8000", "robot.lan:8000", own) is not None
    assert policy.refusal("null", "robot.lan:8000", own) is not None
    assert policy.refusal("http://robot.lan:8000", None, own) is not None  # no Host: nothing to match
    assert OriginPolicy(["null"]).refusal("null", "x", own) is None
    assert OriginPolicy(["*"]).refusal(FOREIGN, "x", own) is None
    for bad in ("ops.example.com", "ftp://x", "https://x/path", "https://user@x"):
        with pytest.raises(OriginConfigError):
            OriginPolicy([bad])
