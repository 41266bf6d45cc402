"""Loads a demonstration dataset (``cosmos3-reach-demos``) with LeRobot's own ``LeRobotDataset``, in LeRobot's
virtualenv, and prints what it read as JSON (frames, episodes, fps, each feature's shape, the task).

    python lerobot_demos_script.py DATASET
"""

from __future__ import annotations

import json
import sys

import torch

# See lerobot_dataset_script.py: torchvision's CUDA-only operators, declared so that it imports on a CPU torch.
if not hasattr(torch.ops, "torchvision") or not hasattr(torch.ops.torchvision, "nms"):
    torch.library.define("torchvision::nms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    torch.library.define("torchvision::qnms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

from ledataset.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

dataset = LeRobotDataset(repo_id="local/reach", root=sys.argv[1])
item = dataset[len(dataset) - 1]
print(
    json.dumps(
        {
            "frames": len(dataset),
            "episodes": dataset.num_episodes,
            "fps": dataset.fps,
            "shapes": {k: list(v.shape) for k, v in item.items() if hasattr(v, "shape")},
            "task": item["task"],
            "last_action": item["action"].tolist(),
        }
    )
)
