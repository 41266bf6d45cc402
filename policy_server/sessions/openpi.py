"""One openpi client's connection to ``/`` or ``/openpi``: openpi's WebSocket protocol, served unchanged.

openpi clients (``openpi_client.websocket_client_policy.WebsocketClientPolicy``, the LIBERO, DROID and
ALOHA eval scripts, Isaac Lab bridges) speak a minimal protocol:

* on connect the server sends one binary msgpack frame: a metadata dict;
* then every binary frame from the client is an observation dict, and the server answers each with one
  binary frame: an action dict, ``{"actions": H×D float32, "action": the same, "server_timing": {...}}``
  (``actions`` is openpi's key, ``action`` that of NVIDIA's cosmos-framework server, which RoboLab's and
  strands-robots' clients read), plus ``video`` (T×H×W×3 uint8) under ``--openpi-decode-video``;
* arrays are openpi's ``{b"__ndarray__": True, b"data", b"dtype", b"shape"}`` maps. openpi's unpacker
  looks for **bytes** keys, so that is how this session writes them (the shared wire codec reads both).

openpi clients never say which embodiment, horizon or mode they want, so those come from the server's
settings (:class:`~policy_server.openpi_settings.OpenpiSettings`, set by ``cosmos3-serve --openpi-*`` flags);
which cameras feed the model comes from a :class:`~policy_server.openpi_settings.CameraMapping`.

Errors: openpi's own server sends a traceback as a text frame and closes the connection. Here the
error goes out as a text frame too (openpi's client raises ``RuntimeError`` with it), but the
connection stays open and the next observation is served: a robot that sent one bad frame keeps going.
The text is ``"<code>: <message> (field: <key>)"`` with the stable codes of the native protocol.

An observation may name a ``session_id`` (a string; NVIDIA's RoboLab names one per parallel environment):
it is then served by that policy session of the connection (:mod:`.policy_sessions`), with its own
sequence, queue slot, turn and recording episode; the key is not passed on as an observation key.

Observations go through the server's request queue like native ones (latest wins, fair turns, the one
engine worker), so openpi robots and native robots share the model fairly. Replies go through the same
bounded outbox as native ones (:mod:`policy_server.foundation.outbox`): an unread action reply replaced by a newer
one becomes the text ``dropped: ...`` in its place, and a client that stops reading is closed with 1008
(:mod:`policy_server.foundation.connection_supervisor`), as is one that sends nothing for ``--idle-timeout-s``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection

from cosmos3_runtime.requests import ResolvedSettings
from robot_clients.client_frames import ObservationFrame, parse_session_id
from robot_clients.protocol import SESSION_ID, CodedError, DropReason, ErrorCode, ProtocolError
from robot_clients.wire_codec import WireFormatError, packb

from ..context import ServerContext
from ..engine.request_queue import EngineOutcome, PendingObservation
from ..foundation.camera_intake import canvas_side
from ..foundation.log_hygiene import printable
from ..metadata import openpi_metadata
from ..openpi_settings import OpenpiSettings
from ..session_config import SessionConfig, observation_request
from .base import Session
from .observation_rules import UNREAD_CHUNK_MESSAGE, ChunkReply
from .openpi_observation import (
    OpenpiObservation,
    detect_convention,
    openpi_decode,
    parse_openpi_observation,
)

logger = logging.getLogger(__name__)

OPENPI_PATHS = ("/", "/openpi")


def openpi_arrays(obj: Any) -> Any:
    """``obj`` with numpy arrays and scalars as openpi's bytes-keyed maps (what its unpacker expects)."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise WireFormatError(f"cannot send an array of dtype {obj.dtype}")
        return {
            b"__ndarray__": True,
            b"data": np.ascontiguousarray(obj).tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": list(obj.shape),
        }
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    if isinstance(obj, dict):
        return {key: openpi_arrays(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [openpi_arrays(value) for value in obj]
    return obj


def error_text(code: str, message: str, field: str | None = None) -> str:
    return CodedError(code, message, field).text()


class OpenpiSession(Session):
    """openpi's protocol: every binary frame an observation, every reply an action dict or an error text."""

    protocol = "openpi"
    id_prefix = "openpi-"
    bug_message = "the server failed on this observation (ref {reference})"

    def __init__(
        self,
        connection: ServerConnection,
        context: ServerContext[Session],
        settings: OpenpiSettings,
        *,
        parent: Session | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(connection, context, parent=parent, name=name)
        self.settings = settings
        self.config_error: ProtocolError | None = None
        self.convention: str | None = None
        self._next_seq = 0
        self._last_total_ms: float | None = None
        self._unused_state_logged = False

    def opened(self) -> None:
        try:
            self.set_config(self.settings.session_config(self.description))
            if self.settings.decode_video:
                self.make_room_for_videos()
        except ProtocolError as exc:
            # The operator's flags do not fit this model: every observation will be told why.
            self.config_error = exc
            logger.error("openpi session %s: the server's openpi settings are invalid: %s", self.id, exc.message)
        self.put(packb(openpi_arrays(self.metadata())))

    def make_room_for_videos(self) -> None:
        """Let the outbox hold the two replies with a predicted video that may wait in it (the one on the
        wire and the newest, which replaces any unread one): a 33-frame video at the 480 tier is up to 40 MB,
        past the outbox's default budget, and a client that has two observations in flight would otherwise
        be closed for a full outbox while it reads the first."""
        resolved = self._resolved()
        canvases = self.description.canvases.get(resolved.resolution_tier, ())
        frame_bytes = max((canvas.height * canvas.width * 3 for canvas in canvases), default=0)
        self.outbox.max_bytes += 2 * (resolved.action_horizon + 1) * frame_bytes

    def metadata(self) -> dict[str, Any]:
        error = self.config_error
        return openpi_metadata(
            self.description,
            self.id,
            self.config,
            self.settings.cameras,
            None if error is None else error_text(error.code, error.message, error.field),
            strict_state=self.settings.strict_state,
        )

    # -- replies: openpi's client raises RuntimeError with a text frame ------------------------------

    def encode_error(self, code: str, message: str, field: str | None, seq: int | None) -> str:
        return error_text(code, message, field)

    def encode_drop(self, seq: int, reason: str, message: str) -> str:
        if message == UNREAD_CHUNK_MESSAGE:
            why = ": a newer action reply replaced it before the client read it"
        else:
            why = ": a newer one replaced it" if reason == DropReason.SUPERSEDED else ""
        return error_text("dropped", f"observation not answered ({reason}){why}")

    def refuse_at_shutdown(self, seq: int) -> None:
        self.send_error(ErrorCode.ENGINE_ERROR, "the server is shutting down")

    def pack_chunk(self, reply: ChunkReply) -> bytes:
        assert isinstance(reply.body, bytes)
        return reply.body  # packed when made: openpi's reply carries no age

    # -- observations --------------------------------------------------------------------------------

    def spawn(self, name: str) -> OpenpiSession:
        session = OpenpiSession(self.connection, self.context, self.settings, parent=self, name=name)
        session.config_error = self.config_error
        return session

    def handle(self, message: bytes | str, received_at: float) -> None:
        if isinstance(message, str):
            raise ProtocolError(ErrorCode.BAD_FRAME, "send observations as binary msgpack frames, not text")
        self.take_rate(received_at)  # every openpi frame is an observation: refused before decoding
        if self.config_error is not None:
            raise self.config_error
        self.last_observation_at = received_at
        try:
            decoded = self.intake.unpack(message)
        except WireFormatError as exc:
            raise ProtocolError(ErrorCode.BAD_FRAME, exc.message, exc.field) from None
        name = None
        if isinstance(decoded, dict):  # a map: parse_openpi_observation refuses anything else
            for key in (SESSION_ID, SESSION_ID.encode()):
                name = decoded.pop(key, name)
        target = self.policy_session(None if name is None else parse_session_id(name))
        if target is self:
            self.observe_openpi(decoded, received_at)
        else:
            assert isinstance(target, OpenpiSession)
            target._guard(None, target.observe_openpi, decoded, received_at)

    def observe_openpi(self, decoded: Any, received_at: float) -> None:
        """One decoded observation of this (policy) session: its seq, its cameras and state, then admitted."""
        seq = self.frame_seq = self._next_seq
        self._next_seq += 1
        self.last_observation_at = received_at
        config = self._config()
        resolved = self._resolved()
        resolved_view = resolved.view_point
        obs = parse_openpi_observation(
            decoded,
            self.settings.cameras,
            resolved_view,
            self.context.frame_limits,
            video=config.action_mode == "inverse_dynamics",
            domain=self.description.domain(config.domain_name),
            strict_state=self.settings.strict_state,
        )
        if obs.unused_state:
            self.note_unused_state(obs.unused_state)
        if self.convention is None:
            self.convention = detect_convention(decoded)
            logger.info(
                "openpi session %s: %s observations, cameras %s",
                self.id,
                self.convention or "custom",
                printable("+".join(obs.cameras))[:200],
            )
        # Encoded cameras: headers checked now, decoded and composed on the decode pool, then admitted.
        fit_side = canvas_side(self.description, resolved.resolution_tier)
        decode = openpi_decode(obs, config.action_mode == "inverse_dynamics", self.context.frame_limits, seq, fit_side)
        self.observe(seq, received_at, self._admit, obs, decode)

    def _config(self) -> SessionConfig:
        assert self.config is not None, "configured from the server's settings when it opened"
        return self.config

    def _resolved(self) -> ResolvedSettings:
        """What the session's settings resolve to, kept when they were set (``set_config``)."""
        assert self.resolved_settings is not None, "configured from the server's settings when it opened"
        return self.resolved_settings

    def note_unused_state(self, keys: tuple[str, ...]) -> None:
        """State keys the domain does not read (it takes no state, or reads the other family's keys: joints
        against end-effector poses): counted (``/metrics``), logged once."""
        self.context.unused_state[self.protocol] += 1
        if not self._unused_state_logged:
            self._unused_state_logged = True
            assert self.config is not None
            logger.info(
                "openpi session %s: domain %r does not read %s (its profile takes no state, or another key "
                "family); accepted and not used (--openpi-strict-state refuses it)",
                self.id,
                self.config.domain_name,
                ", ".join(keys),
            )

    def _admit(self, obs: OpenpiObservation, received_at: float) -> None:
        seq = self.frame_seq
        assert seq is not None
        overrides = {"prompt": obs.prompt} if obs.prompt else {}
        frame = ObservationFrame(
            seq=seq,
            image=obs.image,
            video=obs.video,
            prefix_actions=obs.prefix_actions,
            state=obs.state,
            overrides=overrides,
        )
        request = replace(
            observation_request(self._config(), frame, self.description), decode_video=self.settings.decode_video
        )
        self.enqueue(frame, request, received_at)

    def encode_chunk(self, item: PendingObservation, outcome: EngineOutcome) -> ChunkReply:
        chunk = outcome.chunk
        assert chunk is not None
        total_ms = (time.monotonic() - item.received_at) * 1e3
        server_timing: dict[str, float | None] = {
            "infer_ms": outcome.engine_ms,
            "queue_ms": item.queue_ms,
            "model_ms": chunk.timing.model_ms,
            "total_ms": total_ms,
        }
        if self._last_total_ms is not None:
            server_timing["prev_total_ms"] = self._last_total_ms
        self._last_total_ms = total_ms
        actions = np.ascontiguousarray(chunk.actions, dtype=np.float32)
        # Both keys, one array: openpi's clients read `actions`, those written for NVIDIA's server `action`.
        # msgpack has no references, so the chunk travels twice: H×D×4 bytes more (1 KiB for 32×8).
        reply: dict[str, Any] = {"actions": actions, "action": actions, "server_timing": server_timing}
        if chunk.video is not None:
            reply["video"] = np.ascontiguousarray(chunk.video, dtype=np.uint8)
            server_timing["decode_ms"] = chunk.timing.decode_ms
        body = packb(openpi_arrays(reply))
        timing: dict[str, float | None] = {
            "queue_ms": item.queue_ms,
            "model_ms": chunk.timing.model_ms,
            "engine_ms": outcome.engine_ms,
            "total_ms": total_ms,
        }
        return ChunkReply(item.seq, actions, chunk.seed, timing, item.received_at, body, len(body))
