"""What a session tells its recording, and the recording of a session that is not recorded.

:class:`~.base.Session` calls these hooks for every observation, chunk, drop, error, configuration,
reset and close (``docs/recording.md``); ``policy_server.recording.SessionRecording`` implements them.
A session starts with :data:`NOT_RECORDED`, which does nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from robot_clients.client_frames import ObservationFrame


class RecordingHooks(Protocol):
    """What a session tells its recording (``policy_server.recording.SessionRecording`` provides it)."""

    def start_episode(self, config: Mapping[str, Any], model: Mapping[str, Any], fps: int | None = None) -> None: ...

    def configured(self, config: Mapping[str, Any]) -> None: ...

    def observation(self, seq: int, cameras: Mapping[str, np.ndarray], request: Any = None, **details: Any) -> bool: ...

    def chunk(
        self, seq: int, actions: np.ndarray, timing: Mapping[str, float | None], seed: int | None = None
    ) -> None: ...

    def dropped(self, seq: int, reason: str, message: str = "") -> None: ...

    def error(self, seq: int | None, code: str, message: str, field: str | None = None) -> None: ...

    def note(self, kind: str, **details: Any) -> None: ...

    def end_episode(self, reason: str) -> None: ...


class _NotRecorded:
    """A session that is not recorded. (``policy_server.recording`` has the same no-op, but importing that
    package loads its writer and video encoder, which a server that records nothing must not pay for.)"""

    def start_episode(self, config: Mapping[str, Any], model: Mapping[str, Any], fps: int | None = None) -> None: ...

    def configured(self, config: Mapping[str, Any]) -> None: ...

    def observation(self, seq: int, cameras: Mapping[str, np.ndarray], request: Any = None, **details: Any) -> bool:
        return False

    def chunk(
        self, seq: int, actions: np.ndarray, timing: Mapping[str, float | None], seed: int | None = None
    ) -> None: ...

    def dropped(self, seq: int, reason: str, message: str = "") -> None: ...

    def error(self, seq: int | None, code: str, message: str, field: str | None = None) -> None: ...

    def note(self, kind: str, **details: Any) -> None: ...

    def end_episode(self, reason: str) -> None: ...


NOT_RECORDED: RecordingHooks = _NotRecorded()


def cameras_of(frame: ObservationFrame) -> Mapping[str, np.ndarray]:
    """An observation's cameras as a recording names them: its named images, its image, or a clip's first
    frame (``video``)."""
    if frame.images is not None:
        return frame.images
    if frame.image is not None:
        return {"image": frame.image}
    return {"video": frame.video[0]} if frame.video is not None and len(frame.video) else {}
