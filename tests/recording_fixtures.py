"""Helpers for the recording tests: camera frames that survive H.264, a session's traffic, a recorder.

Frames are structured (gradients and a bar that moves one step per frame), so that after lossy
compression a decoded frame is still clearly the frame it was (closest to its own original) and close
to it in value. :func:`record_traffic` plays what a session would tell its recorder: observations, and
for each one exactly one chunk, drop or error, and returns what it sent so tests can compare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from cosmos3_runtime.requests import ActionRequest
from policy_server.recording import Recorder, RecorderSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
DOMAIN = "bridge_orig_lerobot"
HORIZON, ACTION_DIM = 4, 3
CONFIG = {
    "domain_name": DOMAIN,
    "action_horizon": HORIZON,
    "raw_action_dim": ACTION_DIM,
    "prompt": "pick up the cube",
    "control_hz": 10.0,
}
MODEL = {"model": "synthetic", "variant": "none"}
TIMING = {
    "decode_ms": 0.5,
    "queue_ms": 1.0,
    "model_ms": 20.0,
    "engine_ms": 22.0,
    "total_ms": 25.0,
    "observation_age_ms": 26.0,
}


def frame(i: int, height: int = 48, width: int = 64, channel_shift: int = 0) -> np.ndarray:
    """Frame ``i`` of a camera: smooth gradients and a 4-pixel bar at column ``3 * i`` (mod width)."""
    y = np.linspace(0, 200, height)[:, None]
    x = np.linspace(0, 200, width)[None, :]
    image = np.empty((height, width, 3), dtype=np.uint8)
    image[..., 0] = (y + 0 * x).astype(np.uint8)
    image[..., 1] = (x + 0 * y).astype(np.uint8)
    image[..., 2] = ((x + y) / 2 + channel_shift).clip(0, 255).astype(np.uint8)
    column = (3 * i) % (width - 4)
    image[:, column : column + 4, :] = 255
    return image


def chunk(i: int) -> np.ndarray:
    return (i + np.arange(HORIZON * ACTION_DIM, dtype=np.float32).reshape(HORIZON, ACTION_DIM) / 10).astype(np.float32)


@dataclass
class Sent:
    """What a session handed to its recorder for one observation."""

    seq: int
    cameras: dict[str, np.ndarray]
    state: np.ndarray | None
    prompt: str
    kind: str  # chunk | dropped | error | unanswered
    actions: np.ndarray | None = None
    reason: str = ""
    queued: bool = True


@dataclass
class Traffic:
    sent: list[Sent] = field(default_factory=list)

    @property
    def queued(self) -> list[Sent]:
        return [s for s in self.sent if s.queued]


def record_traffic(
    recording,
    count: int,
    *,
    start_seq: int = 0,
    cameras: dict[str, tuple[int, int]] | None = None,
    with_state: bool = True,
    drop_every: int = 4,
    error_at: tuple[int, ...] = (),
    unanswered: tuple[int, ...] = (),
    prompts: tuple[str, ...] = ("pick up the cube",),
    noise: bool = False,
) -> Traffic:
    """Play ``count`` observations into ``recording`` (a SessionRecording), each answered once.
    ``noise``: random pixels instead of :func:`frame` (hard to compress: big MP4s)."""
    cameras = cameras or {"front": (48, 64), "wrist": (32, 40)}
    traffic = Traffic()
    for n in range(count):
        seq = start_seq + n
        if noise:
            rng = np.random.default_rng(seq)
            images = {name: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for name, (h, w) in cameras.items()}
        else:
            images = {name: frame(seq, h, w, channel_shift=10 * k) for k, (name, (h, w)) in enumerate(cameras.items())}
        state = np.linspace(0, 1, 5, dtype=np.float32) + seq if with_state else None
        prompt = prompts[(n * len(prompts)) // count]
        first = next(iter(images.values()))
        request = ActionRequest(domain_name=DOMAIN, image=first, prompt=prompt, seed=seq)
        queued = recording.observation(seq, images, request, state=state)
        sent = Sent(seq, images, state, prompt, "chunk", queued=queued)
        if seq in unanswered:
            sent.kind = "unanswered"
        elif seq in error_at:
            sent.kind, sent.reason = "error", "engine_error"
            recording.error(seq, "engine_error", "the model failed")
        elif drop_every and n % drop_every == drop_every - 1:
            sent.kind, sent.reason = "dropped", "superseded"
            recording.dropped(seq, "superseded", "a newer observation replaced it")
        else:
            sent.actions = chunk(seq)
            recording.chunk(seq, sent.actions, TIMING, seed=seq)
        traffic.sent.append(sent)
    return traffic


@pytest.fixture
def recorders():
    """``recorders(root, **settings) -> Recorder`` (started); every one is closed after the test."""
    started: list[Recorder] = []

    def make(root: Path, **settings) -> Recorder:
        recorder = Recorder(RecorderSettings(root=Path(root), **settings))
        recorder.start()
        started.append(recorder)
        return recorder

    yield make
    for recorder in started:
        recorder.close(timeout=60)


def only_recording(root: Path) -> Path:
    found = sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(found) == 1, [p.name for p in found]
    return found[0]


def leftovers(root: Path) -> list[str]:
    """Files a finished recorder must not leave: partial episodes, temporary and segment files."""
    root = Path(root)
    found = [str(p.relative_to(root)) for p in (root / ".partial").iterdir()] if (root / ".partial").exists() else []
    found += [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if (p.is_file() and p.name.endswith((".tmp", ".partial"))) or p.name == "segments"
    ]
    return found


def assert_frames_match(decoded: np.ndarray, originals: list[np.ndarray], index: int) -> None:
    """``decoded`` is frame ``index`` of ``originals`` after H.264: close in value, closest to its own."""
    errors = [float(np.abs(decoded.astype(np.int16) - o.astype(np.int16)).mean()) for o in originals]
    assert errors[index] < 6.0, f"frame {index} decodes {errors[index]:.1f} levels away from what was sent"
    neighbours = [errors[j] for j in (index - 1, index + 1) if 0 <= j < len(originals)]
    assert all(errors[index] < e for e in neighbours), (index, errors[max(0, index - 1) : index + 2])


def wait_until_published(server, timeout: float = 60.0) -> bool:
    """Wait until a recording server has ended every session (a client's close reaches the server a little
    later than the client returns) and its writer has handled what those sessions queued, so that their
    episodes are published. Call it on a thread, not on the event loop the test's robot runs on."""
    import time

    deadline = time.monotonic() + timeout
    while server.server.context.sessions and time.monotonic() < deadline:
        time.sleep(0.02)
    return not server.server.context.sessions and server.recorder.sync(max(0.0, deadline - time.monotonic()))
