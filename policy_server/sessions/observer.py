"""The observer channel, ``/v1/observe``: watch live sessions and send operator controls.

The teleop dashboard (``policy_server/dashboard/``) connects here from a browser. The channel is
deliberately not a robot connection: it has no path to the request queue, so nothing sent on it can
become an observation or reach the model. What it can do:

* **watch**: every ``sessions_interval`` (1 s) the server sends a ``sessions`` frame listing the live
  sessions, and every ``interval`` (0.25 s), for the session the observer subscribed to, a
  ``session_detail`` frame (latest chunk, latency timeline, drops, and the latest camera frame as a JPEG
  when it changed);
* **steer**: a ``control`` frame pauses, resumes or stops a native session, or gives it a new prompt;
  the session tells its robot (:mod:`policy_server.sessions.controls`) and the observer gets
  ``control_result`` (or ``error``).

Frames are JSON text both ways (a browser reads JSON without a library; the volume is small). Robot
frames (``observation``, ``configure``, ``cancel``, ``reset``) are refused with ``read_only``.
``docs/dashboard.md`` describes every frame.

What one observer may cost is bounded: observers at once (``--max-observers``, checked by the server at
the handshake); the frames it may send (:data:`OBSERVER_MAX_MESSAGE_BYTES` each, at most
``observer_frame_rate`` a second, beyond which they are answered ``rate_limited``); what the server pushes
to it (one ``sessions`` list per sessions interval and one ``session_detail`` per interval, none made while
the previous one waits unsent; both built once per interval for all observers by :class:`SnapshotCache`,
so the work does not grow with the observers; prompts cut to :data:`LIST_PROMPT_CHARS` in the list and
:data:`DETAIL_PROMPT_CHARS` in the detail; the camera JPEG encoded once per frame); and what waits for it
(the bounded outbox and reply timeout of every connection, :mod:`policy_server.foundation.connection_supervisor`).

Access is decided in one place, :func:`authorize`, called by the server for every handshake to this
path before anything is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request

from robot_clients import protocol
from robot_clients.client_frames import REQUEST_SETTINGS
from robot_clients.protocol import ProtocolError

from ..context import ServerContext
from ..foundation.connection_supervisor import close_connection
from ..foundation.json_text import JsonTextError, loads_bounded
from ..foundation.outbox import OutboxFull, paced
from ..metadata import public_model_name
from .base import Session
from .controls import RECORDING_ACTIONS, ControlAction, ControlError, ControlErrorCode, parse_control

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.25  # session_detail of the watched session
DEFAULT_SESSIONS_INTERVAL_S = 1.0  # the sessions list (it changes at the pace of people, not of robots)
# Observers send subscribe and control frames of a few hundred bytes, at the pace of clicks.
OBSERVER_MAX_MESSAGE_BYTES = 64 * 1024
# A prompt is shown whole (up to the model's usual prompt bound) only to whoever watches that session.
LIST_PROMPT_CHARS = 200
DETAIL_PROMPT_CHARS = 2000
# Robot frames; an observer that sends one is told the channel is read-only instead of "unknown type".
ROBOT_FRAME_TYPES = ("observation", "configure", "cancel", "reset")


class ObserverErrorCode:
    """Stable codes of ``error`` frames on the observer channel (controls add ControlErrorCode's)."""

    BAD_FRAME = "bad_frame"  # not a JSON object in a text frame
    UNKNOWN_TYPE = "unknown_type"
    READ_ONLY = "read_only"  # a robot frame: observers cannot send observations or drive a session
    RATE_LIMITED = "rate_limited"  # more frames a second than --observer-frame-rate allows; this one was not acted on
    PAYLOAD_TOO_LARGE = "payload_too_large"  # JSON nested deeper than MAX_JSON_DEPTH (or larger than the frame limit)


def authorize(request: Request) -> tuple[HTTPStatus, str] | None:
    """Whether this handshake may watch and steer sessions: ``None`` to allow, else (status, message).

    The observer channel's own hook (its static files carry no data; everything live comes through
    here). The bearer token (``cosmos3-serve --auth-token``) is checked before this, in the server's
    handshake hook, by :mod:`policy_server.foundation.auth`, like for every closed endpoint; it accepts the
    ``access_token`` query parameter the dashboard uses (``/dashboard/#token=...``; docs/dashboard.md).
    Checks specific to observers (e.g. a separate operator token) would go here.
    """
    del request  # no credential to check yet
    return None


def _rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)


@dataclass(frozen=True)
class Detail:
    """A session's ``session_detail`` as UTF-8 JSON, with and without the camera frame it carries."""

    frame_key: tuple[str, int] | None  # (session, seq) of the camera frame in ``with_frame``; None: no frame
    with_frame: bytes
    without_frame: bytes


class SnapshotCache:
    """What observers are sent, built once per ``max_age_s`` and shared by all of them (UTF-8 JSON).

    Observers differ only in which camera frame they already have, so each session's detail is kept with
    and without its frame; an observer picks one. Its cost therefore does not grow with the observers.
    """

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._sessions: tuple[float, bytes] | None = None
        self._details: dict[str, tuple[float, Detail]] = {}

    def sessions(self, server: ServerContext[Session], now: float) -> bytes:
        if self._sessions is None or now - self._sessions[0] >= self.max_age_s:
            sessions = [session_summary(server, s, LIST_PROMPT_CHARS) for s in list(server.sessions.values())]
            frame = protocol.ObserverSessionsFrame(time.time(), sessions)
            self._sessions = (now, json.dumps(frame.wire(), allow_nan=False).encode())
            live = set(server.sessions)  # forget the details of sessions that have gone
            for session_id in [k for k in self._details if k not in live]:
                del self._details[session_id]
        return self._sessions[1]

    def detail(self, server: ServerContext[Session], session: Session, now: float) -> Detail:
        cached = self._details.get(session.id)
        if cached is None or now - cached[0] >= self.max_age_s:
            cached = (now, session_detail(server, session))
            self._details[session.id] = cached
        return cached[1]


def session_detail(server: ServerContext[Session], session: Session) -> Detail:
    """``session``'s detail: summary (prompt up to DETAIL_PROMPT_CHARS), latest chunk, latencies, drops, and
    its latest camera frame as a JPEG."""
    telemetry = session.telemetry
    detail = protocol.ObserverSessionDetailFrame(
        session.id, time.time(), session_summary(server, session, DETAIL_PROMPT_CHARS)
    )
    frame = telemetry.latest_frame if telemetry is not None else None
    if telemetry is not None:
        chunk = None
        if telemetry.latest_actions is not None:
            actions = np.asarray(telemetry.latest_actions, dtype=np.float64)
            chunk = {
                "seq": telemetry.latest_actions_seq,
                "horizon": int(actions.shape[0]),
                "dim": int(actions.shape[1]),
                "actions": np.nan_to_num(actions).round(5).tolist(),
            }
        latency = [
            {
                "t": round(c.t, 3),
                "seq": c.seq,
                "total_ms": round(c.total_ms, 2),
                "queue_ms": round(c.queue_ms, 2),
                "model_ms": round(c.model_ms, 2),
            }
            for c in telemetry.chunks
        ]
        dropped = [{"t": round(d.t, 3), "seq": d.seq, "reason": d.reason} for d in telemetry.drops]
        detail = replace(detail, chunk=chunk, latency=latency, dropped=dropped)
    without_frame = json.dumps(detail.wire(), allow_nan=False).encode()
    if frame is None or telemetry is None:
        return Detail(None, without_frame, without_frame)
    jpeg, width, height = telemetry.preview(frame)
    picture = {"seq": frame.seq, "t": round(frame.t, 3), "width": width, "height": height, "jpeg_base64": jpeg}
    with_frame = json.dumps(replace(detail, frame=picture).wire(), allow_nan=False).encode()
    return Detail((session.id, frame.seq), with_frame, without_frame)


def _cut(text: str | None, limit: int) -> tuple[str | None, bool]:
    if text is None or len(text) <= limit:
        return text, False
    return text[:limit], True


def session_summary(server: ServerContext[Session], session: Session, prompt_chars: int) -> dict[str, Any]:
    """One session as observers see it; the prompt cut to ``prompt_chars`` (``prompt_truncated`` says so)."""
    telemetry = session.telemetry
    description = server.description
    config = session.config.resolved(description) if session.config is not None and description is not None else {}
    prompt, truncated = _cut(config.get("prompt"), prompt_chars)
    summary = {
        "session_id": session.id,
        "protocol": session.protocol,
        "controllable": session.controllable,
        "remote": session.remote,
        "state": session.state.value,
        "state_reason": session.state_reason,
        **{setting.name: config.get(setting.name) for setting in REQUEST_SETTINGS},  # resolved: defaults filled in
        "prompt": prompt,
        "prompt_truncated": truncated,
        "answered": session.answered,
        "dropped": session.dropped,
        "recording": session.recorded,
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


class ObserverSession:
    """One observer connection: a ticker that makes snapshots, a reader for subscribe/control, and a
    sender that drains the bounded outbox both write to."""

    def __init__(
        self,
        connection: ServerConnection,
        server: ServerContext[Session],
        snapshots: SnapshotCache,
        interval_s: float = DEFAULT_INTERVAL_S,
        sessions_interval_s: float = DEFAULT_SESSIONS_INTERVAL_S,
    ) -> None:
        self.id = "observer-" + uuid.uuid4().hex[:8]
        self.connection = connection
        self.server = server
        self.snapshots = snapshots
        self.interval_s = interval_s
        self.sessions_interval_s = sessions_interval_s
        self.subscribed: str | None = None
        self.outbox = server.settings.session_limits.outbox()
        self.rate = server.settings.observer_frame_rate.bucket()
        self._frame_sent: tuple[str, int] | None = None  # (session, seq) of the camera frame last sent
        self._wake = asyncio.Event()

    def idle_for(self, now: float) -> float:
        """Never idle: watching is what an observer is for (its count is bounded at the handshake)."""
        return 0.0

    async def run(self) -> None:
        ticker = asyncio.create_task(self._tick_loop(), name=f"{self.id}-ticker")
        sender = asyncio.create_task(self._send_loop(), name=f"{self.id}-sender")
        try:
            self._send(self._hello())
            async for message in paced(self.connection, self.outbox):
                self._handle(message)
        except ConnectionClosed:
            pass
        finally:
            ticker.cancel()
            self.outbox.close()
            sender.cancel()
            await asyncio.gather(ticker, sender, return_exceptions=True)

    def _send(self, frame: protocol.ObserverFrame | bytes, latest: str | None = None) -> None:
        """Queue a frame (or its JSON already encoded to UTF-8, sent as a text frame as-is)."""
        data = frame if isinstance(frame, bytes) else json.dumps(frame.wire(), allow_nan=False).encode()
        try:
            self.outbox.put(data, len(data), latest=latest)
        except OutboxFull as full:
            self.server.supervisor.overflowed(self, full)

    async def _send_loop(self) -> None:
        try:
            await self.outbox.pump(self._send_text)
        except ConnectionClosed:
            pass

    async def _send_text(self, data: bytes) -> None:
        await self.connection.send(data, text=True)  # UTF-8 JSON shared between observers: no re-encoding

    def _hello(self) -> protocol.ObserverHelloFrame:
        d = self.server.description
        return protocol.ObserverHelloFrame(
            self.id,
            {
                "model": public_model_name(d.model) if d is not None else None,
                "variant": d.variant if d is not None else None,
                "interval_s": self.interval_s,
                "sessions_interval_s": self.sessions_interval_s,
                "controls": [action.value for action in ControlAction],
                "recording": self.server.recordings is not None,
            },
        )

    # -- frames from the observer ----------------------------------------------------------------

    def _handle(self, message: str | bytes) -> None:
        try:
            if not self.rate.take():
                raise ControlError(
                    ObserverErrorCode.RATE_LIMITED,
                    f"more than {self.rate.rate_hz:g} frames a second on this observer "
                    f"(burst {self.rate.burst:g}); this one was not acted on",
                )
            if not isinstance(message, str):
                raise ControlError(ObserverErrorCode.BAD_FRAME, "the observer channel speaks JSON text frames")
            try:
                frame = loads_bounded(message, OBSERVER_MAX_MESSAGE_BYTES)
            except JsonTextError as exc:
                if exc.too_large:
                    raise ControlError(ObserverErrorCode.PAYLOAD_TOO_LARGE, exc.message) from None
                raise ControlError(ObserverErrorCode.BAD_FRAME, "a frame must be a JSON object") from None
            if not isinstance(frame, dict):
                raise ControlError(ObserverErrorCode.BAD_FRAME, "a frame must be a JSON object")
            kind = frame.get("type")
            if kind == "subscribe":
                self._on_subscribe(frame)
            elif kind == "control":
                self._on_control(frame)
            elif kind in ROBOT_FRAME_TYPES:
                raise ControlError(
                    ObserverErrorCode.READ_ONLY,
                    f"`{kind}` is a robot frame; the observer channel only watches and sends operator controls "
                    "(robots connect to /v1/actions/realtime)",
                    "type",
                )
            else:
                raise ControlError(
                    ObserverErrorCode.UNKNOWN_TYPE,
                    f"unknown frame type {repr(kind)[:80]}; expected `subscribe` or `control`",
                    "type",
                )
        except ControlError as exc:
            self._send(protocol.ObserverErrorFrame(exc.code, exc.message, exc.field))

    def _on_subscribe(self, frame: dict[str, Any]) -> None:
        session_id = frame.get("session_id")
        if session_id is not None and not isinstance(session_id, str):
            raise ControlError(ControlErrorCode.BAD_CONTROL, "`session_id` must be a string or null", "session_id")
        self.subscribed, self._frame_sent = session_id, None
        self._send(protocol.ObserverSubscribedFrame(session_id))
        self._wake.set()  # the detail comes at the next allowed moment, not one per subscribe

    def _on_control(self, frame: dict[str, Any]) -> None:
        limits = self.server.description.limits if self.server.description is not None else None
        control = parse_control(frame, limits.max_prompt_chars or 2000 if limits is not None else 2000)
        session = self.server.sessions.get(control.session_id)
        if session is None:
            raise ControlError(
                ControlErrorCode.UNKNOWN_SESSION, f"no live session {control.session_id[:64]!r}", "session_id"
            )
        if control.action in RECORDING_ACTIONS:
            try:
                session.set_recording(RECORDING_ACTIONS[control.action], control.reason or "operator")
            except ProtocolError as exc:  # recording_unavailable: the server has no --record-dir
                raise ControlError(ControlErrorCode.RECORDING_UNAVAILABLE, exc.message, "action") from None
            state = session.state
        else:
            state = session.apply_control(control)
        logger.info(
            "%s: %s on session %s (%s)",
            self.id,
            control.action.value,
            control.session_id,
            control.reason or "no reason given",
        )
        self._send(protocol.ObserverControlResultFrame(control.session_id, control.action.value, state))

    # -- snapshots to the observer ---------------------------------------------------------------

    async def _tick_loop(self) -> None:
        """At most one ``sessions`` list per sessions interval and one detail per interval; a snapshot is
        not made while the previous one of its kind still waits unsent (the observer is behind)."""
        last_list = last_detail = -float("inf")
        try:
            while True:
                now = time.monotonic()
                if now - last_list >= self.sessions_interval_s:
                    last_list = now
                    if not self.outbox.waiting("sessions"):
                        self._send(self.snapshots.sessions(self.server, now), latest="sessions")
                session = self.server.sessions.get(self.subscribed) if self.subscribed else None
                if session is not None and now - last_detail >= self.interval_s:
                    last_detail = now
                    if not self.outbox.waiting("detail"):
                        self._send_detail(session, now)
                due = last_list + self.sessions_interval_s
                if session is not None:
                    due = min(due, last_detail + self.interval_s)
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, due - time.monotonic()))
                except asyncio.TimeoutError:
                    pass
        except Exception:  # noqa: BLE001 - a bug here must not go unnoticed, nor take the server down
            logger.exception("%s: snapshot failed; closing the observer", self.id)
            self.outbox.close()
            await close_connection(
                self.connection, 1011, "observer snapshot failed", self.server.settings.session_limits.close_grace_s
            )

    def _send_detail(self, session: Session, now: float) -> None:
        """The shared detail, with the camera frame only if this observer does not have it yet."""
        detail = self.snapshots.detail(self.server, session, now)
        if detail.frame_key is not None and detail.frame_key != self._frame_sent:
            self._send(detail.with_frame, latest="detail")
            self._frame_sent = detail.frame_key
        else:
            self._send(detail.without_frame, latest="detail")
