"""What ``TCP_NODELAY`` on the HTTP sidecar's sockets is worth: keep-alive latency with and without it.

Two real servers (tiny model, CPU) run side by side, one whose sidecar sets ``TCP_NODELAY`` on its
connections (the default) and one that leaves Nagle's algorithm on (``SidecarConnectionLimits(tcp_nodelay=
False)``, what the sidecar did before). One keep-alive ``http.client`` connection to each (which sets
``TCP_NODELAY`` on its own side, as most clients do), requests alternating between the two so that both
see the same machine load:

* ``GET /healthz``: the smallest request, the transport alone;
* ``POST /v1/actions/generations``: a 64×64 image, one chunk of actions from the tiny model.

Without it, a response written in two pieces (headers, then body) waits for the client's delayed ACK
of the first (about 40 ms on Linux) on every request after the first of a connection.

Run::

    .venv/bin/python benchmarks/http_nodelay.py --healthz 200 --actions 40
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's code, not an installed copy

import argparse  # noqa: E402
import base64  # noqa: E402
import http.client  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from server_fixtures import DOMAIN, ServerThread, tiny_engine_loader  # noqa: E402

import policy_server  # noqa: E402,F401  (first: sets OMP_WAIT_POLICY=PASSIVE before torch loads)
from policy_server.sidecar_settings import SidecarConnectionLimits, SidecarSettings  # noqa: E402


def _png_b64(size: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _server(nodelay: bool, data_dir: str) -> ServerThread:
    http = SidecarSettings(data_dir=Path(data_dir), port=0, connections=SidecarConnectionLimits(tcp_nodelay=nodelay))
    return ServerThread(tiny_engine_loader(), http=http, warmup=False, max_batch=1)


def _timed(connection: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> float:
    headers = {"content-type": "application/json"} if body is not None else {}
    started = time.perf_counter()
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    payload = response.read()
    elapsed = (time.perf_counter() - started) * 1e3
    if response.status != 200:
        raise RuntimeError(f"{method} {path}: {response.status} {payload[:200]!r}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--healthz", type=int, default=200, help="GET /healthz per server")
    parser.add_argument("--actions", type=int, default=40, help="action generations per server")
    parser.add_argument("--image-size", type=int, default=64)
    args = parser.parse_args()

    body = json.dumps({"domain_name": DOMAIN, "image": _png_b64(args.image_size), "action_horizon": 8}).encode()
    with tempfile.TemporaryDirectory() as on_dir, tempfile.TemporaryDirectory() as off_dir:
        servers = {"TCP_NODELAY on": _server(True, on_dir), "off (before)": _server(False, off_dir)}
        for server in servers.values():
            server.start()
        try:
            connections = {
                name: http.client.HTTPConnection("127.0.0.1", server.sidecar.port, timeout=60)
                for name, server in servers.items()
            }
            results: dict[str, dict[str, list[float]]] = {name: {"healthz": [], "actions": []} for name in servers}
            for connection in connections.values():  # open each connection and warm the model up
                _timed(connection, "GET", "/healthz")
                _timed(connection, "POST", "/v1/actions/generations", body)
            for _ in range(args.healthz):
                for name, connection in connections.items():
                    results[name]["healthz"].append(_timed(connection, "GET", "/healthz"))
            for _ in range(args.actions):
                for name, connection in connections.items():
                    results[name]["actions"].append(_timed(connection, "POST", "/v1/actions/generations", body))
        finally:
            for server in servers.values():
                server.stop()

    load = os.getloadavg()
    print(
        f"keep-alive latency, one connection per server, requests alternating (load {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs)"
    )
    print(f"{'request (ms: p50 / p90)':<32} {'TCP_NODELAY on':>18} {'off (before)':>18} {'off / on':>9}")
    for kind, label in (("healthz", "GET /healthz"), ("actions", "POST /v1/actions/generations")):
        on, off = results["TCP_NODELAY on"][kind], results["off (before)"][kind]

        def summary(values: list[float]) -> str:
            ordered = sorted(values)
            return f"{statistics.median(values):7.1f} / {ordered[int(0.9 * (len(ordered) - 1))]:6.1f}"

        ratio = statistics.median(off) / statistics.median(on)
        print(f"{label:<32} {summary(on):>18} {summary(off):>18} {ratio:8.2f}x")
    print(f"(n = {args.healthz} healthz, {args.actions} generations per server; {args.image_size}² PNG, horizon 8)")


if __name__ == "__main__":
    main()
