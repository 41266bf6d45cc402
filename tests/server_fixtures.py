"""Helpers for the server and client tests: a real tiny checkpoint, a real server, real sockets.

Nothing here is a mock. ``ServerThread`` runs :class:`policy_server.assembly.server.PolicyServer` on its own
event loop in a background thread (so tests can use blocking and asyncio clients alike) on
127.0.0.1 with an ephemeral port; ``ServerProcess`` runs the ``cosmos3-serve`` command line in a
subprocess (for signals and exit codes). ``DelayedEngine`` makes a real engine slower by a known amount
for the scheduling tests.

Import what you need from this module in a test file (``from server_fixtures import ...``); it is not
a conftest so that it stays out of the way of other test suites in this repository.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

import policy_server  # noqa: F401  (first: sets OMP_WAIT_POLICY=PASSIVE before torch loads)
from policy_server.assembly.cli import assemble_server, sidecar_of
from policy_server.server_settings import ServerSettings
from policy_server.vla_eval import VlaEvalSettings
from robot_clients.protocol import HEALTH_PATH, REALTIME_PATH

REPO_ROOT = Path(__file__).resolve().parent.parent
DOMAIN = "bridge_orig_lerobot"

_checkpoints: dict[str, Path] = {}
_checkpoint_lock = threading.Lock()
_workdir: Path | None = None


def tiny_checkpoint(variant: str = "distilled", droid: bool = False) -> Path:
    """A tiny random checkpoint of ``variant``, built once per test process (a few seconds).

    ``droid``: its default domain ships NVIDIA's DROID profile (state-conditioned, [32, 8] chunks)."""
    global _workdir
    name = f"{variant}-droid" if droid else variant
    with _checkpoint_lock:
        if name not in _checkpoints:
            from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint

            if _workdir is None:
                _workdir = Path(tempfile.mkdtemp(prefix="policy-server-tests-"))
                atexit.register(shutil.rmtree, _workdir, True)
            _checkpoints[name] = Path(build_tiny_checkpoint(_workdir / name, variant=variant, droid=droid))
        return _checkpoints[name]


class DelayedEngine:
    """A real Cosmos3 engine that sleeps ``delay_s`` before every engine call (single or batched).

    Used to make inference reliably slower than the rate observations arrive at, so that latest-wins,
    fairness and "answered while busy" can be checked without depending on how fast this machine is.
    The actions still come from the real model; only the added delay is artificial, and it is known.
    """

    def __init__(self, engine: Any, delay_s: float) -> None:
        self.engine = engine
        self.delay_s = delay_s
        self.calls = 0

    def predict_actions(self, request):
        self.calls += 1
        time.sleep(self.delay_s)
        return self.engine.predict_actions(request)

    def predict_actions_batch(self, requests):
        self.calls += 1
        time.sleep(self.delay_s)
        return self.engine.predict_actions_batch(requests)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def tiny_engine_loader(variant: str = "distilled", delay_s: float = 0.0, droid: bool = False) -> Callable[[], Any]:
    """A loader for :class:`PolicyServer`: the real tiny engine (``droid``: the DROID-profile checkpoint),
    optionally wrapped in DelayedEngine."""
    path = tiny_checkpoint(variant, droid=droid)

    def load():
        from cosmos3_runtime.engine import Cosmos3Engine

        engine = Cosmos3Engine.load(path, device="cpu", dtype="float32")
        return DelayedEngine(engine, delay_s) if delay_s else engine

    return load


class LoopbackUrls:
    """The robot endpoint and /healthz of a server listening on 127.0.0.1:``port``."""

    port: int | None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{REALTIME_PATH}"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{HEALTH_PATH}"


class ServerThread(LoopbackUrls):
    """A :class:`PolicyServer` on its own event loop and thread. ``with ServerThread(loader) as s:``.

    Unlike the command line, it does not warm the engine up unless asked (``warmup=True``): the warm-up
    runs a 17-frame inverse-dynamics clip at the default tier, several CPU-seconds per server, and only
    tests that time the first requests need it (the CLI's warm-up is tested in test_server_lifecycle)."""

    def __init__(self, load_engine: Callable[[], Any], port: int = 0, **settings: Any) -> None:
        settings.setdefault("warmup", False)
        # The features' own settings (``http``: the sidecar, ``recording``, ``vla_eval``: on unless None, as
        # the command line's default), attached as the command line does.
        self.http, self.recording = settings.pop("http", None), settings.pop("recording", None)
        self.vla_eval = settings.pop("vla_eval", VlaEvalSettings())
        self.settings = ServerSettings(host="127.0.0.1", port=port, **settings)
        self.server = assemble_server(
            load_engine, self.settings, http=self.http, recording=self.recording, vla_eval=self.vla_eval
        )
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="test-server", daemon=True)
        self.port: int | None = None

    @property
    def sidecar(self) -> Any:
        """The server's HTTP sidecar (started with ``http=...``), or None."""
        return sidecar_of(self.server)

    @property
    def recorder(self) -> Any:
        """The server's recorder (started with ``recording=...``), or None."""
        from policy_server.recording.feature import RecordingFeature

        feature = next((f for f in self.server.features if isinstance(f, RecordingFeature)), None)
        return feature.recorder if feature is not None else None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            await self.server.start()
            self.port = self.server.port
            await self.server.wait_ready()
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.server.shutdown()

    def start(self, timeout: float = 120.0) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the test server did not become ready")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 60.0) -> None:
        if self._thread.is_alive() and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's event loop and return its result (to read server state safely)."""

        async def call():
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


_LISTENING = re.compile(r"listening on wss?://[^:]+:(\d+)/")
_HTTP_LISTENING = re.compile(r"HTTP sidecar listening on https?://[^ ]+:(\d+) ")


class ServerProcess(LoopbackUrls):
    """``python -m policy_server.assembly.cli`` in a subprocess, its stderr collected; the port parsed from it.

    ``command``: what runs instead of ``python -m policy_server.assembly.cli`` (the installed console script)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, command: tuple[str, ...] | None = None) -> None:
        # The HTTP sidecar gets a free port and, unless the test names one, a data directory of its own,
        # so that test processes never share port 8001 or a job store.
        sidecar = [] if "--http-port" in args or "--no-http" in args else ["--http-port", "0"]
        if "--data-dir" not in args and "--no-http" not in args:
            self._data_dir = tempfile.TemporaryDirectory(prefix="policy-server-data-")
            sidecar += ["--data-dir", self._data_dir.name]
        command = command or (sys.executable, "-m", "policy_server.assembly.cli")
        self.args = [*command, "--host", "127.0.0.1", "--port", "0", *sidecar, *args]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.port: int | None = None
        self.http_port: int | None = None  # the sidecar's, once its log line appears (it precedes `port`)
        self._port_known = threading.Event()

    def start(self, timeout: float = 60.0) -> ServerProcess:
        self.proc = subprocess.Popen(
            self.args, cwd=REPO_ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        threading.Thread(target=self._read_stderr, daemon=True).start()
        if not self._port_known.wait(timeout):
            self.kill()
            raise TimeoutError("server process did not start listening:\n" + self.log)
        return self

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            http_match = _HTTP_LISTENING.search(line)
            if http_match and self.http_port is None:
                self.http_port = int(http_match.group(1))
            match = _LISTENING.search(line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._port_known.set()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log:
            if time.monotonic() > deadline or (self.proc is not None and self.proc.poll() is not None):
                raise TimeoutError(f"{text!r} never appeared in the server log:\n{self.log}")
            time.sleep(0.05)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then wait up to ``timeout`` for the graceful shutdown; kill it if it does not come."""
        self.signal()
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def rgb_image(size: int = 224, seed: int = 0) -> np.ndarray:
    """A random H×W×3 uint8 camera frame."""
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, dict[str, Any], float]:
    """GET ``url``; return (status, JSON body, seconds taken). Uses only the standard library."""
    import json
    import urllib.error
    import urllib.request

    started = time.monotonic()
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
        with opener.open(url, timeout=timeout) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    elapsed = time.monotonic() - started
    try:
        data = json.loads(body)
    except ValueError:
        data = {"text": body.decode(errors="replace")}
    return status, data, elapsed


class PeakRss:
    """Peak resident memory of a process over a ``with`` block.

    Linux keeps the high-water mark (``VmHWM``) exactly and lets it be reset (``clear_refs`` ``5``); where
    the reset is refused, a thread samples ``memory_info().rss`` every millisecond instead.
    """

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._hwm_reset = False

    def _hwm(self) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.001)

    def __enter__(self) -> PeakRss:
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as clear:
                clear.write("5")
            self._hwm_reset = True
        except OSError:
            pass
        self._thread = threading.Thread(target=self._sample, daemon=True)
        if not self._hwm_reset:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._hwm_reset:
            self.peak = max(self.peak, self._hwm())


async def until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """``condition()``'s first true value, polled every 20 ms; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.02)
    return value
