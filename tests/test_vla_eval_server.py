"""vla-eval's model-server protocol on a real server (tiny distilled checkpoint), frame by frame.

A raw WebSocket client writes exactly the frames vla-eval's ``Connection`` writes (``{type, payload, seq,
timestamp}`` msgpack maps); tests/test_vla_eval_harness.py runs vla-eval's own orchestrator. Here: the
hello, episodes, one reply per observation in lock-step, the chunk played out, hostile frames answered
with typed errors while the session goes on, the state a stateless domain does not use (counted in
/metrics), /health and /config, the request queue shared fairly with a native robot, and recording.
"""

from __future__ import annotations

import io
import threading
import time

import msgpack
import numpy as np
import pytest
from PIL import Image
from server_fixtures import DOMAIN, ServerThread, http_get, rgb_image, tiny_engine_loader
from sidecar_fixtures import SidecarServer
from websockets.sync.client import connect

from policy_server.recording import RecordingStore
from policy_server.recording.feature import RecordingOptions
from policy_server.recording.replay import RecordedEpisode
from policy_server.vla_eval import ChunkPlan, VlaEvalSettings
from robot_clients import PolicyClient
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(300)

HORIZON = 4
IMAGE = rgb_image(64, seed=1)


def png(image: np.ndarray) -> dict:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    return {"__image__": True, "format": "png", "data": buffer.getvalue(), "shape": list(image.shape)}


class Harness:
    """One vla-eval connection, written frame by frame."""

    def __init__(self, server: ServerThread) -> None:
        self.connecting = connect(
            f"ws://127.0.0.1:{server.port}/v1/vla-eval", compression=None, max_size=None, proxy=None, open_timeout=30
        )
        self.seq = 0

    def send(self, kind: str, payload: dict) -> int:
        self.seq += 1
        self.ws.send(packb({"type": kind, "payload": payload, "seq": self.seq, "timestamp": time.time()}))
        return self.seq

    def recv(self, timeout: float = 60) -> dict:
        return unpackb(self.ws.recv(timeout=timeout))

    def act(self, payload: dict) -> dict:
        seq = self.send("observation", payload)
        reply = self.recv()
        assert reply["seq"] == seq, (reply, seq)
        return reply

    def __enter__(self) -> Harness:
        self.ws = self.connecting.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.connecting.__exit__(None, None, None)


def observation(step: int = 0, **extra) -> dict:
    return {"images": {"front": rgb_image(64, seed=step), "wrist": IMAGE}, "task_description": "reach", **extra}


@pytest.fixture(scope="module")
def server():
    settings = VlaEvalSettings(requested={"action_horizon": HORIZON}, plan=ChunkPlan(ask_ahead=1))
    with SidecarServer(tiny_engine_loader("distilled"), vla_eval=settings) as running:
        yield running


def test_hello_says_what_is_served_and_a_wrong_version_is_refused(server):
    with Harness(server) as harness:
        harness.send("hello", {"protocol_version": 2, "harness_version": "0.8.0"})
        refused = harness.recv()
        assert refused["type"] == "error" and refused["payload"]["field"] == "protocol_version"
        seq = harness.send("hello", {"protocol_version": 1, "harness_version": "0.8.0"})
        hello = harness.recv()
        assert (hello["type"], hello["seq"], hello["payload"]["protocol_version"]) == ("hello", seq, 1)
        served = hello["payload"]["cosmos3"]
        assert (served["domain_name"], served["action_horizon"], served["action_dim"]) == (DOMAIN, HORIZON, 10)
        assert served["state_dim"] is None and served["unused_state_keys"] == ["states", "state"]
        assert (served["chunk"], served["ask_ahead"]) == ("step", 1)


def test_an_episode_plays_each_chunk_out_one_action_per_observation(server):
    with Harness(server) as harness:
        harness.send("hello", {"protocol_version": 1})
        harness.recv()
        harness.send("episode_start", {"task": {"name": "reach", "task_description": "reach the cube"}})
        replies = [harness.act(observation(step)) for step in range(2 * HORIZON + 1)]
        assert all(reply["type"] == "action" for reply in replies), replies
        actions = np.stack([reply["payload"]["actions"] for reply in replies])
        assert actions.shape == (2 * HORIZON + 1, 10) and actions.dtype == np.float32
        # Engine replies carry its timing; actions played from a chunk already here come at once, bare.
        timed = [step for step, reply in enumerate(replies) if "server_timing" in reply["payload"]]
        # Chunk 1 from step 0; asked at its last row (step 3), it answers step 4 with its row 1; asked again
        # at step 6 (its row 3), it answers step 7.
        assert timed == [0, 4, 7], timed
        harness.send("episode_end", {"metrics": {"success": False}})


def test_hostile_frames_get_typed_errors_and_the_session_goes_on(server):
    with Harness(server) as harness:
        harness.send("hello", {"protocol_version": 1})
        harness.recv()
        # An observation before any episode_start.
        assert harness.act(observation())["payload"]["code"] == "not_configured"
        for message, code in (
            (b"\xc1\xc1", "bad_frame"),
            ("a text frame", "bad_frame"),
            (msgpack.packb({"type": "launch", "payload": {}, "seq": 40, "timestamp": 0.0}), "unknown_type"),
            (msgpack.packb({"type": "observation", "payload": 7, "seq": 41, "timestamp": 0.0}), "invalid_field"),
            (packb({"type": "observation", "payload": {}, "seq": 42, "timestamp": 0.0, "x": 1}), "invalid_field"),
        ):
            harness.ws.send(message)
            error = harness.recv()
            assert (error["type"], error["payload"]["code"]) == ("error", code), error
            assert error["payload"]["error"].startswith(code + ":")
        # A refused episode_start has no reply of its own: its error answers the next observation.
        harness.send("episode_start", {"task": {}, "settings": {"horizon": 3}})
        deferred = harness.act(observation())
        assert (deferred["payload"]["code"], deferred["payload"]["field"]) == ("invalid_field", "settings/horizon")
        assert harness.act(observation())["payload"]["code"] == "not_configured"
        harness.send("episode_start", {"task": {"task_description": "reach"}})
        for bad, code, field in (
            ({"images": {"front": np.zeros((64, 64), np.uint8)}}, "invalid_image", "images/front"),
            ({"images": {"front": {"__image__": True, "format": "png", "data": b"not a png"}}}, "invalid_image", None),
            ({"images": {"front": IMAGE}, "joint_torques": np.zeros(7)}, "invalid_field", "joint_torques"),
            ({"images": {"front": IMAGE}, "states": np.full(4, np.inf)}, "invalid_field", "states"),
        ):
            error = harness.act(bad)
            assert error["type"] == "error" and error["payload"]["code"] == code, error
            assert field is None or error["payload"]["field"] == field
        # The episode goes on, PNG cameras (vla-eval's default) included.
        reply = harness.act({"images": {"front": png(IMAGE), "wrist": png(IMAGE)}, "task_description": "reach"})
        assert reply["type"] == "action" and reply["payload"]["actions"].shape == (10,)


def test_a_whole_chunk_where_the_episode_asks_for_it(server):
    with Harness(server) as harness:
        harness.send("episode_start", {"task": {"task_description": "reach"}, "settings": {"chunk": "whole"}})
        for step in range(3):
            reply = harness.act(observation(step))
            assert reply["payload"]["actions"].shape == (HORIZON, 10)


def unused_state_count(server) -> float:
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith('cosmos3_unused_state_observations_total{protocol="vla-eval"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_state_the_domain_does_not_use_is_accepted_and_counted(server):
    before = unused_state_count(server)
    with Harness(server) as harness:
        harness.send("episode_start", {"task": {"task_description": "reach"}})
        for step in range(3):
            assert harness.act(observation(step, states=np.zeros(4, np.float32)))["type"] == "action"
    assert unused_state_count(server) == before + 3


def test_health_and_config_answer_on_the_websocket_port(server):
    for path in ("/health", "/v1/vla-eval/health"):
        status, body, _ = http_get(f"http://127.0.0.1:{server.port}{path}")
        assert (status, body) == (200, {"status": "ok"})
    status, body, _ = http_get(f"http://127.0.0.1:{server.port}/config")
    assert status == 200 and body["applied"] == {}
    assert (body["config"]["domain_name"], body["config"]["action_horizon"], body["config"]["chunk"]) == (
        DOMAIN,
        HORIZON,
        "step",
    )
    status, body, _ = http_get(f"http://127.0.0.1:{server.port}/config?max_batch_size=8")
    assert status == 422 and "max_batch_size" in body["errors"][0]


def test_a_harness_and_a_native_robot_share_the_engine_fairly(server):
    """Both in lock-step on the one engine worker at once, whole chunks (an engine call per observation)."""
    counts = {"vla-eval": 0, "native": 0}
    stop = time.monotonic() + 8.0

    def native() -> None:
        with PolicyClient(server.url) as client:
            client.configure(domain_name=DOMAIN, action_horizon=HORIZON)
            while time.monotonic() < stop:
                client.infer({"image": IMAGE}, timeout=60)
                counts["native"] += 1

    robot = threading.Thread(target=native)
    robot.start()
    with Harness(server) as harness:
        harness.send("episode_start", {"task": {"task_description": "reach"}, "settings": {"chunk": "whole"}})
        while time.monotonic() < stop:
            assert harness.act(observation())["type"] == "action"
            counts["vla-eval"] += 1
    robot.join()
    assert min(counts.values()) >= 3, counts
    assert max(counts.values()) <= 3 * min(counts.values()), counts  # turns, not one starving the other


def test_vla_eval_episodes_are_recorded_like_other_sessions(tmp_path):
    root = tmp_path / "recordings"
    settings = VlaEvalSettings(requested={"action_horizon": HORIZON})
    with ServerThread(tiny_engine_loader("distilled"), vla_eval=settings, recording=RecordingOptions(root=root)) as rec:
        with Harness(rec) as harness:
            for text in ("reach the cube", "touch the cube"):
                harness.send("episode_start", {"task": {"task_description": text}})
                for step in range(HORIZON + 1):
                    assert harness.act({"images": {"front": rgb_image(64, seed=step)}})["type"] == "action"
                harness.send("episode_end", {"metrics": {"success": True}})
    store = RecordingStore(root)
    recorded = sorted((RecordedEpisode(store.path(info.name)) for info in store.list()), key=lambda e: e.rows()[0].seq)
    assert [episode.rows()[0].task for episode in recorded] == ["reach the cube", "touch the cube"]
    for episode in recorded:
        assert [row.kind for row in episode.rows()] == ["chunk", "chunk"]  # two chunks played per episode
        assert "episode_end" in [event["kind"] for event in episode.events()]


def test_with_a_token_health_stays_open_and_the_rest_is_closed():
    from websockets.exceptions import InvalidStatus

    from policy_server.foundation.auth import TokenSet

    with ServerThread(tiny_engine_loader("distilled"), auth_tokens=TokenSet.load("s3cret", None)) as closed:
        assert http_get(f"http://127.0.0.1:{closed.port}/health")[:2] == (200, {"status": "ok"})
        assert http_get(f"http://127.0.0.1:{closed.port}/config")[0] == 401
        with pytest.raises(InvalidStatus) as info:
            with connect(f"ws://127.0.0.1:{closed.port}/v1/vla-eval", proxy=None, open_timeout=30):
                pass
        assert info.value.response.status_code == 401
        with connect(f"ws://127.0.0.1:{closed.port}/v1/vla-eval?token=s3cret", proxy=None, open_timeout=30) as ws:
            ws.send(packb({"type": "hello", "payload": {"protocol_version": 1}, "seq": 1, "timestamp": 0.0}))
            assert unpackb(ws.recv(timeout=30))["type"] == "hello"


def test_without_vla_eval_its_paths_are_not_served():
    """``--no-vla-eval`` (``vla_eval=None`` at assembly): its WebSocket path, /health and /config are 404."""
    from websockets.exceptions import InvalidStatus

    with ServerThread(tiny_engine_loader("distilled"), vla_eval=None) as plain:
        for path in ("/health", "/config", "/v1/vla-eval/health"):
            assert http_get(f"http://127.0.0.1:{plain.port}{path}")[0] == 404
        with pytest.raises(InvalidStatus) as info:
            with connect(f"ws://127.0.0.1:{plain.port}/v1/vla-eval", proxy=None, open_timeout=30):
                pass
        assert info.value.response.status_code == 404
        assert http_get(f"http://127.0.0.1:{plain.port}/healthz")[0] == 200


def test_the_rate_limit_counts_the_observations_that_reach_the_engine():
    from policy_server.foundation.rate_limit import RateLimit

    settings = VlaEvalSettings(requested={"action_horizon": 8}, plan=ChunkPlan(ask_ahead=0))
    limited = RateLimit(rate_hz=1.0, burst=2)
    with ServerThread(tiny_engine_loader("distilled"), vla_eval=settings, observation_rate=limited) as server:
        with Harness(server) as harness:
            harness.send("episode_start", {"task": {"task_description": "reach"}})
            # Eight steps of one chunk, faster than 1/s: one engine call, every step answered.
            assert [harness.act(observation(step))["type"] for step in range(8)] == ["action"] * 8
            harness.send("episode_start", {"task": {}, "settings": {"chunk": "whole"}})
            codes = [harness.act(observation(step))["payload"].get("code") for step in range(4)]
            assert "rate_limited" in codes and codes[0] is None, codes  # every one of these is an engine call


def test_a_live_run_is_answered_with_the_freshest_chunk_for_its_latest_observation(server):
    """Real time: observations do not wait for replies; latest wins in the queue, and every chunk the engine
    makes goes to the newest observation (vla-eval's live runner keeps the newest action it received)."""
    with Harness(server) as harness:
        harness.send(
            "episode_start", {"task": {"task_description": "reach"}, "mode": "live", "settings": {"chunk": "whole"}}
        )
        sent = [harness.send("observation", observation(step)) for step in range(6)]
        replies = []
        while not replies or replies[-1]["seq"] != sent[-1]:
            replies.append(harness.recv())
        assert all(reply["type"] == "action" for reply in replies), replies
        assert all(reply["payload"]["actions"].shape == (HORIZON, 10) for reply in replies)
        assert len(replies) < len(sent)  # the ones replaced while they waited were not run
