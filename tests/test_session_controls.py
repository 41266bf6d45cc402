"""Operator controls and the observer channel, end to end: a real server with the real tiny model, real
robot clients (the library's and a bare WebSocket one), and an observer speaking ``/v1/observe``."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from server_fixtures import DOMAIN, ServerThread, rgb_image, tiny_engine_loader
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from robot_clients import PolicyClient, SessionPaused, SessionStopped
from robot_clients.chunker import ActionChunker, ChunkerConfig, RemoteChunkPolicy
from robot_clients.wire_codec import packb, unpackb


@pytest.fixture(scope="module")
def server():
    with ServerThread(tiny_engine_loader("distilled")) as running:
        yield running


def observer(server: ServerThread):
    return connect(f"ws://127.0.0.1:{server.port}/v1/observe", compression=None, proxy=None, max_size=None)


def wait_for(ws, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0) -> dict[str, Any]:
    """Read observer frames until one satisfies ``predicate``."""
    deadline = time.monotonic() + timeout
    while True:
        frame = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if predicate(frame):
            return frame


def control(ws, session_id: str, action: str, **fields: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "control", "session_id": session_id, "action": action, **fields}))
    return wait_for(ws, lambda f: f["type"] in ("control_result", "error"))


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@contextlib.contextmanager
def raw_robot(server: ServerThread):
    """A bare WebSocket robot, configured, its metadata read: yields (connection, session id)."""
    with connect(server.url, compression=None, proxy=None, max_size=None) as ws:
        session_id = unpackb(ws.recv(timeout=10))["session_id"]
        ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8}))
        assert unpackb(ws.recv(timeout=10))["type"] == "session"
        yield ws, session_id


def observation(seq: int) -> bytes:
    return packb({"type": "observation", "seq": seq, "image": rgb_image(64, seed=seq)})


def test_observer_sees_the_session_its_chunk_frame_and_latencies(server):
    with PolicyClient(server.url) as client, observer(server) as obs:
        hello = wait_for(obs, lambda f: f["type"] == "hello")
        assert "pause" in hello["controls"] and hello["variant"] == "distilled"
        assert client.metadata["capabilities"]["session_controls"] is True
        client.configure(domain_name=DOMAIN, action_horizon=8, prompt="stack the cups", control_hz=15)
        session_id = client.metadata["session_id"]
        for i in range(3):
            last = client.infer({"image": rgb_image(96, seed=i)})

        listed = wait_for(
            obs,
            lambda f: (
                f["type"] == "sessions"
                and any(s["session_id"] == session_id and s["answered"] == 3 for s in f["sessions"])
            ),
        )
        summary = next(s for s in listed["sessions"] if s["session_id"] == session_id)
        assert summary["protocol"] == "native" and summary["controllable"] is True
        # No mode configured: each observation's media decide it (the dashboard shows "—").
        assert (summary["domain_name"], summary["action_mode"], summary["prompt"]) == (DOMAIN, None, "stack the cups")
        assert summary["control_hz"] == 15 and summary["state"] == "running"
        assert 0 < summary["latency_p50_ms"] <= summary["latency_p99_ms"] < 60_000

        obs.send(json.dumps({"type": "subscribe", "session_id": session_id}))
        detail = wait_for(obs, lambda f: f["type"] == "session_detail" and f["frame"] is not None)
        assert detail["chunk"]["seq"] == last.seq and (detail["chunk"]["horizon"], detail["chunk"]["dim"]) == (8, 10)
        np.testing.assert_allclose(np.array(detail["chunk"]["actions"]), last.actions, atol=1e-4)
        assert [s["seq"] for s in detail["latency"]] == [0, 1, 2]
        jpeg = base64.b64decode(detail["frame"]["jpeg_base64"])
        assert jpeg[:2] == b"\xff\xd8" and detail["frame"]["seq"] == last.seq
        assert (detail["frame"]["width"], detail["frame"]["height"]) == (96, 96)


def test_a_paused_session_drops_observations_until_resumed(server):
    with raw_robot(server) as (robot, session_id), observer(server) as obs:
        assert control(obs, session_id, "pause", reason="checking the gripper")["state"] == "paused"
        state = unpackb(robot.recv(timeout=10))
        assert state == {
            "type": "session_state",
            "session_id": session_id,
            "state": "paused",
            "reason": "checking the gripper",
            "source": "operator",
        }
        robot.send(observation(0))
        dropped = unpackb(robot.recv(timeout=10))
        assert (dropped["type"], dropped["seq"], dropped["reason"]) == ("dropped", 0, "paused")

        assert control(obs, session_id, "pause")["state"] == "paused"  # idempotent: nothing sent to the robot
        assert control(obs, session_id, "resume")["state"] == "running"
        assert unpackb(robot.recv(timeout=10))["state"] == "running"
        robot.send(observation(1))
        chunk = unpackb(robot.recv(timeout=30))
        assert (chunk["type"], chunk["seq"]) == ("action_chunk", 1)

        # Frames read from here on may be older snapshots still buffered: wait for a current one.
        wait_for(
            obs,
            lambda f: (
                f["type"] == "sessions"
                and any((s["session_id"], s["dropped"], s["answered"]) == (session_id, 1, 1) for s in f["sessions"])
            ),
        )


def test_the_client_raises_session_paused_and_waits_for_the_resume(server):
    with PolicyClient(server.url) as client, observer(server) as obs:
        client.configure(domain_name=DOMAIN, action_horizon=8)
        session_id = client.metadata["session_id"]
        client.infer(rgb_image(64))
        control(obs, session_id, "pause", reason="operator break")
        eventually(lambda: client.paused)
        assert client.session_state == "paused" and client.state_reason == "operator break"
        sent = client.stats.sent
        with pytest.raises(SessionPaused, match="paused"):
            client.infer(rgb_image(64))
        assert client.stats.sent == sent  # refused on the robot, never sent
        with pytest.raises(TimeoutError):
            client.wait_until_running(timeout=0.1)

        control(obs, session_id, "resume")
        client.wait_until_running(timeout=10)
        assert client.infer(rgb_image(64)).actions.shape == (8, 10)


def test_an_operator_prompt_reaches_the_client_and_the_session(server):
    with PolicyClient(server.url) as client, observer(server) as obs:
        client.configure(domain_name=DOMAIN, action_horizon=8, prompt="open the drawer")
        session_id = client.metadata["session_id"]
        assert control(obs, session_id, "set_prompt", prompt="close the drawer")["state"] == "running"
        eventually(lambda: client.session.get("prompt") == "close the drawer")
        session = server.server.context.sessions[session_id]
        assert server.run(lambda: (session.config.prompt, session.operator_prompt)) == ("close the drawer", True)
        assert client.infer(rgb_image(64)).actions.shape == (8, 10)
        # The operator steers: an observation's own prompt gives way, and the chunk says which one was used.
        assert client.infer(rgb_image(64), prompt="do something else").prompt == "close the drawer"

        client.configure(prompt="open it again")  # the robot takes its prompt back
        assert server.run(lambda: (session.config.prompt, session.operator_prompt)) == ("open it again", False)
        assert client.infer(rgb_image(64), prompt="just this once").prompt == "just this once"


def test_stop_ends_the_session_and_the_client_does_not_reconnect(server):
    client = PolicyClient(server.url, backoff_initial=0.01)
    with client, observer(server) as obs:
        client.configure(domain_name=DOMAIN, action_horizon=8)
        session_id = client.metadata["session_id"]
        assert control(obs, session_id, "stop", reason="end of shift")["state"] == "stopped"
        eventually(lambda: not client.connected and session_id not in server.server.context.sessions)
        assert client.session_state == "stopped"
        with pytest.raises(SessionStopped):
            client.infer(rgb_image(64))
        time.sleep(0.3)
        assert client.stats.reconnects == 0 and not client.connected
        assert control(obs, session_id, "resume")["code"] == "unknown_session"


def test_the_observer_channel_cannot_send_observations(server):
    completed = server.server.context.worker.completed
    with observer(server) as obs:
        obs.send(json.dumps({"type": "observation", "seq": 0, "image": [[0, 0, 0]]}))
        assert wait_for(obs, lambda f: f["type"] == "error")["code"] == "read_only"
        obs.send(packb({"type": "observation", "seq": 0, "image": rgb_image(64)}))  # a robot's binary frame
        assert wait_for(obs, lambda f: f["type"] == "error")["code"] == "bad_frame"
        obs.send(json.dumps({"type": "configure", "domain_name": DOMAIN}))
        assert wait_for(obs, lambda f: f["type"] == "error")["code"] == "read_only"
        assert control(obs, "nobody", "pause")["code"] == "unknown_session"
        assert control(obs, "nobody", "teleport")["code"] == "bad_control"
        listed = wait_for(obs, lambda f: f["type"] == "sessions")
        assert all(s["session_id"].startswith("observer-") is False for s in listed["sessions"])
    assert server.server.context.worker.completed == completed and len(server.server.context.queue) == 0


def test_openpi_sessions_are_listed_but_not_controllable(server):
    with (
        connect(f"ws://127.0.0.1:{server.port}/openpi", compression=None, proxy=None) as openpi,
        observer(server) as obs,
    ):
        unpackb(openpi.recv(timeout=10))  # openpi's metadata
        listed = wait_for(
            obs, lambda f: f["type"] == "sessions" and any(s["protocol"] == "openpi" for s in f["sessions"])
        )
        session_id = next(s["session_id"] for s in listed["sessions"] if s["protocol"] == "openpi")
        assert control(obs, session_id, "pause")["code"] == "not_controllable"


def test_the_chunker_holds_the_robot_while_paused(server):
    with PolicyClient(server.url) as client, observer(server) as obs:
        client.configure(domain_name=DOMAIN, action_horizon=8, seed=0)
        session_id = client.metadata["session_id"]
        with ActionChunker(RemoteChunkPolicy(client), ChunkerConfig(strategy="rtc", control_hz=50)) as chunker:
            tick = lambda i: chunker.next_action({"image": rgb_image(64, seed=i)})  # noqa: E731
            for i in range(10):
                tick(i)
            control(obs, session_id, "pause")
            eventually(lambda: client.paused)
            held = [tick(i) for i in range(10, 20)]
            assert all(np.array_equal(a, held[0]) for a in held)
            assert chunker.stats.held_steps == 10 and chunker.stats.holds == 1
            chunks = chunker.stats.chunks

            control(obs, session_id, "resume")
            eventually(lambda: not client.paused)
            for i in range(20, 200):
                tick(i)
                time.sleep(0.02)
                if chunker.stats.chunks > chunks:
                    break
            assert chunker.stats.chunks > chunks and chunker.stats.held_steps == 10


def test_the_authorize_hook_can_refuse_observers(server, monkeypatch):
    import policy_server.assembly.server as server_module

    monkeypatch.setattr(server_module, "authorize", lambda request: (403, "observers need a token"))
    with pytest.raises(InvalidStatus) as refused:
        observer(server)
    assert refused.value.response.status_code == 403
