"""Cosmos3 Edge at its published size on this CPU, through the production path (slow: about 10-15 minutes).

Builds the Edge shape (3.37 B transformer parameters, 8 GB of bf16 on disk) and checks that the builder
never held the model twice (its peak RSS stays near one 1 GiB shard), then serves one distilled policy
chunk at the 256 tier through a real server process and the real client, fp32 on CPU (about 16 GiB
resident). Skipped unless 17 GiB of memory is available: the machine is shared.
``benchmarks/real_size_cpu.py`` records the same run's figures (docs/benchmarks.md).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from server_fixtures import REPO_ROOT, ServerProcess, http_get

pytestmark = pytest.mark.slow

EDGE_TRANSFORMER_PARAMETERS = 3_369_657_024
WAN22_VAE_PARAMETERS = 704_688_668


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def _peak_rss_gib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def test_edge_shape_builds_in_bounded_memory_and_serves_a_chunk(tmp_path):
    if _available_gib() < 17:
        pytest.skip(f"needs 17 GiB of available memory, {_available_gib():.1f} GiB now")
    from cosmos3_runtime.checkpoints import inspect_checkpoint
    from robot_clients.client import PolicyClient

    checkpoint = tmp_path / "edge"
    build = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from cosmos3_runtime.cli import tiny_main; sys.exit(tiny_main(sys.argv[1:]))",
            str(checkpoint),
            "--shape",
            "edge",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    builder_peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    assert builder_peak_gib < 3.0, f"the builder peaked at {builder_peak_gib:.1f} GiB: two copies in memory?"
    info = inspect_checkpoint(checkpoint)
    assert info.variant == "edge-distilled"
    assert info.weights["transformer"].parameters == EDGE_TRANSFORMER_PARAMETERS
    assert info.weights["vae"].parameters == WAN22_VAE_PARAMETERS
    assert info.weights["transformer"].bytes == 2 * EDGE_TRANSFORMER_PARAMETERS  # bf16

    server = ServerProcess(
        "--model", str(checkpoint), "--no-http", "--no-warmup", "--engine-timeout-s", "0", "--max-batch", "1"
    ).start(timeout=300)
    try:
        deadline = time.monotonic() + 900
        while http_get(server.health_url)[1].get("status") != "ready":
            assert time.monotonic() < deadline and server.proc.poll() is None, server.log[-3000:]
            time.sleep(1)
        image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
        with PolicyClient(server.url) as client:
            assert client.metadata["variant"] == "edge-distilled"
            client.configure(domain_name=client.metadata["defaults"]["domain_name"], resolution_tier=256)
            chunk = client.infer({"image": image}, timeout=1800)
        assert chunk.num_steps == 4 and chunk.actions.shape == (16, chunk.raw_action_dim)
        assert np.isfinite(chunk.actions).all() and chunk.actions.std() > 0
        assert _peak_rss_gib(server.proc.pid) < 20.0  # fp32 weights (16.3 GB) plus activations, not two copies
    finally:
        server.signal()
        exit_code = server.wait(120)
        shutil.rmtree(checkpoint, ignore_errors=True)  # 8 GB: not left for pytest's retained temp dirs
    assert exit_code == 0
