"""A robot in closed loop over a raw WebSocket, for the benchmarks that load the server from elsewhere.

One observation, wait for its reply, the next: what a robot without a chunker does. Raw frames (through
the shared protocol and codec), not :class:`robot_clients.PolicyClient`, so nothing but the server sits
between the two clocks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import websockets.sync.client as ws_client

from robot_clients import protocol
from robot_clients.wire_codec import packb, unpackb


def lockstep_chunks(
    url: str, image: np.ndarray, seconds: float, settings: Mapping[str, Any], *, warmup: int = 0, timeout: float = 120.0
) -> list[tuple[float, dict[str, float]]]:
    """Configure with ``settings``, send ``warmup`` unmeasured observations (first frames pay one-time
    costs), then loop for ``seconds``. Returns, per chunk, its round trip in ms and the server's timing."""
    chunks = []
    with ws_client.connect(url, compression=None, proxy=None, max_size=2**24) as ws:
        unpackb(ws.recv())  # metadata
        ws.send(packb(protocol.configure_frame(settings)))
        unpackb(ws.recv())
        seq = 0
        for seq in range(1, warmup + 1):
            ws.send(packb(protocol.observation_frame(seq, {"image": image}, {})))
            unpackb(ws.recv(timeout=timeout))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            seq += 1
            sent = time.monotonic()
            ws.send(packb(protocol.observation_frame(seq, {"image": image}, {})))
            reply = unpackb(ws.recv(timeout=timeout))
            if reply["type"] == protocol.ACTION_CHUNK:
                chunks.append(((time.monotonic() - sent) * 1e3, reply["timing"]))
    return chunks
