"""``PolicyClient``: the blocking client, for control loops that are not written with asyncio.

It runs an :class:`~robot_clients.async_policy_client.AsyncPolicyClient` on a private event loop in a
daemon thread and waits on it, so both clients share one implementation of the protocol, the stale-seq
filter and the reconnect logic. The extra thread hop costs tens of microseconds per call.

::

    with PolicyClient("ws://robot-server:8000") as client:
        client.configure(domain_name="droid_lerobot")
        while running:
            chunk = client.infer({"image": camera.read()}, timeout=0.5)
            robot.execute(chunk.actions)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import numpy as np

from .async_policy_client import AsyncPolicyClient
from .results import ActionChunk, ClientStats

T = TypeVar("T")


class PolicyClient:
    """Blocking client of ``/v1/actions/realtime``; takes the same arguments as ``AsyncPolicyClient``.

    Methods may be called from any one thread at a time (a control loop); the connection lives on the
    client's own thread, so keepalive pings keep flowing while the robot's thread is busy.
    """

    def __init__(self, url: str = "ws://127.0.0.1:8000", **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="policy-client-loop", daemon=True)
        self._thread.start()
        self._client = self._call(self._make_client(url, options))

    @staticmethod
    async def _make_client(url: str, options: dict[str, Any]) -> AsyncPolicyClient:
        return AsyncPolicyClient(url, **options)  # built on the client loop: its asyncio objects live there

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- the AsyncPolicyClient interface, blocking ----------------------------------------------------

    def connect(self) -> dict[str, Any]:
        """Open the connection (retrying while the server loads); return the server's metadata."""
        return self._call(self._client.connect())

    def configure(self, timeout: float | None = 10.0, **settings: Any) -> dict[str, Any]:
        return self._call(self._client.configure(timeout=timeout, **settings))

    def infer(
        self, obs: Mapping[str, Any] | np.ndarray, timeout: float | None = 10.0, *, state: Any = None, **settings: Any
    ) -> ActionChunk:
        """One round trip; ``state`` is the robot's proprio state and ``settings`` apply to this observation
        only (see ``AsyncPolicyClient.infer``)."""
        return self._call(self._client.infer(obs, timeout=timeout, state=state, **settings))

    def submit(
        self, obs: Mapping[str, Any] | np.ndarray, timeout: float | None = None, *, state: Any = None, **settings: Any
    ) -> int:
        return self._call(self._client.submit(obs, timeout=timeout, state=state, **settings))

    def receive(self, timeout: float | None = None) -> ActionChunk:
        return self._call(self._client.receive(timeout=timeout))

    def cancel(self, seq: int | None = None) -> None:
        self._call(self._client.cancel(seq))

    def reset(self, timeout: float | None = 10.0) -> None:
        self._call(self._client.reset(timeout=timeout))

    def wait_until_running(self, timeout: float | None = None) -> None:
        """Block until an operator resumes the session (at once if running); see ``AsyncPolicyClient``."""
        self._call(self._client.wait_until_running(timeout=timeout))

    def close(self) -> None:
        """Close the connection and stop the client's thread. Idempotent."""
        if not self._thread.is_alive():
            return
        try:
            self._call(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5.0)
            self._loop.close()

    @property
    def metadata(self) -> dict[str, Any]:
        return self._client.metadata

    @property
    def session(self) -> dict[str, Any]:
        return self._client.session

    @property
    def session_state(self) -> str:
        """``running``, ``paused`` or ``stopped``: what an operator last set (read from any thread)."""
        return self._client.session_state

    @property
    def state_reason(self) -> str:
        return self._client.state_reason

    @property
    def paused(self) -> bool:
        return self._client.paused

    @property
    def stats(self) -> ClientStats:
        return self._client.stats

    @property
    def buffered_bytes(self) -> int:
        """Bytes written and not yet acknowledged by the server (see ``AsyncPolicyClient.buffered_bytes``)."""
        return self._client.buffered_bytes

    @property
    def connected(self) -> bool:
        return self._client.connected

    def __enter__(self) -> PolicyClient:
        self.connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
