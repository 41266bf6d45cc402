"""``cosmos3-eval``: task success of a served policy on the reach or moving-cube task, per execution mode and delay.

Every episode runs the whole robot side against a real ``cosmos3-serve --model CKPT`` in its own process:
:class:`~robot_clients.client.PolicyClient` over the WebSocket, the
:class:`~robot_clients.chunker.ActionChunker` and the :class:`~robot_clients.control_loop.ControlLoop`
at 20 Hz on :class:`~robot_clients.sim.reach_task.ReachTaskEnv`. A cell of the table is one execution mode
(``wait``: ask for a chunk only when the last one is used up and hold meanwhile; ``replace``; ``blend``;
``rtc``, real-time chunking with the server conditioning the prefix) and one injected inference delay
(each chunk handed to the chunker that much later than the server answered). Episodes use cube places of
``--seed`` (keep it off the training data's seeds). Success rates come with a 95 % Wilson interval.

``--task moving`` runs the moving-cube task (:mod:`robot_clients.sim.moving_task`) and serves its policy
(``assets/moving_policy``) unless ``--model`` or ``--server`` says otherwise; ``--task reach`` (the default)
serves ``assets/reach_policy``. Besides the chunker's modes, ``lockstep`` is the baseline of a client that
waits for each chunk and executes it from its first action while the world goes on
(:mod:`robot_clients.sim.lockstep`, over the server's openpi route). A chunker mode with ``+forward``
(``rtc+forward``, ``replace+forward``, ...) also rolls the state sent forward to the chunk's start
(:class:`~robot_clients.chunker.ChunkerConfig`'s ``roll_state_forward``, VLASH's idea). ``--horizon`` is
the chunk asked for (the session's ``action_horizon``) and the moving task's expert chunk rows; unset, the
served domain's ``default_horizon`` from the server's metadata (the horizon its policy was trained for), or
the expert's :data:`~robot_clients.sim.moving_task.CHUNK` when no server runs. ``--clip-stride`` is the
moving task's ticks between the camera clip's two frames, which must be the ones the policy was trained on
(default :data:`~robot_clients.sim.moving_task.CLIP_STRIDE`, the shipped policy's).

Ablations (``--ablation``): ``black`` sends an all-black image, ``shuffled_state`` sends the state's
entries in a random order each tick; ``blind_expert`` runs the camera-blind scripted baseline locally;
``expert`` runs the scripted expert: on the reach task locally every tick, on the moving task as a chunk
policy through the same modes and injected delays as the server's (what delay costs an agent that knows the
cube's path).

``--out``'s ``results.json`` names its run (:class:`EvaluationRun`): the seed, the weights the server stated
(the checkpoint's SHA-256 and the quantization, ``--quantization`` passed to the server it starts), the
source's git commit, the command line, the horizon and the moving task's clip stride.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..chunker import ActionChunker, ChunkerConfig, ChunkPolicy
from ..client import PolicyClient
from ..control_loop import ChunkingAgent, ControlLoop
from . import moving_task, reach_task
from .demo import REACH_POLICY, ServerSubprocess
from .lockstep import OpenpiLockstepClient, run_lockstep_episode
from .mujoco_arm import ArmEnvConfig
from .reach_task import BlindReachExpert, ReachChunkPolicy, ReachExpert, ReachOutcome, ReachTaskEnv, run_expert

MODES = ("wait", "replace", "blend", "rtc", "lockstep")
CHUNKER_MODES = MODES[:4]  # lockstep is not the chunker's: robot_clients.sim.lockstep
FORWARD = "+forward"  # a chunker mode's suffix: the state sent is rolled forward to the chunk's start
ALL_MODES = (*MODES, *(m + FORWARD for m in CHUNKER_MODES))
ABLATIONS = ("none", "black", "shuffled_state", "blind_expert", "expert")
DELAYS_MS = (0, 100, 200, 300)
MOVING_POLICY = REACH_POLICY.parent / "moving_policy"


@dataclass(frozen=True)
class EvalTask:
    """What differs between the tasks ``cosmos3-eval`` runs."""

    name: str
    domain: str
    prompt: str
    model: Path  # the checkpoint served by default
    env: Callable[[ArmEnvConfig], ReachTaskEnv]
    episode_steps: int


TASKS = {
    "reach": EvalTask(
        "reach", reach_task.DOMAIN, reach_task.TASK, REACH_POLICY, ReachTaskEnv, reach_task.EPISODE_STEPS
    ),
    "moving": EvalTask(
        "moving",
        moving_task.DOMAIN,
        moving_task.TASK,
        MOVING_POLICY,
        moving_task.MovingCubeTaskEnv,
        moving_task.EPISODE_STEPS,
    ),
}


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a success rate."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class CellResult:
    mode: str
    delay_ms: int
    ablation: str
    episodes: int
    successes: int
    rate: float
    low: float
    high: float
    median_distance_cm: float
    chunk_latency_p50_ms: float | None
    achieved_hz: float | None
    stalls: int
    distances_cm: list[float]  # every episode's final distance, in episode order: the whole spread, not only the median


@dataclass(frozen=True)
class EvaluationRun:
    """What names a run of ``cosmos3-eval``: enough to tell two result files apart and to run one again."""

    seed: int  # of the cube places
    checkpoint: str | None  # the --model folder (None: a running --server's model, or no server)
    # What the server stated in its hello (cosmos3_runtime.served_weights): None where no server answered.
    checkpoint_sha256: str | None
    quantization: str | None
    git_commit: str | None  # of the source that ran (None outside a git checkout)
    git_dirty: bool | None  # the checkout had changes not committed
    command: list[str]  # the command line, program name first
    horizon: int  # the chunk asked for (--horizon, else the served domain's default_horizon)
    clip_stride: int | None = None  # the moving task's ticks between the clip's two frames (None: reach)


def source_commit() -> tuple[str | None, bool | None]:
    """The git commit of the checkout this module runs from, and whether it had uncommitted changes;
    (None, None) outside a checkout or without git."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit or None, bool(status.strip())


def provenance(
    seed: int,
    model: str | None,
    argv: list[str],
    served: dict[str, Any] | None,
    horizon: int,
    clip_stride: int | None = None,
) -> EvaluationRun:
    """The run's name; ``served``: the ``weights`` the server's hello stated (None: no server answered)."""
    commit, dirty = source_commit()
    sha256 = served.get("sha256") if served else None
    quantization = served.get("quantization") if served else None
    argv = ["cosmos3-eval", *argv]
    return EvaluationRun(seed, model, sha256, quantization, commit, dirty, argv, horizon, clip_stride)


def chunker_config(mode: str, control_hz: float, execute_horizon: int) -> ChunkerConfig:
    """The chunker's configuration of a chunker mode of :data:`ALL_MODES`."""
    forward = mode.endswith(FORWARD)
    mode = mode.removesuffix(FORWARD)
    if mode == "wait":  # ask only when the chunk is used up: the robot holds while the model thinks
        return ChunkerConfig(
            strategy="open_loop",
            control_hz=control_hz,
            execute_horizon=execute_horizon,
            request_threshold=0,
            roll_state_forward=forward,
        )
    return ChunkerConfig(
        strategy=mode, control_hz=control_hz, execute_horizon=execute_horizon, roll_state_forward=forward
    )


def run_cell(
    client: PolicyClient | None,
    mode: str,
    delay_ms: int,
    ablation: str,
    episodes: int,
    seed: int,
    control_hz: float = 20.0,
    execute_horizon: int = 8,
    episode_steps: int | None = None,
    task: EvalTask = TASKS["reach"],
    lockstep: OpenpiLockstepClient | None = None,
    horizon: int = moving_task.CHUNK,
) -> CellResult:
    """``episodes`` episodes of one cell. ``client`` answers the chunker's modes, ``lockstep`` the lockstep
    mode; the expert ablations need neither. ``horizon``: the rows of the moving task's expert chunks (a
    served chunk's are the client's configured ``action_horizon``)."""
    env = task.env(
        ArmEnvConfig(
            image_height=128,
            image_width=128,
            wrist_camera=False,
            seed=seed,
            episode_steps=episode_steps or task.episode_steps,
        )
    )
    successes, distances, latencies, rates, stalls = 0, [], [], [], 0
    with env:
        for episode in range(episodes):
            if ablation == "blind_expert" or (ablation == "expert" and task.name == "reach"):
                _, outcome = run_local_expert(env, task, blind=ablation == "blind_expert")
            elif mode == "lockstep":
                infer = lockstep_policy(env, task, ablation, lockstep, horizon)
                report = run_lockstep_episode(
                    env, infer, execute_horizon=execute_horizon, control_hz=control_hz, delay_s=delay_ms / 1e3
                )
                outcome = env.outcome()
                latencies.append(float(np.median(report.latencies_s)) * 1e3)
            else:
                policy: ChunkPolicy
                if ablation == "expert":
                    assert isinstance(env, moving_task.MovingCubeTaskEnv)
                    expert = moving_task.MovingCubeExpert(env, horizon)
                    policy = moving_task.ExpertChunkPolicy(expert, delay_s=delay_ms / 1e3)
                else:
                    assert client is not None
                    policy = ReachChunkPolicy(client, delay_s=delay_ms / 1e3, ablation=ablation, seed=seed + episode)
                config = chunker_config(mode, control_hz, execute_horizon)
                with ActionChunker(policy, config) as chunker:
                    loop = ControlLoop(env, ChunkingAgent(chunker), control_hz=control_hz)
                    loop_report = loop.run_episode()
                outcome = env.outcome()
                summary = loop_report.summary()
                if summary.get("chunk_latency_p50_ms") is not None:
                    latencies.append(summary["chunk_latency_p50_ms"])
                rates.append(summary["achieved_hz"])
                stalls += int(summary.get("stalls", 0))
            successes += outcome.success
            distances.append(outcome.distance)
    low, high = wilson(successes, episodes)
    return CellResult(
        mode,
        delay_ms,
        ablation,
        episodes,
        successes,
        successes / episodes,
        low,
        high,
        float(np.median(distances) * 100),
        float(np.median(latencies)) if latencies else None,
        float(np.median(rates)) if rates else None,
        stalls,
        [round(d * 100, 2) for d in distances],
    )


def run_local_expert(env: ReachTaskEnv, task: EvalTask, blind: bool) -> tuple[object, ReachOutcome]:
    """One episode of the task's scripted expert (or its camera-blind baseline) acting every tick, locally."""
    if task.name == "moving":
        assert isinstance(env, moving_task.MovingCubeTaskEnv)
        moving = moving_task.BlindMovingExpert(env) if blind else moving_task.MovingCubeExpert(env)
        return moving_task.run_moving_expert(env, moving)
    expert = BlindReachExpert(env) if blind else ReachExpert(env)
    return run_expert(env, expert)


def lockstep_policy(
    env: ReachTaskEnv,
    task: EvalTask,
    ablation: str,
    client: OpenpiLockstepClient | None,
    horizon: int = moving_task.CHUNK,
) -> Callable[[Mapping[str, Any]], np.ndarray]:
    """What the lock-step client asks: the server over openpi (the image blacked for ``black``), or the expert."""
    if ablation == "expert":
        assert isinstance(env, moving_task.MovingCubeTaskEnv)
        expert = moving_task.MovingCubeExpert(env, horizon)
        return lambda observation: expert.plan(observation["expert_view"])
    assert client is not None
    if ablation == "black":
        return lambda observation: client.infer({**observation, "image": np.zeros_like(observation["image"])})
    if ablation != "none":
        raise ValueError(f"the lockstep baseline runs no {ablation!r} ablation")
    return client.infer


def plot(results: list[CellResult], path: Path, title: str) -> None:
    """Success against injected delay, one line per mode (95 % intervals as bars), drawn with Pillow."""
    from PIL import Image, ImageDraw

    width, height, left, bottom, top, right = 720, 440, 70, 60, 40, 150
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    plot_w, plot_h = width - left - right, height - top - bottom
    delays = sorted({r.delay_ms for r in results})
    span = max(delays) or 1

    def xy(delay: float, rate: float) -> tuple[float, float]:
        return left + plot_w * delay / span, top + plot_h * (1 - rate)

    draw.rectangle([left, top, left + plot_w, top + plot_h], outline="black")
    for rate in (0.0, 0.25, 0.5, 0.75, 1.0):
        _, y = xy(0, rate)
        draw.line([left, y, left + plot_w, y], fill=(225, 225, 225))
        draw.text((left - 40, y - 6), f"{rate:.0%}", fill="black")
    for delay in delays:
        x, _ = xy(delay, 0)
        draw.text((x - 12, top + plot_h + 8), f"{delay} ms", fill="black")
    draw.text((left + plot_w / 2 - 80, height - 28), "injected inference delay", fill="black")
    draw.text((left, 12), title, fill="black")
    colours = {
        "wait": (120, 120, 120),
        "replace": (200, 60, 40),
        "blend": (40, 120, 200),
        "rtc": (30, 150, 60),
        "lockstep": (150, 60, 170),
        "wait+forward": (60, 60, 60),
        "replace+forward": (240, 150, 40),
        "blend+forward": (40, 200, 220),
        "rtc+forward": (200, 40, 150),
    }
    for i, mode in enumerate(m for m in ALL_MODES if any(r.mode == m for r in results)):
        cells = sorted((r for r in results if r.mode == mode and r.ablation == "none"), key=lambda r: r.delay_ms)
        if not cells:
            continue
        colour = colours[mode]
        offset = (i - 2) * 4
        points = [xy(r.delay_ms, r.rate) for r in cells]
        points = [(x + offset, y) for x, y in points]
        if len(points) > 1:
            draw.line(points, fill=colour, width=3)
        for r, (x, y) in zip(cells, points):
            _, y_low = xy(0, r.low)
            _, y_high = xy(0, r.high)
            draw.line([x, y_low, x, y_high], fill=colour, width=1)
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=colour)
        draw.line([width - right + 15, top + 20 * i + 6, width - right + 40, top + 20 * i + 6], fill=colour, width=3)
        draw.text((width - right + 46, top + 20 * i), mode, fill="black")
    image.save(path)


def table(results: list[CellResult]) -> str:
    lines = [
        "| mode | delay | ablation | success | 95 % interval | median distance | chunk p50 | control rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        latency = "n/a" if r.chunk_latency_p50_ms is None else f"{r.chunk_latency_p50_ms:.0f} ms"
        rate = "n/a" if r.achieved_hz is None else f"{r.achieved_hz:.1f} Hz"
        lines.append(
            f"| {r.mode} | {r.delay_ms} ms | {r.ablation} | {r.successes}/{r.episodes} ({r.rate:.0%}) | "
            f"{r.low:.0%}-{r.high:.0%} | {r.median_distance_cm:.1f} cm | {latency} | {rate} |"
        )
    return "\n".join(lines)


@contextmanager
def served_client(model: str, task: EvalTask, horizon: int | None = None) -> Iterator[tuple[PolicyClient, int]]:
    """``model`` served by a ``cosmos3-serve`` of its own (free ports), and a client configured for ``task``'s
    domain and prompt at seed 0, asking ``horizon`` rows (None: the served domain's ``default_horizon``).
    Yields the client and the rows it asks; the server is stopped on the way out."""
    server = ServerSubprocess(["--model", model, "--log-level", "info", "--http-port", "0"])
    url = server.start(timeout=300.0)
    try:
        with PolicyClient(url, connect_timeout=300.0) as client:
            rows = horizon or served_horizon(client, task)
            client.configure(domain_name=task.domain, action_horizon=rows, prompt=task.prompt, seed=0)
            yield client, rows
    finally:
        server.stop()


def served_horizon(client: PolicyClient | None, task: EvalTask) -> int:
    """The chunk a session of ``task``'s domain gets when it asks for none: the served domain's
    ``default_horizon`` (the server's metadata), or the moving expert's chunk when no server runs."""
    if client is None:
        return moving_task.CHUNK
    domain = client.metadata.get("domains", {}).get(task.domain, {})
    return int(domain.get("default_horizon") or moving_task.CHUNK)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cosmos3-eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="reach", choices=sorted(TASKS), help="the task (default: reach)")
    parser.add_argument(
        "--model", help="checkpoint folder the started server serves (default: the task's shipped policy in assets/)"
    )
    parser.add_argument("--server", default=None, help="ws://HOST:PORT of a running server instead")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=100_000, help="seed of the cube places (held out)")
    parser.add_argument(
        "--modes", default="rtc", help=f"comma-separated, of {', '.join(MODES)}, or a chunker mode with {FORWARD}"
    )
    parser.add_argument("--delays", default="0", help="comma-separated injected delays in ms")
    parser.add_argument("--ablations", default="none", help=f"comma-separated, of {', '.join(ABLATIONS)}")
    parser.add_argument("--execute-horizon", type=int, default=8)
    parser.add_argument(
        "--horizon",
        type=int,
        default=None,
        help="the chunk asked for: the session's action_horizon (and the openpi route's), the expert's chunk rows "
        "(default: the served domain's default_horizon; 16 without a server)",
    )
    parser.add_argument(
        "--quantization",
        default=None,
        metavar="{none,int8,fp8}",
        help="cosmos3-serve --quantization for the server this command starts (default: the server's)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="write results.json (the cells and the run's provenance), results.md and success_vs_delay.png here",
    )
    parser.add_argument(
        "--clip-stride",
        type=int,
        default=None,
        help="moving: ticks between the camera clip's two frames, as the policy was trained (default "
        f"{moving_task.CLIP_STRIDE}, the shipped policy's; the policies before its stage 5: 8)",
    )
    parser.add_argument("--title", default=None, help="the plot's title (default: the task's)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    task = TASKS[args.task]
    clip_stride = None
    if args.clip_stride is not None and task.name != "moving":
        parser.error("--clip-stride is the moving task's (the reach task's camera shows one frame)")
    if task.name == "moving":
        clip_stride = moving_task.CLIP_STRIDE if args.clip_stride is None else args.clip_stride
        if clip_stride < 1:
            parser.error(f"--clip-stride must be at least 1, got {clip_stride}")
        task = replace(task, env=partial(moving_task.MovingCubeTaskEnv, clip_stride=clip_stride))
    model = args.model or str(task.model)
    title = args.title or f"{task.name} task: success vs injected delay"
    modes = [m for m in args.modes.split(",") if m]
    delays = [int(d) for d in args.delays.split(",") if d]
    ablations = [a for a in args.ablations.split(",") if a]
    for mode in modes:
        if mode not in ALL_MODES:
            parser.error(f"unknown mode {mode!r}")
    for ablation in ablations:
        if ablation not in ABLATIONS:
            parser.error(f"unknown ablation {ablation!r}")

    if args.quantization is not None and args.server is not None:
        parser.error("--quantization applies to the server cosmos3-eval starts, not to a running --server")
    # Named before the episodes: the checkout as it was when it started, the weights as the server stated them.
    run = None
    needs_server = any(a not in ("blind_expert", "expert") for a in ablations)
    server, client, lockstep, results = None, None, None, []
    try:
        url = args.server
        if needs_server and url is None:
            # The openpi route's settings: what the lock-step client (an openpi client) cannot send itself.
            openpi = ["--openpi-domain", task.domain, "--openpi-prompt", task.prompt]
            if args.horizon is not None:  # unset, the openpi route answers the domain's default horizon
                openpi += ["--openpi-horizon", str(args.horizon)]
            quantization = ["--quantization", args.quantization] if args.quantization else []
            # The HTTP sidecar on a free port: the evaluation does not use it, and 8001 may be another server's.
            server = ServerSubprocess(
                ["--model", model, "--log-level", "info", "--http-port", "0", *openpi, "--openpi-seed", "0"]
                + quantization
            )
            url = server.start(timeout=300.0)
        if needs_server:
            client = PolicyClient(url, connect_timeout=300.0)
            client.connect()
            asked = {} if args.horizon is None else {"action_horizon": args.horizon}
            client.configure(domain_name=task.domain, prompt=task.prompt, seed=0, **asked)
        horizon = args.horizon or served_horizon(client, task)
        served = client.metadata.get("weights") if client is not None else None
        if args.out:
            run = provenance(args.seed, None if args.server else model, argv, served, horizon, clip_stride)
        for ablation in ablations:
            full_grid = ablation == "none" or (ablation == "expert" and task.name == "moving")
            cells = [(m, d) for m in modes for d in delays] if full_grid else [(modes[0], delays[0])]
            for mode, delay in cells:
                if mode == "lockstep" and needs_server and ablation != "expert":
                    # A connection of its own per cell: one left open through the other cells would be closed
                    # by the server's idle limit.
                    assert url is not None
                    lockstep = OpenpiLockstepClient(url)
                result = run_cell(
                    client,
                    mode,
                    delay,
                    ablation,
                    args.episodes,
                    args.seed,
                    execute_horizon=args.execute_horizon,
                    task=task,
                    lockstep=lockstep,
                    horizon=horizon,
                )
                if lockstep is not None:
                    lockstep.close()
                    lockstep = None
                results.append(result)
                print(json.dumps(asdict(result)), flush=True)
    finally:
        if lockstep is not None:
            lockstep.close()
        if client is not None:
            client.close()
        if server is not None:
            server.stop()
    print(table(results), flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        document = {"provenance": asdict(run) if run else None, "cells": [asdict(r) for r in results]}
        (out / "results.json").write_text(json.dumps(document, indent=2))
        (out / "results.md").write_text(table(results) + "\n")
        if any(r.ablation == "none" for r in results):
            plot(results, out / "success_vs_delay.png", title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
