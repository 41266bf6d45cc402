"""Scripted demonstrations written as a LeRobot v3.0 dataset: ``cosmos3-reach-demos`` and ``cosmos3-gym-demos``.

- ``cosmos3-reach-demos``: :func:`~robot_clients.sim.reach_task.run_expert` on fresh cube places of the
  reach task (the MuJoCo arm, this project's own); with ``--task moving``,
  :func:`~robot_clients.sim.moving_task.run_moving_expert` on fresh paths of the moving-cube task, whose
  camera frame is its two-frame clip.
- ``cosmos3-gym-demos``: a gymnasium preset's own scripted expert (MetaWorld's policies), run in the
  simulator's virtualenv by :mod:`robot_clients.sim.gym_bridge` and handed over as an ``.npz``.

The dataset has one camera (``observation.images.front``, stored in the data file as PNG, LeRobot's
``image`` feature), ``observation.state`` (the robot's own state) and ``action`` (one row per frame), with
the layout, metadata and column types of :mod:`~policy_server.recording.lerobot_format`. Where the task's
goal is (the cube, the drawer) is not stored: a policy trained on the dataset can only learn it from the
camera. It lives beside the recorder because it writes the recorder's format.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cosmos3_runtime.lerobot_layout import (
    ANSWERED_KIND,
    DATA_PATH,
    EPISODES_PATH,
    INFO_PATH,
    PREFIX_ROWS,
    RESPONSE_KIND,
    STATS_PATH,
    TASKS_PATH,
)
from robot_clients.chunker import RemoteChunkPolicy
from robot_clients.sim.gym_bridge import load_demonstrations

from . import lerobot_format as fmt

CAMERA_KEY = fmt.VIDEO_KEY_PREFIX + "front"
REACH_FPS = 20
# LeRobot's image feature in the data file: the encoded image and an (empty) path.
_IMAGE_TYPE = pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])


@dataclass(frozen=True)
class Demonstration:
    """One expert episode: ``images`` (T, H, W, 3) uint8, ``state`` (T, D) and ``actions`` (T, D); with
    ``chunks`` (T, H, D), every frame's label is the expert's whole chunk for it (DAgger's labels), written
    as a recording's answered chunks, and ``actions`` (what the arm executed) is not stored; ``prefix_rows``
    (T,) says how many leading rows of each frame's chunk are a given prefix (``action.prefix_rows``)."""

    images: np.ndarray
    state: np.ndarray
    actions: np.ndarray
    success: bool
    chunks: np.ndarray | None = None
    prefix_rows: np.ndarray | None = None


def _png(frame: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(frame).save(out, format="PNG", compress_level=1)
    return out.getvalue()


def write_dataset(
    out: Path, demonstrations: list[Demonstration], task: str, fps: int, robot_type: str
) -> dict[str, Any]:
    """Write ``demonstrations`` as a new LeRobot v3.0 dataset at ``out`` (one task, one camera).

    Demonstrations with ``chunks`` (all or none) are written as a recording is: ``action`` is each frame's
    chunk (H x D) and ``response.kind`` says it was answered, so ``cosmos3-train`` trains on the chunk as
    labelled instead of on the actions that followed the frame. With ``prefix_rows`` (all or none, chunks
    only) the frames also say how many leading rows of their chunk are a given prefix (``action.prefix_rows``)."""
    chunked = demonstrations[0].chunks is not None
    if any((d.chunks is not None) != chunked for d in demonstrations):
        raise ValueError("either every demonstration has chunk labels or none has")
    prefixed = demonstrations[0].prefix_rows is not None
    if any((d.prefix_rows is not None) != prefixed for d in demonstrations):
        raise ValueError("either every demonstration has prefix rows or none has")
    if prefixed and not chunked:
        raise ValueError("a given prefix is a chunk label's leading rows: prefix rows need chunk labels")
    images = [_png(frame) for d in demonstrations for frame in d.images]
    states_np = np.concatenate([d.state for d in demonstrations]).astype(np.float32)
    labels = [d.chunks if d.chunks is not None else d.actions for d in demonstrations]
    actions_np = np.concatenate(labels).astype(np.float32)
    lengths = [len(d.actions) for d in demonstrations]
    episode_index = np.concatenate([np.full(n, k, np.int64) for k, n in enumerate(lengths)])
    frame_index = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
    height, width_px = demonstrations[0].images.shape[1:3]
    features: dict[str, dict[str, Any]] = {
        "observation.state": {"dtype": "float32", "shape": (states_np.shape[1],), "names": None},
        "action": {"dtype": "float32", "shape": tuple(actions_np.shape[1:]), "names": None},
        **({RESPONSE_KIND: fmt.SCALAR_FEATURES[RESPONSE_KIND]} if chunked else {}),
        **({PREFIX_ROWS: {"dtype": "int64", "shape": (1,), "names": None}} if prefixed else {}),
        **fmt.DEFAULT_FEATURES,
    }
    frames = len(images)
    values: dict[str, np.ndarray] = {
        "observation.state": states_np,
        "action": actions_np,
        "timestamp": frame_index.astype(np.float32) / fps,
        "frame_index": frame_index,
        "episode_index": episode_index,
        "index": np.arange(frames, dtype=np.int64),
        "task_index": np.zeros(frames, np.int64),
        **({RESPONSE_KIND: np.full(frames, ANSWERED_KIND, dtype=object)} if chunked else {}),
        **({PREFIX_ROWS: np.concatenate([d.prefix_rows for d in demonstrations]).astype(np.int64)} if prefixed else {}),
    }
    schema = fmt.data_schema(features)
    hf = json.loads(schema.metadata[b"huggingface"])
    hf["info"]["features"] = {CAMERA_KEY: {"_type": "Image"}, **hf["info"]["features"]}
    schema = pa.schema([pa.field(CAMERA_KEY, _IMAGE_TYPE), *schema], metadata={"huggingface": json.dumps(hf)})
    columns = [pa.array([{"bytes": b, "path": None} for b in images], _IMAGE_TYPE)]
    columns += [fmt.column(values[name], features[name]) for name in features]
    (out / EPISODES_PATH).parent.mkdir(parents=True, exist_ok=False)
    (out / DATA_PATH).parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_arrays(columns, schema=schema), out / DATA_PATH)

    episodes = len(demonstrations)
    image_feature = {"dtype": "image", "shape": (height, width_px, 3), "names": ["height", "width", "channels"]}
    all_features = {CAMERA_KEY: image_feature, **features}
    info = fmt.info_json(all_features, fps, frames, 1, robot_type)
    info.update(total_episodes=episodes, splits={"train": f"0:{episodes}"})
    (out / INFO_PATH).write_text(json.dumps(info, indent=4))
    stats = {name: fmt.numeric_stats(values[name]) for name in ("observation.state", "action")}
    (out / STATS_PATH).write_text(
        json.dumps({f: {k: np.asarray(v).tolist() for k, v in s.items()} for f, s in stats.items()}, indent=4)
    )
    pq.write_table(fmt.tasks_table([task]), out / TASKS_PATH)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows = [
        {
            "episode_index": k,
            "tasks": [task],
            "length": lengths[k],
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": int(starts[k]),
            "dataset_to_index": int(starts[k + 1]),
            "meta/episodes/chunk_index": 0,
            "meta/episodes/file_index": 0,
        }
        for k in range(episodes)
    ]
    pq.write_table(pa.Table.from_pylist(rows), out / EPISODES_PATH)
    successes = sum(d.success for d in demonstrations)
    return {"episodes": episodes, "frames": frames, "expert_success": successes / max(episodes, 1)}


def collect(out: Path, episodes: int, seed: int, image_size: int = 128, episode_steps: int = 30) -> dict[str, Any]:
    """Record ``episodes`` reach-task expert episodes (cube places from ``seed``) into a new dataset at ``out``."""
    from robot_clients.sim.mujoco_arm import ArmEnvConfig
    from robot_clients.sim.reach_task import TASK, ReachExpert, ReachTaskEnv, run_expert

    config = ArmEnvConfig(
        image_height=image_size, image_width=image_size, wrist_camera=False, seed=seed, episode_steps=episode_steps
    )
    env = ReachTaskEnv(config)
    expert = ReachExpert(env)
    with env:
        demonstrations = [_demonstration(*run_expert(env, expert)) for _ in range(episodes)]
    return write_dataset(out, demonstrations, TASK, REACH_FPS, "cosmos3_mujoco_arm")


def collect_moving(
    out: Path,
    episodes: int,
    seed: int,
    image_size: int = 128,
    episode_steps: int = 40,
    chunk_labels: bool = False,
    perturbed: float = 0.0,
    student_prefixes: float = 0.0,
    max_prefix: int = 12,
    horizon: int | None = None,
    rollout_model: str | None = None,
    rollout_share: float = 0.0,
    clip_stride: int | None = None,
) -> dict[str, Any]:
    """Record ``episodes`` moving-cube expert episodes (paths from ``seed``) into a new dataset at ``out``.

    ``clip_stride``: ticks between the camera clip's two frames (default
    :data:`~robot_clients.sim.moving_task.CLIP_STRIDE`), the clip the policy trained on them will read.

    ``chunk_labels``: every frame is labelled with the expert's chunk for it, of ``horizon`` rows (default
    :data:`~robot_clients.sim.moving_task.CHUNK`; the policy trained on them answers chunks that long)
    (:func:`~robot_clients.sim.moving_task.run_labelled_episode`); then a share ``perturbed`` of the
    episodes (every ``round(1 / perturbed)``-th) is driven by a student that errs
    (:func:`~robot_clients.sim.moving_task.draw_student`), the expert labelling the states it visits; and a
    share ``student_prefixes`` of a student's frames is labelled with the expert's chunk continuing the next
    rows (1 to ``max_prefix``) the student is about to execute, written as ``action.prefix_rows``.

    ``rollout_model``: a checkpoint served by a ``cosmos3-serve`` started here drives a share
    ``rollout_share`` of the episodes (every ``round(1 / rollout_share)``-th, before the students' share is
    counted among the rest), its chunks executed as ``rtc`` does at a latency drawn per episode, 1 to
    ``max_prefix`` ticks (:func:`~robot_clients.sim.moving_task.run_policy_labelled_episode`): DAgger on
    the policy's own states and its own chunks as prefixes."""
    from robot_clients.sim.moving_task import (
        CHUNK,
        CLIP_STRIDE,
        TASK,
        MovingCubeExpert,
        MovingCubeTaskEnv,
        draw_student,
        run_labelled_episode,
        run_moving_expert,
        run_policy_labelled_episode,
    )
    from robot_clients.sim.mujoco_arm import ArmEnvConfig

    if perturbed and not chunk_labels:
        raise ValueError("a perturbed episode needs chunk labels: its executed actions are the student's")
    if student_prefixes and not perturbed:
        raise ValueError("a student's prefixes need perturbed episodes: the expert's own chunks are its labels")
    if horizon is not None and not chunk_labels:
        raise ValueError("a label's rows need chunk labels: without them a frame's label is the actions that follow")
    if horizon is not None and horizon < 2:
        raise ValueError(f"a chunk label needs at least 2 rows, got {horizon}")
    if (rollout_model is None) != (not rollout_share):
        raise ValueError("a rollout model and a share of episodes it drives go together")
    if rollout_model is not None and not chunk_labels:
        raise ValueError("a model's rollouts need chunk labels: its executed actions are not the expert's")
    config = ArmEnvConfig(
        image_height=image_size, image_width=image_size, wrist_camera=False, seed=seed, episode_steps=episode_steps
    )
    env = MovingCubeTaskEnv(config, CLIP_STRIDE if clip_stride is None else clip_stride)
    expert = MovingCubeExpert(env, horizon or CHUNK)
    rng = np.random.default_rng(seed + 1)
    demonstrations = []
    students = rollouts = rollout_successes = 0
    with env, _served_policy(rollout_model, horizon or CHUNK) as policy:
        for k in range(episodes):
            if not chunk_labels:
                demonstrations.append(_demonstration(*run_moving_expert(env, expert)))
                continue
            if policy is not None and _is_perturbed(k, rollout_share):
                delay = int(rng.integers(1, max_prefix + 1))
                steps, outcome = run_policy_labelled_episode(
                    env, expert, policy, delay, rng, student_prefixes, max_prefix
                )
                rollouts += 1
                rollout_successes += outcome.success
                demonstrations.append(_demonstration(steps, outcome, with_prefixes=True))
                continue
            errors = draw_student(rng) if perturbed and _is_perturbed(k - rollouts, perturbed) else None
            students += errors is not None
            steps, outcome = run_labelled_episode(env, expert, errors, rng, student_prefixes, max_prefix)
            demonstrations.append(_demonstration(steps, outcome, with_prefixes=bool(student_prefixes or policy)))
    summary = write_dataset(out, demonstrations, TASK, REACH_FPS, "cosmos3_mujoco_arm")
    summary["perturbed_episodes"] = students
    summary["clip_stride"] = env.clip_stride
    if policy is not None:
        summary["rollout_episodes"] = rollouts
        summary["rollout_success"] = rollout_successes / max(rollouts, 1)
    if student_prefixes or rollout_model is not None:
        summary["prefixed_frames"] = int(
            sum(int((d.prefix_rows > 0).sum()) for d in demonstrations if d.prefix_rows is not None)
        )
    return summary


@contextlib.contextmanager
def _served_policy(model: str | None, horizon: int) -> Iterator[RemoteChunkPolicy | None]:
    """``model`` served by a ``cosmos3-serve`` of its own on a free port, as the moving task's chunk policy of
    ``horizon`` rows (None: no model, nothing started)."""
    if model is None:
        yield None
        return
    from robot_clients.sim.reach_eval import TASKS, served_client

    with served_client(model, TASKS["moving"], horizon) as (client, _):
        yield RemoteChunkPolicy(client, timeout=60.0)


def _is_perturbed(k: int, share: float) -> bool:
    """Whether episode ``k`` is a student's when a share ``share`` of them is: evenly spread, not random."""
    return int((k + 1) * share) > int(k * share)


def _demonstration(steps: list[dict[str, Any]], outcome: Any, with_prefixes: bool = False) -> Demonstration:
    """One expert episode of the arm (its ticks' image, state and action) as a recorded demonstration;
    ``with_prefixes``: with each tick's ``prefix_rows``."""
    return Demonstration(
        np.asarray([s["image"] for s in steps]),
        np.asarray([s["state"] for s in steps], np.float32),
        np.asarray([s["action"] for s in steps], np.float32),
        outcome.success,
        np.asarray([s["chunk"] for s in steps], np.float32) if "chunk" in steps[0] else None,
        np.asarray([s["prefix_rows"] for s in steps], np.int64) if with_prefixes else None,
    )


def collect_gym(out: Path, preset: str, python: str, episodes: int, seed: int, fps: int) -> dict[str, Any]:
    """Record ``episodes`` of a gym preset's scripted expert, run by ``python`` (the simulator's virtualenv),
    into a new dataset at ``out``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demos.npz"
        command = [python, "-m", "robot_clients.sim.gym_bridge", "--preset", preset, "--episodes", str(episodes)]
        command += ["--seed", str(seed), "--expert-demos", str(path)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        recorded, task = load_demonstrations(str(path))
    demonstrations = [Demonstration(e["images"], e["state"], e["actions"], e["success"]) for e in recorded]
    return write_dataset(out, demonstrations, task, fps, preset)


def _finish(summary: dict[str, Any], started: float) -> int:
    summary["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(summary), flush=True)
    return 0


def reach_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cosmos3-reach-demos", description="the MuJoCo arm tasks' scripted experts (reach, moving cube)"
    )
    parser.add_argument("out", help="folder of the new dataset (must not exist)")
    parser.add_argument("--task", default="reach", choices=("reach", "moving"), help="the task (default: reach)")
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="seed of the cube places")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument(
        "--episode-steps",
        type=int,
        default=None,
        help="actions per episode (default: 30 reach, the reach takes ~12; 40 moving)",
    )
    parser.add_argument(
        "--chunk-labels",
        action="store_true",
        help="moving: label every frame with the expert's chunk for it (a recording's answered chunks)",
    )
    parser.add_argument(
        "--perturbed",
        type=float,
        default=0.0,
        help="moving, with --chunk-labels: the share of episodes driven by an erring student (DAgger)",
    )
    parser.add_argument(
        "--student-prefixes",
        type=float,
        default=0.0,
        help="moving, with --perturbed: the share of a student's frames labelled as rtc asks, the expert's chunk "
        "continuing the rows the student is about to execute (action.prefix_rows)",
    )
    parser.add_argument(
        "--max-prefix", type=int, default=12, help="with --student-prefixes: the longest prefix (cosmos3-train's)"
    )
    parser.add_argument(
        "--horizon",
        type=int,
        default=None,
        help="with --chunk-labels: the rows of each frame's label, the chunk the policy will answer (default 16)",
    )
    parser.add_argument(
        "--rollout-model",
        default=None,
        help="moving, with --chunk-labels: a checkpoint, served here, that drives a share of the episodes as rtc "
        "executes its chunks, the expert labelling its states and its own prefixes (DAgger on the policy)",
    )
    parser.add_argument(
        "--rollout-share",
        type=float,
        default=None,
        help="with --rollout-model: the share of episodes the model drives (default 0.5)",
    )
    parser.add_argument(
        "--clip-stride",
        type=int,
        default=None,
        help="moving: ticks between the camera clip's two frames (default: robot_clients.sim.moving_task's "
        "CLIP_STRIDE); the policy trained on the dataset reads that clip, and is evaluated with it",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        parser.error(f"{out} already exists")
    if args.horizon is not None and (not args.chunk_labels or args.horizon < 2):
        parser.error(f"--horizon needs --chunk-labels and at least 2 rows, got {args.horizon}")
    if not 0.0 <= args.student_prefixes <= 1.0:
        parser.error(f"--student-prefixes must be in [0, 1], got {args.student_prefixes}")
    if args.student_prefixes and not args.perturbed:
        parser.error("--student-prefixes needs --perturbed (the prefixes are a student's)")
    if args.max_prefix < 1:
        parser.error(f"--max-prefix must be at least 1, got {args.max_prefix}")
    if not 0.0 <= args.perturbed <= 1.0:
        parser.error(f"--perturbed must be in [0, 1], got {args.perturbed}")
    if (args.chunk_labels or args.perturbed) and args.task != "moving":
        parser.error("--chunk-labels and --perturbed are the moving task's")
    if args.perturbed and not args.chunk_labels:
        parser.error("--perturbed needs --chunk-labels (a student's actions are not the labels)")
    if args.rollout_model is not None and not args.chunk_labels:
        parser.error("--rollout-model needs --chunk-labels (the model's actions are not the labels)")
    if args.rollout_share is not None and args.rollout_model is None:
        parser.error("--rollout-share needs --rollout-model (the share of episodes that model drives)")
    if args.clip_stride is not None and args.task != "moving":
        parser.error("--clip-stride is the moving task's (the reach task's camera shows one frame)")
    if args.clip_stride is not None and args.clip_stride < 1:
        parser.error(f"--clip-stride must be at least 1, got {args.clip_stride}")
    rollout_share = 0.5 if args.rollout_share is None else args.rollout_share
    if not 0.0 < rollout_share <= 1.0:
        parser.error(f"--rollout-share must be in (0, 1], got {rollout_share}")
    started = time.monotonic()
    if args.task == "moving":
        summary = collect_moving(
            out,
            args.episodes,
            args.seed,
            args.image_size,
            args.episode_steps or 40,
            args.chunk_labels,
            args.perturbed,
            args.student_prefixes,
            args.max_prefix,
            args.horizon,
            args.rollout_model,
            rollout_share if args.rollout_model is not None else 0.0,
            args.clip_stride,
        )
    else:
        summary = collect(out, args.episodes, args.seed, args.image_size, args.episode_steps or 30)
    return _finish(summary, started)


def gym_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cosmos3-gym-demos", description="a gymnasium preset's own scripted expert (robot_clients.sim.gym_bridge)"
    )
    parser.add_argument("out", help="folder of the new dataset (must not exist)")
    parser.add_argument("--preset", required=True, help="a preset of robot_clients.sim.gym_bridge with an expert")
    parser.add_argument(
        "--python", required=True, help="the simulator virtualenv's python, e.g. .venv-metaworld/bin/python"
    )
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="seed of the environment's task variations")
    parser.add_argument("--fps", type=int, default=10, help="the control rate the policy will run at")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        parser.error(f"{out} already exists")
    started = time.monotonic()
    return _finish(collect_gym(out, args.preset, args.python, args.episodes, args.seed, args.fps), started)


if __name__ == "__main__":
    sys.exit(reach_main())
