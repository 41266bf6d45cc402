"""``cosmos3-reach-demos``: scripted demonstrations of the reach task, written as a LeRobot v3.0 dataset.

Each episode is :func:`~robot_clients.sim.reach_task.run_expert` on a fresh cube place. The dataset has
one camera (``observation.images.front``, stored in the data file as PNG, LeRobot's ``image`` feature),
``observation.state`` (the arm in action units) and ``action`` (one row per frame), with the layout,
metadata and column types of :mod:`~policy_server.recording.lerobot_format`. The cube's place is not
stored: a policy trained on the dataset can only learn it from the camera. It lives beside the recorder
because it writes the recorder's format; the task and its expert are the robot side's.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from robot_clients.sim.mujoco_arm import ArmEnvConfig
from robot_clients.sim.reach_task import TASK, ReachExpert, ReachTaskEnv, run_expert

from . import lerobot_format as fmt

CAMERA_KEY = fmt.VIDEO_KEY_PREFIX + "front"
FPS = 20
# LeRobot's image feature in the data file: the encoded image and an (empty) path.
_IMAGE_TYPE = pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])


def _png(frame: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(frame).save(out, format="PNG", compress_level=1)
    return out.getvalue()


def collect(out: Path, episodes: int, seed: int, image_size: int = 128, episode_steps: int = 30) -> dict[str, Any]:
    """Record ``episodes`` expert episodes (cube places from ``seed``) into a new dataset at ``out``."""
    config = ArmEnvConfig(
        image_height=image_size, image_width=image_size, wrist_camera=False, seed=seed, episode_steps=episode_steps
    )
    env = ReachTaskEnv(config)
    expert = ReachExpert(env)
    images: list[bytes] = []
    states, actions, episode_index, frame_index = [], [], [], []
    lengths, successes = [], 0
    with env:
        for episode in range(episodes):
            steps, outcome = run_expert(env, expert)
            successes += outcome.success
            lengths.append(len(steps))
            for i, step in enumerate(steps):
                images.append(_png(step["image"]))
                states.append(step["state"])
                actions.append(step["action"])
                episode_index.append(episode)
                frame_index.append(i)
    states_np, actions_np = np.asarray(states, np.float32), np.asarray(actions, np.float32)
    width = actions_np.shape[1]
    features: dict[str, dict[str, Any]] = {
        "observation.state": {"dtype": "float32", "shape": (width,), "names": None},
        "action": {"dtype": "float32", "shape": (width,), "names": None},
        **fmt.DEFAULT_FEATURES,
    }
    frames = len(images)
    values: dict[str, np.ndarray] = {
        "observation.state": states_np,
        "action": actions_np,
        "timestamp": np.asarray(frame_index, np.float32) / FPS,
        "frame_index": np.asarray(frame_index, np.int64),
        "episode_index": np.asarray(episode_index, np.int64),
        "index": np.arange(frames, dtype=np.int64),
        "task_index": np.zeros(frames, np.int64),
    }
    schema = fmt.data_schema(features)
    hf = json.loads(schema.metadata[b"huggingface"])
    hf["info"]["features"] = {CAMERA_KEY: {"_type": "Image"}, **hf["info"]["features"]}
    schema = pa.schema([pa.field(CAMERA_KEY, _IMAGE_TYPE), *schema], metadata={"huggingface": json.dumps(hf)})
    columns = [pa.array([{"bytes": b, "path": None} for b in images], _IMAGE_TYPE)]
    columns += [fmt.column(values[name], features[name]) for name in features]
    (out / "meta" / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=False)
    (out / "data" / "chunk-000").mkdir(parents=True)
    pq.write_table(pa.Table.from_arrays(columns, schema=schema), out / fmt.DATA_PATH)

    image_feature = {"dtype": "image", "shape": (image_size, image_size, 3), "names": ["height", "width", "channels"]}
    all_features = {CAMERA_KEY: image_feature, **features}
    info = fmt.info_json(all_features, FPS, frames, 1, "cosmos3_mujoco_arm")
    info.update(total_episodes=episodes, splits={"train": f"0:{episodes}"})
    (out / fmt.INFO_PATH).write_text(json.dumps(info, indent=4))
    stats = {name: fmt.numeric_stats(values[name]) for name in ("observation.state", "action")}
    (out / fmt.STATS_PATH).write_text(
        json.dumps({f: {k: np.asarray(v).tolist() for k, v in s.items()} for f, s in stats.items()}, indent=4)
    )
    pq.write_table(fmt.tasks_table([TASK]), out / fmt.TASKS_PATH)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows = [
        {
            "episode_index": k,
            "tasks": [TASK],
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
    pq.write_table(pa.Table.from_pylist(rows), out / fmt.EPISODES_PATH)
    return {"episodes": episodes, "frames": frames, "expert_success": successes / max(episodes, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cosmos3-reach-demos", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder of the new dataset (must not exist)")
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="seed of the cube places")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--episode-steps", type=int, default=30, help="actions per episode (the reach takes ~12)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        parser.error(f"{out} already exists")
    started = time.monotonic()
    summary = collect(out, args.episodes, args.seed, args.image_size, args.episode_steps)
    summary["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
