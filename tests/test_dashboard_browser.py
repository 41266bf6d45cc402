"""The teleop dashboard in a real headless Chromium (Debian's), against a real server and a real robot.

A robot (``PolicyClient`` + ``ActionChunker`` + ``ControlLoop`` at 20 Hz on a drawn scene) drives a
session on a server with its HTTP sidecar; the page comes from the sidecar at ``/dashboard``. The test
checks what an operator relies on: the session is listed, its plot follows new chunks, the camera frame
and latency timeline show, and pause / resume / stop reach the robot, which holds while paused.

``DASHBOARD_SCREENSHOT=docs/dashboard.png`` also saves the screenshot there (the README's picture).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from server_fixtures import DOMAIN, ServerThread, tiny_engine_loader

from policy_server.sidecar_settings import SidecarSettings
from robot_clients import PolicyClient
from robot_clients.chunker import ActionChunker, ChunkerConfig, RemoteChunkPolicy
from robot_clients.control_loop import ChunkingAgent, ControlLoop, Environment, EpisodeReport

CHROMIUM = Path("/usr/bin/chromium")
# Debian's chromium as root in a sandboxed machine: no sandbox, no GPU, and nothing that phones home
# (the closed network refuses those connections, noisily).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian's chromium is not installed at /usr/bin/chromium (apt-get install chromium)"
)


class DrawnScene(Environment):
    """A camera looking at a ball circling a table, so the dashboard has a picture that moves."""

    def __init__(self, client: PolicyClient) -> None:
        self.client = client
        self.step = 0
        self.applied: list[tuple[np.ndarray, str]] = []  # (action, session state) at each tick
        yy, xx = np.mgrid[0:128, 0:128]
        self._grid = (yy, xx)

    def reset(self) -> None:
        self.step = 0

    def is_episode_complete(self) -> bool:
        return False

    def get_observation(self) -> dict:
        yy, xx = self._grid
        image = np.zeros((128, 128, 3), np.uint8)
        image[..., 0], image[..., 1], image[..., 2] = 60 + yy // 3, 70 + xx // 4, 90  # a lit table
        angle = self.step / 12.0
        cy, cx = 64 + 35 * np.sin(angle), 64 + 35 * np.cos(angle)
        image[(yy - cy) ** 2 + (xx - cx) ** 2 < 120] = (230, 120, 40)
        return {"image": image}

    def apply_action(self, action: dict) -> None:
        self.applied.append((np.array(action["actions"]), self.client.session_state))
        self.step += 1


class Robot:
    """A robot in closed loop with the server on its own thread, until an operator stops it (or 60 s)."""

    def __init__(self, url: str) -> None:
        self.client = PolicyClient(url)
        self.client.connect()
        self.client.configure(
            domain_name=DOMAIN, action_horizon=16, prompt="put the carrot in the pot", control_hz=20, seed=0
        )
        self.session_id = self.client.metadata["session_id"]
        self.scene = DrawnScene(self.client)
        config = ChunkerConfig(strategy="rtc", control_hz=20, execute_horizon=8)
        self.chunker = ActionChunker(RemoteChunkPolicy(self.client), config)
        self.loop = ControlLoop(self.scene, ChunkingAgent(self.chunker), control_hz=20, max_episode_s=60)
        self.report: EpisodeReport | None = None
        self._thread = threading.Thread(target=self._run, name="robot", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.report = self.loop.run_episode()

    def close(self) -> None:
        self.loop.stop()
        self._thread.join(10)
        self.chunker.close()
        self.client.close()


def eventually(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sidecar = SidecarSettings(data_dir=tmp_path_factory.mktemp("sidecar-data"), host="127.0.0.1", port=0)
    with ServerThread(tiny_engine_loader("distilled"), http=sidecar) as running:
        yield running


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # Playwright's own browser download is never used: Debian's chromium, a fresh profile per launch.
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1180, "height": 1000})
        page.set_default_timeout(20_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # The page runs under the server's Content-Security-Policy: anything it refuses is a bug of the page.
        page.on(
            "console",
            lambda message: errors.append(message.text) if "Content Security Policy" in message.text else None,
        )
        page.on("dialog", lambda dialog: dialog.accept())  # "Stop session ...?" -> yes
        yield page
        browser.close()
        assert not errors, f"the page raised: {errors}"


def chunk_seq(page) -> int:
    return int(page.get_attribute("#chunk-plot", "data-seq"))


def test_the_dashboard_watches_a_live_robot_and_pause_reaches_it(server, page, tmp_path):
    robot = Robot(server.url)
    try:
        eventually(lambda: robot.chunker.stats.chunks >= 2, timeout=60)
        response = page.goto(f"http://127.0.0.1:{server.sidecar.port}/dashboard")  # redirected to /dashboard/
        assert page.url.endswith("/dashboard/")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert response.headers["x-frame-options"] == "DENY"
        page.wait_for_selector("body[data-connection='open']")

        row = page.locator(f"tr[data-session-id='{robot.session_id}']")
        row.wait_for()
        assert DOMAIN in row.inner_text() and "20 Hz" in row.inner_text() and "running" in row.inner_text()
        row.click()

        # The plot follows the robot: new chunks redraw it.
        page.wait_for_selector("#chunk-plot[data-seq]")
        first = chunk_seq(page)
        page.wait_for_function(f"() => +document.querySelector('#chunk-plot').dataset.seq >= {first + 5}")
        assert page.get_attribute("#camera", "src").startswith("data:image/jpeg;base64,")
        assert "p50" in page.inner_text("#latency-caption") and "p99" in page.inner_text("#latency-caption")
        assert page.input_value("#prompt") == "put the carrot in the pot"
        page.screenshot(path=str(tmp_path / "dashboard.png"))
        if os.environ.get("DASHBOARD_SCREENSHOT"):
            shutil.copyfile(tmp_path / "dashboard.png", os.environ["DASHBOARD_SCREENSHOT"])

        # Pause: the robot's client hears it and the chunker holds the last action.
        page.fill("#reason", "checking the gripper")
        page.click("#pause")
        eventually(lambda: robot.client.paused)
        assert robot.client.state_reason == "checking the gripper"
        page.wait_for_selector("#detail[data-state='paused']")
        held_from = robot.chunker.stats.held_steps
        eventually(lambda: robot.chunker.stats.held_steps >= held_from + 10)
        held = [action for action, state in list(robot.scene.applied) if state == "paused"]
        assert len(held) >= 10 and all(np.array_equal(a, held[-1]) for a in held[1:])

        # Resume: chunks flow again and the plot moves on.
        paused_seq = chunk_seq(page)
        page.click("#resume")
        eventually(lambda: not robot.client.paused)
        page.wait_for_function(f"() => +document.querySelector('#chunk-plot').dataset.seq > {paused_seq}")

        # A new prompt from the operator reaches the robot's client.
        page.fill("#prompt", "put the spoon in the cup")
        page.click("#set-prompt")
        eventually(lambda: robot.client.session.get("prompt") == "put the spoon in the cup")

        # Stop: the session ends, the robot's control loop ends its episode.
        page.click("#stop")
        eventually(lambda: robot.report is not None)
        assert robot.report.stopped_by_operator and robot.client.session_state == "stopped"
        page.wait_for_selector("#detail-state.state-ended")
    finally:
        robot.close()
