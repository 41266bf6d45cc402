"""The dashboard's recordings in a real headless Chromium (Debian's): a robot's recorded session is listed
and replayed from disk (camera, chunk plot, latency timeline) with play, speed and seek; the Record button
turns recording on for a live session. The page comes from the sidecar with the server's token in its
fragment, as an operator opens it."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from recording_fixtures import frame, wait_until_published
from server_fixtures import DOMAIN, ServerThread, tiny_engine_loader
from test_dashboard_browser import CHROMIUM, eventually, page  # noqa: F401 - the browser fixture
from websockets.asyncio.client import connect

from policy_server.foundation.auth import TokenSet
from policy_server.recording.feature import RecordingOptions
from policy_server.sidecar_settings import SidecarSettings
from robot_clients.wire_codec import packb, unpackb

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed at /usr/bin/chromium"),
    pytest.mark.timeout(300),
]
TOKEN = "replay-token-0123456789abcdef"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sidecar = SidecarSettings(data_dir=tmp_path_factory.mktemp("sidecar-data"), host="127.0.0.1", port=0)
    options = RecordingOptions(root=tmp_path_factory.mktemp("recordings"), every_session=False)
    with ServerThread(
        tiny_engine_loader("distilled"), http=sidecar, recording=options, auth_tokens=TokenSet([TOKEN])
    ) as running:
        yield running


class RobotLoop:
    """An event loop on its own thread for the robot's WebSocket (Playwright's sync API owns this thread's)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def record_session(server, observations: int) -> tuple[str, list[dict]]:
    async with connect(server.url + f"?access_token={TOKEN}", compression=None, proxy=None, max_size=None) as ws:
        session_id = unpackb(await ws.recv())["session_id"]
        await ws.send(
            packb(
                {
                    "type": "configure",
                    "domain_name": DOMAIN,
                    "record": True,
                    "control_hz": 10,
                    "prompt": "put the carrot in the pot",
                }
            )
        )
        assert unpackb(await ws.recv())["recording"] is True
        replies = []
        for seq in range(observations):
            await ws.send(packb({"type": "observation", "seq": seq, "images": {"front": frame(seq, 96, 128)}}))
            replies.append(unpackb(await asyncio.wait_for(ws.recv(), 60)))
    assert await asyncio.to_thread(wait_until_published, server)
    return session_id, replies


def test_a_recorded_session_is_replayed_with_play_speed_and_seek(server, page):
    robot_loop = RobotLoop()
    try:
        session_id, replies = robot_loop.run(record_session(server, 6))
    finally:
        robot_loop.close()
    assert all(reply["type"] == "action_chunk" for reply in replies)
    page.goto(f"http://127.0.0.1:{server.sidecar.port}/dashboard/#token={TOKEN}")
    row = page.locator("#recordings tbody tr").first
    row.wait_for()
    assert session_id in row.inner_text()
    row.click()
    page.wait_for_selector("#replay[data-index='0']")
    page.wait_for_selector("#replay-camera[data-index='0']")  # the first page of frames arrived
    assert page.get_attribute("#replay-camera", "src").startswith("data:image/jpeg;base64,")
    assert page.get_attribute("#replay-chunk-plot", "data-seq") == "0"
    assert "put the carrot in the pot" in page.inner_text("#replay-info")

    # Play at 4x to the end: the last observation's frame, chunk and the whole latency timeline show.
    page.select_option("#replay-speed", "4")
    page.click("#replay-play")
    page.wait_for_selector("#replay[data-index='5'][data-playing='false']", timeout=60_000)
    assert page.get_attribute("#replay-chunk-plot", "data-seq") == "5"
    assert page.get_attribute("#replay-latency-plot", "data-samples") == "6"
    page.wait_for_selector("#replay-camera[data-index='5']")

    # Seek back to just after the third observation's arrival: the view is that moment's, not the end's.
    page.evaluate("""async () => {
        const name = document.querySelector('#replay').dataset.name;
        const headers = { Authorization: 'Bearer ' + new URLSearchParams(location.hash.slice(1)).get('token') };
        const episode = await (await fetch('../v1/recordings/' + name, { headers })).json();
        const seek = document.querySelector('#replay-seek');
        // Between the third and fourth arrivals (the range input may round a value given exactly at one).
        seek.value = String((episode.rows[2].received_at + episode.rows[3].received_at) / 2);
        seek.dispatchEvent(new Event('input'));
    }""")
    page.wait_for_selector("#replay[data-index='2']")
    assert page.get_attribute("#replay-chunk-plot", "data-seq") == "2"
    assert page.get_attribute("#replay-latency-plot", "data-samples") == "3"
    page.wait_for_selector("#replay-camera[data-index='2']")


def test_the_record_button_records_a_live_session(server, page):
    async def robot():
        async with connect(server.url + f"?access_token={TOKEN}", compression=None, proxy=None) as ws:
            session_id = unpackb(await ws.recv())["session_id"]
            await ws.send(packb({"type": "configure", "domain_name": DOMAIN}))
            assert unpackb(await ws.recv())["recording"] is False
            yield session_id
            await ws.send(packb({"type": "observation", "seq": 0, "image": frame(0, 96, 128)}))
            yield unpackb(await asyncio.wait_for(ws.recv(), 60))

    loop = RobotLoop()
    steps = robot()
    try:
        session_id = loop.run(steps.__anext__())
        page.goto(f"http://127.0.0.1:{server.sidecar.port}/dashboard/#token={TOKEN}")
        page.locator(f"tr[data-session-id='{session_id}']").click()
        page.wait_for_selector("#record[data-recording='off']")
        page.click("#record")
        page.wait_for_selector("#record[data-recording='on']")
        assert server.run(lambda: server.server.context.sessions[session_id].recorded)
        reply = loop.run(steps.__anext__())
        assert reply["type"] == "action_chunk" and np.asarray(reply["actions"]).size
    finally:
        loop.run(steps.aclose())
        loop.close()
