"""The two reference servers the transport and concurrency benchmarks compare ``policy_server`` against.

Each runs as its own process, like a real server, and is started by the benchmarks through
:class:`BaselineProcess`; run one by hand with::

    .venv/bin/python benchmarks/lockstep_baseline.py lockstep [--port 8010] [--view-point concat_view]
    .venv/bin/python benchmarks/lockstep_baseline.py echo [--port 8011]

``lockstep``: a minimal msgpack-over-WebSocket policy server of the kind robots use today, shaped after
openpi's ``WebsocketPolicyServer``: one handler per connection that sends a metadata frame, then loops
*receive an observation frame → run the model inline, on the event loop → send the reply*. While the
model runs, nothing else on the server moves: other connections, pings, and ``GET /healthz`` (answered,
as in openpi, by the websockets ``process_request`` hook, which runs on the same blocked loop). That is
the contrast the benchmarks measure. It runs the *same* engine as ``cosmos3-serve --tiny distilled``
(a tiny distilled checkpoint built offline, ``Cosmos3Engine.load``, the engine's own warm-up) with the
same thread policy as the policy server's worker (passive OpenMP wait, every core but one), so the
model costs the same on both sides; each reply carries ``server_timing.infer_ms`` (the
``predict_actions`` call) and ``model_ms`` so the client can subtract them.

Observations are openpi dicts: the cameras named by ``--cameras`` that are present are composed side
by side (a 4-D camera array, T×H×W×3, is a clip and makes the request ``inverse_dynamics``); ``prompt``
is used, anything else (state) ignored. Replies: ``{"actions": H×D float32, "server_timing": {...}}``.

``echo``: the transport floor. ``/echo`` sends every binary message back unchanged (the same bytes both
ways); ``/ack`` answers every message with a fixed frame the size of an action reply (the bytes of one
observation up, one reply down: the floor for a policy round trip). ``/healthz`` answers ready.

Both servers use the settings ``docs/protocol.md`` asks of any server on a LAN: compression off and no
frame size limit worth hitting (``max_size`` 64 MiB).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(BENCHMARKS))

# Importing the server package sets OMP_WAIT_POLICY=PASSIVE before torch loads, as the real server does.
from realtime_roundtrip import ServerProcess  # noqa: E402

from policy_server.engine.thread_policy import configure_worker_threads  # noqa: E402
from robot_clients.wire_codec import packb, unpackb  # noqa: E402

logger = logging.getLogger("lockstep_baseline")

MAX_FRAME_BYTES = 64 * 2**20
DEFAULT_CAMERAS = ("observation/image", "observation/wrist_image")
# What /ack answers: the size of a real reply (16×10 float32 actions plus timing), so the floor carries
# the same bytes down as a policy reply does.
ACK_FRAME = packb({"actions": np.zeros((16, 10), np.float32), "server_timing": {"infer_ms": 0.0, "model_ms": 0.0}})


# -- the lock-step policy server ---------------------------------------------------------------------


class LockstepPolicy:
    """The model call of the lock-step server: an openpi dict in, an action dict out (synchronous)."""

    def __init__(self, engine, cameras: tuple[str, ...], view_point: str | None, horizon: int) -> None:
        self.engine = engine
        self.cameras = cameras
        self.view_point = view_point
        self.horizon = horizon
        self.domain = engine.default_domain()

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        from cosmos3_runtime.requests import ActionRequest

        frames = [np.asarray(obs[key]) for key in self.cameras if key in obs]
        if not frames:
            raise KeyError(f"no camera among {', '.join(self.cameras)}")
        composed = np.concatenate(frames, axis=-2) if len(frames) > 1 else frames[0]
        clip = composed.ndim == 4
        request = ActionRequest(
            domain_name=self.domain,
            action_mode="inverse_dynamics" if clip else "policy",
            video=composed if clip else None,
            image=None if clip else composed,
            prompt=obs.get("prompt") or "",
            action_horizon=self.horizon,
            view_point=self.view_point,
        )
        started = time.perf_counter()
        chunk = self.engine.predict_actions(request)
        infer_ms = (time.perf_counter() - started) * 1e3
        return {"actions": chunk.actions, "server_timing": {"infer_ms": infer_ms, "model_ms": chunk.timing.model_ms}}

    def metadata(self) -> dict[str, Any]:
        return {
            "server": "lockstep-baseline",
            "domain_name": self.domain,
            "action_horizon": self.horizon,
            "cameras": list(self.cameras),
            "view_point": self.view_point,
        }


def load_policy(args: argparse.Namespace, workdir: Path) -> LockstepPolicy:
    """Build and warm the same tiny engine ``cosmos3-serve --tiny`` serves, on this (the loop's) thread."""
    threads = configure_worker_threads(args.torch_threads)
    from cosmos3_runtime.engine import Cosmos3Engine
    from cosmos3_runtime.random_checkpoints import build_tiny_checkpoint

    engine = Cosmos3Engine.load(build_tiny_checkpoint(workdir / f"tiny-{args.tiny}", variant=args.tiny))
    engine.warmup()
    logger.info("engine ready (%s), threads %s", args.tiny, threads)
    return LockstepPolicy(engine, tuple(args.cameras.split(",")), args.view_point, args.horizon)


async def lockstep_handler(policy: LockstepPolicy, websocket) -> None:
    """openpi's loop: metadata, then recv → infer (blocking the event loop) → send, until the client leaves."""
    from websockets.exceptions import ConnectionClosed

    await websocket.send(packb(policy.metadata()))
    while True:
        try:
            obs = unpackb(await websocket.recv())
            reply = policy.infer(obs)  # inline, on the event loop: the point of this baseline
            await websocket.send(packb(reply))
        except ConnectionClosed:
            return
        except Exception as exc:  # noqa: BLE001 - openpi sends the error as text; we keep the connection
            await websocket.send(f"{type(exc).__name__}: {exc}")


# -- the echo server -----------------------------------------------------------------------------------


async def echo_handler(websocket) -> None:
    """``/echo``: the same bytes back; ``/ack``: a reply-sized frame back."""
    from websockets.exceptions import ConnectionClosed

    ack = websocket.request.path.startswith("/ack")
    try:
        async for message in websocket:
            await websocket.send(ACK_FRAME if ack else message)
    except ConnectionClosed:
        pass


# -- serving -------------------------------------------------------------------------------------------


def health_hook(connection, request):
    """``GET /healthz`` through websockets' ``process_request`` (openpi's way); other paths upgrade."""
    if request.path.split("?", 1)[0] == "/healthz":
        return connection.respond(HTTPStatus.OK, json.dumps({"status": "ready"}) + "\n")
    return None


async def serve(args: argparse.Namespace, handler) -> None:
    from websockets.asyncio.server import serve as ws_serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with ws_serve(
        handler, args.host, args.port, compression=None, max_size=MAX_FRAME_BYTES, process_request=health_hook
    ) as server:
        port = server.sockets[0].getsockname()[1]
        # The line ServerProcess (benchmarks/realtime_roundtrip.py) waits for.
        logger.info("listening on ws://%s:%d/", args.host, port)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("lockstep", "echo"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--tiny", default="distilled", help="lockstep: tiny checkpoint variant (default distilled)")
    parser.add_argument(
        "--cameras",
        default=",".join(DEFAULT_CAMERAS),
        help="lockstep: camera keys composed side by side, left to right (those present)",
    )
    parser.add_argument("--view-point", default=None, help="lockstep: view point of every request")
    parser.add_argument("--horizon", type=int, default=16, help="lockstep: actions per chunk (default 16)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="lockstep: torch threads (default: every core but one, as the policy server)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("websockets").setLevel(logging.WARNING)
    if args.kind == "echo":
        asyncio.run(serve(args, echo_handler))
        return 0
    with tempfile.TemporaryDirectory(prefix="lockstep-baseline-") as workdir:
        policy = load_policy(args, Path(workdir))

        async def handler(websocket):
            await lockstep_handler(policy, websocket)

        asyncio.run(serve(args, handler))
    return 0


# -- starting it from a benchmark ----------------------------------------------------------------------


class BaselineProcess(ServerProcess):
    """This script as a subprocess on an ephemeral port; ``ServerProcess`` reads its port and stops it.

    Only the command differs from ``ServerProcess`` (which always starts ``policy_server.assembly.cli``).
    """

    def __init__(self, kind: str, args: list[str] | None = None) -> None:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            kind,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *(args or []),
        ]
        self.proc = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.port: int | None = None
        self.log: list[str] = []
        self._port_known = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()


@contextlib.contextmanager
def serving(starters: dict[str, Callable[[], ServerProcess]], timeout: float = 300.0):
    """Start every process (they load in parallel), wait until each answers ``/healthz`` ready, yield
    them by name, and stop them all on exit, whatever happened.

    SIGTERM to the benchmark is turned into ``SystemExit`` so that the cleanup also runs then (Ctrl-C
    raises ``KeyboardInterrupt``, which unwinds through it already).
    """
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    processes: dict[str, ServerProcess] = {}
    try:
        for name, start in starters.items():
            processes[name] = start()
        for name, process in processes.items():
            _wait_listening(name, process, timeout)
            process.wait_ready(timeout)
        yield processes
    finally:
        for process in processes.values():
            process.proc.terminate()
        for name, process in processes.items():
            try:
                process.proc.wait(30)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop within 30 s; killing it", name)
                process.proc.kill()
                process.proc.wait()
        signal.signal(signal.SIGTERM, previous)


def _wait_listening(name: str, process: ServerProcess, timeout: float) -> None:
    """Until the process has printed its port; fail at once, with its log, if it exits first."""
    deadline = time.monotonic() + timeout
    while process.port is None:
        if process.proc.poll() is not None or time.monotonic() > deadline:
            time.sleep(0.2)  # let the reader thread collect the last lines
            log = "".join(process.log[-20:])
            raise RuntimeError(f"{name} did not start (exit code {process.proc.poll()}):\n{log}")
        time.sleep(0.05)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
