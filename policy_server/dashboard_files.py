"""The teleop dashboard's static files (``policy_server/dashboard/``), for whichever HTTP server serves them.

The dashboard is plain HTML, CSS and JavaScript shipped as package data: no build step, nothing fetched
from elsewhere. Its live data comes from the observer channel on the WebSocket port
(:mod:`policy_server.sessions.observer`); ``config.json`` tells the page where that is, so the same files
work when the HTTP sidecar serves them on its own port (``policy_server.http.sidecar``) and when the WebSocket
port does (``PolicyServer``, so a server started with ``--no-http`` still has its dashboard).

Both ports send every dashboard file with :data:`DASHBOARD_HEADERS`: a Content-Security-Policy that lets
the page run only its own files, and headers that forbid framing it (its buttons pause robots) and
sniffing types.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD_PATH = "/dashboard"
# The dashboard's live channel on the WebSocket port, served by `sessions/observer.py`.
OBSERVE_PATH = "/v1/observe"
DASHBOARD_DIR = Path(__file__).parent / "dashboard"
CONFIG_NAME = "config.json"

# The page's own script, style and images (camera previews arrive as data: URLs); no inline code; fetches
# to itself and WebSockets to any host (the observer channel is on the WebSocket port, another origin, and
# `?observer=` may name another host). No framing: a page that frames the dashboard could click its buttons.
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self' ws: wss:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
DASHBOARD_HEADERS = {
    "Content-Security-Policy": DASHBOARD_CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}


@dataclass(frozen=True)
class DashboardAsset:
    body: bytes
    content_type: str


def dashboard_asset(name: str) -> DashboardAsset | None:
    """The file ``name`` of the dashboard folder ("" is ``index.html``); None if there is no such file.

    Only plain names of files directly in the folder, with a known type, are served: no sub-paths, so
    a request can never reach anything outside the folder.
    """
    name = name or "index.html"
    if "/" in name or "\\" in name or name.startswith("."):
        return None
    path = DASHBOARD_DIR / name
    content_type = _CONTENT_TYPES.get(path.suffix)
    if content_type is None or not path.is_file():
        return None
    return DashboardAsset(path.read_bytes(), content_type)


def dashboard_config(observer_port: int) -> dict[str, Any]:
    """What ``/dashboard/config.json`` says: where the observer channel is (same host as the page)."""
    return {"observer_path": OBSERVE_PATH, "observer_port": observer_port}
