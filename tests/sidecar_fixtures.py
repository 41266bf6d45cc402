"""Helpers for the HTTP sidecar tests: a real server with its sidecar, an httpx client, test media.

Nothing is mocked: :class:`SidecarServer` is :class:`server_fixtures.ServerThread` (the real
``PolicyServer`` on its own event loop, the real tiny engine) with the sidecar on an ephemeral port and
a data directory of its own. ``SlowVideoEngine`` adds a known delay before every real
``rollout_video`` (like ``DelayedEngine`` does for actions) so tests can look at a job while it is
queued or running without depending on this machine's speed.
"""

from __future__ import annotations

import base64
import io
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from server_fixtures import DOMAIN, ServerThread, tiny_checkpoint

from policy_server.sidecar_settings import RetentionPolicy, SidecarSettings

ACTION_DIM = 10  # raw_action_dim of DOMAIN in the tiny checkpoints


class SlowVideoEngine:
    """A real engine whose ``rollout_video`` starts ``delay_s`` late (actions are not delayed)."""

    def __init__(self, engine: Any, delay_s: float) -> None:
        self.engine = engine
        self.delay_s = delay_s
        self.video_calls = 0

    def rollout_video(self, request):
        self.video_calls += 1
        time.sleep(self.delay_s)
        return self.engine.rollout_video(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def engine_loader(video_delay_s: float = 0.0, gate: Any = None) -> Callable[[], Any]:
    """The real tiny distilled engine; optionally slower videos, optionally held until ``gate`` is set."""
    path = tiny_checkpoint("distilled")

    def load():
        from cosmos3_runtime.engine import Cosmos3Engine

        if gate is not None:
            gate.wait(60)
        engine = Cosmos3Engine.load(path, device="cpu", dtype="float32")
        return SlowVideoEngine(engine, video_delay_s) if video_delay_s else engine

    return load


class SidecarServer(ServerThread):
    """A ``PolicyServer`` with its HTTP sidecar; ``client`` is an httpx client on the sidecar."""

    def __init__(
        self,
        load_engine: Callable[[], Any],
        data_dir: str | Path | None = None,
        retention: RetentionPolicy | None = None,
        max_body_bytes: int | None = None,
        wait_ready: bool = True,
        **settings: Any,
    ) -> None:
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sidecar-test-")
            data_dir = self._tmp.name
        self.data_dir = Path(data_dir)
        http = SidecarSettings(data_dir=self.data_dir, port=0, retention=retention or RetentionPolicy())
        if max_body_bytes is not None:
            http.max_body_bytes = max_body_bytes
        super().__init__(load_engine, http=http, warmup=False, **settings)
        self._wait_ready = wait_ready
        self.client: httpx.Client | None = None

    async def _main(self) -> None:
        if self._wait_ready:
            await super()._main()
            return
        # Not waiting for the model: report "started" as soon as the ports are open.
        import asyncio

        self._stop = asyncio.Event()
        await self.server.start()
        self.port = self.server.port
        self._ready.set()
        ready = asyncio.ensure_future(self.server.wait_ready())
        await self._stop.wait()
        ready.cancel()
        await self.server.shutdown()

    def start(self, timeout: float = 120.0) -> SidecarServer:
        super().start(timeout)
        self.client = httpx.Client(base_url=self.http_url, trust_env=False, timeout=60)
        return self

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.sidecar.port}"

    def stop(self, timeout: float = 60.0) -> None:
        if self.client is not None:
            self.client.close()
        super().stop(timeout)
        if self._tmp is not None:
            self._tmp.cleanup()


def rgb(size: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    return buffer.getvalue()


def png_b64(image: np.ndarray) -> str:
    return base64.b64encode(png_bytes(image)).decode()


def actions(steps: int = 8, dim: int = ACTION_DIM, seed: int = 0) -> list[list[float]]:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, (steps, dim)).round(4).tolist()


def video_body(steps: int = 8, **extra: Any) -> dict[str, Any]:
    return {"action": actions(steps), "input_reference": png_b64(rgb()), "domain_name": DOMAIN, "seed": 7, **extra}


def wait_for_job(
    client: httpx.Client, job_id: str, statuses=("completed", "failed"), timeout: float = 60.0, interval: float = 0.05
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/videos/{job_id}").json()
        if job.get("status") in statuses:
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} never reached {statuses}: {job}")
        time.sleep(interval)


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The typed error body, checked for its shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "field"}, body
    assert body["error"]["message"], body
    return body["error"]
