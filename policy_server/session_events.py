"""What a session tells whoever listens to it (:class:`SessionListener`), and what it tells them of an
accepted observation (:class:`AcceptedObservation`).

A session notifies each of its listeners of what happens to it, instead of calling the features that care
inline. A listener overrides the events it wants; the others do nothing. The listeners today: the recording
(``policy_server.recording.recorder.RecordingListener``, attached only when recording is on, so a server that
records nothing never loads the recorder; the server's context carries how to make one,
:class:`~policy_server.context.SessionRecordings`), and the one every native session has, its telemetry
(:class:`~policy_server.sessions.telemetry.SessionTelemetry`). The contract lives outside ``sessions/`` so that
the context and the features name it without loading a session.

Events, in the order a session's life produces them:

* :meth:`~SessionListener.configured`: the session's configuration is set or changed (``config`` resolved
  against the model, ``model`` the engine's ``describe()``). A listener attached to a session that is
  already configured hears it first, at once;
* :meth:`~SessionListener.observation`: an observation was accepted (parsed, decoded, checked, in order);
  its terminal reply follows as exactly one of ``chunk_made`` (then ``chunk_sent``), ``dropped`` or ``error``;
* :meth:`~SessionListener.chunk_made` when the engine's chunk becomes a reply, :meth:`~SessionListener.chunk_sent`
  when it leaves for the socket (with its ``observation_age_ms``);
* :meth:`~SessionListener.dropped`, :meth:`~SessionListener.error` (errors about no observation too: ``seq`` None);
* :meth:`~SessionListener.noted`: something worth a line in the session's log (an operator's control, a
  replica move, recording stopped);
* :meth:`~SessionListener.reset`: the client reset the session (what was in flight has been dropped);
* :meth:`~SessionListener.closed`: the session ended, or this listener was detached from it (``reason``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosmos3_runtime.requests import ActionRequest
from robot_clients.client_frames import ObservationFrame


@dataclass(frozen=True)
class AcceptedObservation:
    """An observation a session accepted: its frame (cameras decoded), the request made of it, its arrival."""

    frame: ObservationFrame
    request: ActionRequest
    received_at: float  # time.monotonic()

    @property
    def cameras(self) -> Mapping[str, np.ndarray]:
        """Its cameras by name: its named images, its image, or a clip's first frame (``video``)."""
        frame = self.frame
        if frame.images is not None:
            return {name: image for name, image in frame.images.items() if isinstance(image, np.ndarray)}
        if isinstance(frame.image, np.ndarray):
            return {"image": frame.image}
        video = frame.video
        return {"video": video[0]} if isinstance(video, np.ndarray) and len(video) else {}


class SessionListener:
    """Hears a session's events (see the module docstring); every event does nothing unless overridden."""

    def configured(self, config: Mapping[str, Any], model: Mapping[str, Any]) -> None:
        """The session's resolved configuration, set or changed."""

    def observation(self, event: AcceptedObservation) -> None:
        """An observation accepted; its one terminal reply follows."""

    def chunk_made(self, seq: int, actions: np.ndarray, timing: Mapping[str, float | None]) -> None:
        """The engine's chunk for ``seq`` became a reply (it may still be replaced before it leaves)."""

    def chunk_sent(self, seq: int, actions: np.ndarray, timing: Mapping[str, float | None], seed: int | None) -> None:
        """The chunk for ``seq`` leaves for the socket (``timing`` now has ``observation_age_ms``; ``seed``: the
        one it was sampled with)."""

    def dropped(self, seq: int, reason: str, message: str) -> None:
        """``seq`` was answered without actions."""

    def error(self, seq: int | None, code: str, message: str, field: str | None) -> None:
        """An error reply (about observation ``seq``, or about no observation)."""

    def noted(self, kind: str, details: Mapping[str, Any]) -> None:
        """A line for the session's log (``kind``: ``operator``, ``replica_moved``, ``recording``...)."""

    def reset(self) -> None:
        """The client reset the session."""

    def closed(self, reason: str) -> None:
        """The session ended, or this listener was detached from it."""
