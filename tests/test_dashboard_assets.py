"""The dashboard's files as served: by the HTTP sidecar at /dashboard and by the WebSocket port, with
config.json pointing the page at the observer channel, and nothing outside the dashboard folder."""

from __future__ import annotations

import re
import urllib.request

import pytest
from server_fixtures import ServerThread, http_get, tiny_engine_loader

from policy_server.dashboard_files import DASHBOARD_DIR
from policy_server.sidecar_settings import SidecarSettings


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sidecar = SidecarSettings(data_dir=tmp_path_factory.mktemp("sidecar-data"), host="127.0.0.1", port=0)
    with ServerThread(tiny_engine_loader("distilled"), http=sidecar) as running:
        yield running


def fetch(url: str) -> tuple[int, str, bytes]:
    """GET without following redirects: (status, content type or Location, body)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)
    try:
        with opener.open(url, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location") or exc.headers.get("Content-Type", ""), exc.read()


@pytest.mark.parametrize("port_of", ["sidecar", "websocket"])
def test_both_ports_serve_the_dashboard(server, port_of):
    port = server.sidecar.port if port_of == "sidecar" else server.port
    base = f"http://127.0.0.1:{port}/dashboard"
    status, location, _ = fetch(base)
    assert status in (301, 307, 308) and location.endswith("/dashboard/")
    status, content_type, body = fetch(base + "/")
    assert status == 200 and content_type.startswith("text/html") and b'src="dashboard.js"' in body
    for name, kind in (
        ("dashboard.js", "text/javascript"),
        ("plots.js", "text/javascript"),
        ("dashboard.css", "text/css"),
    ):
        status, content_type, _ = fetch(f"{base}/{name}")
        assert status == 200 and content_type.startswith(kind), name
    status, config, _ = http_get(base + "/config.json")
    assert status == 200 and config == {"observer_path": "/v1/observe", "observer_port": server.port}
    for outside in ("../server.py", "..%2fserver.py", "nope.js", ".hidden.css"):
        assert fetch(f"{base}/{outside}")[0] == 404, outside


def test_the_dashboard_is_not_part_of_the_http_api_schema(server):
    status, schema, _ = http_get(f"http://127.0.0.1:{server.sidecar.port}/openapi.json")
    assert status == 200 and not any(path.startswith("/dashboard") for path in schema["paths"])


def test_the_dashboard_loads_nothing_from_elsewhere():
    for path in DASHBOARD_DIR.iterdir():
        text = path.read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I), f"{path.name} refers to another host"
