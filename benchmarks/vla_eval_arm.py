"""vla-eval's own orchestrator scores the server on the MuJoCo arm, in sync and real-time modes.

Starts ``cosmos3-serve --tiny distilled`` (random weights: the success rate measures nothing about a
policy; episodes scored end to end by a harness nobody here wrote, and the real-time figures, do), writes
a vla-eval config for ``robot_clients.sim.vla_eval_arm:MujocoArmBenchmark`` and runs ``vla-eval run``
from ``.venv-vlaeval`` (``make .venv-vlaeval/.installed``). vla-eval prints its own summary table per
benchmark; its results JSON lands in ``--output-dir``. Then a line per mode from that JSON.

    python benchmarks/vla_eval_arm.py --episodes 5 --max-steps 40 --hz 10 [--ask-ahead 4]

In the real-time run vla-eval logs, per episode, the share of stale ticks (no fresh action: the arm held
its last one) and the control rate it achieved.
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
BENCHMARK = "robot_clients.sim.vla_eval_arm:MujocoArmBenchmark"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=5, help="episodes per mode")
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--hz", type=float, default=10.0, help="the real-time run's control rate")
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--ask-ahead", type=int, default=1, help="the server's --vla-eval-ask-ahead")
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--modes", default="sync,live")
    parser.add_argument("--output-dir", default="vla-eval-results")
    parser.add_argument("--vla-eval", default=str(ROOT / ".venv-vlaeval" / "bin" / "python"))
    args = parser.parse_args()
    output = Path(args.output_dir).resolve()
    output.mkdir(parents=True, exist_ok=True)
    server = ServerSubprocess(
        ["--tiny", "distilled", "--vla-eval-horizon", str(args.horizon), "--vla-eval-ask-ahead", str(args.ask_ahead)]
        + ["--no-http"]
    )
    url = server.start() + "/v1/vla-eval"
    entries = []
    for mode in args.modes.split(","):
        entry = {
            "benchmark": BENCHMARK,
            "name": f"mujoco_arm_{mode}",
            "mode": mode,
            "episodes_per_task": args.episodes,
            "max_steps": args.max_steps,
            "params": {"image_size": args.image_size, "seed": 0, "control_hz": args.hz},
        }
        if mode == "live":
            entry["hz"] = args.hz
        entries.append(entry)
    config = {
        "server": {"url": url, "timeout": 120},
        "render": "cpu",
        "output_dir": str(output),
        "benchmarks": entries,
    }
    path = output / "eval.json"
    path.write_text(json.dumps(config, indent=2))
    env = {**os.environ, "NO_PROXY": "*", "PYTHONPATH": str(ROOT), "MUJOCO_GL": "egl"}
    try:
        code = subprocess.call([args.vla_eval, "-m", "vla_eval.cli.main", "run", "--config", str(path)], env=env)
    finally:
        server.stop()
    if code != 0:
        return code
    for entry in entries:
        result = json.loads((output / f"{entry['name']}_aggregate.json").read_text())
        line = (
            f"{entry['name']}: success {result['mean_success']:.0%} of {result['num_episodes_total']} episodes "
            f"(random weights), mean closest approach {result['mean_min_distance'] * 100:.1f} cm, "
            f"{result['num_errors']} errors"
        )
        print(line)
    print(f"results JSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
