"""Device and dtype defaults, and the GPU preprocessing path (run where a GPU is present)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosmos3_runtime.checkpoints import resolve_device_and_dtype
from cosmos3_runtime.errors import CheckpointError
from cosmos3_runtime.frame_preprocessing import prepare_frames


def test_bf16_is_the_default_on_cuda_and_fp32_on_cpu():
    assert resolve_device_and_dtype("cuda", None) == (torch.device("cuda"), torch.bfloat16)
    assert resolve_device_and_dtype("cuda:1", None) == (torch.device("cuda:1"), torch.bfloat16)
    assert resolve_device_and_dtype("cpu", None) == (torch.device("cpu"), torch.float32)
    assert resolve_device_and_dtype("cuda", "fp32")[1] == torch.float32  # an explicit dtype wins
    with pytest.raises(CheckpointError, match="dtype"):
        resolve_device_and_dtype("cpu", "int8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_preprocessing_matches_the_cpu_path():
    """uint8 to the GPU (pinned, non-blocking), resized and normalised there: the CPU result within a level."""
    frames = np.random.default_rng(0).integers(0, 256, (3, 480, 640, 3), dtype=np.uint8)
    for tier, num_frames in ((256, 1), (480, 5)):
        cpu, cpu_size, *cpu_canvas = prepare_frames(frames, tier, num_frames, torch.device("cpu"))
        gpu, gpu_size, *gpu_canvas = prepare_frames(frames, tier, num_frames, torch.device("cuda"))
        assert gpu.device.type == "cuda" and gpu_canvas == cpu_canvas and torch.equal(gpu_size.cpu(), cpu_size)
        assert (gpu.cpu() - cpu).abs().max().item() <= 2.0 / 255.0
