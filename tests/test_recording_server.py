"""Sessions recorded by a real server (``--record-dir``): what a robot sent and received over the WebSocket
ends up in an episode that the reader reads back; the ``configure`` opt-in and opt-out; the operator's toggle.

A real :class:`PolicyServer` on 127.0.0.1 with the real tiny distilled model; the robot is a bare
``websockets`` connection and the shared codec, so the test knows exactly what was sent and received.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from recording_fixtures import frame, wait_until_published
from server_fixtures import DOMAIN, ServerThread, http_get, tiny_checkpoint, tiny_engine_loader
from websockets.asyncio.client import connect

from cosmos3_runtime.served_weights import checkpoint_sha256
from policy_server.recording import RecordingStore
from policy_server.recording.feature import RecordingOptions
from policy_server.recording.replay import RecordedEpisode
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(300)


class Robot:
    """A raw protocol connection: send maps, receive decoded maps."""

    def __init__(self, ws):
        self.ws = ws

    @classmethod
    async def open(cls, server: ServerThread) -> Robot:
        robot = cls(await connect(server.url, compression=None, proxy=None, max_size=None))
        hello = await robot.recv()
        assert hello["type"] == "metadata"
        robot.session_id = hello["session_id"]
        return robot

    async def send(self, frame_: dict) -> None:
        await self.ws.send(packb(frame_))

    async def recv(self, timeout: float = 60.0) -> dict:
        return unpackb(await asyncio.wait_for(self.ws.recv(), timeout))

    async def observe(self, seq: int, **fields) -> dict:
        await self.send({"type": "observation", "seq": seq, "images": {"front": frame(seq, 64, 80)}, **fields})
        return await self.recv()


def episodes(root) -> list[RecordedEpisode]:
    store = RecordingStore(root)
    return [RecordedEpisode(store.path(info.name)) for info in store.list()]


def recording_server(root, every_session: bool = True, **settings) -> ServerThread:
    return ServerThread(
        tiny_engine_loader("distilled"), recording=RecordingOptions(root=root, every_session=every_session), **settings
    )


async def test_a_sessions_chunks_drops_and_errors_are_recorded_with_the_actions_it_received(tmp_path):
    root = tmp_path / "recordings"
    with recording_server(root) as server:
        robot = await Robot.open(server)
        await robot.send({"type": "configure", "domain_name": DOMAIN, "prompt": "pick up the cube", "control_hz": 10})
        session = await robot.recv()
        assert session["type"] == "session" and session["recording"] is True
        received = {}
        for seq in range(3):
            reply = await robot.observe(seq, timestamp=100.0 + seq)
            assert reply["type"] == "action_chunk", reply
            received[seq] = reply["actions"]
        # An observation cancelled at once is answered `dropped`; a bad one `error` (no seq is recorded for it).
        await robot.send({"type": "observation", "seq": 3, "images": {"front": frame(3, 64, 80)}})
        await robot.send({"type": "cancel", "seq": 3})
        replies = [await robot.recv()]
        if replies[0]["type"] == "action_chunk":  # the engine was faster than the cancel: that is a chunk too
            received[3] = replies[0]["actions"]
        await robot.send({"type": "observation", "seq": 4, "image": np.zeros((8, 8), np.uint8)})
        error = await robot.recv()
        assert error["type"] == "error"
        await robot.ws.close()
        health = http_get(server.health_url)[1]
        assert health["recording"]["state"] == "recording" and health["recording"]["every_session"] is True
    # Stopping the server closed the recorder after the session ended: its episode is published.
    [episode] = episodes(root)
    assert episode.session["session_id"] == robot.session_id
    assert episode.session["config"]["prompt"] == "pick up the cube"
    assert episode.session["model"]["variant"] == "distilled"
    # Which weights answered: the quantization, the checkpoint's SHA-256 and its Hub commit (a local folder: None).
    weights = episode.session["model"]["weights"]
    assert weights == {"quantization": "none", "sha256": checkpoint_sha256(tiny_checkpoint()), "revision": None}
    rows = episode.rows()
    assert [row.seq for row in rows] == [0, 1, 2, 3]
    for seq, actions in received.items():
        assert rows[seq].kind == "chunk"
        np.testing.assert_array_equal(rows[seq].actions, actions)
    if 3 not in received:
        assert (rows[3].kind, rows[3].reason) == ("dropped", "cancelled")
    assert [row.task for row in rows] == ["pick up the cube"] * 4
    frames = list(episode.frames())
    assert len(frames) == 4
    assert np.abs(frames[1]["front"].astype(int) - frame(1, 64, 80)).mean() < 8  # H.264, not the same bytes
    kinds = [event["kind"] for event in episode.events()]
    assert "error" in kinds


async def test_configure_opts_in_and_out_and_is_refused_without_a_record_dir(tmp_path):
    root = tmp_path / "recordings"
    with recording_server(root, every_session=False) as server:
        quiet = await Robot.open(server)
        await quiet.send({"type": "configure", "domain_name": DOMAIN})
        assert (await quiet.recv())["recording"] is False
        assert (await quiet.observe(0))["type"] == "action_chunk"

        robot = await Robot.open(server)
        await robot.send({"type": "configure", "domain_name": DOMAIN, "record": "yes"})
        refused = await robot.recv()
        assert (refused["type"], refused["code"], refused["field"]) == ("error", "invalid_field", "record")
        await robot.send({"type": "configure", "domain_name": DOMAIN, "record": True})
        assert (await robot.recv())["recording"] is True
        opted_in = await robot.observe(0)
        await robot.send({"type": "configure", "record": False})
        assert (await robot.recv())["recording"] is False
        assert (await robot.observe(1))["type"] == "action_chunk"  # served, not recorded
        await asyncio.gather(robot.ws.close(), quiet.ws.close())
    [episode] = episodes(root)  # only the session that opted in, and only while it did
    assert episode.session["session_id"] == robot.session_id
    assert [row.seq for row in episode.rows()] == [0]
    np.testing.assert_array_equal(episode.rows()[0].actions, opted_in["actions"])
    assert episode.session["end_reason"] == "recording_stopped"

    with ServerThread(tiny_engine_loader("distilled")) as plain:
        robot = await Robot.open(plain)
        await robot.send({"type": "configure", "domain_name": DOMAIN, "record": True})
        refused = await robot.recv()
        assert (refused["type"], refused["code"], refused["field"]) == ("error", "recording_unavailable", "record")
        await robot.send({"type": "configure", "domain_name": DOMAIN})
        assert (await robot.recv())["recording"] is False  # the refused configure changed nothing
        await robot.ws.close()


async def test_an_operator_toggles_recording_through_the_observer_channel(tmp_path):
    root = tmp_path / "recordings"
    with recording_server(root, every_session=False) as server:
        robot = await Robot.open(server)
        await robot.send({"type": "configure", "domain_name": DOMAIN})
        await robot.recv()
        observe_url = f"ws://127.0.0.1:{server.port}/v1/observe"
        async with connect(observe_url, proxy=None) as observer:
            hello = json.loads(await observer.recv())
            assert hello["recording"] is True and "record" in hello["controls"]

            async def control(action: str) -> dict:
                await observer.send(
                    json.dumps(
                        {"type": "control", "session_id": robot.session_id, "action": action, "reason": "look at this"}
                    )
                )
                while True:
                    reply = json.loads(await asyncio.wait_for(observer.recv(), 10))
                    if reply["type"] in ("control_result", "error"):
                        return reply

            assert (await control("record"))["type"] == "control_result"
            assert server.run(lambda: server.server.context.sessions[robot.session_id].recorded)
            chunk = await robot.observe(0)
            assert (await control("stop_recording"))["type"] == "control_result"
            assert not server.run(lambda: server.server.context.sessions[robot.session_id].recorded)
        await robot.ws.close()
    [episode] = episodes(root)
    np.testing.assert_array_equal(episode.rows()[0].actions, chunk["actions"])
    assert any(event.get("action") == "stop" and event.get("reason") == "look at this" for event in episode.events()), (
        episode.events()
    )

    with ServerThread(tiny_engine_loader("distilled")) as plain:
        robot = await Robot.open(plain)
        async with connect(f"ws://127.0.0.1:{plain.port}/v1/observe", proxy=None) as observer:
            assert json.loads(await observer.recv())["recording"] is False
            await observer.send(json.dumps({"type": "control", "session_id": robot.session_id, "action": "record"}))
            while (reply := json.loads(await asyncio.wait_for(observer.recv(), 10)))["type"] != "error":
                pass
            assert reply["code"] == "recording_unavailable"
        await robot.ws.close()


def _get(url: str, token: str | None = None) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


async def test_recordings_are_served_only_with_the_token_and_only_by_their_safe_names(tmp_path):
    from policy_server.auth import TokenSet
    from policy_server.sidecar_settings import SidecarSettings

    token = "recordings-token-0123456789"
    root = tmp_path / "recordings"
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("not a recording")
    sidecar = SidecarSettings(data_dir=tmp_path / "sidecar", host="127.0.0.1", port=0)
    with recording_server(root, http=sidecar, auth_tokens=TokenSet([token])) as server:
        robot_url = server.url + f"?access_token={token}"
        ws = await connect(robot_url, compression=None, proxy=None, max_size=None)
        robot = Robot(ws)
        robot.session_id = (await robot.recv())["session_id"]
        await robot.send({"type": "configure", "domain_name": DOMAIN, "control_hz": 5})
        await robot.recv()
        sent = [await robot.observe(seq) for seq in range(2)]
        await ws.close()
        # The episode is published when the session's end reaches the writer; wait for it.
        assert await asyncio.to_thread(wait_until_published, server)
        base = f"http://127.0.0.1:{server.sidecar.port}/v1/recordings"
        for url in (base, base + "/anything", base + "/anything/frames"):
            status, body = await asyncio.to_thread(_get, url)
            assert status == 401 and body["error"]["code"] == "unauthorized", (url, body)
        status, listing = await asyncio.to_thread(_get, base, token)
        assert status == 200
        [info] = listing["recordings"]
        name = info["name"]
        assert info["session"] == robot.session_id
        status, episode = await asyncio.to_thread(_get, f"{base}/{name}", token)
        assert status == 200 and episode["fps"] == 5 and episode["cameras"] == ["front"]
        assert [row["seq"] for row in episode["rows"]] == [0, 1]
        for row, reply in zip(episode["rows"], sent):
            np.testing.assert_array_equal(np.asarray(row["actions"], np.float32), reply["actions"])
        status, page = await asyncio.to_thread(_get, f"{base}/{name}/frames?start=1&count=5", token)
        assert status == 200 and page["start"] == 1 and len(page["frames"]) == 1
        assert page["frames"][0]["front"]["width"] == 80
        status, _ = await asyncio.to_thread(_get, f"{base}/{name}/frames?count=1000", token)
        assert status == 400
        for bad in ("..%2Foutside", "%2E%2E", "20260101T120000Z_x_000", name + "%2F..%2F..%2Foutside"):
            status, body = await asyncio.to_thread(_get, f"{base}/{bad}", token)
            assert status == 404, (bad, status, body)
    # Without --record-dir the routes say so.
    with ServerThread(tiny_engine_loader("distilled"), http=SidecarSettings(data_dir=tmp_path / "s2", port=0)) as plain:
        status, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{plain.sidecar.port}/v1/recordings")
        assert status == 404 and "--record-dir" in body["error"]["message"]


async def test_the_recordings_listing_pages_and_an_absurd_frame_index_is_a_client_error(tmp_path, caplog):
    """The attack run: ``?limit=`` was ignored (every recording listed), and ``frames?start=`` beyond what
    an index holds answered 500 with a traceback in the log."""
    from policy_server.sidecar_settings import SidecarSettings

    root = tmp_path / "recordings"
    sidecar = SidecarSettings(data_dir=tmp_path / "sidecar", host="127.0.0.1", port=0)
    with recording_server(root, http=sidecar) as server:
        for _ in range(3):
            robot = await Robot.open(server)
            await robot.send({"type": "configure", "domain_name": DOMAIN})
            await robot.recv()
            assert (await robot.observe(0))["type"] == "action_chunk"
            await robot.ws.close()
            assert await asyncio.to_thread(wait_until_published, server)
        base = f"http://127.0.0.1:{server.sidecar.port}/v1/recordings"
        status, everything = await asyncio.to_thread(_get, base)
        assert status == 200 and everything["total"] == 3 and len(everything["recordings"]) == 3
        assert everything["next_offset"] is None
        names = [info["name"] for info in everything["recordings"]]
        status, first = await asyncio.to_thread(_get, base + "?limit=2")
        assert status == 200 and [info["name"] for info in first["recordings"]] == names[:2]
        assert first["total"] == 3 and first["next_offset"] == 2
        status, rest = await asyncio.to_thread(_get, base + f"?limit=2&offset={first['next_offset']}")
        assert [info["name"] for info in rest["recordings"]] == names[2:] and rest["next_offset"] is None
        for bad in ("?limit=0", "?limit=abc", "?limit=100000", "?offset=-1", "?offset=99999999999999999999"):
            status, body = await asyncio.to_thread(_get, base + bad)
            assert status == 400 and body["error"]["field"] in ("limit", "offset"), (bad, body)
        for start in ("99999999999999999999", "2147483648", "-1"):
            status, body = await asyncio.to_thread(_get, f"{base}/{names[0]}/frames?start={start}")
            assert status == 400 and body["error"]["field"] == "start", (start, body)
        status, page = await asyncio.to_thread(_get, f"{base}/{names[0]}/frames?start=2147483647")
        assert status == 200 and page["frames"] == []  # past the end: an empty page, not an error
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"


async def test_replay_pages_decode_on_one_low_priority_thread_are_cached_and_rate_limited(tmp_path):
    """Issue 25.4: 8 clients paging recorded frames in a loop took the CPU from the engine (a robot's p50
    39 -> 967 ms). Pages decode on one thread nicer than the server's, a page asked for again is answered
    from the cache (here: after its videos are gone), and a client asking too fast is answered 429."""
    import os
    import shutil
    import threading

    from policy_server.http.routes.recordings import PAGES_BURST, REPLAY_NICENESS
    from policy_server.sidecar_settings import SidecarSettings

    root = tmp_path / "recordings"
    sidecar = SidecarSettings(data_dir=tmp_path / "sidecar", host="127.0.0.1", port=0)
    with recording_server(root, http=sidecar) as server:
        robot = await Robot.open(server)
        await robot.send({"type": "configure", "domain_name": DOMAIN})
        await robot.recv()
        for seq in range(3):
            assert (await robot.observe(seq))["type"] == "action_chunk"
        await robot.ws.close()
        assert await asyncio.to_thread(wait_until_published, server)
        base = f"http://127.0.0.1:{server.sidecar.port}/v1/recordings"
        (info,) = (await asyncio.to_thread(_get, base))[1]["recordings"]
        page_url = f"{base}/{info['name']}/frames?start=0&count=2"
        status, page = await asyncio.to_thread(_get, page_url)
        assert status == 200 and len(page["frames"]) == 2
        replay_threads = [t.native_id for t in threading.enumerate() if t.name.startswith("recording-replay")]
        assert len(replay_threads) == 1  # one decoding thread for the whole server
        (thread,) = replay_threads
        assert os.getpriority(os.PRIO_PROCESS, thread) >= min(19, os.getpriority(os.PRIO_PROCESS, 0) + REPLAY_NICENESS)
        shutil.rmtree(RecordingStore(root).path(info["name"]) / "videos")
        status, again = await asyncio.to_thread(_get, page_url)
        assert status == 200 and again == page  # from the cache: the videos are gone
        status, _ = await asyncio.to_thread(_get, f"{base}/{info['name']}/frames?start=1&count=2")
        assert status >= 400  # not cached: decoding it needs the videos
        statuses = [(await asyncio.to_thread(_get, page_url))[0] for _ in range(PAGES_BURST + 4)]
        assert 429 in statuses, statuses  # faster than a client may page
        status, body = await asyncio.to_thread(_get, page_url)
        assert status == 429 and body["error"]["code"] == "rate_limited"
