"""One openpi client's connection to ``/`` or ``/openpi``: openpi's WebSocket protocol, served unchanged.

openpi clients (``openpi_client.websocket_client_policy.WebsocketClientPolicy``, the LIBERO, DROID and
ALOHA eval scripts, Isaac Lab bridges) speak a minimal protocol:

* on connect the server sends one binary msgpack frame: a metadata dict;
* then every binary frame from the client is an observation dict, and the server answers each with one
  binary frame: an action dict, ``{"actions": H×D float32, "server_timing": {...}}``;
* arrays are openpi's ``{b"__ndarray__": True, b"data", b"dtype", b"shape"}`` maps. openpi's unpacker
  looks for **bytes** keys, so that is how this session writes them (the shared wire codec reads both).

openpi clients never say which embodiment, horizon or mode they want, so those come from the server's
settings (:class:`OpenpiSettings`, set by ``cosmos3-serve --openpi-*`` flags); which cameras feed the
model comes from a :class:`~policy_server.sessions.openpi_observation.CameraMapping`.

Errors: openpi's own server sends a traceback as a text frame and closes the connection. Here the
error goes out as a text frame too (openpi's client raises ``RuntimeError`` with it), but the
connection stays open and the next observation is served: a robot that sent one bad frame keeps going.
The text is ``"<code>: <message> (field: <key>)"`` with the stable codes of the native protocol.

Observations go through the server's request queue like native ones (latest wins, fair turns, the one
engine worker), so openpi robots and native robots share the model fairly. Replies go through the same
bounded outbox as native ones (:mod:`policy_server.sessions.outbox`): an unread action reply replaced by a newer
one becomes the text ``dropped: ...`` in its place, and a client that stops reading is closed with 1008
(:mod:`policy_server.sessions.supervisor`), as is one that sends nothing for ``--idle-timeout-s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from robot_clients.client_frames import ObservationFrame
from robot_clients.protocol import CodedError, DropReason, ErrorCode, ProtocolError
from robot_clients.wire_codec import WireFormatError, packb, unpackb

from ..engine.description import ModelDescription
from ..engine.outcome import EngineOutcome
from ..engine.request_queue import PendingObservation, QueueClosed
from ..log_hygiene import printable
from .config import STATE_PROFILE_FIELDS, SessionConfig, merge_session_config, observation_request
from .openpi_observation import CameraMapping, detect_convention, parse_openpi_observation
from .outbox import OutboxFull, paced

if TYPE_CHECKING:
    from ..server import PolicyServer

logger = logging.getLogger(__name__)

OPENPI_PATHS = ("/", "/openpi")


@dataclass(frozen=True)
class OpenpiSettings:
    """What openpi clients cannot say for themselves. ``None``: the model's default for the domain."""

    domain_name: str | None = None
    action_horizon: int | None = None
    action_mode: str = "policy"
    view_point: str | None = None
    prompt: str = ""  # used when an observation has no `prompt`
    resolution_tier: int | None = None
    seed: int | None = None
    cameras: CameraMapping = field(default_factory=CameraMapping)

    def session_config(self, description: ModelDescription) -> SessionConfig:
        """Resolve against the loaded model; raises :class:`ProtocolError` naming a bad setting."""
        domain = self.domain_name or description.defaults.domain_name
        settings = {
            "domain_name": domain,
            "action_mode": self.action_mode.strip().lower(),
            "action_horizon": self.action_horizon,
            "view_point": self.view_point,
            "prompt": self.prompt,
            "resolution_tier": self.resolution_tier,
            "seed": self.seed,
        }
        return merge_session_config(None, {k: v for k, v in settings.items() if v is not None}, description)


def openpi_arrays(obj: Any) -> Any:
    """``obj`` with numpy arrays and scalars as openpi's bytes-keyed maps (what its unpacker expects)."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise WireFormatError(f"cannot send an array of dtype {obj.dtype}")
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    if isinstance(obj, dict):
        return {key: openpi_arrays(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [openpi_arrays(value) for value in obj]
    return obj


def error_text(code: str, message: str, field: str | None = None) -> str:
    return CodedError(code, message, field).text()


class OpenpiSession:
    """Protocol state of one openpi connection. Replies leave in order, through one sender task."""

    def __init__(self, connection: ServerConnection, server: "PolicyServer", settings: OpenpiSettings) -> None:
        self.id = "openpi-" + uuid.uuid4().hex[:12]
        self.connection = connection
        self.server = server
        self.settings = settings
        self.config: SessionConfig | None = None
        self.config_error: ProtocolError | None = None
        self.in_flight: dict[int, PendingObservation] = {}
        self.closed = False
        self.answered = 0
        self.dropped = 0
        self.convention: str | None = None
        self._next_seq = 0
        self._last_total_ms: float | None = None
        self.outbox = server.settings.connection_limits.outbox()
        self.last_observation_at = time.monotonic()
        self.rate = server.settings.observation_rate.bucket()

    # -- the connection's life ---------------------------------------------------------------------

    async def run(self) -> None:
        try:
            self.config = self.settings.session_config(self.server.description)
        except ProtocolError as exc:
            # The operator's flags do not fit this model: every observation will be told why.
            self.config_error = exc
            logger.error("openpi session %s: the server's openpi settings are invalid: %s", self.id, exc.message)
        sender = asyncio.create_task(self._send_loop(), name=f"{self.id}-sender")
        try:
            self._put(packb(openpi_arrays(self.metadata())))
            async for message in paced(self.connection, self.outbox):
                self._handle(message)
        except ConnectionClosed:
            pass
        finally:
            self.closed = True
            self.server.queue.cancel(self.id)
            self.in_flight.clear()
            self.outbox.close()  # the connection is gone: nobody will read what waits
            try:
                await asyncio.wait_for(sender, timeout=1.0)
            except (asyncio.TimeoutError, ConnectionClosed):
                sender.cancel()

    async def drain(self, timeout: float) -> None:
        """Wait until the outbox is empty (used at shutdown, before closing with 1001)."""
        deadline = time.monotonic() + timeout
        while not self.outbox.empty() and time.monotonic() < deadline and not self.closed:
            await asyncio.sleep(0.005)

    def idle_for(self, now: float) -> float:
        """Seconds without an observation while nothing of this session is queued or running."""
        return 0.0 if self.in_flight else now - self.last_observation_at

    def _put(self, message: bytes | str, latest: bool = False) -> None:
        """Queue a reply; an action reply (``latest``) replaces an unread one, which becomes ``dropped``."""
        if self.closed:
            return
        nbytes = len(message) if isinstance(message, bytes) else len(message.encode())
        try:
            self.outbox.put(message, nbytes, latest="actions" if latest else None,
                            replaced=self._unread_actions_dropped if latest else None)
        except OutboxFull as full:
            self.server.supervisor.overflowed(self, full)

    def _unread_actions_dropped(self, _message: bytes) -> tuple[str, int]:
        self.answered -= 1
        self.dropped += 1
        text = error_text("dropped", "observation not answered (superseded): a newer action reply replaced it "
                                     "before the client read it")
        return text, len(text)

    async def _send_loop(self) -> None:
        try:
            await self.outbox.pump(self.connection.send)
        except ConnectionClosed:
            pass

    def metadata(self) -> dict[str, Any]:
        d = self.server.description
        resolved = self.config.resolved(d) if self.config is not None else {}
        return {
            "server": "cosmos3-policy-server",
            "protocol": "openpi",
            "session_id": self.id,
            "model": d.model,
            "variant": d.variant,
            "domain_name": resolved.get("domain_name"),
            "action_mode": resolved.get("action_mode"),
            "action_horizon": resolved.get("action_horizon"),
            "action_dim": resolved.get("raw_action_dim"),
            "view_point": resolved.get("view_point"),
            **{name: resolved.get(name) for name in STATE_PROFILE_FIELDS},
            "cameras": self.settings.cameras.describe().get(resolved.get("view_point"), []),
            "error": None if self.config_error is None else error_text(
                self.config_error.code, self.config_error.message, self.config_error.field),
        }

    # -- observations --------------------------------------------------------------------------------

    def _handle(self, message: bytes | str) -> None:
        received_at = time.monotonic()
        seq = self._next_seq
        self._next_seq += 1
        try:
            if isinstance(message, str):
                raise ProtocolError(ErrorCode.BAD_FRAME, "send observations as binary msgpack frames, not text")
            if not self.rate.take(received_at):  # every openpi frame is an observation: refused before decoding
                raise ProtocolError(ErrorCode.RATE_LIMITED, self.rate.message())
            if self.config_error is not None:
                raise self.config_error
            assert self.config is not None
            self.last_observation_at = received_at
            try:
                decoded = unpackb(message)
            except WireFormatError as exc:
                raise ProtocolError(ErrorCode.BAD_FRAME, exc.message, exc.field) from None
            resolved_view = self.config.resolved(self.server.description)["view_point"]
            obs = parse_openpi_observation(
                decoded, self.settings.cameras, resolved_view, self.server.frame_limits,
                video=self.config.action_mode == "inverse_dynamics",
                domain=self.server.description.domain(self.config.domain_name),
            )
            if self.convention is None:
                self.convention = detect_convention(decoded)
                logger.info("openpi session %s: %s observations, cameras %s", self.id,
                            self.convention or "custom", printable("+".join(obs.cameras))[:200])
            overrides = {"prompt": obs.prompt} if obs.prompt else {}
            frame = ObservationFrame(seq=seq, image=obs.image, video=obs.video, prefix_actions=obs.prefix_actions,
                                     state=obs.state, overrides=overrides)
            item = PendingObservation(
                session_id=self.id, seq=seq, request=observation_request(self.config, frame, self.server.description),
                owner=self,
                received_at=received_at, decode_ms=(time.monotonic() - received_at) * 1e3,
            )
            try:
                replaced = self.server.queue.put(item)
            except QueueClosed:
                self._send_error(ErrorCode.ENGINE_ERROR, "the server is shutting down")
                return
            self.in_flight[seq] = item
            if replaced is not None:
                self._report_dropped(replaced, DropReason.SUPERSEDED)
        except ProtocolError as exc:
            self._send_error(exc.code, exc.message, exc.field)
        except Exception:  # noqa: BLE001 - a bug of ours must not end the session
            reference = uuid.uuid4().hex[:12]
            logger.exception("openpi session %s: failed to handle an observation (ref %s)", self.id, reference)
            self._send_error(ErrorCode.ENGINE_ERROR, f"the server failed on this observation (ref {reference})")

    def _send_error(self, code: str, message: str, field: str | None = None) -> None:
        self._put(error_text(code, message, field))

    def _report_dropped(self, item: PendingObservation, reason: str) -> None:
        self.in_flight.pop(item.seq, None)
        self.dropped += 1
        self._send_error("dropped", f"observation not answered ({reason}): a newer one replaced it"
                         if reason == DropReason.SUPERSEDED else f"observation not answered ({reason})")

    # -- outcomes from the engine worker (called on the event loop) ----------------------------------

    def on_dropped(self, item: PendingObservation, reason: str) -> None:
        if self.closed or self.in_flight.get(item.seq) is not item:
            return
        self._report_dropped(item, reason)

    def on_result(self, item: PendingObservation, outcome: EngineOutcome) -> None:
        if self.closed or self.in_flight.pop(item.seq, None) is not item:
            return
        if outcome.chunk is None:
            self._send_error(outcome.error.code, outcome.error.message, outcome.error.field)
            return
        self.answered += 1
        chunk = outcome.chunk
        total_ms = (time.monotonic() - item.received_at) * 1e3
        server_timing = {
            "infer_ms": outcome.engine_ms,
            "queue_ms": ((item.taken_at or item.enqueued_at) - item.enqueued_at) * 1e3,
            "model_ms": chunk.timing.model_ms,
            "total_ms": total_ms,
        }
        if self._last_total_ms is not None:
            server_timing["prev_total_ms"] = self._last_total_ms
        self._last_total_ms = total_ms
        reply = {"actions": np.ascontiguousarray(chunk.actions, dtype=np.float32), "server_timing": server_timing}
        self._put(packb(openpi_arrays(reply)), latest=True)
