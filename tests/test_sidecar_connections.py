"""Slow and numerous connections cannot hold the sidecar (or the robots' port) before auth.

Raw sockets against a real server: connections that send their headers a byte at a time, uploads that
stall mid-body, more connections than one address (or everyone) may hold, over-long headers, and
handshakes on the WebSocket port that never send their request. Each is answered (408, 431, 503) and
closed, or closed at once, by the deadlines and caps of ``policy_server.http.connections`` and
``policy_server.foundation.connection_limits``. The last test exhausts a server process's file-descriptor limit
through the sidecar and checks that robots can still connect.

Source addresses 127.0.0.2, 127.0.0.3, ... stand for other hosts (Linux routes all of 127/8 to the
loopback interface), so per-address caps can be seen from one machine.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from server_fixtures import DOMAIN, ServerProcess, http_get, tiny_checkpoint
from sidecar_fixtures import SidecarServer, engine_loader, png_b64, rgb
from websockets.asyncio.client import connect

from policy_server.sidecar_settings import SidecarConnectionLimits

pytestmark = pytest.mark.timeout(180)

PATIENCE_S = 10.0  # how long a test waits for the server to act; deadlines under test are 1 s


def _open(port: int, source: str = "127.0.0.1", data: bytes = b"") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    if data:
        sock.sendall(data)
    return sock


def _answer(sock: socket.socket, timeout: float = PATIENCE_S) -> tuple[int | None, dict | None, bool]:
    """Read until the server closes (or ``timeout``): (status, JSON error body, closed by the server)."""
    sock.settimeout(timeout)
    received = b""
    closed = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            received += chunk
    except TimeoutError:
        pass
    except ConnectionResetError:
        closed = True
    if not received:
        return None, None, closed
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    return status, payload, closed


async def _robot_connects(url: str) -> None:
    """A robot's handshake succeeds and its session's first frame (the metadata) arrives."""
    async with connect(url, proxy=None, open_timeout=5) as ws:
        assert await asyncio.wait_for(ws.recv(), 5)


@pytest.fixture(scope="module")
def server():
    running = SidecarServer(engine_loader())
    running.http.connections = SidecarConnectionLimits(
        header_timeout_s=1.0, body_timeout_s=1.0, max_connections=24, max_connections_per_peer=8
    )
    running.http.max_buffered_body_bytes = 8 * 2**20
    running.settings.handshake_timeout_s = 1.0
    running.settings.max_pending_handshakes = 12
    running.settings.max_pending_handshakes_per_peer = 4
    with running:
        yield running


def _sidecar_port(server) -> int:
    return server.sidecar.port


def test_headers_dripped_a_byte_at_a_time_get_408_and_are_closed(server):
    port = _sidecar_port(server)
    started = time.monotonic()
    socks = [_open(port, f"127.0.0.{2 + n % 3}", b"GET /healthz HTTP/1.1\r\nHost: x\r\n") for n in range(15)]
    for _ in range(4):  # keep dripping: every byte used to restart nothing, now nothing restarts the deadline
        time.sleep(0.25)
        for sock in socks:
            try:
                sock.send(b"X")
            except OSError:
                pass
    for sock in socks:
        status, payload, closed = _answer(sock)
        sock.close()
        assert (status, closed) == (408, True)
        assert payload["error"]["code"] == "request_timeout"
    assert time.monotonic() - started < PATIENCE_S


def test_an_idle_kept_alive_connection_is_closed(server):
    port = _sidecar_port(server)
    sock = _open(port, data=b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(PATIENCE_S)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    # Then half a request and nothing more: the next request's headers have a deadline too.
    sock.sendall(b"GET /healthz HTTP/1.1\r\n")
    status, _, closed = _answer(sock)
    sock.close()
    assert closed and status in (None, 408)


def test_uploads_stalled_mid_body_get_408_and_are_closed(server):
    port = _sidecar_port(server)
    declared = 40 * 2**20
    head = (
        f"POST /v1/actions/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    ).encode()
    # Three uploads per address: within the per-client bound on action generations in flight (4), which
    # would otherwise answer the later ones 429 before their bodies are read.
    socks = [_open(port, f"127.0.0.{5 + n % 4}", head + b'{"image": "' + b"A" * 2**19) for n in range(12)]
    for sock in socks:
        status, payload, closed = _answer(sock)
        sock.close()
        assert (status, closed) == (408, True)
        assert payload["error"]["code"] == "request_timeout"
    status, body, _ = http_get(server.http_url + "/healthz")
    assert status == 200, body


def test_bodies_held_together_are_bounded_and_let_go_at_the_body_deadline():
    """The sidecar holds at most 8 MiB of bodies here (--http-max-buffered-mib; 7 MiB each, --max-body-mib):
    a second upload that would pass it is answered 503 server_busy at once; the first, stalled, is cut
    off at its deadline and its bytes are let go, so the next request gets through."""
    running = SidecarServer(engine_loader(), max_body_bytes=7 * 2**20)
    running.http.connections = SidecarConnectionLimits(body_timeout_s=6.0)
    running.http.max_buffered_body_bytes = 8 * 2**20
    with running:
        port, budget = _sidecar_port(running), running.sidecar.body_budget
        head = (
            f"POST /v1/actions/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {7 * 2**20}\r\n\r\n"
        ).encode()
        first = _open(port, "127.0.0.23", head + b'{"image": "' + b"A" * (6 * 2**20))
        deadline = time.monotonic() + PATIENCE_S
        while running.run(lambda: budget.held) < 6 * 2**20:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = _open(port, "127.0.0.24", head + b'{"image": "' + b"A" * (6 * 2**20))
        status, payload, _ = _answer(second, timeout=3)
        second.close()
        assert status == 503 and payload["error"]["code"] == "server_busy", payload
        assert _answer(first)[0] == 408
        first.close()
        time.sleep(0.2)
        assert running.run(lambda: budget.held) == 0
        response = running.client.post(
            "/v1/actions/generations", json={"domain_name": DOMAIN, "image": png_b64(rgb(64))}
        )
        assert response.status_code == 200, response.text


def _check_refused(port: int, source: str) -> None:
    """A connection from ``source`` is answered 503 too_many_connections and closed at once."""
    refused = _open(port, source, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, payload, closed = _answer(refused, timeout=3)
    refused.close()
    assert (status, closed) == (503, True)
    assert payload["error"]["code"] == "too_many_connections"


def test_connections_past_the_per_address_cap_are_refused_and_others_still_served(server):
    port = _sidecar_port(server)
    held = [_open(port, "127.0.0.7") for _ in range(8)]
    try:
        _check_refused(port, "127.0.0.7")
        other = _open(port, "127.0.0.8", b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _answer(other, timeout=3)[0] == 200
        other.close()
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    again = _open(port, "127.0.0.7", b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _answer(again, timeout=3)[0] == 200  # a closed connection frees its place
    again.close()


def test_connections_past_the_sidecar_cap_are_refused(server):
    port = _sidecar_port(server)
    held = [_open(port, f"127.0.0.{10 + n % 4}") for n in range(24)]
    try:
        _check_refused(port, "127.0.0.20")
        assert server.sidecar.connection_counter.total == 24
    finally:
        for sock in held:
            sock.close()


def test_headers_longer_than_the_bound_get_431(server):
    sock = _open(
        _sidecar_port(server), "127.0.0.21", b"GET /healthz HTTP/1.1\r\n" + b"X-Padding: " + b"a" * 100_000 + b"\r\n"
    )
    status, _, closed = _answer(sock)
    sock.close()
    assert closed and status in (431, 400)  # 400: h11's own bound, where uvicorn runs without httptools


def test_the_sidecar_sets_tcp_nodelay_on_its_connections(server):
    sock = _open(_sidecar_port(server), "127.0.0.22")
    try:
        time.sleep(0.2)

        def flags():
            connections = server.sidecar.serving.connections()
            return [
                c.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                for c in connections
                if c.transport.get_extra_info("peername")[0] == "127.0.0.22"
            ]

        assert server.run(flags) == [1]
    finally:
        sock.close()


def test_a_request_within_the_deadlines_is_served(server):
    response = server.client.post("/v1/actions/generations", json={"domain_name": DOMAIN, "image": png_b64(rgb(64))})
    assert response.status_code == 200, response.text


def test_websocket_handshakes_that_never_arrive_are_capped_per_address_and_time_out(server):
    port = server.port
    waiting = [_open(port, "127.0.0.30") for _ in range(4)]
    try:
        extra = _open(port, "127.0.0.30")
        assert _answer(extra, timeout=3) == (None, None, True)  # closed at once, past the per-address cap
        extra.close()
        status, body, _ = http_get(f"http://127.0.0.1:{port}/healthz")  # another address: still answered
        assert status == 200, body

        asyncio.run(_robot_connects(server.url))
        for sock in waiting:  # the handshake deadline (1 s here) closes the ones that never sent a request
            assert _answer(sock, timeout=5)[2]
    finally:
        for sock in waiting:
            sock.close()


def test_robots_still_connect_while_the_sidecar_is_flooded_past_the_descriptor_limit():
    """The attack run's 1,100 slow connections exhausted the usual limit of 1,024 descriptors; here the
    server process gets that limit and 1,100 slow connections arrive from 40 addresses. The sidecar's cap
    keeps room, so the robots' handshakes and /healthz on the WebSocket port still answer."""
    process = ServerProcess("--model", str(tiny_checkpoint("distilled")), "--no-warmup")
    process.args = ["prlimit", "--nofile=1024:1024", "--", *process.args]
    process.start()
    attack: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 120
        while http_get(process.health_url)[1].get("status") != "ready":
            assert time.monotonic() < deadline, process.log
            time.sleep(0.2)
        assert process.http_port is not None
        for n in range(1100):
            try:
                attack.append(_open(process.http_port, f"127.0.1.{1 + n % 40}", b"GET /v1/videos HTTP/1.1\r\n"))
            except OSError:
                pass
        time.sleep(1.0)
        status, body, _ = http_get(process.health_url, timeout=5)
        assert status == 200, body

        asyncio.run(_robot_connects(process.url))
        assert "Too many open files" not in process.log
    finally:
        for sock in attack:
            sock.close()
        process.signal()
        try:
            process.wait(30)
        except Exception:  # noqa: BLE001
            process.kill()
