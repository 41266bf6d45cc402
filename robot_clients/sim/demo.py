"""``cosmos3-demo-mujoco``: a simulated arm driven by the policy server in closed loop, for a fixed time.

What it does, from nothing:

1. starts ``cosmos3-serve --model assets/reach_policy`` (the small reach policy trained here by
   ``cosmos3-train``, shipped with the source; ``make reach-policy`` retrains it from nothing) in a
   subprocess on a free loopback port, unless ``--server`` names a running one; ``--tiny`` serves a
   random tiny checkpoint instead, on the plain arm scene;
2. connects the native realtime client and configures the session (domain, horizon, prompt);
3. runs :class:`~robot_clients.sim.mujoco_arm.MujocoArmEnv` at ``--control-hz`` for ``--duration``
   seconds: every tick the front camera is rendered offscreen, the :class:`ActionChunker` hands out the
   action for that tick and asks the server for the next chunk early (real-time chunking by default),
   and the arm's position servos follow the action;
4. prints the control rate achieved, chunk latency p50/p99, boundary stalls and dropped observations,
   and writes ``rollout.mp4`` (camera beside the executed and predicted action chunks) and
   ``summary.json`` into ``--output-dir``.

With the reach policy the scene is :class:`~robot_clients.sim.reach_task.ReachTaskEnv`: a cube placed at
random (seen only by the camera), ``--episodes`` episodes, each one's success printed (the hand within
3 cm of the point above the cube at the end). ``rollout.mp4`` is the first episode; the others are
``rollout-<k>.mp4``.

It talks to the server only over the WebSocket, as a robot would; the server runs in its own process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..chunker import ActionChunker, ChunkerConfig, ChunkStrategy, RemoteChunkPolicy
from ..client import PolicyClient
from ..control_loop import ChunkingAgent, ControlLoop

logger = logging.getLogger("cosmos3-demo-mujoco")

# The reach policy cosmos3-train makes (make reach-policy), shipped with the source.
REACH_POLICY = Path(__file__).resolve().parents[2] / "assets" / "reach_policy"

_LISTENING = re.compile(r"listening on ws://[^:]+:(\d+)/")


class ServerSubprocess:
    """``python -m policy_server.assembly.cli`` in a child process; its port read from its log."""

    def __init__(self, args: list[str]) -> None:
        self.command = [sys.executable, "-m", "policy_server.assembly.cli", "--host", "127.0.0.1", "--port", "0", *args]
        self.lines: list[str] = []
        self.port: int | None = None
        self._listening = threading.Event()
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 120.0) -> str:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read_log, name="server-log", daemon=True).start()
        if not self._listening.wait(timeout) or self.port is None:
            self.stop()
            raise RuntimeError("the policy server did not start listening:\n" + "".join(self.lines[-30:]))
        return f"ws://127.0.0.1:{self.port}"

    def _read_log(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            match = _LISTENING.search(line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._listening.set()
        self._listening.set()  # the process ended: stop waiting

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # graceful: the running inference finishes first
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cosmos3-demo-mujoco", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of closed-loop control (default 20)")
    parser.add_argument("--control-hz", type=float, default=20.0, help="control rate (default 20)")
    parser.add_argument(
        "--strategy",
        default=None,
        choices=[s.value for s in ChunkStrategy],
        help="how chunks are merged (default: blend for the reach policy, the mode it scores best in "
        "(docs/training.md); rtc, real-time chunking, otherwise)",
    )
    parser.add_argument("--horizon", type=int, default=16, help="actions per chunk (default 16)")
    parser.add_argument("--execute-horizon", type=int, default=8, help="actions executed of each chunk (default 8)")
    parser.add_argument("--domain", default="bridge_orig_lerobot", help="embodiment the model acts as")
    parser.add_argument("--prompt", default="push the blue cube to the left")
    parser.add_argument("--server", default=None, help="ws://HOST:PORT of a running server (default: start one)")
    parser.add_argument(
        "--model", default=str(REACH_POLICY), help="checkpoint the started server serves (default: the reach policy)"
    )
    parser.add_argument("--tiny", default=None, help="serve a random tiny checkpoint of this variant instead")
    parser.add_argument("--episodes", type=int, default=4, help="reach episodes (reach policy only)")
    parser.add_argument("--episode-steps", type=int, default=60, help="actions per reach episode (default 60)")
    parser.add_argument("--output-dir", default="demo-output", help="where rollout.mp4 and summary.json go")
    parser.add_argument("--no-video", dest="video", action="store_false", help="skip writing the video")
    parser.add_argument("--image-size", type=int, default=224, help="camera resolution, square (default 224)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--record-dir",
        default=None,
        help="the started server records the session there, as a LeRobot dataset (docs/recording.md)",
    )
    return parser


def run_demo(args: argparse.Namespace) -> dict[str, Any]:
    if args.tiny is None and args.server is None:
        if (Path(args.model) / "model_index.json").is_file():
            args.strategy = args.strategy or ChunkStrategy.BLEND.value
            return run_reach_demo(args)
        print(f"no checkpoint at {args.model} (make reach-policy trains it): serving a random tiny one", flush=True)
    args.tiny = args.tiny or "distilled"
    args.strategy = args.strategy or ChunkStrategy.REAL_TIME_CHUNKING.value
    return run_random_demo(args)


def run_reach_demo(args: argparse.Namespace) -> dict[str, Any]:
    """The trained reach policy on the reach task: ``args.episodes`` episodes, each one's success."""
    from .mujoco_arm import ArmEnvConfig
    from .reach_task import DOMAIN, TASK, ReachChunkPolicy, ReachTaskEnv
    from .rollout_video import RolloutRecorder

    record = ["--record-dir", args.record_dir] if args.record_dir else []
    server = ServerSubprocess(["--model", args.model, "--log-level", "info", *record])
    print(f"starting the policy server ({args.model})...", flush=True)
    url = server.start()
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    episodes: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    try:
        with PolicyClient(url, connect_timeout=300.0) as client:
            client.configure(domain_name=DOMAIN, action_horizon=args.horizon, prompt=TASK, seed=args.seed)
            config = ArmEnvConfig(
                control_hz=args.control_hz,
                image_height=128,
                image_width=128,
                wrist_camera=False,
                seed=args.seed,
                episode_steps=args.episode_steps,
            )
            chunker_config = ChunkerConfig(
                strategy=args.strategy, control_hz=args.control_hz, execute_horizon=args.execute_horizon
            )
            policy = ReachChunkPolicy(client, delay_s=0.0, ablation="none", seed=args.seed)
            env = ReachTaskEnv(config)
            with env:
                for k in range(args.episodes):
                    recorder = RolloutRecorder()
                    with ActionChunker(policy, chunker_config, on_chunk=recorder.on_chunk) as chunker:
                        loop = ControlLoop(env, ChunkingAgent(chunker), [recorder], control_hz=args.control_hz)
                        report = loop.run_episode()
                    outcome = env.outcome()
                    reports.append(report.summary())
                    video = output / ("rollout.mp4" if k == 0 else f"rollout-{k}.mp4")
                    if args.video:
                        title = f"reach episode {k}: {'success' if outcome.success else 'miss'}"
                        recorder.write_video(video, fps=args.control_hz, title=title)
                    episodes.append({"success": outcome.success, "distance_cm": round(outcome.distance * 100, 2)})
                    print(
                        f"  episode {k}: {'success' if outcome.success else 'miss'} "
                        f"(hand {outcome.distance * 100:.1f} cm from the goal)",
                        flush=True,
                    )
    finally:
        server.stop()
    summary = dict(reports[0])
    summary.update(
        episodes=episodes,
        success_rate=sum(e["success"] for e in episodes) / max(len(episodes), 1),
        strategy=args.strategy,
        horizon=args.horizon,
        execute_horizon=args.execute_horizon,
        model=args.model,
    )
    if args.video:
        summary["video"] = str(output / "rollout.mp4")
    if args.record_dir:
        summary["recordings"] = sorted(str(p) for p in Path(args.record_dir).iterdir() if not p.name.startswith("."))
    (output / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    return summary


def run_random_demo(args: argparse.Namespace) -> dict[str, Any]:
    """A random tiny checkpoint (or a running server) on the plain arm scene, for ``args.duration`` s."""
    from .mujoco_arm import ArmEnvConfig, MujocoArmEnv  # mujoco is needed from here on
    from .rollout_video import RolloutRecorder

    server = None
    url = args.server
    if url is None:
        record = ["--record-dir", args.record_dir] if args.record_dir else []
        server = ServerSubprocess(["--tiny", args.tiny, "--log-level", "info", *record])
        print(f"starting the policy server (tiny {args.tiny} checkpoint)...", flush=True)
        url = server.start()
    try:
        started = time.monotonic()
        # connect() retries while the server builds and warms the model (it answers 503 until then).
        with PolicyClient(url, connect_timeout=300.0) as client:
            print(
                f"connected to {url} after {time.monotonic() - started:.1f} s ({client.metadata.get('variant')} model)",
                flush=True,
            )
            client.configure(domain_name=args.domain, action_horizon=args.horizon, prompt=args.prompt, seed=args.seed)
            env = MujocoArmEnv(
                ArmEnvConfig(
                    control_hz=args.control_hz,
                    image_height=args.image_size,
                    image_width=args.image_size,
                    wrist_camera=False,
                    seed=args.seed,
                )
            )
            recorder = RolloutRecorder()
            config = ChunkerConfig(
                strategy=args.strategy, control_hz=args.control_hz, execute_horizon=args.execute_horizon
            )
            with env, ActionChunker(RemoteChunkPolicy(client), config, on_chunk=recorder.on_chunk) as chunker:
                loop = ControlLoop(
                    env, ChunkingAgent(chunker), [recorder], control_hz=args.control_hz, max_episode_s=args.duration
                )
                print(
                    f"running the arm for {args.duration:.0f} s at {args.control_hz:g} Hz "
                    f"({args.strategy}, {args.execute_horizon} of {args.horizon} actions per chunk)...",
                    flush=True,
                )
                report = loop.run_episode()
                client_dropped = dict(client.stats.dropped)
    finally:
        if server is not None:
            server.stop()

    summary = report.summary()
    if args.record_dir and server is not None:  # stopped gracefully: the recorder published the episode
        summary["recordings"] = sorted(str(p) for p in Path(args.record_dir).iterdir() if not p.name.startswith("."))
    summary.update(
        strategy=args.strategy,
        horizon=args.horizon,
        execute_horizon=args.execute_horizon,
        server_dropped_by_reason=client_dropped,
    )
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    if args.video:
        title = f"{args.strategy}: {args.execute_horizon}/{args.horizon} actions per chunk at {args.control_hz:g} Hz"
        summary["video"] = str(recorder.write_video(output / "rollout.mp4", fps=args.control_hz, title=title))
    (output / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.0f} ms"

    lines = [
        "",
        "closed-loop MuJoCo demo",
        f"  control rate achieved   {summary['achieved_hz']:.2f} Hz (target {summary['target_hz']:g} Hz, "
        f"{summary['steps']} steps in {summary['duration_s']:.1f} s, {summary['missed_ticks']} missed ticks)",
        f"  chunk latency           p50 {ms(summary['chunk_latency_p50_ms'])}, "
        f"p99 {ms(summary['chunk_latency_p99_ms'])} "
        f"({summary['chunks']} chunks)",
        f"  boundary stalls         {summary['stalls']} ({summary['stall_steps']} steps held)",
        f"  dropped observations    {summary['dropped']} (errors {summary['errors']}, "
        f"prefix overruns {summary['prefix_overruns']})",
        f"  step time               p50 {summary['step_ms_p50']:.1f} ms, p99 {summary['step_ms_p99']:.1f} ms",
    ]
    if "success_rate" in summary:
        done = sum(e["success"] for e in summary["episodes"])
        lines.append(f"  reach success           {done}/{len(summary['episodes'])} episodes ({summary['model']})")
    if summary.get("video"):
        lines.append(f"  video                   {summary['video']}")
    for recording in summary.get("recordings", []):
        lines.append(f"  recording               {recording}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("MUJOCO_GL", "egl")
    summary = run_demo(args)
    print(format_summary(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
