"""``cosmos3-serve``: load a Cosmos3 checkpoint and serve it to robots over WebSocket.

Examples::

    cosmos3-serve --model nvidia/Cosmos3-...           # a Hub id, or a local folder
    cosmos3-serve --tiny distilled --port 8000         # a tiny random checkpoint, built on the spot

The port opens first (``GET /healthz`` answers while the model loads); robots can connect to
``ws://HOST:PORT/v1/actions/realtime`` once ``/healthz`` says ``"status": "ready"``. SIGINT or SIGTERM
stops the server gracefully and the process exits 0.

Every option, its default and its help are in one parser (:func:`build_parser`); each default is the
constant of the module that enforces it, so ``--help`` and the code cannot disagree.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

# policy_server's package import sets OMP_WAIT_POLICY=PASSIVE; it must happen before torch loads.
import policy_server  # noqa: F401  (imported for that side effect, first)
from cosmos3_runtime.description import EngineLimits
from cosmos3_runtime.errors import CheckpointError
from cosmos3_runtime.quantization import parse_quantization
from cosmos3_runtime.random_checkpoints import VARIANTS
from robot_clients.client_frames import REQUEST_SETTINGS
from robot_clients.wire_codec import FRAME_MAX_DEPTH, FRAME_MAX_VALUES

from ..engine.backend import BackendFactory
from ..engine.loading import EngineLoader
from ..engine.watchdog import DEFAULT_ENGINE_TIMEOUT_S
from ..engine.worker import DEFAULT_VIDEO_STEP_INTERVAL_S, ActionEngine
from ..foundation import log_hygiene
from ..foundation.auth import OriginConfigError, OriginPolicy, TokenConfigError, TokenSet
from ..foundation.camera_intake import DEFAULT_MAX_DECODED_BYTES, MAX_SIDE_PER_CANVAS_SIDE
from ..foundation.connection_limits import (
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_MAX_PENDING_HANDSHAKES,
    DEFAULT_MAX_PENDING_HANDSHAKES_PER_PEER,
)
from ..foundation.connection_supervisor import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_OUTBOX_BYTES,
    DEFAULT_MAX_OUTBOX_FRAMES,
    DEFAULT_REPLY_TIMEOUT_S,
    SessionLimits,
)
from ..foundation.rate_limit import DEFAULT_BURST, DEFAULT_MAX_OBSERVATION_HZ, RateLimit
from ..openpi_settings import OPENPI_SETTINGS, CameraMapping, CameraMappingError, OpenpiSettings
from ..server_settings import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_OBSERVERS,
    DEFAULT_MAX_SESSION_IDS,
    DEFAULT_SESSION_ID_IDLE_S,
    FrameBudget,
    PolicySessionLimits,
    ServerSettings,
)
from ..sessions.endpoints import NO_ENDPOINTS
from ..sidecar_settings import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_JSON_VALUES,
    RetentionPolicy,
    SidecarConnectionLimits,
    SidecarSettings,
)
from ..vla_eval import ChunkPlan, MappingFileError, ObservationMapping, VlaEvalSettings
from ..vla_eval.translation import VLA_EVAL_SETTINGS
from .server import PolicyServer

if TYPE_CHECKING:
    from ..http.sidecar import HttpSidecar
    from ..recording.feature import RecordingOptions
    from ..sessions.native import Dialect

__all__ = ["assemble_server", "build_parser", "main", "serve_until_stopped", "server_from_args"]

# The most one robot request may cost by default, in default chunks of its domain: the next tier up on a
# distilled checkpoint (5x) passes; 200 steps with guidance at tier 720 on a base one (12.8x) does not.
DEFAULT_MAX_REQUEST_COST = 8.0

logger = logging.getLogger("policy_server")


# -- the options -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cosmos3-serve", description="Serve a Cosmos3 policy to robots over WebSocket (native protocol v1)."
    )
    for add_arguments in (
        _add_model_arguments,
        _add_sidecar_arguments,
        _add_bounds_arguments,
        _add_security_arguments,
        _add_runtime_arguments,
        _add_engine_arguments,
        _add_ray_arguments,
        _add_openpi_arguments,
        _add_vla_eval_arguments,
        _add_recording_arguments,
    ):
        add_arguments(parser)
    return parser


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The checkpoint to serve (or a tiny one) and where the WebSocket port listens (``ServerSettings``)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="checkpoint: a local folder or a Hub id (namespace/repo[/subfolder])")
    source.add_argument(
        "--tiny",
        choices=VARIANTS,
        metavar="VARIANT",
        help=f"build and serve a tiny random checkpoint of this variant ({', '.join(VARIANTS)})",
    )
    parser.add_argument("--host", default="0.0.0.0", help="interface to listen on (default: all, 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8000, help="WebSocket port; 0 picks a free one (default 8000)")


def _add_sidecar_arguments(parser: argparse.ArgumentParser) -> None:
    """The HTTP sidecar: its port, data folder, video retention and bodies (``SidecarSettings``)."""
    http = parser.add_argument_group(
        "HTTP sidecar",
        "video jobs (/v1/videos), one-shot actions, metadata, /healthz, /readyz, /metrics, "
        "the teleop /dashboard; "
        "see docs/http_api.md",
    )
    http.add_argument(
        "--http-port", type=int, default=8001, help="port of the HTTP sidecar; 0 picks a free one (default 8001)"
    )
    http.add_argument("--no-http", dest="http", action="store_false", help="serve the WebSocket port only")
    http.add_argument(
        "--sglang",
        action="store_true",
        help="serve SGLang's lock-step dialect on the robots' WebSocket path (docs/sglang.md) with --no-http too; "
        "on whenever the sidecar runs",
    )
    http.add_argument(
        "--data-dir",
        type=Path,
        default=_default_data_dir(),
        help="where video jobs and their results are kept across restarts (default: %(default)s)",
    )
    http.add_argument(
        "--video-retention-hours",
        type=float,
        default=24.0,
        help="finished video jobs are deleted this long after they finish (default 24)",
    )
    http.add_argument(
        "--video-storage-mib",
        type=float,
        default=2048.0,
        help="video jobs may take this much disk, inputs of queued jobs and finished videos together; "
        "the oldest finished go first beyond it, and a submission that still does not fit is "
        "refused with 507 (default 2048)",
    )
    http.add_argument(
        "--max-queued-videos",
        type=int,
        default=100,
        help="video jobs that may wait; more are refused with 429 (default 100)",
    )
    http.add_argument(
        "--max-body-mib",
        type=float,
        default=DEFAULT_MAX_BODY_BYTES / 2**20,
        help="largest HTTP request body, uploads included, in MiB (default 64)",
    )


def _add_bounds_arguments(parser: argparse.ArgumentParser) -> None:
    """What one observation, one HTTP request or one peer may cost (``ServerSettings``, ``SidecarSettings``)."""
    hardening = parser.add_argument_group(
        "request and connection bounds", "what one HTTP request or one peer may cost; see docs/security.md"
    )
    hardening.add_argument(
        "--max-decoded-mib",
        type=float,
        default=DEFAULT_MAX_DECODED_BYTES / 2**20,
        help="pixels one observation (WebSocket) or HTTP request may decode to (images and clips, as RGB), "
        "in MiB; checked from headers before decoding, more is refused (payload_too_large, 413) (default %(default)g)",
    )
    hardening.add_argument(
        "--max-image-side",
        type=int,
        default=None,
        help="longest camera frame side accepted, raw or encoded; larger is refused (invalid_image) from the "
        f"array's shape or the header (default: {MAX_SIDE_PER_CANVAS_SIDE}x the largest canvas side the model "
        "serves, 2560 for Cosmos3, within the model's own limit)",
    )
    hardening.add_argument(
        "--max-json-values",
        type=int,
        default=DEFAULT_MAX_JSON_VALUES,
        help="elements (numbers, lists, maps) a JSON or msgpack body may hold; more is refused "
        "with 413 before or while parsing (default %(default)d)",
    )
    hardening.add_argument(
        "--http-header-timeout-s",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT_S,
        help="an HTTP request's line and headers must arrive within this many seconds of the "
        "connection (or of the previous response); else 408 and closed (default %(default)g)",
    )
    hardening.add_argument(
        "--http-body-timeout-s",
        type=float,
        default=DEFAULT_BODY_TIMEOUT_S,
        help="an HTTP request's body must arrive within this many seconds of its headers; else "
        "408 and closed (default %(default)g)",
    )
    hardening.add_argument(
        "--http-max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="connections the HTTP sidecar holds at once; more are answered 503 and closed "
        "(default %(default)d, lowered if the open-file limit needs room for the robots)",
    )
    hardening.add_argument(
        "--http-max-connections-per-peer",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS_PER_PEER,
        help="connections one IP address may hold on the HTTP sidecar (default %(default)d)",
    )
    hardening.add_argument(
        "--http-max-buffered-mib",
        type=float,
        default=DEFAULT_MAX_BUFFERED_BODY_BYTES / 2**20,
        help="request bodies all HTTP requests together may hold while they arrive, in MiB; a "
        "request past it is answered 503 server_busy (default %(default)g)",
    )
    hardening.add_argument(
        "--handshake-timeout-s",
        type=float,
        default=DEFAULT_HANDSHAKE_TIMEOUT_S,
        help="a WebSocket-port connection must complete its handshake within this many seconds (default %(default)g)",
    )
    hardening.add_argument(
        "--max-pending-handshakes",
        type=int,
        default=DEFAULT_MAX_PENDING_HANDSHAKES,
        help="WebSocket-port connections that may be waiting for their handshake request at "
        "once; more are closed at once (default %(default)d)",
    )
    hardening.add_argument(
        "--max-pending-handshakes-per-peer",
        type=int,
        default=DEFAULT_MAX_PENDING_HANDSHAKES_PER_PEER,
        help="the same, per IP address (default %(default)d)",
    )


def _add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """Tokens, origins, TLS and the per-connection limits (``ServerSettings``, ``SessionLimits``)."""
    security = parser.add_argument_group("security and limits", "see docs/security.md")
    security.add_argument(
        "--tls-cert",
        "--certfile",
        dest="tls_cert",
        default=None,
        help="TLS certificate chain (PEM): serve wss:// and the sidecar over https://",
    )
    security.add_argument(
        "--tls-key", "--keyfile", dest="tls_key", default=None, help="TLS private key (PEM), if not inside --tls-cert"
    )
    security.add_argument(
        "--auth-token",
        default=os.environ.get("COSMOS3_AUTH_TOKEN") or None,
        help="bearer token required on every endpoint but /healthz and the dashboard's static "
        "files (default: $COSMOS3_AUTH_TOKEN; unset: no authentication)",
    )
    security.add_argument(
        "--auth-token-file",
        default=None,
        help="file of accepted tokens, one per line (# comments); combines with --auth-token",
    )
    security.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        help="robot sessions open at once, each `session_id` a connection names counting as one; more "
        "connections are refused with HTTP 503, more ids with `too_many_sessions` (default 64)",
    )
    security.add_argument(
        "--max-session-ids",
        type=int,
        default=DEFAULT_MAX_SESSION_IDS,
        help="policy sessions (`session_id`s) one connection may name at once; a new one beyond is "
        "refused with `too_many_sessions` and the connection goes on (default %(default)d)",
    )
    security.add_argument(
        "--max-request-cost",
        type=float,
        default=DEFAULT_MAX_REQUEST_COST,
        help="the most one robot request may cost, in default chunks of its domain (transformer forwards x "
        "tokens, from steps, guidance, tier and horizon); a costlier one is refused at `configure` or at the "
        "observation, naming this bound (default %(default)g; 0: unbounded)",
    )
    security.add_argument(
        "--session-id-turns",
        type=int,
        default=1,
        help="turns in the engine queue one connection's `session_id`s share: each connection is one robot "
        "for fairness, its names served together in its turn; more weights a trusted connection stepping "
        "many environments (RoboLab) (default %(default)d)",
    )
    security.add_argument(
        "--max-sessions-per-peer",
        type=int,
        default=None,
        help="sessions one peer address may hold, connections and `session_id`s together, before its new "
        "`session_id`s are refused with `too_many_sessions` (default: --max-sessions less a quarter of it, "
        "48 of 64: the others stay for other peers)",
    )
    security.add_argument(
        "--session-id-idle-timeout-s",
        type=float,
        default=DEFAULT_SESSION_ID_IDLE_S,
        help="a `session_id` that sends no observation for this long, with nothing of it queued or "
        "running, expires: its slot is freed and its recording episode ends (default %(default)g; 0: never)",
    )
    security.add_argument(
        "--max-observation-hz",
        type=float,
        default=DEFAULT_MAX_OBSERVATION_HZ,
        help="observations per second per session, beyond which they are answered "
        "`rate_limited` (default %(default)g; 0: no limit)",
    )
    security.add_argument(
        "--observation-burst",
        type=int,
        default=DEFAULT_BURST,
        help="observations a session may send at once above that rate (default %(default)d)",
    )
    security.add_argument(
        "--engine-timeout-s",
        type=float,
        default=DEFAULT_ENGINE_TIMEOUT_S,
        help="an engine call (one inference, one video step) running longer than this fails its "
        "requests with `engine_timeout` and the engine is reloaded (default %(default)g; 0: off)",
    )
    # Connections that hold resources without using them, browsers of other sites, log floods (issue 18).
    security.add_argument(
        "--max-observers",
        type=int,
        default=DEFAULT_MAX_OBSERVERS,
        help="observer channels (/v1/observe, the dashboard) open at once; more are refused with "
        "HTTP 503 (default %(default)d)",
    )
    security.add_argument(
        "--reply-timeout-s",
        type=float,
        default=DEFAULT_REPLY_TIMEOUT_S,
        help="a client whose oldest unread reply waits longer than this is closed with 1008 "
        "(default %(default)g; 0: off)",
    )
    security.add_argument(
        "--idle-timeout-s",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        help="a robot session that sends no observation for this long, with nothing of it "
        "queued or running, is closed with 1008 (default %(default)g; 0: off)",
    )
    security.add_argument(
        "--max-outbox-frames",
        type=int,
        default=DEFAULT_MAX_OUTBOX_FRAMES,
        help="replies that may wait unread per connection; beyond, it is closed with 1008 (default %(default)d)",
    )
    security.add_argument(
        "--max-outbox-mib",
        type=float,
        default=DEFAULT_MAX_OUTBOX_BYTES / 2**20,
        help="bytes of replies that may wait unread per connection, in MiB (default %(default)g)",
    )
    security.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin (scheme://host[:port]) allowed to open WebSockets and change state "
        "besides the server's own; repeat for several; `*` allows any (default: none)",
    )
    security.add_argument(
        "--log-repeat-burst",
        type=int,
        default=log_hygiene.DEFAULT_BURST,
        help="log lines of one kind written per --log-repeat-interval-s; the rest are counted in "
        "a `suppressed` summary (default %(default)d; 0: no limit)",
    )
    security.add_argument(
        "--log-repeat-interval-s",
        type=float,
        default=log_hygiene.DEFAULT_INTERVAL_S,
        help="the window of --log-repeat-burst, in seconds (default %(default)g)",
    )


def _add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """The model's device, dtype and profile file, warm-up, threads, frame bounds and batching
    (``ServerSettings``, the engine loader)."""
    parser.add_argument("--device", default=None, help="torch device, e.g. cpu, cuda, cuda:1 (default: best available)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the device's best)")
    parser.add_argument(
        "--quantization",
        default="none",
        metavar="{none,int8,fp8}",
        help="quantize the transformer's linear layers while they load, with diffusers' torchao config: int8 "
        "(weight-only, CPU and GPU) or fp8 (a GPU of compute capability 8.9 or newer); default none "
        "(docs/runtime.md, 'Quantized weights')",
    )
    parser.add_argument("--profiles", default=None, help="a policy profile file overriding the checkpoint's")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the warm-up requests")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads of the engine worker (default: every available core but one, at least 1)",
    )
    parser.add_argument(
        "--max-message-mib",
        type=float,
        default=DEFAULT_MAX_MESSAGE_BYTES / 2**20,
        help="largest frame accepted, in MiB; a bigger one closes the connection with 1009 (default %(default)g: "
        "a 4096x4096 RGB image and its envelope)",
    )
    parser.add_argument(
        "--max-frame-values",
        type=int,
        default=FRAME_MAX_VALUES,
        help="most elements (values, map keys, entries) one WebSocket msgpack frame may hold, counted before "
        "anything is built; more is answered payload_too_large (default %(default)d)",
    )
    parser.add_argument(
        "--max-frame-depth",
        type=int,
        default=FRAME_MAX_DEPTH,
        help="deepest nesting of one WebSocket msgpack frame (default %(default)d)",
    )
    parser.add_argument(
        "--max-decode-share",
        type=float,
        default=FrameBudget.decode_share,
        help="CPU seconds a second one connection's refused msgpack frames (past the element budget, malformed, "
        "or not parsing) may take to count and decode; a connection past it is not read until it is back "
        "within (default %(default)g; 0: off)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=4,
        help="most observations of different sessions run through shared transformer calls (1: no batching)",
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        help="longest an observation may wait for others to batch with (default 0: batch only what is waiting)",
    )
    parser.add_argument(
        "--overlap-host-prep",
        choices=("on", "off"),
        default="on",
        help="prepare the next waiting observations (validation, frame resize) on a host thread while the "
        "engine runs the current batch, so it does not wait for that work between batches (default on)",
    )


def _add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine worker: batches, turns, threads, warm-up and the watchdog (``ServerSettings``)."""
    turns = parser.add_argument_group(
        "engine turns", "how robots, HTTP clients and video jobs share the engine; see docs/security.md"
    )
    turns.add_argument(
        "--max-http-actions-in-flight",
        type=int,
        default=DEFAULT_MAX_IN_FLIGHT,
        help="action generations one HTTP client (its token; without auth, its address) may have in "
        "flight; more are refused with 429 `too_many_in_flight` (default %(default)d)",
    )
    turns.add_argument(
        "--video-step-interval-s",
        type=float,
        default=DEFAULT_VIDEO_STEP_INTERVAL_S,
        help="while robots wait, a video job still gets one denoising step this often, so it finishes "
        "under any robot load (default %(default)g; 0: only when no robot waits)",
    )
    parser.add_argument(
        "--prefix-cache-mb", type=float, default=256.0, help="memory for the text prefix cache (0: off)"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the transformer's decoder layers (warm-up then compiles each shape)",
    )


def _add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """Replicas on Ray Serve (``RayBackendSettings``)."""
    scale = parser.add_argument_group(
        "engine backend", "where the engine runs; see docs/deployment.md (the ray backend needs the `ray` extra)"
    )
    scale.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="local: one engine worker in this process (default); ray: replicas on Ray Serve",
    )
    scale.add_argument("--replicas", type=int, default=1, help="engine replicas with --backend ray (default 1)")
    scale.add_argument(
        "--ray-address",
        default=None,
        help="join this Ray cluster (e.g. auto, or HEAD:6379) instead of starting a local instance",
    )
    scale.add_argument(
        "--replica-gpus",
        type=float,
        default=None,
        help="GPUs per replica (default: 1 if the cluster has GPUs, else 0 = CPU replicas)",
    )
    scale.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs reserved per replica (default 1)")
    parser.add_argument("--shutdown-grace", type=float, default=30.0, help="seconds to let a running inference finish")


def _add_openpi_arguments(parser: argparse.ArgumentParser) -> None:
    """What openpi clients cannot say for themselves (``OpenpiSettings``)."""
    openpi = parser.add_argument_group(
        "openpi endpoint",
        "openpi clients connect to ws://HOST:PORT/ or /openpi and cannot choose these themselves; unset: the model's "
        "default domain, policy (inverse_dynamics takes T x H x W x 3 clips), the domain's defaults",
    )
    openpi.add_argument("--no-openpi", dest="openpi", action="store_false", help="do not serve / and /openpi")
    _add_setting_flags(openpi, "openpi", OPENPI_SETTINGS)
    openpi.add_argument(
        "--openpi-cameras",
        default=None,
        metavar="FILE_OR_JSON",
        help="camera mapping overriding the defaults per view point (see docs/openpi.md)",
    )
    openpi.add_argument(
        "--openpi-strict-state",
        action="store_true",
        help="refuse a robot state sent to a domain that does not condition on it (default: accept it, unused, "
        "counted in /metrics)",
    )
    openpi.add_argument(
        "--openpi-decode-video",
        action="store_true",
        help="also answer every chunk with the video the model predicted, `video` uint8 [T, H, W, 3], its decode "
        "time in server_timing's decode_ms (cosmos-framework's --decode-video; costs a VAE decode per chunk)",
    )


def _add_vla_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """vla-eval's endpoints and their settings (``VlaEvalSettings``)."""
    vla_eval = parser.add_argument_group(
        "vla-eval endpoint",
        "vla-eval's harness connects to ws://HOST:PORT/v1/vla-eval; an episode_start's `settings` override these; "
        "unset: the model's default domain, the domain's defaults",
    )
    vla_eval.add_argument("--no-vla-eval", dest="vla_eval", action="store_false", help="do not serve /v1/vla-eval")
    _add_setting_flags(vla_eval, "vla-eval", VLA_EVAL_SETTINGS)
    vla_eval.add_argument(
        "--vla-eval-chunk",
        default="step",
        choices=("step", "whole"),
        help="one action per observation from the current chunk (step, default), or the whole chunk per reply",
    )
    vla_eval.add_argument(
        "--vla-eval-ask-ahead",
        type=int,
        default=1,
        help="ask for the next chunk when this many actions of the current one remain (default 1)",
    )
    vla_eval.add_argument(
        "--vla-eval-execute", type=int, default=None, help="actions of each chunk played before the next (default: all)"
    )
    vla_eval.add_argument(
        "--vla-eval-mapping",
        default=None,
        metavar="FILE_OR_JSON",
        help="cameras, state, prompt and unused keys of vla-eval observations (see docs/vla_eval.md)",
    )
    vla_eval.add_argument(
        "--vla-eval-strict-state",
        action="store_true",
        help="refuse a robot state sent to a domain that does not condition on it (default: accept it, unused)",
    )


def _add_recording_arguments(parser: argparse.ArgumentParser) -> None:
    """Recording sessions as LeRobot datasets (``RecordingOptions``)."""
    recording = parser.add_argument_group(
        "recording",
        "sessions recorded as LeRobot datasets, replayed on the dashboard and by cosmos3-replay; see docs/recording.md",
    )
    recording.add_argument(
        "--record-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="record sessions into DIR (created 0700), one LeRobotDataset v3.0 folder per episode",
    )
    recording.add_argument(
        "--record-opt-in",
        action="store_true",
        help="record only the sessions that ask (configure `record: true`, the dashboard's "
        "toggle) instead of every session",
    )
    recording.add_argument(
        "--record-max-bytes",
        type=int,
        default=None,
        metavar="N",
        help="quota of DIR in bytes: the oldest recordings are deleted first (default: none)",
    )
    recording.add_argument(
        "--record-max-age-s",
        type=float,
        default=None,
        metavar="S",
        help="recordings older than this many seconds are deleted (default: kept)",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def _default_data_dir() -> Path:
    """``$XDG_DATA_HOME/cosmos3-policy-server`` (``~/.local/share/...``): jobs outlive the process."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "cosmos3-policy-server"


# -- settings from the options, the server assembled and run ---------------------------------------


def _add_setting_flags(group: argparse._ArgumentGroup, prefix: str, names: tuple[str, ...]) -> None:
    """A ``--PREFIX-<setting>`` flag for each request setting of ``names``, typed by the table, unset by default."""
    for setting in REQUEST_SETTINGS:
        if setting.name in names:
            group.add_argument(
                f"--{prefix}-{setting.option}",
                type=setting.parse_text,
                default=None,
                metavar=setting.types[0].__name__.upper(),
                help=setting.doc,
            )


def _flag_settings(args: argparse.Namespace, prefix: str, names: tuple[str, ...]) -> dict[str, Any]:
    """What the ``--PREFIX-<setting>`` flags of the settings ``names`` say, by setting name (``None``: unset)."""
    values = vars(args)
    return {
        setting.name: values[f"{prefix}_{setting.option.replace('-', '_')}"]
        for setting in REQUEST_SETTINGS
        if setting.name in names
    }


def _openpi_settings(args: argparse.Namespace) -> OpenpiSettings | None:
    if not args.openpi:
        return None
    return OpenpiSettings(
        requested=_flag_settings(args, "openpi", OPENPI_SETTINGS),
        cameras=CameraMapping.load(args.openpi_cameras),
        strict_state=args.openpi_strict_state,
        decode_video=args.openpi_decode_video,
    )


def _vla_eval_settings(args: argparse.Namespace) -> VlaEvalSettings | None:
    if not args.vla_eval:
        return None
    return VlaEvalSettings(
        requested=_flag_settings(args, "vla_eval", VLA_EVAL_SETTINGS),
        plan=ChunkPlan(chunk=args.vla_eval_chunk, ask_ahead=args.vla_eval_ask_ahead, execute=args.vla_eval_execute),
        mapping=ObservationMapping.load(args.vla_eval_mapping),
        strict_state=args.vla_eval_strict_state,
    )


def _sidecar_settings(args: argparse.Namespace) -> SidecarSettings | None:
    if not args.http:
        return None
    return SidecarSettings(
        data_dir=args.data_dir,
        host=args.host,
        port=args.http_port,
        retention=RetentionPolicy(
            max_age_s=args.video_retention_hours * 3600.0,
            max_bytes=int(args.video_storage_mib * 2**20),
            max_queued=max(1, args.max_queued_videos),
        ),
        max_body_bytes=int(args.max_body_mib * 2**20),
        max_actions_in_flight=max(1, args.max_http_actions_in_flight),
        max_decoded_bytes=int(args.max_decoded_mib * 2**20),
        max_json_values=max(1, args.max_json_values),
        max_buffered_body_bytes=int(args.http_max_buffered_mib * 2**20),
        connections=SidecarConnectionLimits(
            header_timeout_s=max(0.0, args.http_header_timeout_s),
            body_timeout_s=max(0.0, args.http_body_timeout_s),
            max_connections=max(1, args.http_max_connections),
            max_connections_per_peer=max(1, args.http_max_connections_per_peer),
        ),
    )


def assemble_server(
    load_engine: Callable[[], ActionEngine] | None,
    settings: ServerSettings,
    backend: BackendFactory | None = None,
    *,
    http: SidecarSettings | None = None,
    recording: RecordingOptions | None = None,
    vla_eval: VlaEvalSettings | None = None,
    sglang: bool = False,
) -> PolicyServer:
    """The server with its optional features attached at its edge: SGLang's lock-step dialect on the
    robots' path (``sglang``: ``--sglang``, and whenever the sidecar runs, which serves SGLang's bodies
    too), vla-eval's endpoints (``vla_eval``: on unless ``--no-vla-eval``), the recording (``recording``:
    ``--record-dir``) and the HTTP sidecar (``http``).

    The one place optional features are put together; each is imported only when it is wanted, so a
    WebSocket-only server that records nothing never loads FastAPI, pydantic, SGLang's dialect or the
    recorder.
    """
    dialects: tuple[Dialect, ...] = ()
    if sglang or http is not None:
        from ..http.requests import item_requests
        from ..sglang.lockstep_session import SglangDialect

        dialects = (SglangDialect(item_requests),)
    endpoints = NO_ENDPOINTS
    if vla_eval is not None:
        from ..vla_eval.session import vla_eval_endpoints

        endpoints = vla_eval_endpoints(vla_eval)
    server = PolicyServer(load_engine, settings, backend=backend, dialects=dialects, endpoints=endpoints)
    if recording is not None:  # first: a directory that cannot be made fails the start
        from ..recording.feature import RecordingFeature

        server.attach(RecordingFeature(server.context, recording))
    if http is not None:
        from ..http.sidecar import HttpSidecar

        server.attach(HttpSidecar(server.context, http))
    return server


def sidecar_of(server: PolicyServer) -> HttpSidecar | None:
    """The HTTP sidecar attached to ``server``, if any."""
    from ..http.sidecar import HttpSidecar

    return next((feature for feature in server.features if isinstance(feature, HttpSidecar)), None)


def _recording_options(args: argparse.Namespace) -> RecordingOptions | None:
    if args.record_dir is None:
        return None
    from ..recording.feature import RecordingOptions  # only a server that records loads the recorder

    return RecordingOptions(
        root=args.record_dir,
        max_bytes=args.record_max_bytes,
        max_age_s=args.record_max_age_s,
        every_session=not args.record_opt_in,
        close_timeout_s=max(1.0, args.shutdown_grace),
    )


def engine_loader(args: argparse.Namespace, source: str) -> EngineLoader:
    """How every backend loads the engine ``source`` from ``args``: the local worker on its thread, each Ray
    replica in its actor. One place, so a flag that shapes the engine (``--max-request-cost``) reaches both."""
    return EngineLoader(
        source=source,
        device=args.device,
        dtype=args.dtype,
        profiles_path=args.profiles,
        prefix_cache_mb=args.prefix_cache_mb,
        compile=args.compile,
        quantization=parse_quantization(args.quantization),
        torch_threads=args.torch_threads,
        warmup=args.warmup,
        limits=EngineLimits(max_chunk_cost=max(0.0, args.max_request_cost)),
    )


def _tiny_source(args: argparse.Namespace, workdir: Path) -> str:
    """``--model``, or the ``--tiny`` checkpoint built in ``workdir`` (a few seconds)."""
    if not args.tiny:
        return str(args.model)
    from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint

    source = build_tiny_checkpoint(workdir / f"tiny-{args.tiny}", variant=args.tiny)
    logger.info("built a tiny %s checkpoint at %s", args.tiny, source)
    return str(source)


def _engine_loader(args: argparse.Namespace, workdir: Path) -> Callable[[], ActionEngine]:
    """The function the engine worker calls, on its own thread, to build the engine."""

    def load() -> ActionEngine:
        # main() held a --model to its memory plan before the server started (_check_model_fits): building
        # Nano's transformer on the meta device again costs seconds of start-up. A --tiny one is checked here.
        loader = replace(engine_loader(args, _tiny_source(args, workdir)), memory_check=args.model is None)
        engine: ActionEngine = loader.load()
        return engine

    return load


def _ray_backend(args: argparse.Namespace, workdir: Path) -> BackendFactory:
    """The Ray backend's factory (imports Ray, so only for --backend ray). A --tiny checkpoint is built
    here, once, and its path handed to the replicas: fine for a local instance, not for remote nodes."""
    from ..ray.backend import RayBackendFactory
    from ..ray.deployment import RayBackendSettings

    settings = RayBackendSettings(
        replicas=max(1, args.replicas), address=args.ray_address, num_gpus=args.replica_gpus, num_cpus=args.replica_cpus
    )
    # Its make_backend takes the queue its own make_queue made (a ReplicaRouter), narrower than the protocol's.
    return RayBackendFactory(settings, engine_loader(args, _tiny_source(args, workdir)))  # type: ignore[return-value]


def _ssl_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.tls_cert, args.tls_key)
    return context


def server_from_args(args: argparse.Namespace, workdir: Path) -> PolicyServer:
    """The server ``cosmos3-serve`` runs for ``args``, assembled (:func:`assemble_server`), not started.

    ``workdir``: where a ``--tiny`` checkpoint is built when the engine loads."""
    ray = args.backend == "ray"
    return assemble_server(
        None if ray else _engine_loader(args, workdir),
        _server_settings(args),
        _ray_backend(args, workdir) if ray else None,
        http=_sidecar_settings(args),
        recording=_recording_options(args),
        vla_eval=_vla_eval_settings(args),
        sglang=args.sglang,
    )


def _server_settings(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        host=args.host,
        port=args.port,
        max_message_bytes=int(args.max_message_mib * 2**20),
        frame_budget=FrameBudget(
            max(1, args.max_frame_values), max(1, args.max_frame_depth), decode_share=max(0.0, args.max_decode_share)
        ),
        max_decoded_bytes=int(args.max_decoded_mib * 2**20),
        max_image_side=args.max_image_side,
        torch_threads=args.torch_threads,
        warmup=args.warmup,
        max_batch=max(1, args.max_batch),
        max_batch_wait_ms=max(0.0, args.batch_wait_ms),
        overlap_host_prep=args.overlap_host_prep == "on",
        shutdown_grace_s=args.shutdown_grace,
        openpi=_openpi_settings(args),
        ssl_context=_ssl_context(args),
        auth_tokens=TokenSet.load(args.auth_token, args.auth_token_file),
        max_sessions=max(1, args.max_sessions),
        policy_sessions=PolicySessionLimits(
            max(0, args.max_session_ids),
            max(0.0, args.session_id_idle_timeout_s),
            turns_per_connection=max(1, args.session_id_turns),
            max_per_peer=None if args.max_sessions_per_peer is None else max(1, args.max_sessions_per_peer),
        ),
        observation_rate=RateLimit(max(0.0, args.max_observation_hz), max(1, args.observation_burst)),
        engine_timeout_s=max(0.0, args.engine_timeout_s),
        video_step_interval_s=max(0.0, args.video_step_interval_s),
        handshake_timeout_s=max(0.1, args.handshake_timeout_s),
        max_pending_handshakes=max(1, args.max_pending_handshakes),
        max_pending_handshakes_per_peer=max(1, args.max_pending_handshakes_per_peer),
        max_observers=max(1, args.max_observers),
        session_limits=SessionLimits(
            max_outbox_frames=max(1, args.max_outbox_frames),
            max_outbox_bytes=int(args.max_outbox_mib * 2**20),
            reply_timeout_s=max(0.0, args.reply_timeout_s),
            idle_timeout_s=max(0.0, args.idle_timeout_s),
        ),
        allowed_origins=tuple(args.allowed_origin),
    )


async def serve_until_stopped(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="cosmos3-serve-") as workdir:
        server = server_from_args(args, Path(workdir))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        try:
            await server.start()
        except OSError as exc:  # a port already taken, an address this host does not have
            # Nothing was loaded yet (the sidecar binds before the model worker starts): just exit.
            logger.error(
                "cannot start (%s); choose other ports with --port / --http-port, or --no-http, "
                "and a writable --record-dir",
                exc,
            )
            return 2
        # The dashboard is on the sidecar's port when it runs; asked of it only then, so that a WebSocket-only
        # server never imports the sidecar (and with it FastAPI and pydantic).
        sidecar = sidecar_of(server) if args.http else None
        dashboard_port = sidecar.port if sidecar is not None else server.port
        logger.info("teleop dashboard: http://%s:%d/dashboard/", args.host, dashboard_port)
        ready = asyncio.ensure_future(server.wait_ready())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
        exit_code = 0
        if ready.done() and ready.exception() is not None:
            logger.error("could not load the model: %s", ready.exception())
            exit_code = 1
        elif not stopped.done():
            if args.backend == "ray":
                # ray.init (on a loading thread) installed Ray's own SIGTERM handler, which would kill the
                # process in the middle of the graceful stop: ours again, now that Ray is up.
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, stop.set)
            await stopped
        else:
            ready.cancel()
        logger.info("stopping")
        await server.shutdown()
        return exit_code


def _check_model_fits(args: argparse.Namespace) -> None:
    """The quantization against the device, and a ``--model`` against the memory it would need (the runtime's
    memory plan, from its config files alone); raises the runtime's ``CheckpointError``. A Ray backend's
    replicas load elsewhere and check there."""
    from cosmos3_runtime.checkpoints import CheckpointSource, inspect_checkpoint, resolve_device_and_dtype
    from cosmos3_runtime.memory_plan import check_fits
    from cosmos3_runtime.quantization import check_device

    quantization = parse_quantization(args.quantization)
    if args.backend == "ray":
        return
    device, dtype = resolve_device_and_dtype(args.device, args.dtype)
    check_device(quantization, device)
    if args.model is not None:
        info = inspect_checkpoint(CheckpointSource.parse(args.model).resolve(config_only=True))
        check_fits(info, device, dtype, quantization)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        CameraMapping.load(args.openpi_cameras)  # a bad mapping is a usage error, before anything starts
    except CameraMappingError as exc:
        parser.error(str(exc))
    try:
        ObservationMapping.load(args.vla_eval_mapping)
    except MappingFileError as exc:  # one line: a hostile file's refusal is not buried under the usage
        parser.exit(2, f"{parser.prog}: error: {' '.join(str(exc).split())}\n")
    if (
        args.record_opt_in or args.record_max_bytes is not None or args.record_max_age_s is not None
    ) and args.record_dir is None:
        parser.error("--record-opt-in, --record-max-bytes and --record-max-age-s need --record-dir")
    if args.tls_key and not args.tls_cert:
        parser.error("--tls-key needs --tls-cert")
    try:  # an unreadable token file is a usage error, before anything starts
        TokenSet.load(args.auth_token, args.auth_token_file)
    except TokenConfigError as exc:
        parser.error(str(exc))
    try:
        OriginPolicy(args.allowed_origin)
    except OriginConfigError as exc:
        parser.error(str(exc))
    try:  # refused in one line before a port is bound or a weight read: never left to the OOM killer
        _check_model_fits(args)
    except CheckpointError as exc:
        parser.exit(2, f"{parser.prog}: error: {' '.join(str(exc).split())}\n")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.log_level != "debug":
        # websockets logs every HTTP response (each /healthz probe) at INFO; sessions are logged by us.
        logging.getLogger("websockets").setLevel(logging.WARNING)
    # Client text in log lines is escaped, and a line repeated by a flood of clients is summarised.
    log_hygiene.install(args.log_repeat_burst, max(1.0, args.log_repeat_interval_s))
    return asyncio.run(serve_until_stopped(args))


if __name__ == "__main__":
    sys.exit(main())
