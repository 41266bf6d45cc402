"""What a policy client hands to the robot: action chunks, the errors a call can end with, and its counters."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .protocol import CodedError


@dataclass
class ActionChunk:
    """A chunk of actions answering observation ``seq``: ``actions`` is float32, horizon × action width.

    ``timing`` is the server's breakdown in milliseconds (``queue_ms``, ``preprocess_ms``, ``model_ms``,
    ``postprocess_ms``, ``total_ms``, ``observation_age_ms``, ...); ``round_trip_ms`` is what this client
    measured from sending the observation to decoding the chunk.
    """

    seq: int
    actions: np.ndarray
    action_mode: str
    domain_name: str
    domain_id: int
    raw_action_dim: int
    num_steps: int | None = None
    seed: int | None = None
    timing: dict[str, float] = field(default_factory=dict)
    round_trip_ms: float | None = None
    # The other settings the server used for this chunk (an observation's own, else the session's).
    prompt: str | None = None
    resolution_tier: int | None = None
    view_point: str | None = None
    guidance_scale: float | None = None
    fps: float | None = None

    @property
    def action_horizon(self) -> int:
        return int(self.actions.shape[0])

    @classmethod
    def from_frame(cls, frame: dict[str, Any], round_trip_ms: float | None) -> ActionChunk:
        return cls(
            seq=frame["seq"],
            # The wire codec gives a read-only view on the received bytes; a robot may want to edit it.
            actions=np.array(frame["actions"], dtype=np.float32, copy=True),
            action_mode=frame.get("action_mode", ""),
            domain_name=frame.get("domain_name", ""),
            domain_id=frame.get("domain_id", -1),
            raw_action_dim=frame.get("raw_action_dim", -1),
            num_steps=frame.get("num_steps"),
            seed=frame.get("seed"),
            timing=dict(frame.get("timing") or {}),
            round_trip_ms=round_trip_ms,
            prompt=frame.get("prompt"),
            resolution_tier=frame.get("resolution_tier"),
            view_point=frame.get("view_point"),
            guidance_scale=frame.get("guidance_scale"),
            fps=frame.get("fps"),
        )


class PolicyClientError(Exception):
    """Base of the errors a policy client raises."""


class ServerError(PolicyClientError, CodedError):
    """The server answered with an ``error`` frame: ``code`` is stable, ``field`` names the culprit."""

    def __init__(self, code: str, message: str, field: str | None = None, seq: int | None = None) -> None:
        CodedError.__init__(self, code, message, field)
        self.args = (self.text(),)
        self.seq = seq


class ObservationDropped(PolicyClientError):
    """The server will not answer this observation (``reason``: superseded, deadline, cancelled,
    shutdown), or the client discarded its answer because a newer one was already delivered (stale)."""

    def __init__(self, seq: int, reason: str, message: str = "") -> None:
        super().__init__(f"observation {seq} dropped: {reason}" + (f" ({message})" if message else ""))
        self.seq = seq
        self.reason = reason


class ConnectionLost(PolicyClientError):
    """The connection closed before the answer came. The client reconnects in the background."""


class SessionPaused(ObservationDropped):
    """An operator paused the session: observations are not answered until it is resumed. Hold the robot.

    Raised for observations the server dropped because of the pause, and at once, without sending, for
    observations submitted while the client knows the session is paused.
    """

    def __init__(self, seq: int | None, message: str = "") -> None:
        PolicyClientError.__init__(
            self, "the session is paused by an operator" + (f" ({message})" if message else "") + "; hold"
        )
        self.seq = seq  # None: refused before it was sent
        self.reason = "paused"


class SessionStopped(PolicyClientError):
    """An operator stopped the session. The server closed the connection; the client does not reconnect."""

    reason = "stopped"


@dataclass
class ClientStats:
    """Counters of what happened to this client's observations (across reconnects)."""

    sent: int = 0
    answered: int = 0
    errors: int = 0
    stale: int = 0  # chunks discarded because a newer seq had already been delivered
    reconnects: int = 0
    dropped: Counter = field(default_factory=Counter)  # by reason ("unsent": replaced on the robot, never sent)
    bytes_sent: int = 0  # observation frames written to the socket
    buffered_bytes: int = 0  # written and not yet acknowledged by the server, at the last submit
    buffered_bytes_max: int = 0
