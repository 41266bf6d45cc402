"""The long fuzzing run: the fuzz tests' properties with many more examples, for as long as asked.

``make test`` runs a bounded subset of ``tests/test_fuzz_protocols.py`` (native, openpi and observer
WebSocket protocols, memory flat) and ``tests/test_fuzz_sidecar.py`` (schemathesis on the sidecar's
OpenAPI schema, raw hostile bodies). This script runs those same tests in rounds, each round with a new
random seed (``FUZZ_SEED``) and ``--examples`` examples per property (``FUZZ_EXAMPLES``), until
``--minutes`` have passed or a round fails. A failing round prints hypothesis' minimal failing example
and its seed, which reproduces it::

    .venv/bin/python benchmarks/fuzz_long.py --minutes 30 --examples 2000
    FUZZ_SEED=<seed> FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests/test_fuzz_protocols.py   # replay

Loopback only: the tests start their own servers on ephemeral ports.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_fuzz_protocols.py", "tests/test_fuzz_sidecar.py"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="stop starting new rounds after this long")
    parser.add_argument("--examples", type=int, default=2000, help="examples per property per round")
    parser.add_argument("--seed", type=int, default=None, help="first round's seed (default: random)")
    parser.add_argument("tests", nargs="*", default=TESTS, help="test files (default: both fuzz modules)")
    args = parser.parse_args(argv)

    deadline = time.monotonic() + args.minutes * 60
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rounds = 0
    while time.monotonic() < deadline:
        env = {**os.environ, "FUZZ_SEED": str(seed), "FUZZ_EXAMPLES": str(args.examples), "HYPOTHESIS_SEED": str(seed)}
        print(f"round {rounds + 1}: seed {seed}, {args.examples} examples per property", flush=True)
        started = time.monotonic()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                f"--hypothesis-seed={seed}",
                *args.tests,
            ],
            cwd=REPO,
            env=env,
        )
        rounds += 1
        print(f"round {rounds}: exit {result.returncode} in {time.monotonic() - started:.0f} s", flush=True)
        if result.returncode != 0:
            print(
                f"FAILED with seed {seed}; replay: FUZZ_SEED={seed} FUZZ_EXAMPLES={args.examples} "
                f".venv/bin/python -m pytest --hypothesis-seed={seed} {' '.join(args.tests)}",
                flush=True,
            )
            return result.returncode
        seed = random.randrange(2**32)
    print(f"{rounds} round(s), no failure", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
