"""vla-eval on the server's port: a harness's session on ``/v1/vla-eval``, and its HTTP control plane.

The frames, what an observation means and which action answers which observation are
:mod:`.translation`'s. The session puts them on a :class:`~policy_server.sessions.base.Session`, so a
harness is served like every robot: its observations wait in the same request queue (latest wins,
fair turns, the one engine worker), its replies leave through the same bounded outbox, its rate and idle
time are limited the same way, and it is recorded like the others (``--record-dir``; one recorded
episode per vla-eval episode).

The rules of the exchange, as vla-eval's client expects them:

* ``hello`` is answered by a ``hello`` (a ``protocol_version`` other than 1 by an ``error`` instead).
* ``episode_start`` resets the session: whatever is in flight is forgotten, a new episode begins with the
  task's text as its prompt and the settings of :class:`~.translation.VlaEvalSettings`, or those of the
  payload's ``settings`` map. ``mode: "live"`` is a real-time run.
* every ``observation`` gets at most one reply, in sync mode exactly one: the next action of the current
  chunk at once, or (the chunk spent) the first action of the next chunk when the engine answers. In a
  live run an observation that arrives while the engine works is answered by none: the harness fills
  that tick with its hold action.
* a frame that expects no reply (``episode_start``, ``episode_end``) and is refused has its error
  answered in place of the next observation's action, so a lock-step harness reads exactly one reply per
  observation; likewise an engine failure on a chunk asked for early. A frame vla-eval never sends (not
  msgpack, an unknown ``type``) is answered at once. The connection survives every error.

**What vla-eval adds to the port.** vla-eval's client speaks first on its connection and reads only
vla-eval frames, so it cannot share the robots' path as a first-frame dialect (the native session greets
every connection there with its ``metadata`` frame): its sessions get ``/v1/vla-eval``
(:class:`VlaEvalSession`). ``policy_server.cli.assemble_server`` hands these to the server
(:class:`policy_server.sessions.endpoints.EdgeEndpoints`) unless ``--no-vla-eval``.

The control plane: vla-eval's own model servers answer ``GET /health`` with ``200 {"status": "ok"}`` once
they can serve (its tooling uses it as the readiness probe), and ``GET /config`` with their configuration
(``{"applied": {}, "config": {...}}``; ``?key=value`` changes whitelisted settings there). Here
``/health`` (open, like ``/healthz``) is ``200 ok`` once the model is loaded and warm (``503 loading``
before, ``503 stopping`` while shutting down), and ``/config`` is read-only: a query is refused with
``422`` and its keys named, as vla-eval's servers refuse keys they do not know. Both are also served
under ``/v1/vla-eval/``. :func:`health_answer` and :func:`config_answer` compute the answers (status,
JSON body); the server writes them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import numpy as np
from websockets.asyncio.server import ServerConnection

from robot_clients.client_frames import ObservationFrame
from robot_clients.protocol import DropReason, ErrorCode, ProtocolError

from ..camera_intake import check_cameras, decoded_image
from ..context import ServerContext
from ..engine.request_queue import EngineOutcome, PendingObservation
from ..log_hygiene import printable
from ..metadata import public_model_name, served_weights
from ..session_config import SessionConfig, observation_request
from ..sessions.base import Session
from ..sessions.endpoints import EdgeEndpoints, HttpEndpoint, SessionEndpoint
from ..sessions.observation_rules import ChunkReply, Drop
from .translation import (
    IMAGES_KEY,
    PROTOCOL_VERSION,
    VLA_EVAL_PATH,
    VLA_EVAL_SETTINGS,
    ChunkPlan,
    ChunkPlayer,
    FrameType,
    VlaEvalFrame,
    VlaEvalObservation,
    VlaEvalSettings,
    action_frame,
    error_frame,
    frame,
    parse_frame,
    parse_observation,
)

logger = logging.getLogger(__name__)

SERVER_NAME = "Cosmos3PolicyServer"
EPISODE_START_KEYS = ("task", "mode", "recording", "settings")
MODES = ("sync", "live")
TASK_TEXT_KEYS = ("task_description", "description", "instruction", "language", "prompt")
# Engine requests are numbered apart from the harness's frame seqs, so that one is never taken for the other.
ENGINE_SEQ_BASE = 1 << 40


@dataclass
class Episode:
    """One vla-eval episode: its settings, its chunks, whether it runs on the wall clock."""

    number: int
    config: SessionConfig
    plan: ChunkPlan
    player: ChunkPlayer
    live: bool
    prompt: str


@dataclass
class Ask:
    """An observation on its way to the engine: the request seq, the episode step it is, its contents."""

    engine_seq: int
    step: int
    episode: int
    observation: VlaEvalObservation


class VlaEvalSession(Session):
    """vla-eval's model-server protocol (see the module docstring)."""

    protocol = "vla-eval"
    id_prefix = "vlaeval-"
    bug_message = "the server failed on this frame (ref {reference})"

    def __init__(
        self, connection: ServerConnection, context: ServerContext[Session], settings: VlaEvalSettings
    ) -> None:
        super().__init__(connection, context)
        self.settings = settings
        self.episode: Episode | None = None
        self.episodes = 0
        self.awaiting: int | None = None  # the latest observation's seq while it has no reply
        self.latest: int | None = None  # the latest observation's seq
        self.deferred: ProtocolError | None = None  # answered in place of the next observation's action
        self._asks: dict[int, Ask] = {}  # engine seq -> the observation it is
        self._next_engine_seq = ENGINE_SEQ_BASE
        self._unused_state_logged = False
        self.last_metrics: dict[str, Any] | None = None  # the last episode_end's

    # -- replies ---------------------------------------------------------------------------------------

    def encode_error(self, code: str, message: str, field: str | None, seq: int | None) -> bytes:
        return error_frame(code, message, field, seq if seq is not None else 0)

    def encode_drop(self, seq: int, reason: str, message: str) -> bytes:
        return error_frame("dropped", f"observation not answered ({reason}): {message}", None, seq)

    def pack_chunk(self, reply: ChunkReply) -> bytes:
        raise AssertionError("vla-eval replies are framed when made")

    def send_error(self, code: str, message: str, field: str | None = None, seq: int | None = None) -> None:
        ask = self._asks.pop(seq, None) if seq is not None else None
        if ask is None:
            super().send_error(code, message, field, seq)
            return
        # An engine request failed (decoding, the engine, shutdown): it answers the observation waiting for
        # it, or the next one; the next observation asks again.
        self._ask_failed(ask)
        for listener in self.listeners:
            listener.error(seq, code, message, field)
        self._answer_error(ProtocolError(code, message, field))

    def _ask_failed(self, ask: Ask | None) -> None:
        """An engine request of the current episode got no chunk: its next observation asks again."""
        if ask is not None and self.episode is not None and ask.episode == self.episode.number:
            self.episode.player.failed(ask.step)

    def _answer_error(self, error: ProtocolError) -> None:
        if self.awaiting is not None:
            seq, self.awaiting = self.awaiting, None
            super().send_error(error.code, error.message, error.field, seq)
        else:
            self.deferred = error

    def send_drop(self, drop: Drop) -> None:
        """An engine request not answered (counted by the rules): replaced by a newer one, or cancelled by a
        new episode, which the harness needs no word of; at shutdown the observation waiting for it is told."""
        self._ask_failed(self._asks.pop(drop.seq, None))
        for listener in self.listeners:
            listener.dropped(drop.seq, drop.reason, drop.message)
        if drop.reason == DropReason.SHUTDOWN:
            self._answer_error(ProtocolError(ErrorCode.ENGINE_ERROR, "the server is shutting down"))

    def refuse_at_shutdown(self, seq: int) -> None:
        self.drop(seq, DropReason.SHUTDOWN)

    # -- frames ----------------------------------------------------------------------------------------

    def handle(self, message: bytes | str, received_at: float) -> None:
        parsed = parse_frame(message, self.intake.unpack)
        self.frame_seq = parsed.seq
        if parsed.type is FrameType.HELLO:
            self._hello(parsed)
        elif parsed.type is FrameType.OBSERVATION:
            self._observation(parsed, received_at)
        elif parsed.type is FrameType.EPISODE_START:
            try:
                self._episode_start(parsed)
            except ProtocolError as error:  # no reply is read for it: the next observation carries it
                self.episode = None
                self.deferred = error
                for listener in self.listeners:
                    listener.error(parsed.seq, error.code, error.message, error.field)
                logger.info("vla-eval session %s: episode_start refused: %s", self.id, printable(error.text())[:300])
        elif parsed.type is FrameType.EPISODE_END:
            self._episode_end(parsed)
        else:  # the harness reports an error of its own
            logger.warning("vla-eval session %s: the harness reports %s", self.id, printable(str(parsed.payload))[:300])

    def _hello(self, parsed: VlaEvalFrame) -> None:
        version = parsed.payload.get("protocol_version", PROTOCOL_VERSION)
        if version != PROTOCOL_VERSION:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"protocol_version {version!r}: this server speaks vla-eval's protocol version {PROTOCOL_VERSION}",
                "protocol_version",
                parsed.seq,
            )
        self.put(frame(FrameType.HELLO, self.hello_payload(), parsed.seq))

    def hello_payload(self) -> dict[str, Any]:
        description = self.description
        served: dict[str, Any] = {
            "model": public_model_name(description.model),
            "variant": description.variant,
            "weights": served_weights(description),
            "session_id": self.id,
        }
        try:
            config, plan = self.settings.episode(description, {})
            resolved = config.resolved(description)
            stateless = resolved["state_dim"] is None
            served.update({name: resolved[name] for name in VLA_EVAL_SETTINGS})  # what the episode's settings became
            served.update(
                action_dim=resolved["raw_action_dim"],
                state_dim=resolved["state_dim"],
                unused_state_keys=list(self.settings.mapping.state)
                if stateless and not self.settings.strict_state
                else [],
                chunk=plan.chunk,
                ask_ahead=plan.ask_ahead,
                execute=plan.execute,
                mapping=self.settings.mapping.describe(),
                error=None,
            )
        except ProtocolError as error:
            served["error"] = error.text()
        payload: dict[str, Any] = {
            "harness_version": None,
            "protocol_version": PROTOCOL_VERSION,
            "model_server": SERVER_NAME,
            "capabilities": {"modes": list(MODES), "chunk": ["step", "whole"], "episode_settings": True},
            "cosmos3": served,
        }
        if self.settings.mapping.observation_params:
            payload["observation_params"] = dict(self.settings.mapping.observation_params)
        return payload

    def _episode_start(self, parsed: VlaEvalFrame) -> None:
        payload = parsed.payload
        for key in payload:
            if key not in EPISODE_START_KEYS:
                raise ProtocolError(
                    ErrorCode.INVALID_FIELD,
                    f"unknown episode_start key `{key}`; it has {', '.join(EPISODE_START_KEYS)}",
                    key,
                    parsed.seq,
                )
        task = payload.get("task", {})
        overrides = payload.get("settings", {})
        mode = payload.get("mode", "sync")
        for key, value, kind in (("task", task, dict), ("settings", overrides, dict), ("mode", mode, str)):
            if not isinstance(value, kind):
                raise ProtocolError(ErrorCode.INVALID_FIELD, f"`{key}` must be a {kind.__name__}", key, parsed.seq)
        if mode not in MODES:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"`mode` must be one of {', '.join(MODES)}, got {mode!r}", "mode", parsed.seq
            )
        config, plan = self.settings.episode(self.description, overrides)
        text = next((task[key] for key in TASK_TEXT_KEYS if isinstance(task.get(key), str) and task[key]), None)
        prompt = text if text is not None else config.prompt
        # A new episode: nothing of the last one is answered any more.
        self.cancel_in_flight(None)
        self.awaiting, self.deferred, self.latest = None, None, None
        first = self.config is None
        self.set_config(config)
        if not first:
            self.reset()
        self.episodes += 1
        self.episode = Episode(self.episodes, config, plan, ChunkPlayer(plan), mode == "live", prompt)
        logger.info(
            "vla-eval session %s: episode %d (%s, %s chunks) on %s: %s",
            self.id,
            self.episodes,
            mode,
            plan.chunk,
            config.domain_name,
            printable(prompt)[:200],
        )

    def _episode_end(self, parsed: VlaEvalFrame) -> None:
        metrics = parsed.payload.get("metrics")
        self.last_metrics = metrics if isinstance(metrics, dict) else None
        success = self.last_metrics.get("success") if self.last_metrics else None
        self.note("episode_end", {"success": bool(success) if isinstance(success, (bool, np.bool_)) else None})
        self.cancel_in_flight(None)
        self.awaiting = self.latest = None
        self.episode = None

    def _observation(self, parsed: VlaEvalFrame, received_at: float) -> None:
        seq = parsed.seq
        self.last_observation_at = received_at
        if self.deferred is not None:
            error, self.deferred = self.deferred, None
            raise ProtocolError(error.code, error.message, error.field, seq)
        episode = self.episode
        if episode is None:
            raise ProtocolError(
                ErrorCode.NOT_CONFIGURED, "send `episode_start` before the observations of an episode", None, seq
            )
        description = self.description
        resolved = episode.config.resolved(description)
        domain = description.domains[episode.config.domain_name]
        obs = parse_observation(
            parsed.payload,
            seq,
            self.settings.mapping,
            resolved["view_point"],
            domain,
            self.context.frame_limits,
            strict_state=self.settings.strict_state,
        )
        if obs.unused_state:
            self._note_unused_state(obs.unused_state, episode.config.domain_name)
        if episode.player.peek().ask:
            # Observations that go to the engine spend the session's rate; those answered from the chunk
            # already here cost a parse, so a simulator stepping faster than real time is not refused.
            self.take_rate(received_at, seq)
        if obs.encoded:  # the one media check now (headers, clip, decoded bytes), before it counts as a step
            cameras = [(f"{IMAGES_KEY}/{name}", value) for name, value in zip(obs.cameras, obs.frames)]
            check_cameras(cameras, self.context.frame_limits, seq, side_by_side=len(cameras) > 1, fit_side=None)
        decision = episode.player.observe()
        self.latest = seq
        if decision.action is not None:
            self.put(action_frame(decision.action, seq))
            self.awaiting = None
        else:
            self.awaiting = seq
        if not decision.ask:
            return
        ask = Ask(self._next_engine_seq, decision.step, episode.number, obs)
        self._next_engine_seq += 1
        self._asks[ask.engine_seq] = ask
        decode = None
        if obs.encoded:
            limits = self.context.frame_limits

            def decode() -> Ask:
                obs.frames = [
                    decoded_image(value, f"{IMAGES_KEY}/{name}", limits, ask.engine_seq)
                    for name, value in zip(obs.cameras, obs.frames)
                ]
                obs.seq = ask.engine_seq
                obs.compose(limits)
                return ask

        self.observe(ask.engine_seq, received_at, self._admit, ask, decode)

    def _note_unused_state(self, keys: tuple[str, ...], domain: str) -> None:
        self.context.unused_state[self.protocol] += 1
        if not self._unused_state_logged:
            self._unused_state_logged = True
            logger.info(
                "vla-eval session %s: domain %r does not condition on the robot's state; %s accepted and not used "
                "(--vla-eval-strict-state refuses it)",
                self.id,
                domain,
                ", ".join(keys),
            )

    def _admit(self, ask: Ask, received_at: float) -> None:
        episode = self.episode
        if episode is None or ask.episode != episode.number:
            self._asks.pop(ask.engine_seq, None)
            return  # the episode it belonged to is over
        obs = ask.observation
        assert obs.image is not None
        overrides = {"prompt": obs.prompt or episode.prompt}
        observation = ObservationFrame(seq=ask.engine_seq, image=obs.image, state=obs.state, overrides=overrides)
        request = observation_request(episode.config, observation, self.description)
        self.enqueue(observation, request, received_at)

    def encode_chunk(self, item: PendingObservation, outcome: EngineOutcome) -> ChunkReply:
        raise AssertionError("vla-eval chunks are played out by on_result")

    def _chunk_played(self, reply: ChunkReply) -> None:
        """Tell the listeners of a chunk of the current episode. It is this session's answer from the moment it
        arrives (its actions are played out from the session, never replaced in the outbox), so it is made and
        sent at once, whether or not an observation is waiting for its first action."""
        reply.timing["observation_age_ms"] = (time.monotonic() - reply.received_at) * 1e3
        for listener in self.listeners:
            listener.chunk_made(reply.seq, reply.actions, reply.timing)
        for listener in self.listeners:
            listener.chunk_sent(reply.seq, reply.actions, reply.timing, reply.seed)

    def on_result(self, item: PendingObservation, outcome: EngineOutcome) -> None:
        if not self.rules.engine_answered(item):
            return  # a new episode, the shutdown or the client's leaving: nobody wants these actions any more
        if outcome.chunk is None:
            error = outcome.error
            assert error is not None, "an outcome has a chunk or an error"
            self.send_error(error.code, error.message, error.field, item.seq)  # answers the observation waiting
            return
        ask = self._asks.pop(item.seq, None)
        episode = self.episode
        if ask is None or episode is None or ask.episode != episode.number:
            return
        chunk = outcome.chunk
        actions = np.ascontiguousarray(chunk.actions, dtype=np.float32)
        self.rules.chunk_made()
        timing: dict[str, float | None] = {
            "queue_ms": item.queue_ms,
            "model_ms": chunk.timing.model_ms,
            "engine_ms": outcome.engine_ms,
            "total_ms": (time.monotonic() - item.received_at) * 1e3,
        }
        self._chunk_played(ChunkReply(item.seq, actions, chunk.seed, dict(timing), item.received_at, None, 0))
        # A live run's whole chunks all go out, each to the latest observation (the harness keeps the newest
        # action it received); otherwise only an observation still waiting is answered.
        fresh = episode.live and episode.plan.chunk == "whole"
        seq = self.awaiting if self.awaiting is not None else self.latest if fresh else None
        reply = episode.player.arrived(actions, ask.step, awaiting=seq is not None)
        if reply is not None and seq is not None:
            self.awaiting = None
            self.put(action_frame(reply, seq, {"server_timing": timing}))


# -- the endpoints ---------------------------------------------------------------------------------

HEALTH_PATHS = ("/health", VLA_EVAL_PATH + "/health")
CONFIG_PATHS = ("/config", VLA_EVAL_PATH + "/config")


def health_answer(context: ServerContext[Any]) -> tuple[int, dict[str, Any]]:
    if context.stopping:
        return 503, {"status": "stopping"}
    if not context.ready:
        return 503, {"status": "loading"}
    return 200, {"status": "ok"}


def config_answer(context: ServerContext[Any], settings: VlaEvalSettings, query: str) -> tuple[int, dict[str, Any]]:
    """The endpoint's configuration; ``query`` (the request's query string) must be empty here."""
    keys = sorted(parse_qs(query, keep_blank_values=True))
    if keys:
        errors = [f"read-only: {key} (set it with the server's --vla-eval-* flags, or per episode)" for key in keys]
        return 422, {"errors": errors}
    current: dict[str, Any] = {
        "max_batch_size": context.settings.max_batch,
        "max_wait_time": context.settings.max_batch_wait_ms / 1e3,
        "chunk": settings.plan.chunk,
        "ask_ahead": settings.plan.ask_ahead,
        "execute": settings.plan.execute,
        "strict_state": settings.strict_state,
        "mapping": settings.mapping.describe(),
    }
    description = context.description
    if description is not None:
        try:
            config, _ = settings.episode(description, {})
            resolved = config.resolved(description)
            current.update({key: resolved[key] for key in (*VLA_EVAL_SETTINGS, "state_dim")})
        except ProtocolError as error:
            current["error"] = error.text()
    return 200, {"applied": {}, "config": current}


def vla_eval_endpoints(settings: VlaEvalSettings) -> EdgeEndpoints:
    """vla-eval's session path and HTTP answers, served with ``settings``."""

    def session(connection: ServerConnection, context: ServerContext[Session]) -> Session:
        return VlaEvalSession(connection, context, settings)

    def config(context: ServerContext[Session], query: str) -> tuple[int, dict[str, Any]]:
        return config_answer(context, settings, query)

    def health(context: ServerContext[Session], query: str) -> tuple[int, dict[str, Any]]:
        return health_answer(context)

    return EdgeEndpoints.of(
        SessionEndpoint(VLA_EVAL_PATH, session),
        *(HttpEndpoint(path, health, open=True) for path in HEALTH_PATHS),
        *(HttpEndpoint(path, config) for path in CONFIG_PATHS),
    )
