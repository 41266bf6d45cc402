"""``cosmos3-serve``: load a Cosmos3 checkpoint and serve it to robots over WebSocket.

Examples::

    cosmos3-serve --model nvidia/Cosmos3-...           # a Hub id, or a local folder
    cosmos3-serve --tiny distilled --port 8000         # a tiny random checkpoint, built on the spot

The port opens first (``GET /healthz`` answers while the model loads); robots can connect to
``ws://HOST:PORT/v1/actions/realtime`` once ``/healthz`` says ``"status": "ready"``. SIGINT or SIGTERM
stops the server gracefully and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import ssl
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

# policy_server's package import sets OMP_WAIT_POLICY=PASSIVE; it must happen before torch loads.
import policy_server  # noqa: F401  (imported for that side effect, first)

from . import log_hygiene
from .auth import OriginConfigError, OriginPolicy, TokenConfigError, TokenSet
from .cli_arguments import build_parser
from .endpoints import NO_ENDPOINTS
from .engine.backend import BackendFactory
from .engine.worker import ActionEngine
from .http.connections import ConnectionLimits
from .http.settings import SidecarSettings
from .recording_setup import RecordingOptions
from .server import PolicyServer
from .server_settings import ServerSettings
from .sessions.openpi_observation import CameraMapping, CameraMappingError, OpenpiSettings
from .sessions.rate_limits import RateLimit
from .sessions.supervisor import SessionLimits
from .videos.job_store import RetentionPolicy
from .vla_eval import ChunkPlan, MappingFileError, ObservationMapping, VlaEvalSettings

if TYPE_CHECKING:
    from .http.sidecar import HttpSidecar

__all__ = ["assemble_server", "main", "serve_until_stopped"]

logger = logging.getLogger("policy_server")


def _openpi_settings(args: argparse.Namespace) -> OpenpiSettings | None:
    if not args.openpi:
        return None
    return OpenpiSettings(
        domain_name=args.openpi_domain,
        action_horizon=args.openpi_horizon,
        action_mode=args.openpi_mode,
        view_point=args.openpi_view_point,
        prompt=args.openpi_prompt,
        cameras=CameraMapping.load(args.openpi_cameras),
        strict_state=args.openpi_strict_state,
    )


def _vla_eval_settings(args: argparse.Namespace) -> VlaEvalSettings | None:
    if not args.vla_eval:
        return None
    return VlaEvalSettings(
        domain_name=args.vla_eval_domain,
        action_horizon=args.vla_eval_horizon,
        view_point=args.vla_eval_view_point,
        prompt=args.vla_eval_prompt,
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
        connections=ConnectionLimits(
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
) -> PolicyServer:
    """The server with its optional features attached at its edge: SGLang's lock-step dialect on the
    robots' path, vla-eval's endpoints (``vla_eval``: on unless ``--no-vla-eval``), the recording
    (``recording``: ``--record-dir``) and the HTTP sidecar (``http``).

    The one place optional features are put together; each is imported only when it is wanted, so a
    WebSocket-only server that records nothing never loads FastAPI or the recorder.
    """
    from .sglang.lockstep_session import SGLANG_DIALECT

    endpoints = NO_ENDPOINTS
    if vla_eval is not None:
        from .vla_eval.endpoints import vla_eval_endpoints

        endpoints = vla_eval_endpoints(vla_eval)
    server = PolicyServer(load_engine, settings, backend=backend, dialects=(SGLANG_DIALECT,), endpoints=endpoints)
    if recording is not None:  # first: a directory that cannot be made fails the start
        from .recording.server_feature import RecordingFeature

        server.attach(RecordingFeature(server.context, recording))
    if http is not None:
        from .http.sidecar import HttpSidecar

        server.attach(HttpSidecar(server.context, http))
    return server


def sidecar_of(server: PolicyServer) -> HttpSidecar | None:
    """The HTTP sidecar attached to ``server``, if any."""
    from .http.sidecar import HttpSidecar

    return next((feature for feature in server.features if isinstance(feature, HttpSidecar)), None)


def _recording_options(args: argparse.Namespace) -> RecordingOptions | None:
    if args.record_dir is None:
        return None
    return RecordingOptions(
        root=args.record_dir,
        max_bytes=args.record_max_bytes,
        max_age_s=args.record_max_age_s,
        every_session=not args.record_opt_in,
        close_timeout_s=max(1.0, args.shutdown_grace),
    )


def _engine_loader(args: argparse.Namespace, workdir: Path) -> Callable[[], ActionEngine]:
    """The function the engine worker calls, on its own thread, to build the engine."""

    def load() -> ActionEngine:
        from cosmos3_runtime.engine import Cosmos3Engine

        source = args.model
        if args.tiny:
            from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint

            source = build_tiny_checkpoint(workdir / f"tiny-{args.tiny}", variant=args.tiny)
            logger.info("built a tiny %s checkpoint at %s", args.tiny, source)
        return Cosmos3Engine.load(
            source,
            device=args.device,
            dtype=args.dtype,
            profiles_path=args.profiles,
            prefix_cache_mb=args.prefix_cache_mb,
            compile=args.compile,
        )

    return load


def _ray_backend(args: argparse.Namespace, workdir: Path) -> BackendFactory:
    """The Ray backend's factory (imports Ray, so only for --backend ray). A --tiny checkpoint is built
    here, once, and its path handed to the replicas: fine for a local instance, not for remote nodes."""
    from .ray.backend import RayBackendFactory
    from .ray.deployment import EngineLoader, RayBackendSettings

    source = args.model
    if args.tiny:
        from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint

        source = str(build_tiny_checkpoint(workdir / f"tiny-{args.tiny}", variant=args.tiny))
    loader = EngineLoader(
        source=source,
        device=args.device,
        dtype=args.dtype,
        profiles_path=args.profiles,
        prefix_cache_mb=args.prefix_cache_mb,
        compile=args.compile,
        torch_threads=args.torch_threads,
        warmup=args.warmup,
    )
    settings = RayBackendSettings(
        replicas=max(1, args.replicas), address=args.ray_address, num_gpus=args.replica_gpus, num_cpus=args.replica_cpus
    )
    # Its make_backend takes the queue its own make_queue made (a ReplicaRouter), narrower than the protocol's.
    return RayBackendFactory(settings, loader)  # type: ignore[return-value]


def _ssl_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.tls_cert, args.tls_key)
    return context


async def serve_until_stopped(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="cosmos3-serve-") as workdir:
        settings = ServerSettings(
            host=args.host,
            port=args.port,
            max_message_bytes=int(args.max_message_mib * 2**20),
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
            observation_rate=RateLimit(max(0.0, args.max_observation_hz), max(1, args.observation_burst)),
            engine_timeout_s=max(0.0, args.engine_timeout_s),
            video_step_interval_s=max(0.0, args.video_step_interval_s),
            handshake_timeout_s=max(0.1, args.handshake_timeout_s),
            max_pending_handshakes=max(1, args.max_pending_handshakes),
            max_pending_handshakes_per_peer=max(1, args.max_pending_handshakes_per_peer),
            max_observers=max(1, args.max_observers),
            connection_limits=SessionLimits(
                max_outbox_frames=max(1, args.max_outbox_frames),
                max_outbox_bytes=int(args.max_outbox_mib * 2**20),
                reply_timeout_s=max(0.0, args.reply_timeout_s),
                idle_timeout_s=max(0.0, args.idle_timeout_s),
            ),
            allowed_origins=tuple(args.allowed_origin),
        )
        http, recording, vla_eval = _sidecar_settings(args), _recording_options(args), _vla_eval_settings(args)
        if args.backend == "ray":
            backend = _ray_backend(args, Path(workdir))
            server = assemble_server(None, settings, backend, http=http, recording=recording, vla_eval=vla_eval)
        else:
            loader = _engine_loader(args, Path(workdir))
            server = assemble_server(loader, settings, http=http, recording=recording, vla_eval=vla_eval)
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
        sidecar = sidecar_of(server)
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        CameraMapping.load(args.openpi_cameras)  # a bad mapping is a usage error, before anything starts
    except CameraMappingError as exc:
        parser.error(str(exc))
    try:
        ObservationMapping.load(args.vla_eval_mapping)
    except MappingFileError as exc:
        parser.error(str(exc))
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
