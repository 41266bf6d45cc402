"""A msgpack element bomb on every WebSocket path is refused before it is built, and no robot notices.

The attack (issue 36.1): one frame under the frame limit holding millions of empty maps (one byte each on
the wire, some 60 bytes each once built). Before the element budget, 45 MiB of them took the server 3.3
GiB and stalled every robot 22 s. Here, against a real server process (the command line, the tiny model)
whose memory is watched from ``/proc``, while a robot runs in closed loop at 10 Hz on its own connection:
a 12 MiB and a 45 MiB bomb on the native, openpi and vla-eval paths, as one array of empty maps (refused
from its header) and as nested arrays of them (no header declares more than 489 entries: refused once the
running count passes the budget, inside the bomb's second 96 kB group). Each must be answered
``payload_too_large`` on the session, which goes on; the server's peak resident memory stays within 200
MiB of what it was before the bomb, and the robot keeps getting its chunks. The robot's worst round trip
meanwhile is printed (``pytest -s``), not asserted: a wall time on a shared machine is a benchmark's figure.
"""

from __future__ import annotations

import subprocess
import threading
import time

import numpy as np
import psutil
import pytest
from server_fixtures import DOMAIN, PeakRss, ServerProcess, tiny_checkpoint
from websockets.sync.client import connect

from robot_clients.protocol import ErrorCode
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(600)

MIB = 2**20
PEAK_LIMIT = 200 * MIB
ROBOT_HZ = 10.0


def flat_bomb(size: int) -> bytes:
    """One array32 declaring ``size`` - 5 empty maps, and holding them."""
    count = size - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count


# The nested bomb's building blocks: 15 empty maps (16 bytes, 16 elements), 15 of those (241 elements), and a
# group of 400 of those (96,400 elements in 96 kB), each header declaring at most 400 entries.
_LEAF = b"\x9f" + b"\x80" * 15
_MID = b"\x9f" + _LEAF * 15
_GROUP = b"\xdc" + (400).to_bytes(2, "big") + _MID * 400


def nested_bomb(size: int) -> bytes:
    """An array of ``size`` / 96 kB groups (at most 489): no header declares more than 489 entries, so only
    the running count, reaching the budget inside the second group, refuses it; built, it would hold about
    one element a byte, 12 million at 12 MiB."""
    groups = size // len(_GROUP)
    return b"\xdc" + groups.to_bytes(2, "big") + _GROUP * groups


def _key(name: str) -> bytes:
    return packb(name)


def native_frame(bomb: bytes) -> bytes:
    return b"\x83" + _key("type") + _key("observation") + _key("seq") + packb(1) + _key("image") + bomb


def openpi_frame(bomb: bytes) -> bytes:
    return b"\x82" + _key("prompt") + _key("reach") + _key("observation/image") + bomb


def vla_eval_frame(bomb: bytes) -> bytes:
    payload = b"\x81" + _key("images") + bomb
    return (
        b"\x84"
        + _key("type")
        + _key("observation")
        + _key("payload")
        + payload
        + _key("seq")
        + packb(7)
        + (_key("timestamp") + packb(0.0))
    )


class Robot:
    """A native robot in closed loop at 10 Hz on its own thread; every round trip kept with its start time."""

    def __init__(self, port: int) -> None:
        url = f"ws://127.0.0.1:{port}/v1/actions/realtime"
        self.ws = connect(url, max_size=None, compression=None, proxy=None).__enter__()  # closed by stop()
        unpackb(self.ws.recv(timeout=60))  # metadata
        self.ws.send(packb({"type": "configure", "domain_name": DOMAIN}))
        assert unpackb(self.ws.recv(timeout=60))["type"] == "session"
        self.image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
        self.trips: list[tuple[float, float]] = []  # (sent at, seconds)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            seq += 1
            started = time.monotonic()
            try:
                self.ws.send(packb({"type": "observation", "seq": seq, "image": self.image}))
                reply = unpackb(self.ws.recv(timeout=60))
            except Exception as exc:  # noqa: BLE001 - recorded, the test fails on it
                self.errors.append(repr(exc))
                return
            self.trips.append((started, time.monotonic() - started))
            if reply.get("type") != "action_chunk":
                self.errors.append(repr(reply))
            self._stop.wait(max(0.0, 1 / ROBOT_HZ - (time.monotonic() - started)))

    def worst_since(self, since: float) -> float:
        """The longest round trip that started after ``since``, or was still running then."""
        return max((seconds for started, seconds in self.trips if started + seconds >= since), default=0.0)

    def start(self) -> Robot:
        self._thread.start()
        deadline = time.monotonic() + 120
        while len(self.trips) < 10:  # warm: the first calls of a fresh engine are slower
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, "the robot never got going"
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.ws.close()


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--model", str(tiny_checkpoint("distilled")), "--no-http").start()
    try:
        deadline = time.monotonic() + 180
        while True:  # ready once a robot can connect (the model loads and warms up first)
            try:
                robot = Robot(process.port).start()
                break
            except Exception:  # noqa: BLE001
                assert time.monotonic() < deadline, process.log
                time.sleep(0.5)
        yield process, robot
        robot.stop()
    finally:
        process.stop()


def _bomb(server, path: str, frame: bytes) -> tuple[bytes | str, int, float]:
    """Send ``frame`` on a new connection to ``path``; (its reply, peak RSS growth, the robot's worst trip)."""
    process, robot = server
    rss = psutil.Process(process.proc.pid)
    with connect(f"ws://127.0.0.1:{process.port}{path}", max_size=None, compression=None, proxy=None) as ws:
        if path != "/v1/vla-eval":
            ws.recv(timeout=30)  # the hello (metadata) these paths greet with
        idle = rss.memory_info().rss
        started = time.monotonic()
        with PeakRss(process.proc.pid) as peak:
            ws.send(frame)
            reply = ws.recv(timeout=60)
            time.sleep(0.5)  # what the robot does just after counts too
        worst = robot.worst_since(started)
        _session_goes_on(ws, path)
    trips = len(robot.trips)
    deadline = time.monotonic() + 60
    while len(robot.trips) < trips + 3:  # the robot goes on getting its chunks
        assert not robot.errors and time.monotonic() < deadline, robot.errors
        time.sleep(0.05)
    assert not robot.errors, robot.errors
    return reply, peak.peak - idle, worst


def _session_goes_on(ws, path: str) -> None:
    if path == "/v1/actions/realtime":
        ws.send(packb({"type": "reset"}))
        assert unpackb(ws.recv(timeout=30))["type"] == "reset_done"
    elif path == "/v1/vla-eval":
        ws.send(packb({"type": "hello", "payload": {"protocol_version": 1}, "seq": 9, "timestamp": 0.0}))
        assert unpackb(ws.recv(timeout=30))["type"] == "hello"
    else:
        ws.send(packb({"prompt": "reach", "observation/image": np.zeros((224, 224, 3), np.uint8)}))
        reply = ws.recv(timeout=60)
        assert isinstance(reply, bytes) and "actions" in unpackb(reply), reply


def _refusal_code(path: str, reply: bytes | str) -> str:
    if path == "/openpi":
        assert isinstance(reply, str), reply
        return reply.split(":", 1)[0]
    decoded = unpackb(reply)
    return decoded["payload"]["code"] if path == "/v1/vla-eval" else decoded["code"]


PATHS = {"/v1/actions/realtime": native_frame, "/openpi": openpi_frame, "/v1/vla-eval": vla_eval_frame}


@pytest.mark.parametrize("shape", [flat_bomb, nested_bomb], ids=["flat", "nested"])
@pytest.mark.parametrize("size_mib", [12, 45])
@pytest.mark.parametrize("path", list(PATHS))
def test_an_element_bomb_is_refused_before_it_is_built_while_a_robot_runs(server, path, size_mib, shape):
    frame = PATHS[path](shape(size_mib * MIB))
    reply, grown, worst = _bomb(server, path, frame)
    print(f"{path} {size_mib} MiB: RSS +{grown / MIB:.0f} MiB, the robot's worst round trip {worst * 1e3:.0f} ms")
    assert grown < PEAK_LIMIT, f"server RSS peaked {grown / MIB:.0f} MiB above idle"
    assert _refusal_code(path, reply) == ErrorCode.PAYLOAD_TOO_LARGE, reply
