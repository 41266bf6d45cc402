"""The observer channel, ``/v1/observe``: watch live sessions and send operator controls.

The teleop dashboard (``policy_server/dashboard/``) connects here from a browser. The channel is
deliberately not a robot connection: it has no path to the request queue, so nothing sent on it can
become an observation or reach the model. What it can do:

* **watch**: every ``interval`` (0.25 s) the server sends a ``sessions`` frame listing the live
  sessions, and, for the session the observer subscribed to, a ``session_detail`` frame (latest chunk,
  latency timeline, drops, and the latest camera frame as a JPEG when it changed);
* **steer**: a ``control`` frame pauses, resumes or stops a native session, or gives it a new prompt;
  the session tells its robot (:mod:`policy_server.session_controls`) and the observer gets
  ``control_result`` (or ``error``).

Frames are JSON text both ways (a browser reads JSON without a library; the volume is small). Robot
frames (``observation``, ``configure``, ``cancel``, ``reset``) are refused with ``read_only``.
``docs/dashboard.md`` describes every frame.

Access is decided in one place, :func:`authorize`, called by the server for every handshake to this
path before anything is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request

from .session_controls import ControlError, ControlErrorCode, parse_control
from .session_telemetry import SessionTelemetry, encode_preview

if TYPE_CHECKING:
    from .server import PolicyServer

logger = logging.getLogger(__name__)

OBSERVE_PATH = "/v1/observe"
OBSERVER_PROTOCOL_VERSION = 1
DEFAULT_INTERVAL_S = 0.25
# Robot frames; an observer that sends one is told the channel is read-only instead of "unknown type".
ROBOT_FRAME_TYPES = ("observation", "configure", "cancel", "reset")


class ObserverErrorCode:
    """Stable codes of ``error`` frames on the observer channel (controls add ControlErrorCode's)."""

    BAD_FRAME = "bad_frame"  # not a JSON object in a text frame
    UNKNOWN_TYPE = "unknown_type"
    READ_ONLY = "read_only"  # a robot frame: observers cannot send observations or drive a session


def authorize(request: Request) -> tuple[HTTPStatus, str] | None:
    """Whether this handshake may watch and steer sessions: ``None`` to allow, else (status, message).

    The observer channel's own hook (its static files carry no data; everything live comes through
    here). The bearer token (``cosmos3-serve --auth-token``) is checked before this, in the server's
    handshake hook, by :mod:`policy_server.auth`, like for every closed endpoint; it accepts the
    ``access_token`` query parameter the dashboard uses (``/dashboard/#token=...``; docs/dashboard.md).
    Checks specific to observers (e.g. a separate operator token) would go here.
    """
    del request  # no credential to check yet
    return None


def _rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)


class ObserverSession:
    """One observer connection: a ticker that sends snapshots, and a reader for subscribe/control."""

    def __init__(self, connection: ServerConnection, server: "PolicyServer",
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.id = "observer-" + uuid.uuid4().hex[:8]
        self.connection = connection
        self.server = server
        self.interval_s = interval_s
        self.subscribed: str | None = None
        self._frame_sent: tuple[str, int] | None = None  # (session, seq) of the camera frame last sent
        self._send_lock = asyncio.Lock()

    async def run(self) -> None:
        ticker = asyncio.create_task(self._tick_loop(), name=f"{self.id}-ticker")
        try:
            await self._send(self._hello())
            async for message in self.connection:
                await self._handle(message)
        except ConnectionClosed:
            pass
        finally:
            ticker.cancel()

    async def _send(self, frame: dict[str, Any]) -> None:
        async with self._send_lock:  # the ticker and the reader both send; one frame at a time
            await self.connection.send(json.dumps(frame, allow_nan=False))

    def _hello(self) -> dict[str, Any]:
        d = self.server.description
        return {
            "type": "hello",
            "observer_protocol_version": OBSERVER_PROTOCOL_VERSION,
            "observer_id": self.id,
            "model": d.get("model"),
            "variant": d.get("variant"),
            "interval_s": self.interval_s,
            "controls": ["pause", "resume", "stop", "set_prompt"],
        }

    # -- frames from the observer ----------------------------------------------------------------

    async def _handle(self, message: str | bytes) -> None:
        try:
            if not isinstance(message, str):
                raise ControlError(ObserverErrorCode.BAD_FRAME, "the observer channel speaks JSON text frames")
            try:
                frame = json.loads(message)
            except ValueError:
                raise ControlError(ObserverErrorCode.BAD_FRAME, "a frame must be a JSON object") from None
            if not isinstance(frame, dict):
                raise ControlError(ObserverErrorCode.BAD_FRAME, "a frame must be a JSON object")
            kind = frame.get("type")
            if kind == "subscribe":
                await self._on_subscribe(frame)
            elif kind == "control":
                await self._on_control(frame)
            elif kind in ROBOT_FRAME_TYPES:
                raise ControlError(
                    ObserverErrorCode.READ_ONLY,
                    f"`{kind}` is a robot frame; the observer channel only watches and sends operator controls "
                    "(robots connect to /v1/actions/realtime)",
                    "type",
                )
            else:
                raise ControlError(ObserverErrorCode.UNKNOWN_TYPE,
                                   f"unknown frame type {kind!r}; expected `subscribe` or `control`", "type")
        except ControlError as exc:
            await self._send({"type": "error", "code": exc.code, "message": exc.message, "field": exc.field})

    async def _on_subscribe(self, frame: dict[str, Any]) -> None:
        session_id = frame.get("session_id")
        if session_id is not None and not isinstance(session_id, str):
            raise ControlError(ControlErrorCode.BAD_CONTROL, "`session_id` must be a string or null", "session_id")
        self.subscribed, self._frame_sent = session_id, None
        await self._send({"type": "subscribed", "session_id": session_id})
        if session_id is not None and session_id in self.server.sessions:
            await self._send(self._detail(self.server.sessions[session_id]))  # no need to wait for the tick

    async def _on_control(self, frame: dict[str, Any]) -> None:
        control = parse_control(frame, int(self.server.description.get("limits", {}).get("max_prompt_chars", 2000)))
        session = self.server.sessions.get(control.session_id)
        if session is None:
            raise ControlError(ControlErrorCode.UNKNOWN_SESSION, f"no live session {control.session_id!r}",
                               "session_id")
        if not hasattr(session, "apply_control"):
            raise ControlError(ControlErrorCode.NOT_CONTROLLABLE,
                               "openpi clients cannot be told to pause or change prompt; only native sessions can",
                               "session_id")
        state = session.apply_control(control)
        logger.info("%s: %s on session %s (%s)", self.id, control.action.value, control.session_id,
                    control.reason or "no reason given")
        await self._send({"type": "control_result", "session_id": control.session_id,
                          "action": control.action.value, "state": state.value})

    # -- snapshots to the observer ---------------------------------------------------------------

    async def _tick_loop(self) -> None:
        try:
            while True:
                await self._send(self._sessions())
                session = self.server.sessions.get(self.subscribed) if self.subscribed else None
                if session is not None:
                    await self._send(self._detail(session))
                await asyncio.sleep(self.interval_s)
        except ConnectionClosed:
            pass
        except Exception:  # noqa: BLE001 - a bug here must not go unnoticed, nor take the server down
            logger.exception("%s: snapshot failed; closing the observer", self.id)
            await self.connection.close(1011, "observer snapshot failed")

    def _sessions(self) -> dict[str, Any]:
        return {"type": "sessions", "t": time.time(),
                "sessions": [self._summary(s) for s in list(self.server.sessions.values())]}

    def _summary(self, session: Any) -> dict[str, Any]:
        telemetry: SessionTelemetry | None = getattr(session, "telemetry", None)
        config = session.config.resolved(self.server.description) if getattr(session, "config", None) else {}
        state = getattr(session, "state", None)
        remote = session.connection.remote_address
        summary = {
            "session_id": session.id,
            "protocol": "native" if telemetry is not None else "openpi",
            "controllable": hasattr(session, "apply_control"),
            "remote": f"{remote[0]}:{remote[1]}" if remote else None,
            "state": state.value if state is not None else "running",
            "state_reason": getattr(session, "state_reason", ""),
            "domain_name": config.get("domain_name"),
            "action_mode": config.get("action_mode"),
            "action_horizon": config.get("action_horizon"),
            "prompt": config.get("prompt"),
            "control_hz": config.get("control_hz"),
            "answered": session.answered,
            "dropped": session.dropped,
        }
        if telemetry is not None:
            last = telemetry.chunks[-1] if telemetry.chunks else None
            summary.update(
                opened_at=telemetry.opened_at,
                observation_hz=_rounded(telemetry.observation_hz()),
                chunk_latency_ms=_rounded(last.total_ms if last else None),
                latency_p50_ms=_rounded(telemetry.latency_ms(0.5)),
                latency_p99_ms=_rounded(telemetry.latency_ms(0.99)),
                observations=telemetry.observations,
                errors=telemetry.errors,
            )
        return summary

    def _detail(self, session: Any) -> dict[str, Any]:
        telemetry: SessionTelemetry | None = getattr(session, "telemetry", None)
        detail: dict[str, Any] = {"type": "session_detail", "session_id": session.id, "t": time.time(),
                                  "summary": self._summary(session), "chunk": None, "latency": [], "dropped": [],
                                  "frame": None}
        if telemetry is None:
            return detail
        if telemetry.latest_actions is not None:
            actions = np.asarray(telemetry.latest_actions, dtype=np.float64)
            detail["chunk"] = {"seq": telemetry.latest_actions_seq, "horizon": int(actions.shape[0]),
                               "dim": int(actions.shape[1]),
                               "actions": np.nan_to_num(actions).round(5).tolist()}
        detail["latency"] = [{"t": round(c.t, 3), "seq": c.seq, "total_ms": round(c.total_ms, 2),
                              "queue_ms": round(c.queue_ms, 2), "model_ms": round(c.model_ms, 2)}
                             for c in telemetry.chunks]
        detail["dropped"] = [{"t": round(d.t, 3), "seq": d.seq, "reason": d.reason} for d in telemetry.drops]
        frame = telemetry.latest_frame
        if frame is not None and self._frame_sent != (session.id, frame.seq):
            jpeg, width, height = encode_preview(frame.image)
            detail["frame"] = {"seq": frame.seq, "t": round(frame.t, 3), "width": width, "height": height,
                               "jpeg_base64": jpeg}
            self._frame_sent = (session.id, frame.seq)
        return detail
