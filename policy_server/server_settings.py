"""The WebSocket server's settings (``cosmos3-serve`` flags): one typed dataclass, read by the server and,
through its context (:mod:`policy_server.context`), by sessions, the HTTP sidecar and backends.

The settings types it holds live with their mechanism where that is on this floor (``RateLimit``,
``SessionLimits``, ``OpenpiSettings``); those whose mechanism is a session's are declared here
(:class:`PolicySessionLimits` for ``sessions/policy_sessions.py``, :class:`FrameBudget` for
``sessions/wire_intake.py``), so that nothing on the floor imports ``sessions/``.

The optional features have settings of their own (``SidecarSettings``, ``RecordingOptions``, each protocol
served at the edge its own), handed to them by whoever attaches them (``policy_server.assembly.cli.assemble_server``),
not to the server."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from robot_clients.wire_codec import FRAME_MAX_DEPTH, FRAME_MAX_VALUES

from .engine.watchdog import DEFAULT_ENGINE_TIMEOUT_S
from .engine.worker import DEFAULT_VIDEO_STEP_INTERVAL_S
from .foundation.auth import TokenSet
from .foundation.camera_intake import DEFAULT_MAX_DECODED_BYTES
from .foundation.connection_limits import (
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_MAX_PENDING_HANDSHAKES,
    DEFAULT_MAX_PENDING_HANDSHAKES_PER_PEER,
)
from .foundation.connection_supervisor import SessionLimits
from .foundation.rate_limit import RateLimit
from .openpi_settings import OpenpiSettings

# A 720p RGB frame is 2.8 MB; a 65-frame 256x256 clip 12.8 MB. The default fits the largest single image
# the models accept (4096x4096x3 = 48 MiB, `limits.max_image_side`) plus the msgpack around it, so the
# two limits agree for one camera; several cameras or a clip in one frame are bounded by this limit
# first (docs/security.md), and it keeps one client from making the server buffer arbitrary amounts.
LARGEST_IMAGE_BYTES = 4096 * 4096 * 3
DEFAULT_MAX_MESSAGE_BYTES = LARGEST_IMAGE_BYTES + 2**20
# Observer channels (/v1/observe): how many at once, and the frames per second each may send (subscribe and
# control frames of a few hundred bytes, at the pace of clicks).
DEFAULT_MAX_OBSERVERS = 16
OBSERVER_FRAME_RATE = RateLimit(rate_hz=20.0, burst=40)
# RoboLab runs a handful of environments per process; 16 covers a vectorised simulator's usual count
# while one connection cannot take more than a quarter of the default --max-sessions (64).
DEFAULT_MAX_SESSION_IDS = 16
# An environment that has sent nothing for this long has finished its episode (a RoboLab episode names a
# new id for every run): its slot and its recording episode are freed.
DEFAULT_SESSION_ID_IDLE_S = 30.0


@dataclass(frozen=True)
class PolicySessionLimits:
    """Bounds on the named policy sessions of one connection (``--max-session-ids``,
    ``--session-id-idle-timeout-s``; a timeout of 0 never expires a name), what its names share, and how
    many sessions one peer address may hold once it names some.

    The fairness unit is the connection: its names share its rate limit, its outbox and its turn in the
    engine queue (their observations ride in that turn's engine call together, up to the batch size).
    ``turns_per_connection`` (``--session-id-turns``) gives a connection's names that many turns instead
    of one: an operator's weight for a trusted connection stepping many environments (RoboLab).
    ``max_per_peer`` (``--max-sessions-per-peer``; None: ``--max-sessions`` less a quarter of it): a new name is refused
    once its peer address holds that many sessions, connections and names together, so one peer cannot
    fill every slot."""

    max_per_connection: int = DEFAULT_MAX_SESSION_IDS
    idle_timeout_s: float = DEFAULT_SESSION_ID_IDLE_S
    turns_per_connection: int = 1
    max_per_peer: int | None = None
    # The idle clock, in seconds: when a name was last used and when it is judged idle. A test turns one by
    # hand, so that a name expires when the test says and never because a loaded machine was slow.
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)

    @property
    def check_interval_s(self) -> float:
        """How often a connection with names looks for idle ones."""
        return max(0.05, min(1.0, self.idle_timeout_s / 4))


@dataclass(frozen=True)
class FrameBudget:
    """What one client frame may hold once decoded (``--max-frame-values``): elements (every value, a map's
    keys included) and the depth containers nest to; and what decoding a connection's refused frames may
    cost: ``decode_share`` CPU seconds a second on average (``--max-decode-share``), ``decode_burst_s`` at once.
    A connection past it is not read until its budget refills (``sessions.wire_intake``)."""

    max_values: int = FRAME_MAX_VALUES
    max_depth: int = FRAME_MAX_DEPTH
    # Only refused frames spend it (a frame that parses is paid for in its session's turn), and a robot's
    # refused frame takes well under a millisecond: 1 % of a core leaves four connections sending frames just
    # under the element budget back to back a twenty-fifth of one core between them.
    decode_share: float = 0.01
    decode_burst_s: float = 0.1


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # What one msgpack frame may hold (elements, nesting), counted before anything is built (sessions.wire_intake).
    frame_budget: FrameBudget = field(default_factory=FrameBudget)
    # Pixels one observation may decode to, and the longest frame side accepted (None: twice the largest
    # canvas side the model serves): the one media check (policy_server.foundation.camera_intake).
    max_decoded_bytes: int | None = DEFAULT_MAX_DECODED_BYTES
    max_image_side: int | None = None
    torch_threads: int | None = None
    warmup: bool = True
    # Requests of different sessions that can share transformer calls run as one batch (1: off).
    max_batch: int = 4
    max_batch_wait_ms: float = 0.0
    # Prepare the next observations' host inputs while a batch runs (BatchPolicy.overlap_host_prep).
    overlap_host_prep: bool = True
    # Keepalive pings run on the event loop, which never runs model code, so they flow during
    # inference; the timeout only has to cover the network, not the model.
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    # An ssl.SSLContext to serve wss:// (None: plain ws://).
    ssl_context: Any = None
    # How long shutdown waits for the running inference to finish before closing anyway.
    shutdown_grace_s: float = 30.0
    # openpi's protocol on `/` and `/openpi` (domain, horizon, mode, cameras); None turns it off.
    openpi: OpenpiSettings | None = field(default_factory=OpenpiSettings)
    # Bearer tokens that open every endpoint but /healthz and the dashboard's static files
    # (policy_server.foundation.auth); None: no authentication (the server is as open as the network it listens on).
    auth_tokens: TokenSet | None = None
    # Robot sessions (native + openpi) open at once; more are refused at the handshake with 503. Each policy
    # session a connection names (`session_id`) counts as one more.
    max_sessions: int = 64
    # How many policy sessions (`session_id`s) one connection may name, and when an idle one expires.
    policy_sessions: PolicySessionLimits = field(default_factory=PolicySessionLimits)
    # A connection must complete its handshake within this many seconds (websockets' open_timeout), and
    # at most this many (in all, and per peer address) may be waiting to (policy_server.foundation.connection_limits).
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    max_pending_handshakes: int = DEFAULT_MAX_PENDING_HANDSHAKES
    max_pending_handshakes_per_peer: int = DEFAULT_MAX_PENDING_HANDSHAKES_PER_PEER
    # Observations per second per session (token bucket); beyond it an observation is answered `rate_limited`.
    observation_rate: RateLimit = field(default_factory=RateLimit)
    # An engine call running longer than this fails its requests (`engine_timeout`) and the engine is
    # reloaded on a new worker thread (policy_server.engine.watchdog.EngineWatchdog); 0 turns the watchdog off.
    engine_timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S
    # While robots wait, a video rollout still gets one denoising step this often (BackgroundShare); 0: never.
    video_step_interval_s: float = DEFAULT_VIDEO_STEP_INTERVAL_S
    # Outbox bounds, reply and idle timeouts of every connection (policy_server.foundation.connection_supervisor).
    session_limits: SessionLimits = field(default_factory=SessionLimits)
    # Observer channels (/v1/observe) open at once; more are refused at the handshake with 503.
    max_observers: int = DEFAULT_MAX_OBSERVERS
    # Frames per second an observer may send (subscribe, control); beyond, they are answered `rate_limited`.
    observer_frame_rate: RateLimit = field(default_factory=lambda: OBSERVER_FRAME_RATE)
    # Browser origins allowed besides the server's own (policy_server.foundation.auth.OriginPolicy; `*`: any).
    allowed_origins: tuple[str, ...] = ()
