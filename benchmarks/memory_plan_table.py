"""The memory-plan table of docs/runtime.md: Edge, Nano and Super at bf16, fp8 and int8, against GPUs of
16, 24, 48 and 80 GiB, each cell printed by ``cosmos3-inspect --json``.

The published shapes are written with ``cosmos3-tiny OUT --shape S --no-weights`` (config files and shard
index only, as a Hub checkpoint fetched for inspection has them: Super's 128 GB would not fit this disk),
then each row is one ``cosmos3-inspect OUT --device cuda --dtype bfloat16 --quantization Q
--device-memory 24GiB --json``: its ``need_bytes`` against each memory size is the comparison its ``fits``
makes (``need_bytes <= device_memory_bytes``). Run: ``python benchmarks/memory_plan_table.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
SHAPES = ("edge", "nano", "super")
QUANTIZATIONS = ("none", "fp8", "int8")
MEMORY_GIB = (16, 24, 48, 80)
GIB = 1 << 30


def plan(checkpoint: Path, quantization: str, memory_gib: int) -> dict:
    command = [str(BIN / "cosmos3-inspect"), str(checkpoint), "--device", "cuda", "--dtype", "bfloat16"]
    command += ["--quantization", quantization, "--device-memory", f"{memory_gib}GiB", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout)["memory_plan"])


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for shape in SHAPES:
            out = Path(scratch) / shape
            subprocess.run(
                [str(BIN / "cosmos3-tiny"), str(out), "--shape", shape, "--no-weights"], check=True, capture_output=True
            )
            for quantization in QUANTIZATIONS:
                first = plan(out, quantization, 24)
                assert first["fits"] == (first["need_bytes"] <= 24 * GIB)
                fits = ["fits" if first["need_bytes"] <= memory * GIB else "no" for memory in MEMORY_GIB]
                components = first["components"]
                rows.append(
                    f"| {shape} | {'bf16' if quantization == 'none' else quantization} | "
                    f"{components['transformer']['bytes'] / GIB:.1f} | {components['vae']['bytes'] / GIB:.1f} | "
                    f"{first['weight_bytes'] / GIB:.1f} | {first['need_bytes'] / GIB:.1f} | " + " | ".join(fits) + " |"
                )
    header = " | ".join(f"{m} GiB" for m in MEMORY_GIB)
    print(f"| shape | weights | transformer GiB | VAE GiB | all weights GiB | needs GiB | {header} |")
    print("| " + " | ".join(["---"] * (6 + len(MEMORY_GIB))) + " |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
