"""``benchmarks/gpu_suite.py`` (``make bench-gpu``) runs end to end: its ``--smoke`` mode on this CPU.

A GPU is lent only now and then, so the suite must work the first time it meets one. The smoke run is
the same code on tiny checkpoints (every group: schedules, batching, prefix cache, a real server), and it
must write the JSON and markdown the docs describe. Without ``--smoke`` and without CUDA it refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SUITE = REPO_ROOT / "benchmarks" / "gpu_suite.py"


def test_smoke_run_writes_json_and_markdown(tmp_path):
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, str(SUITE), "--smoke", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu_suite.json").read_text())
    assert report["smoke"] is True and report["environment"]["device"] == "cpu"
    groups = {c["group"] for c in report["cells"]}
    assert groups == {"schedule", "batch", "prefix cache", "compile"}
    measured = [c for c in report["cells"] if c["p50_ms"] is not None]
    assert all(not c["note"].startswith("failed") for c in report["cells"]), report["cells"]
    schedules = {c["schedule"].split(",")[0]: c for c in measured if c["group"] == "schedule"}
    assert schedules["distilled"]["forwards"] == 4 and schedules["base"]["forwards"] == 6  # 3 steps x guidance
    assert {c["geometry"] for c in measured if c["group"] == "schedule"} == {
        "256 tier, 224x224 camera, chunk 16",
        "DROID: 480 tier, 180x320 camera, chunk 32",
    }
    assert any(c["batch"] == 2 for c in measured) and any(not c["prefix_cache"] for c in measured)
    assert all(c["flops"] > 0 and c["tokens"]["vision"] > 0 for c in measured)
    serving = report["serving"]
    assert serving["requests"] == 3 and 0 <= serving["overhead_p50_ms"] < serving["round_trip_p50_ms"]
    overlap = report["host_prep_overlap"]
    assert (
        overlap["on"]["inline_preps"] + overlap["on"]["overlapped_preps"] == 4
        and overlap["off"]["overlapped_preps"] == 0
    )
    # Quantized weights: full precision, fp8 (refused on this CPU, in its note) and int8, against full precision.
    quantized = {row["quantization"]: row for row in report["quantized"]}
    assert list(quantized) == ["fp32", "fp8", "int8"]
    assert quantized["fp32"]["relative_error"] == 0.0 and quantized["fp32"]["weights"]["quantization"] == "none"
    assert "CUDA" in quantized["fp8"]["note"] and quantized["fp8"].get("chunk_p50_ms") is None
    assert 0.0 < quantized["int8"]["relative_error"] < 0.05 and quantized["int8"]["weights"]["quantization"] == "int8"
    table = (out / "gpu_suite.md").read_text()
    assert "SMOKE" in table and "Serving through" in table and "Host-prep overlap" in table
    assert "Quantized weights" in table
    # + the overlap table's header and two modes, + the quantized table's header and rows
    assert table.count("\n| ") == len(report["cells"]) + 2 + 4 + 2 + len(report["quantized"])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_full_suite_refuses(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SUITE), "--out", str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "--smoke" in done.stderr
    assert not (tmp_path / "gpu_suite.json").exists()
