"""Attack: a 33 kB ``meta/tasks.parquet`` holding one 1 GiB task string (issue 45, item 6).

The task list is dictionary-encoded and zstd-compressed, so its one dictionary page decompresses to
``--chars`` bytes. The trainer must refuse it from the page's header, with exit status 2 and one line, below
1 GiB of peak memory (before the check it took 6.6 GiB and trained with the string as its prompt).

Building the bomb with pyarrow takes about 8 GiB for 1 GiB of text (pyarrow's dictionary and page buffers):
it is built once, in a child process, and kept at ``--bomb`` for later runs.

    python benchmarks/attack_dataset_tasks.py [--chars 1073741824] [--bomb /tmp/tasks-bomb.parquet]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD = (
    "import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq\n"
    "chars = int(sys.argv[2])\n"
    "task = pa.StringArray.from_buffers(1, pa.py_buffer(np.array([0, chars], np.int32).tobytes()),"
    " pa.py_buffer(b'a' * chars))\n"
    "table = pa.table({'task_index': pa.array([0], pa.int64()), '__index_level_0__': task})\n"
    "pq.write_table(table, sys.argv[1], compression='zstd', use_dictionary=True)\n"
)
# Runs the trainer as its only child and prints the child's peak RSS (KiB) on its last line.
WRAPPER = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(done.returncode)\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=2**30)
    parser.add_argument("--bomb", type=Path, default=Path(tempfile.gettempdir()) / "cosmos3-tasks-bomb.parquet")
    args = parser.parse_args()
    bomb = args.bomb.with_name(f"{args.bomb.stem}-{args.chars}{args.bomb.suffix}")
    if not bomb.exists():
        subprocess.run([sys.executable, "-c", BUILD, str(bomb), str(args.chars)], check=True)
    print(f"bomb: {bomb} ({bomb.stat().st_size:,} bytes on disk, one task of {args.chars:,} characters)")

    from policy_server.recording.demonstrations import Demonstration, write_dataset

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rng = np.random.default_rng(0)
        episodes = [
            Demonstration(
                images=rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8),
                state=rng.normal(size=(6, 4)).astype(np.float32),
                actions=rng.normal(size=(6, 4)).astype(np.float32),
                success=True,
            )
            for _ in range(2)
        ]
        dataset = root / "dataset"
        write_dataset(dataset, episodes, "reach the cube", 20, "arm")
        shutil.copyfile(bomb, dataset / "meta/tasks.parquet")
        command = [sys.executable, "-c", WRAPPER, sys.executable, "-m", "cosmos3_runtime.training", str(dataset)]
        command += ["--out", str(root / "ckpt"), "--steps", "2", "--batch-size", "2", "--hidden-size", "32"]
        command += ["--layers", "1", "--save-every", "0", "--threads", "1"]
        done = subprocess.run(command, capture_output=True, text=True, cwd=root, timeout=600)
        *lines, rss_kib = [line for line in done.stderr.splitlines() if line.strip()]
        peak = int(rss_kib) * 1024
        print(f"exit status {done.returncode}; {len(lines)} line(s) on stderr; peak RSS {peak / 2**20:,.0f} MiB")
        for line in lines[-3:]:
            print(f"  {line[:300]}")
        held = done.returncode == 2 and len(lines) == 1 and peak < 2**30
        print(f"bound (exit 2, one line, peak < 1 GiB): {'met' if held else 'NOT met'}")


if __name__ == "__main__":
    main()
