"""Loads recordings with LeRobot's own ``LeRobotDataset`` (PyPI ``lerobot-dataset``, imported as
``ledataset``), in LeRobot's own virtualenv, and writes back what it read.

lerobot-dataset imports torch (and torchvision, torchcodec) without declaring them, so it lives in its
own virtualenv (``make test`` builds ``.venv-lerobot``); tests/test_recording_lerobot.py runs this
script with that environment's Python. It imports nothing of this project. For each recording folder
it loads the dataset the way a LeRobot user does, reads every frame through ``dataset[i]`` (videos
decoded by LeRobot's default decoder, torchcodec), and saves frames (uint8, H×W×3), actions,
timestamps and the other columns into one ``.npz``; a JSON summary goes to stdout. With
``--aggregate DIR`` it also merges all the recordings into one dataset with LeRobot's
``aggregate_datasets`` and reads that one last.

    python lerobot_dataset_script.py --out read.npz [--aggregate DIR] RECORDING [RECORDING ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

# torchvision's only Linux wheels are CUDA builds: on the CPU torch its compiled operators do not load,
# and torchvision 0.28 then fails at import, registering a fake kernel for an operator that does not
# exist. LeRobot's dataset code imports torchvision but uses none of those operators (torchcodec decodes
# the videos), so declaring the two operators' schemas first lets torchvision import.
if not hasattr(torch.ops, "torchvision") or not hasattr(torch.ops.torchvision, "nms"):
    torch.library.define("torchvision::nms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    torch.library.define("torchvision::qnms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

import ledataset  # noqa: E402
from ledataset.datasets.aggregate import aggregate_datasets  # noqa: E402
from ledataset.datasets.lerobot_dataset import CODEBASE_VERSION, LeRobotDataset  # noqa: E402
from ledataset.datasets.video_utils import get_safe_default_codec  # noqa: E402


def read(root: Path, prefix: str, arrays: dict[str, np.ndarray]) -> dict:
    dataset = LeRobotDataset(repo_id=f"local/{root.name}", root=root)
    items = [dataset[i] for i in range(len(dataset))]
    for key in dataset.meta.video_keys:
        arrays[f"{prefix}/{key}"] = np.stack(
            [(item[key].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8) for item in items]
        )
    for key in (
        "action",
        "timestamp",
        "frame_index",
        "index",
        "episode_index",
        "observation.seq",
        "observation.state",
        "response.timing_ms",
    ):
        if key in dataset.features:
            arrays[f"{prefix}/{key}"] = np.stack([item[key].numpy() for item in items])
    episode = dataset.meta.episodes[0]
    return {
        "root": str(root),
        "frames": len(dataset),
        "episodes": dataset.num_episodes,
        "fps": dataset.fps,
        "video_keys": dataset.meta.video_keys,
        "features": list(dataset.features),
        "tasks": [item["task"] for item in items],
        "kinds": [item["response.kind"] for item in items],
        "video_spans": {
            key: [episode[f"videos/{key}/from_timestamp"], episode[f"videos/{key}/to_timestamp"]]
            for key in dataset.meta.video_keys
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--aggregate", default=None)
    parser.add_argument("roots", nargs="+")
    args = parser.parse_args()
    roots = [Path(root) for root in args.roots]
    arrays: dict[str, np.ndarray] = {}
    summary = {
        "codebase_version": CODEBASE_VERSION,
        "decoder": get_safe_default_codec(),
        "torch": torch.__version__,
        "ledataset": getattr(ledataset, "__version__", None),
        "datasets": [read(root, str(i), arrays) for i, root in enumerate(roots)],
    }
    if args.aggregate:
        merged = Path(args.aggregate)
        aggregate_datasets([f"local/{root.name}" for root in roots], "local/merged", roots=roots, aggr_root=merged)
        summary["datasets"].append(read(merged, "merged", arrays))
        summary["merged_episodes"] = LeRobotDataset("local/merged", root=merged).num_episodes
    np.savez(args.out, **arrays)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
