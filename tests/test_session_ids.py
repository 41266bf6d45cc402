"""Several policy sessions on one connection, named by ``session_id``, as NVIDIA's RoboLab v0.3 drives them.

RoboLab's Cosmos3 client (NVlabs/RoboLab ``policies/cosmos3/client.py`` over
``robolab/eval/websocket_transport.py``) steps several simulated environments in one process over one
WebSocket: every observation names its environment (``robolab-episode-{i}-env-{j}``), each request is sent
and its reply read before the next (lock-step), the token goes as ``Authorization: Bearer``, the URI is a
full ``ws://host:port/``, a reply's actions are read from ``action`` or ``actions``, and a text frame is an
error. :class:`RobolabStyleTransport` and :class:`RobolabStyleClient` below reproduce that behaviour,
written here from reading those sources (nothing of RoboLab is installable from the registries here);
they import nothing of this project. Against them: a real server on 127.0.0.1 with the tiny DROID
checkpoint, its recording read back by LeRobot's own reader, the bound on names per connection attacked,
and an idle name expiring. The rules themselves are tested without sockets first.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import websockets.sync.client
from server_fixtures import REPO_ROOT, ServerThread, tiny_engine_loader
from websockets.asyncio.client import connect

from policy_server.foundation.auth import TokenSet
from policy_server.openpi_settings import OpenpiSettings
from policy_server.recording.feature import RecordingOptions
from policy_server.recording.replay import RecordedEpisode
from policy_server.recording.store import RecordingStore
from policy_server.server_settings import PolicySessionLimits
from policy_server.sessions.controls import ControlAction, OperatorControl
from policy_server.sessions.policy_sessions import PolicySessionTable
from robot_clients import AsyncPolicyClient, ServerError
from robot_clients.protocol import ErrorCode, ProtocolError
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(600)

TOKEN = "robolab-secret"
CHUNKS = 32  # per environment
HORIZON, ACTION_DIM = 32, 8  # the DROID profile's chunk
LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_PYTHON", REPO_ROOT / ".venv-lerobot" / "bin" / "python"))
LEROBOT_SCRIPT = Path(__file__).with_name("lerobot_dataset_script.py")


# -- the rules, without sockets ----------------------------------------------------------------------


def test_a_connection_holds_at_most_its_bound_of_names_and_a_refused_name_costs_nothing():
    table: PolicySessionTable[str] = PolicySessionTable(PolicySessionLimits(max_per_connection=2, idle_timeout_s=5))
    made: list[str] = []

    def make(name: str):
        return lambda: made.append(name) or name

    assert table.open("a", 0.0, make("a"), server_room=10) == "a"
    assert table.open("b", 0.0, make("b"), server_room=10) == "b"
    assert table.open("a", 1.0, make("a-again"), server_room=10) == "a"  # known: not made again
    with pytest.raises(ProtocolError) as refused:
        table.open("c", 1.0, make("c"), server_room=10, seq=7)
    assert (refused.value.code, refused.value.field, refused.value.seq) == (
        ErrorCode.TOO_MANY_SESSIONS,
        "session_id",
        7,
    )
    assert made == ["a", "b"] and len(table) == 2 and table.refused == 1
    # The server's own bound: a new name needs a free session slot even below the connection's bound.
    table.remove("b")
    with pytest.raises(ProtocolError) as full:
        table.open("c", 1.0, make("c"), server_room=0)
    assert full.value.code == ErrorCode.TOO_MANY_SESSIONS and "--max-sessions" in full.value.message
    assert table.open("a", 2.0, make("a-again"), server_room=0) == "a"  # a known name needs no new slot


def test_idle_names_expire_unless_their_work_is_in_flight():
    table: PolicySessionTable[str] = PolicySessionTable(PolicySessionLimits(max_per_connection=4, idle_timeout_s=5))
    for name in ("idle", "busy", "fresh"):
        table.open(name, 0.0, lambda name=name: name, server_room=10)
    table.open("fresh", 4.0, lambda: "fresh", server_room=10)  # used again: its clock starts over
    assert table.expire(5.5, busy=lambda session: session == "busy") == ["idle"]
    assert sorted(table) == ["busy", "fresh"] and table.get("idle") is None
    assert table.expire(8.5, busy=lambda session: False) == ["busy"]  # fresh was used at 4.0
    assert [*table] == ["fresh"]
    never = PolicySessionTable[str](PolicySessionLimits(idle_timeout_s=0))
    never.open("a", 0.0, lambda: "a", server_room=1)
    assert never.expire(1e9, busy=lambda session: False) == []


# -- a RoboLab-v0.3-style client, written here ----------------------------------------------------------


class RobolabStyleTransport:
    """Lock-step msgpack over one WebSocket with openpi's numpy markers, as RoboLab's transport does it:
    the server's first frame is its metadata, each request is one binary frame answered by one frame, and
    a text frame is the server's error."""

    def __init__(self, uri: str, token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        connecting = websockets.sync.client.connect(
            uri, additional_headers=headers, compression=None, max_size=None, proxy=None
        )
        self.ws = connecting.__enter__()  # open for the client's life, closed by close()
        first = self.ws.recv(timeout=60)
        if isinstance(first, str):
            raise RuntimeError(f"text metadata: {first}")
        self.metadata = self.unpack(first)

    @staticmethod
    def _encode(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            value = np.ascontiguousarray(value)
            return {b"__ndarray__": True, b"data": value.tobytes(), b"dtype": value.dtype.str, b"shape": value.shape}
        if isinstance(value, np.generic):
            return {b"__npgeneric__": True, b"data": value.item(), b"dtype": value.dtype.str}
        raise TypeError(f"cannot pack {type(value)!r}")

    @staticmethod
    def _decode(value: dict) -> Any:
        if b"__ndarray__" in value:
            return np.frombuffer(value[b"data"], dtype=np.dtype(value[b"dtype"])).reshape(tuple(value[b"shape"]))
        if b"__npgeneric__" in value:
            return np.dtype(value[b"dtype"]).type(value[b"data"])
        return value

    def unpack(self, data: bytes) -> Any:
        return msgpack.unpackb(data, object_hook=self._decode, strict_map_key=False)

    def request(self, request: dict) -> Any:
        self.ws.send(msgpack.packb(request, default=self._encode))
        reply = self.ws.recv(timeout=300)
        if isinstance(reply, str):
            raise RuntimeError(f"Policy server returned a text error:\n{reply}")
        return self.unpack(reply)

    def close(self) -> None:
        self.ws.close()


class RobolabStyleClient:
    """What RoboLab's Cosmos3 client sends per environment: the wrist camera on top of the two shoulder
    cameras at half size (one composed ``observation/image``), the arm's 7 joints and the gripper, the task,
    and ``session_id`` ``robolab-episode-{episode}-env-{env}``; the chunk read from ``action`` or ``actions``."""

    IMAGE_H, IMAGE_W = 72, 128  # RoboLab's 360 x 640, scaled down: the tiny model's canvas is small anyway

    def __init__(self, uri: str, token: str | None, episode: int = 0) -> None:
        self.transport = RobolabStyleTransport(uri, token)
        self.episode = episode

    def observation(self, env: int, step: int, instruction: str) -> dict:
        rng = np.random.default_rng(1000 * env + step)
        h, w = self.IMAGE_H, self.IMAGE_W
        wrist, left, right = (rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(3))
        below = np.concatenate((left[::2, ::2], right[::2, ::2]), axis=1)
        return {
            "observation/image": np.concatenate((wrist, below)),
            "observation/joint_position": rng.uniform(-1, 1, 7).astype(np.float32),
            "observation/gripper_position": rng.uniform(0, 1, 1).astype(np.float32),
            "prompt": instruction,
            "session_id": f"robolab-episode-{self.episode}-env-{env}",
        }

    def infer(self, env: int, step: int, instruction: str = "put the cube in the bowl") -> np.ndarray:
        response = self.transport.request(self.observation(env, step, instruction))
        if isinstance(response, dict):
            if response.get("type") == "error":
                raise RuntimeError(str(response.get("message")))
            response = response["action"] if "action" in response else response["actions"]
        return np.asarray(response)


# -- against a real server ------------------------------------------------------------------------------


def recorded_episodes(root: Path) -> list[RecordedEpisode]:
    store = RecordingStore(root)
    return [RecordedEpisode(store.path(info.name)) for info in store.list()]


def test_robolab_style_client_drives_two_environments_over_one_socket_and_records_two_episodes(tmp_path):
    root = tmp_path / "recordings"
    with ServerThread(
        tiny_engine_loader("base", droid=True),
        auth_tokens=TokenSet.load(TOKEN, None),
        recording=RecordingOptions(root=root),
    ) as server:
        # Without the token the handshake is refused (the Bearer header is what opens it).
        with pytest.raises(websockets.exceptions.InvalidStatus):
            RobolabStyleTransport(f"ws://127.0.0.1:{server.port}/", None)
        client = RobolabStyleClient(f"ws://127.0.0.1:{server.port}/", TOKEN)
        assert client.transport.metadata["action_horizon"] == HORIZON
        chunks: dict[int, list[np.ndarray]] = {0: [], 1: []}
        for step in range(CHUNKS):
            for env in (0, 1):  # interleaved, one request at a time, as RoboLab steps its environments
                chunks[env].append(client.infer(env, step))
        for env in (0, 1):
            assert all(chunk.shape == (HORIZON, ACTION_DIM) and np.isfinite(chunk).all() for chunk in chunks[env])
        assert not np.array_equal(chunks[0][0], chunks[1][0])  # each environment got its own observation's

        # The server sees one connection and three sessions: the connection's own and one per environment.
        sessions = server.run(lambda: {s.id: (s.name, s.answered) for s in server.server.context.sessions.values()})
        named = {name: answered for name, answered in sessions.values() if name is not None}
        assert named == {"robolab-episode-0-env-0": CHUNKS, "robolab-episode-0-env-1": CHUNKS}

        # A bad observation of one environment is a text frame (RoboLab raises it); the connection goes on.
        bad = client.observation(1, CHUNKS, "x")
        bad["observation/image"] = bad["observation/image"][..., :2]
        with pytest.raises(RuntimeError, match="Policy server returned a text error"):
            client.transport.request(bad)
        assert client.infer(0, CHUNKS).shape == (HORIZON, ACTION_DIM)
        client.transport.close()
    # The server stopped after the connection closed: each environment's episode is published on its own.
    episodes = recorded_episodes(root)
    by_name = {episode.session["session_id"].rsplit("/", 1)[-1]: episode for episode in episodes}
    assert sorted(by_name) == ["robolab-episode-0-env-0", "robolab-episode-0-env-1"], [e.session for e in episodes]
    assert [row.seq for row in by_name["robolab-episode-0-env-0"].rows()] == list(range(CHUNKS + 1))
    env1_rows = by_name["robolab-episode-0-env-1"].rows()
    assert [row.seq for row in env1_rows] == list(range(CHUNKS))  # its bad observation never got a row
    np.testing.assert_array_equal(env1_rows[5].actions, chunks[1][5])

    if not LEROBOT_PYTHON.exists():
        pytest.skip(f"LeRobot's virtualenv is missing ({LEROBOT_PYTHON}); `make test` builds it")
    folders = [episode.path for episode in episodes]
    out = tmp_path / "read.npz"
    result = subprocess.run(
        [str(LEROBOT_PYTHON), str(LEROBOT_SCRIPT), "--out", str(out), "--aggregate", str(tmp_path / "merged")]
        + [str(folder) for folder in folders],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "*"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["merged_episodes"] == 2  # LeRobot's reader: one dataset, two episodes
    frames = [dataset["frames"] for dataset in summary["datasets"]]
    assert sorted(frames[:2]) == [CHUNKS, CHUNKS + 1] and frames[2] == 2 * CHUNKS + 1


def small_server(
    idle_timeout_s: float, delay_s: float = 0.0, clock: Callable[[], float] = time.monotonic, **settings: Any
) -> ServerThread:
    """Two names per connection; idle names expire after ``idle_timeout_s`` (0: never) on ``clock``; every engine
    call takes ``delay_s`` longer."""
    return ServerThread(
        tiny_engine_loader("distilled", droid=True, delay_s=delay_s),
        openpi=OpenpiSettings(requested={"seed": 0}),
        policy_sessions=PolicySessionLimits(max_per_connection=2, idle_timeout_s=idle_timeout_s, clock=clock),
        **{"max_sessions": 8, **settings},
    )


class HandTurnedClock:
    """The server's idle clock, moved only by the test: no name expires while the test looks elsewhere."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def bounded_server():
    # Never expire: a slow chunk must not free a slot here. Engine calls of 0.5 s at least: what waits, waits.
    with small_server(idle_timeout_s=0, delay_s=0.5) as server:
        yield server


def named_sessions(server: ServerThread) -> set[str]:
    return server.run(lambda: {s.name for s in server.server.context.sessions.values() if s.name is not None})


def test_a_name_past_the_bound_is_refused_with_a_typed_error_and_the_others_keep_working(bounded_server):
    client = RobolabStyleClient(f"ws://127.0.0.1:{bounded_server.port}/openpi", None, episode=7)
    try:
        assert client.infer(0, 0).shape == (HORIZON, ACTION_DIM)
        assert client.infer(1, 0).shape == (HORIZON, ACTION_DIM)
        for env in range(2, 6):  # an attacker naming ever new sessions gets refused each time
            with pytest.raises(RuntimeError) as refused:
                client.infer(env, 0)
            assert f"{ErrorCode.TOO_MANY_SESSIONS}:" in str(refused.value)
            assert "(field: session_id)" in str(refused.value)
        assert named_sessions(bounded_server) == {"robolab-episode-7-env-0", "robolab-episode-7-env-1"}
        for env in (0, 1):  # the connection and its two names go on
            assert client.infer(env, 1).shape == (HORIZON, ACTION_DIM)
        # A malformed name is refused as such, not counted.
        request = client.observation(0, 2, "x")
        request["session_id"] = 12
        with pytest.raises(RuntimeError, match="invalid_field.*session_id"):
            client.transport.request(request)
    finally:
        client.transport.close()


def test_an_idle_name_expires_freeing_its_slot_and_ending_its_episode(tmp_path):
    """The idle clock is turned by hand (a 10 s timeout on it): env-0 expires once it has been idle 12 s of that
    clock while env-1 was used 6 s before, and nothing else expires however long a round trip takes here."""
    root = tmp_path / "recordings"
    clock = HandTurnedClock()
    with small_server(idle_timeout_s=10.0, clock=clock, recording=RecordingOptions(root=root)) as server:
        client = RobolabStyleClient(f"ws://127.0.0.1:{server.port}/", None, episode=8)
        try:
            client.infer(0, 0)
            client.infer(1, 0)  # both used at 0
            clock.now = 6.0
            client.infer(1, 1)  # env-1 used at 6
            clock.now = 12.0  # env-0 idle for 12 s, env-1 for 6 s: only env-0 is past the timeout
            deadline = time.monotonic() + 60  # the server looks every second of real time
            while "robolab-episode-8-env-0" in named_sessions(server):
                assert time.monotonic() < deadline, "env-0 never expired"
                time.sleep(0.05)
            assert named_sessions(server) == {"robolab-episode-8-env-1"}
            # Its episode ended with it and is published while the connection is still open.
            while not recorded_episodes(root):
                assert time.monotonic() < deadline, "env-0's episode was not published"
                time.sleep(0.1)
            [expired] = recorded_episodes(root)
            assert expired.session["session_id"].endswith("/robolab-episode-8-env-0"), expired.session
            assert expired.session["end_reason"] == "expired", expired.session
            # Its slot went to a new environment: env-1 holds the other of the connection's two.
            assert client.infer(2, 0).shape == (HORIZON, ACTION_DIM)
            assert named_sessions(server) == {"robolab-episode-8-env-1", "robolab-episode-8-env-2"}
        finally:
            client.transport.close()
        deadline = time.monotonic() + 10
        while named_sessions(server):  # the connection closed: its names are gone with it
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_names_are_charged_against_the_servers_session_limit():
    """--max-sessions 2: a connection and one environment it names hold both slots, so a second name is
    refused (below the connection's own bound of 2) and another robot's handshake gets 503, until the
    connection ends."""
    with small_server(idle_timeout_s=0, max_sessions=2) as server:
        uri = f"ws://127.0.0.1:{server.port}/"
        client = RobolabStyleClient(uri, None)
        try:
            assert client.infer(0, 0).shape == (HORIZON, ACTION_DIM)
            with pytest.raises(RuntimeError, match="too_many_sessions: the server holds as many sessions"):
                client.infer(1, 0)
            with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
                RobolabStyleTransport(uri, None)
            assert refused.value.response.status_code == 503
            assert client.infer(0, 1).shape == (HORIZON, ACTION_DIM)  # what it holds goes on
        finally:
            client.transport.close()
        deadline = time.monotonic() + 10
        while True:  # its slots are freed with it
            try:
                RobolabStyleTransport(uri, None).close()
                break
            except websockets.exceptions.InvalidStatus:
                assert time.monotonic() < deadline
                time.sleep(0.1)


# -- the native protocol and its clients --------------------------------------------------------------


async def test_each_name_has_its_own_sequence_and_its_own_slot_in_the_queue(bounded_server):
    """Three observations sent together, all seq 0: the connection's own and two names'. The engine takes
    the first; the two names' wait side by side (one slot each: neither replaces the other) and each gets
    its chunk, tagged with its name."""
    rng = np.random.default_rng(0)
    base = {
        "type": "observation",
        "image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
        "state": np.zeros(8, np.float32),
        "domain_name": "droid_lerobot",
        "seq": 0,
    }
    async with connect(bounded_server.url, compression=None, proxy=None, max_size=None) as ws:
        assert unpackb(await ws.recv())["type"] == "metadata"
        for name in (None, "env-a", "env-b"):
            await ws.send(packb(base if name is None else {**base, "session_id": name}))
        replies = [unpackb(await asyncio.wait_for(ws.recv(), 120)) for _ in range(3)]
    got = sorted((reply["type"], reply["seq"], reply.get("session_id") or "") for reply in replies)
    assert got == [("action_chunk", 0, ""), ("action_chunk", 0, "env-a"), ("action_chunk", 0, "env-b")], replies


async def test_one_native_client_drives_two_policy_sessions_with_their_own_seqs(bounded_server):
    async with AsyncPolicyClient(bounded_server.url, images="raw") as client:
        assert client.metadata["limits"]["max_session_ids"] == 2  # the bound, told in the hello
        assert client.metadata["limits"]["session_id_idle_timeout_s"] is None  # 0: never expires
        await client.configure(domain_name="droid_lerobot", seed=0)
        state = np.zeros(8, np.float32)
        image = np.full((64, 64, 3), 100, np.uint8)
        a = await client.infer(image, state=state, session_id="env-a")
        b = await client.infer(image, state=state, session_id="env-b")
        assert a.actions.shape == b.actions.shape == (HORIZON, ACTION_DIM)
        assert a.session_id == "env-a" and b.session_id == "env-b"
        np.testing.assert_array_equal(a.actions, b.actions)  # same observation, same seed: the same chunk
        # Streamed: both names' chunks come back, tagged, and neither makes the other's stale.
        for name in ("env-a", "env-b"):
            await client.submit(image, state=state, session_id=name)
        got = {(await client.receive(timeout=120)).session_id for _ in range(2)}
        assert got == {"env-a", "env-b"}
        with pytest.raises(ServerError) as refused:
            await client.infer(image, state=state, session_id="env-c")
        assert refused.value.code == ErrorCode.TOO_MANY_SESSIONS
        await client.reset(session_id="env-a")
        assert (await client.infer(image, state=state, session_id="env-a")).session_id == "env-a"
    await asyncio.sleep(0)


async def test_an_operator_pausing_the_connection_holds_every_name_it_drives(bounded_server):
    frame = {
        "type": "observation",
        "image": np.zeros((64, 64, 3), np.uint8),
        "state": np.zeros(8, np.float32),
        "domain_name": "droid_lerobot",
        "session_id": "env-a",
    }
    async with connect(bounded_server.url, compression=None, proxy=None, max_size=None) as ws:
        connection_id = unpackb(await ws.recv())["session_id"]
        await ws.send(packb({**frame, "seq": 0}))
        assert unpackb(await asyncio.wait_for(ws.recv(), 120))["type"] == "action_chunk"

        def control(action: ControlAction) -> None:
            bounded_server.server.context.sessions[connection_id].apply_control(OperatorControl(connection_id, action))

        await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(_call(control, ControlAction.PAUSE), bounded_server.loop)
        )
        assert unpackb(await ws.recv())["state"] == "paused"
        await ws.send(packb({**frame, "seq": 1}))
        held = unpackb(await asyncio.wait_for(ws.recv(), 120))
        assert (held["type"], held["reason"], held["session_id"]) == ("dropped", "paused", "env-a")
        await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(_call(control, ControlAction.RESUME), bounded_server.loop)
        )
        assert unpackb(await ws.recv())["state"] == "running"
        await ws.send(packb({**frame, "seq": 2}))
        assert unpackb(await asyncio.wait_for(ws.recv(), 120))["type"] == "action_chunk"


async def _call(function: Any, *args: Any) -> Any:
    return function(*args)


# -- the connection is the unit of fairness (issue 45.4) ----------------------------------------------

OBSERVATION = {
    "type": "observation",
    "image": np.full((64, 64, 3), 100, np.uint8),
    "state": np.zeros(8, np.float32),
    "domain_name": "droid_lerobot",
}


async def test_a_connections_names_wait_on_its_turn_in_the_queue(bounded_server):
    async with connect(bounded_server.url, compression=None, proxy=None, max_size=None) as ws:
        hello = unpackb(await ws.recv())
        for name in ("env-a", "env-b"):
            await ws.send(packb({**OBSERVATION, "seq": 0, "session_id": name}))
        replies = [unpackb(await asyncio.wait_for(ws.recv(), 120)) for _ in range(2)]
        assert {r["type"] for r in replies} == {"action_chunk"}, replies
        turns = bounded_server.run(
            lambda: {s.name: s.turn for s in bounded_server.server.context.sessions.values() if s.name}
        )
    assert turns == {"env-a": (hello["session_id"], 0), "env-b": (hello["session_id"], 0)}


def test_a_weighted_connections_names_take_its_turns_in_rotation():
    with ServerThread(
        tiny_engine_loader("distilled", droid=True),
        policy_sessions=PolicySessionLimits(max_per_connection=4, idle_timeout_s=0, turns_per_connection=2),
    ) as server:

        async def run() -> dict[str, Any]:
            async with connect(server.url, compression=None, proxy=None, max_size=None) as ws:
                hello = unpackb(await ws.recv())
                for name in ("e0", "e1", "e2"):
                    await ws.send(packb({**OBSERVATION, "seq": 0, "session_id": name}))
                    assert unpackb(await asyncio.wait_for(ws.recv(), 120))["type"] == "action_chunk"
                turns = server.run(lambda: {s.name: s.turn for s in server.server.context.sessions.values() if s.name})
                return {"id": hello["session_id"], "turns": turns}

        got = asyncio.run(run())
    connection = got["id"]
    assert got["turns"] == {"e0": (connection, 0), "e1": (connection, 1), "e2": (connection, 0)}


async def test_a_connections_names_share_its_rate_limit():
    from policy_server.foundation.rate_limit import RateLimit

    with small_server(idle_timeout_s=0, observation_rate=RateLimit(5.0, 3)) as server:
        async with connect(server.url, compression=None, proxy=None, max_size=None) as ws:
            unpackb(await ws.recv())
            # 8 observations at once over two names: each name alone would be within a burst of 3 only for
            # 3 of its 4; sharing the connection's bucket, at most 3 (and what refills meanwhile) pass.
            for seq in range(4):
                for name in ("env-a", "env-b"):
                    await ws.send(packb({**OBSERVATION, "seq": seq, "session_id": name}))
            replies = [unpackb(await asyncio.wait_for(ws.recv(), 120)) for _ in range(8)]
    limited = [r for r in replies if r.get("code") == "rate_limited"]
    assert len(limited) >= 8 - 3 - 1, replies


async def test_a_connections_names_share_its_outbox_when_the_client_stops_reading():
    """A client that never reads, naming two sessions: every reply of its names waits in the one outbox
    of the connection, so what the server holds for it stays within that outbox's bound."""
    from policy_server.foundation.connection_supervisor import SessionLimits

    limits = SessionLimits(max_outbox_frames=16, max_outbox_bytes=64 * 1024, reply_timeout_s=0)
    with small_server(idle_timeout_s=0, session_limits=limits) as server:

        async def held() -> tuple[int, int, int]:
            def count() -> tuple[int, int, int]:
                sessions = list(server.server.context.sessions.values())
                outboxes = {id(s.outbox): s.outbox for s in sessions}
                return len(sessions), len(outboxes), sum(o.nbytes for o in outboxes.values())

            return server.run(count)

        async with connect(server.url, compression=None, proxy=None, max_size=None, max_queue=1) as ws:
            for k in range(400):
                try:
                    for name in ("env-a", "env-b"):  # a chunk, a drop or an error each, never read
                        await asyncio.wait_for(ws.send(packb({**OBSERVATION, "seq": k, "session_id": name})), 0.5)
                except asyncio.TimeoutError:
                    break  # pushed back: the server stopped reading us
            sessions, outboxes, queued = await held()
    assert sessions == 3 and outboxes == 1, (sessions, outboxes)
    assert queued <= limits.max_outbox_bytes


def test_a_name_with_its_chunk_in_flight_is_not_expired_on_the_server():
    """Engine calls of 3 s; once the name is open the test turns the idle clock 10 s past its 0.5 s timeout, so
    every look the server takes while the chunk is in flight finds it idle on the clock. Its chunk still comes
    back (an expired name's chunk is discarded), and the name expires only once that chunk is out."""
    clock = HandTurnedClock()
    with small_server(idle_timeout_s=0.5, delay_s=3.0, clock=clock) as server:

        async def run() -> dict[str, Any]:
            async with connect(server.url, compression=None, proxy=None, max_size=None) as ws:
                unpackb(await ws.recv())
                await ws.send(packb({**OBSERVATION, "seq": 0, "session_id": "slow"}))
                deadline = time.monotonic() + 60
                while "slow" not in named_sessions(server):
                    assert time.monotonic() < deadline, "the name was never opened"
                    await asyncio.sleep(0.01)
                clock.now += 10.0
                reply = unpackb(await asyncio.wait_for(ws.recv(), 60))
                while "slow" in named_sessions(server):  # idle now, with nothing in flight: it goes
                    assert time.monotonic() < deadline, "the idle name never expired once its chunk was out"
                    await asyncio.sleep(0.05)
                return reply

        reply = asyncio.run(run())
    assert reply["type"] == "action_chunk" and reply["session_id"] == "slow", reply


def test_a_peers_names_are_bounded_by_its_share_of_the_sessions():
    with ServerThread(
        tiny_engine_loader("distilled", droid=True),
        max_sessions=8,
        policy_sessions=PolicySessionLimits(max_per_connection=16, idle_timeout_s=0, max_per_peer=3),
    ) as server:
        client = RobolabStyleClient(f"ws://127.0.0.1:{server.port}/", None)
        try:
            client.infer(0, 0)
            client.infer(1, 0)  # the connection and two names: the peer's three
            with pytest.raises(RuntimeError, match="too_many_sessions: .*--max-sessions-per-peer"):
                client.infer(2, 0)
            other = RobolabStyleTransport(f"ws://127.0.0.1:{server.port}/", None)  # a connection is not a name
            other.close()
        finally:
            client.transport.close()
