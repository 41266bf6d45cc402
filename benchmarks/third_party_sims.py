"""Third-party simulators, unchanged, in closed loop on the server: success rate and chunk latency each.

Starts ``cosmos3-serve --tiny distilled`` (random weights: a success rate near zero is the expected
figure, and says nothing about a trained policy), or ``--model CKPT`` (a policy trained on a preset's
demonstrations, ``docs/training.md``), then runs each environment of
``robot_clients.sim.gym_bridge.PRESETS`` from its own virtualenv (``.venv-metaworld``, ``.venv-pusht``;
``make test`` builds them) through PolicyClient and the chunker, and prints one Markdown row each (the
table of ``docs/third_party_sims.md``).

    python benchmarks/third_party_sims.py --episodes 10 --max-steps 100
    python benchmarks/third_party_sims.py --model build/drawer-policy --presets metaworld-drawer-close \
        --episodes 20 --max-steps 150 --seed 100000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from robot_clients.sim.demo import ServerSubprocess

ROOT = Path(__file__).resolve().parent.parent
VENVS = {"metaworld-reach": ".venv-metaworld", "metaworld-drawer-close": ".venv-metaworld", "pusht": ".venv-pusht"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--control-hz", type=float, default=10.0)
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--presets", default="metaworld-reach,pusht")
    parser.add_argument("--model", default=None, help="a trained checkpoint (default: random tiny weights)")
    parser.add_argument("--seed", type=int, default=0, help="first episode's seed (task variations too)")
    parser.add_argument("--chunk-steps", type=int, default=None, help="actions executed per chunk")
    parser.add_argument("--black-image", action="store_true", help="ablation: send all-black camera frames")
    args = parser.parse_args()
    weights = "trained" if args.model else "random weights"
    server = ServerSubprocess(
        ["--model", args.model, "--no-http"] if args.model else ["--tiny", "distilled", "--no-http"]
    )
    url = server.start() + "/v1/actions/realtime"
    env = {**os.environ, "NO_PROXY": "*", "PYTHONPATH": str(ROOT), "MUJOCO_GL": "egl"}
    rows = []
    try:
        for preset in args.presets.split(","):
            command = [
                str(ROOT / VENVS[preset] / "bin" / "python"),
                "-m",
                "robot_clients.sim.gym_bridge",
                "--url",
                url,
                "--preset",
                preset,
                "--episodes",
                str(args.episodes),
                "--max-steps",
                str(args.max_steps),
                "--control-hz",
                str(args.control_hz),
                "--horizon",
                str(args.horizon),
                "--seed",
                str(args.seed),
            ]
            if args.chunk_steps:
                command += ["--chunk-steps", str(args.chunk_steps)]
            if args.black_image:
                command.append("--black-image")
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            summary = json.loads(done.stdout.strip().splitlines()[-1])["summary"]
            print(json.dumps(summary), flush=True)
            rows.append(summary)
    finally:
        server.stop()
    print()
    print(f"| environment | episodes x steps | success rate ({weights}) | chunk latency p50 / p99 | control rate |")
    print("| --- | --- | --- | --- | --- |")
    for s in rows:
        print(
            f"| {s['environment']} | {s['episodes']} x {s['steps_mean']:.0f} | {s['success_rate']:.0%} | "
            f"{s['chunk_latency_p50_ms']:.0f} / {s['chunk_latency_p99_ms']:.0f} ms ({s['chunks']} chunks) | "
            f"{s['achieved_hz_mean']:.1f} of {args.control_hz:g} Hz |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
