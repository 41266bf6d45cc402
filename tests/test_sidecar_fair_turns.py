"""The engine's turns through the real sidecar and WebSocket port (issue 18, items 8 and 9).

Item 8: one HTTP client with 16 action generations in flight used to take 15 of every 16 engine slots
from a streaming robot. Now each client's requests share one turn and at most
``--max-http-actions-in-flight`` (4) are admitted; the rest get 429 ``too_many_in_flight`` at once.

Item 9: video jobs never ran while robots kept an observation waiting. Now a rollout gets one step per
``--video-step-interval-s`` even then, and completes.

The checks count what the engine served per owner and how batches were made up, never latencies.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import websockets.sync.client as ws_client
from server_fixtures import DOMAIN
from sidecar_fixtures import SidecarServer, engine_loader, png_b64, rgb, video_body, wait_for_job

from policy_server.foundation.api_errors import ApiError
from policy_server.foundation.auth import TokenSet
from policy_server.http.turns import InFlightLimit, client_identity
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(180)

IMAGE = rgb(64, seed=3)


@pytest.fixture(scope="module")
def server():
    with SidecarServer(engine_loader()) as running:
        yield running


def _record_batches(server: SidecarServer) -> list[list[str]]:
    """From now on, the owner of every item of every batch the worker runs, in order
    (``http:<client>`` for an action generation, else the session id)."""
    batches: list[list[str]] = []
    worker = server.server.context.worker
    previous = worker.on_batch_done

    def on_batch_done(batch, outcomes):
        batches.append([f"http:{item.turn}" if item.turn is not None else item.session_id for item in batch])
        previous(batch, outcomes)

    worker.on_batch_done = on_batch_done
    return batches


def test_an_http_client_with_16_requests_in_flight_takes_turns_with_a_robot(server):
    stop = threading.Event()
    statuses: list[tuple[float, int, dict]] = []
    body = {"domain_name": DOMAIN, "image": png_b64(IMAGE), "action_horizon": 8}

    def http_client() -> None:  # one of the attacker's 16 concurrent requests, sent again and again
        with httpx.Client(base_url=server.http_url, trust_env=False, timeout=60) as client:
            while not stop.is_set():
                response = client.post("/v1/actions/generations", json=body)
                statuses.append(
                    (
                        time.monotonic(),
                        response.status_code,
                        dict(response.headers)
                        | ({"error": response.json()["error"]} if response.status_code != 200 else {}),
                    )
                )
                if response.status_code == 429:
                    time.sleep(0.5)

    attackers = [threading.Thread(target=http_client, daemon=True) for _ in range(16)]
    robot_chunks: list[float] = []
    with ws_client.connect(server.url, compression=None, proxy=None, max_size=2**24) as ws:
        unpackb(ws.recv())
        ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8}))
        unpackb(ws.recv())
        for thread in attackers:
            thread.start()
        time.sleep(1.0)  # the attack is under way
        batches = _record_batches(server)
        window_start = time.monotonic()
        for seq in range(1, 9):
            ws.send(packb({"type": "observation", "seq": seq, "image": IMAGE}))
            reply = unpackb(ws.recv(timeout=60))
            assert reply["type"] == "action_chunk", reply
            robot_chunks.append(time.monotonic())
        window_end = time.monotonic()
        stop.set()
        for thread in attackers:
            thread.join(60)
    server.server.context.worker.on_batch_done = server.sidecar.metrics.observe_batch

    served_http = [t for t, status, _ in statuses if status == 200 and window_start <= t <= window_end]
    refusals = [headers for _, status, headers in statuses if status == 429]
    # Fair turns: the robot is served about as often as the whole HTTP client (one turn each per round;
    # before: about once for every 15 of the client's). Counted over the same window.
    assert len(robot_chunks) * 3 >= len(served_http), (len(robot_chunks), len(served_http))
    # A batch never holds more than one request of the client (its requests wait for one turn), and a
    # robot's engine call never carries one of them.
    assert batches and all(sum(owner.startswith("http:") for owner in batch) <= 1 for batch in batches), batches
    assert all(len(batch) == 1 for batch in batches if any(owner.startswith("http:") for owner in batch)), batches
    # Bounded in flight: never more than 4 admitted at once; the rest refused at once, typed, with Retry-After.
    assert server.sidecar.actions_in_flight.peak == 4
    assert refusals and all(h["error"]["code"] == "too_many_in_flight" and h["retry-after"] == "1" for h in refusals)
    assert server.sidecar.actions_in_flight.in_flight("peer:127.0.0.1") == 0  # all released


def wait_until(condition, timeout: float) -> bool:
    """Poll ``condition``: a queue's length is a snapshot, and the engine may just have taken every waiting
    observation into one batch."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_video_jobs_complete_while_robots_keep_an_observation_waiting(server):
    """Three robots streaming at 50 Hz without waiting for answers (faster than the engine: one of them
    always has an observation waiting). Before: the job stayed queued for as long as they streamed."""
    stop = threading.Event()
    served = {"chunks": 0}

    def robot(index: int) -> None:
        with ws_client.connect(server.url, compression=None, proxy=None, max_size=2**24) as ws:
            unpackb(ws.recv())
            ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8}))
            unpackb(ws.recv())

            def read() -> None:
                try:
                    for message in ws:
                        if unpackb(message)["type"] == "action_chunk":
                            served["chunks"] += 1
                except Exception:  # noqa: BLE001 - closed at the end
                    pass

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            seq = 0
            while not stop.is_set():
                seq += 1
                ws.send(packb({"type": "observation", "seq": seq, "image": rgb(64, seed=index)}))
                time.sleep(0.02)

    robots = [threading.Thread(target=robot, args=(i,), daemon=True) for i in range(3)]
    for thread in robots:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while served["chunks"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert wait_until(lambda: len(server.server.context.queue) >= 1, 10)  # robots are waiting
        job = server.client.post("/v1/videos", json=video_body()).json()
        chunks_at_submit = served["chunks"]
        done = wait_for_job(server.client, job["id"], timeout=90)
        chunks_during_job = served["chunks"] - chunks_at_submit
        assert wait_until(lambda: len(server.server.context.queue) >= 1, 10)  # and still were when it finished
    finally:
        stop.set()
        for thread in robots:
            thread.join(30)
    assert done["status"] == "completed", done
    assert chunks_during_job > 0  # the robots were served all along


def test_the_client_is_the_token_it_was_admitted_with():
    """With authentication, the turn and the bound belong to the matching token, wherever it travelled,
    even if the request also carried invalid candidates (which must not make it a new client)."""
    tokens = TokenSet(["token-a", "token-b"])

    def token_id(headers: dict[str, str], query: str = "") -> str:
        result = tokens.check(lambda name: [v for k, v in headers.items() if k == name], query)
        assert result.ok
        return result.token_id

    a = token_id({"authorization": "Bearer token-a"})
    assert a == token_id({}, "access_token=token-a") == token_id({"sec-websocket-protocol": "bearer.token-a"})
    assert a == token_id({"authorization": f"Bearer forged-{time.time()}"}, "token=token-a")
    assert a != token_id({"authorization": "Bearer token-b"})
    assert "token-a" not in a
    assert client_identity({"cosmos3.token_id": a, "client": ("10.0.0.1", 5000)}) == f"token:{a}"
    # Without authentication: the peer's address, whatever its port.
    assert client_identity({"client": ("10.0.0.1", 5000)}) == client_identity({"client": ("10.0.0.1", 6000)})
    assert client_identity({"client": ("10.0.0.1", 5000)}) != client_identity({"client": ("10.0.0.2", 5000)})


def test_the_in_flight_bound_is_per_client_and_released():
    limit = InFlightLimit(2)
    with limit.admit("a"), limit.admit("a"):
        with limit.admit("b"):
            assert limit.in_flight("b") == 1
        with pytest.raises(ApiError) as refused:
            with limit.admit("a"):
                pass
        assert refused.value.status == 429 and refused.value.code == "too_many_in_flight"
        assert refused.value.headers["Retry-After"] == "1"
        assert limit.in_flight("a") == 2
    assert limit.in_flight("a") == 0 and limit.peak == 2 and limit.refused == 1
    with pytest.raises(ApiError):  # an error inside the block releases the place too
        with limit.admit("a"):
            raise ApiError("x", "failed in the engine")
    assert limit.in_flight("a") == 0
