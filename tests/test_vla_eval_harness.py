"""vla-eval's own orchestrator (PyPI ``vla-eval`` 0.8.0) scores a real server, in sync and real-time modes.

vla-eval lives in its own virtualenv (``make test`` builds ``.venv-vlaeval``, with mujoco and this
package's light robot_clients) and runs as a subprocess: ``vla-eval run --config`` on the MuJoCo arm
benchmark this project writes on vla-eval's public base class
(``robot_clients.sim.vla_eval_arm:MujocoArmBenchmark``), against a server on the tiny distilled
checkpoint (random weights: the success rate says nothing about a policy; that episodes finish and are
scored, does). The results JSON vla-eval writes is the evidence read here (pytest's tmp_path keeps it).
Nothing of vla-eval is re-implemented.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from server_fixtures import REPO_ROOT, tiny_engine_loader
from sidecar_fixtures import SidecarServer

from policy_server.vla_eval import VlaEvalSettings

VLA_EVAL = Path(os.environ.get("VLA_EVAL_PYTHON", REPO_ROOT / ".venv-vlaeval" / "bin" / "python"))
SCRIPT = Path(__file__).with_name("vla_eval_client_script.py")
BENCHMARK = "robot_clients.sim.vla_eval_arm:MujocoArmBenchmark"
HORIZON = 8

pytestmark = pytest.mark.timeout(400)

if not VLA_EVAL.exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"{VLA_EVAL} is missing: `make test` should have built vla-eval's virtualenv")
    pytest.skip(f"vla-eval's virtualenv is missing ({VLA_EVAL}); `make test` builds it", allow_module_level=True)


@pytest.fixture(scope="module")
def server():
    settings = VlaEvalSettings(requested={"action_horizon": HORIZON})
    with SidecarServer(tiny_engine_loader("distilled"), vla_eval=settings) as running:
        yield running


def environment() -> dict[str, str]:
    # The checkout's robot_clients wins over whatever the virtualenv's editable install points at.
    return {**os.environ, "NO_PROXY": "*", "PYTHONPATH": str(REPO_ROOT), "MUJOCO_GL": "egl"}


def vla_eval_run(server, tmp_path: Path, entries: list[dict]) -> tuple[dict[str, dict], str]:
    """``vla-eval run`` on ``entries``: the results JSON it wrote, by file name, and what it printed."""
    config = {
        "server": {"url": f"ws://127.0.0.1:{server.port}/v1/vla-eval", "timeout": 120},
        "render": "cpu",
        "output_dir": str(tmp_path / "results"),
        "benchmarks": entries,
    }
    path = tmp_path / "eval.json"  # YAML is a superset of JSON: vla-eval reads it as its config
    path.write_text(json.dumps(config))
    result = subprocess.run(
        [str(VLA_EVAL), "-m", "vla_eval.cli.main", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=360,
        cwd=tmp_path,
        env=environment(),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    aggregates = {p.name: json.loads(p.read_text()) for p in (tmp_path / "results").glob("*_aggregate.json")}
    return aggregates, result.stdout + result.stderr


def test_vla_evals_orchestrator_finishes_episodes_in_sync_and_realtime_modes(server, tmp_path):
    entries = [
        {
            "benchmark": BENCHMARK,
            "name": "arm_sync",
            "mode": "sync",
            "episodes_per_task": 2,
            "max_steps": 12,
            "params": {"image_size": 64, "seed": 0},
        },
        {
            "benchmark": BENCHMARK,
            "name": "arm_live",
            "mode": "live",
            "hz": 10,
            "episodes_per_task": 1,
            "max_steps": 15,
            "params": {"image_size": 64, "seed": 0},
        },
    ]
    results, output = vla_eval_run(server, tmp_path, entries)
    assert set(results) == {"arm_sync_aggregate.json", "arm_live_aggregate.json"}, output[-2000:]
    for name, mode, episodes, steps in (("arm_sync", "sync", 2, 12), ("arm_live", "live", 1, 15)):
        result = results[f"{name}_aggregate.json"]
        assert (result["mode"], result["num_episodes_total"], result["num_errors"]) == (mode, episodes, 0), result
        assert result["server_info"]["model_server"] == "Cosmos3PolicyServer"
        assert result["server_info"]["cosmos3"]["action_horizon"] == HORIZON
        successes = [episode["metrics"]["success"] for task in result["tasks"] for episode in task["episodes"]]
        assert len(successes) == episodes and result["mean_success"] == pytest.approx(sum(successes) / episodes)
        assert result["mean_min_distance"] > 0.0
        for episode in result["tasks"][0]["episodes"]:
            assert episode.get("failure_reason") is None, episode
            assert isinstance(episode["metrics"]["success"], bool)
            assert episode["steps"] == steps or episode["metrics"]["success"]
    assert "Benchmark: arm_sync (mode: sync)" in output and "Benchmark: arm_live (mode: live)" in output


def test_a_hostile_frame_gets_a_typed_error_and_vla_evals_connection_goes_on(server):
    result = subprocess.run(
        [str(VLA_EVAL), str(SCRIPT), "--url", f"ws://127.0.0.1:{server.port}/v1/vla-eval"],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["server_info"]["protocol_version"] == 1
    assert out["first"] == [10]
    assert "invalid_image" in out["float_camera"] and "images/front" in out["float_camera"]
    assert out["garbage"]["type"] == "error" and out["garbage"]["payload"]["code"] == "bad_frame"
    assert out["after"] == [[10]] * 3
