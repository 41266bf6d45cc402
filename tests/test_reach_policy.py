"""The shipped reach policy (assets/reach_policy, made by ``make reach-policy``) really controls the arm.

- **Vision**: take held-out first-step frames, where the arm is at its start pose, so the state is the same
  in every episode and only the camera shows the goal. There the policy's chunks err by at most 0.3x the
  mean chunk's (``benchmarks/first_step_error.py`` prints the figure docs/training.md quotes), and a black
  image makes them far worse. A policy that ignored the camera would fail this gate.
- **Success at 20 Hz** (in ``make test``): a real ``cosmos3-serve`` process, ``PolicyClient``, the chunker
  (blend) and the 20 Hz control loop, on 10 held-out cube places, 24-tick episodes (1.2 s; the expert needs
  at most 13 ticks). Success is read from the simulator's state (the hand body's position against the cube's
  at the episode's end): at least 8 of 10 with the camera, at most 2 of 10 with a black image (the blind
  baseline scores 3 %), no boundary stall, no chunk error. A random checkpoint of the same shape fails it.
  No stall needs chunks under 400 ms: the chunker asks for the next chunk when one arrives, so two chunk
  latencies must fit in a 16-action chunk at 20 Hz. A chunk takes about 65 ms alone; on the 2-core
  development machine at load 5-6 with a core kept busy, 100-340 ms, and the test took 47-73 s in all.
- **Success** (slow): the same through 40-tick episodes (2 s), 20 with the camera and 10 black.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; mujoco reads it when first imported
pytest.importorskip("mujoco", reason="the `sim` extra (mujoco) is not installed")

from robot_clients.sim.demo import REACH_POLICY as SHIPPED  # noqa: E402
from robot_clients.sim.reach_task import DOMAIN, GOAL_HEIGHT, TASK  # noqa: E402

pytestmark = pytest.mark.skipif(not (SHIPPED / "model_index.json").is_file(), reason="no shipped reach checkpoint")

# Cube places of the 20 Hz gate: seed 1000 draws the training demonstrations' (``make reach-policy``), a
# generator of another seed draws places of its own, held out.
GATE_SEED = 200_000


def test_the_shipped_policy_reads_the_goal_from_the_camera_on_first_step_frames():
    """Held-out first-step frames: the arm at its start pose, so the state is the same in every episode. The
    measure is ``benchmarks/first_step_error.py``'s, run here on 8 episodes."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "first_step_error.py"
    spec = importlib.util.spec_from_file_location("first_step_error", path)
    assert spec is not None and spec.loader is not None
    benchmark = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = benchmark
    spec.loader.exec_module(benchmark)
    errors = benchmark.first_step_errors(SHIPPED, episodes=8, seed=424_242)
    real_error, mean_error, black_error = (
        errors["first_step_error"],
        errors["mean_chunk_error"],
        errors["black_image_error"],
    )
    assert real_error <= 0.3 * mean_error, (real_error, mean_error)
    assert black_error > 2 * real_error, (black_error, real_error)


@pytest.mark.slow
def test_the_shipped_policy_reaches_the_cube_through_the_server_and_not_blind():
    from robot_clients.client import PolicyClient
    from robot_clients.sim.demo import ServerSubprocess
    from robot_clients.sim.reach_eval import run_cell

    server = ServerSubprocess(["--model", str(SHIPPED), "--log-level", "info"])
    url = server.start(timeout=300.0)
    # The loop's ticks are timed in this pytest process, which holds the heap of every test before it. A full
    # collection of that heap holds the GIL for hundreds of milliseconds (3.4 million objects: 0.55 s here), and a
    # tick then starts that late, however fast the robot's steps (295 ms late with every step under 12 ms, once
    # in a clean-clone run). A robot's process has no such heap: the objects made before the episodes are kept
    # out of the collector, and the robot's own garbage is collected as usual.
    gc.freeze()
    try:
        with PolicyClient(url, connect_timeout=300.0) as client:
            client.configure(domain_name=DOMAIN, action_horizon=16, prompt=TASK, seed=0)
            seen = run_cell(client, "blend", 0, "none", episodes=20, seed=300_000)
            blind = run_cell(client, "blend", 0, "black", episodes=10, seed=300_000)
    finally:
        server.stop()
    assert seen.rate >= 0.8, seen  # blend measured 98 % over 50 episodes (docs/training.md)
    assert blind.rate <= 0.15, blind


def test_the_shipped_policy_reaches_the_cube_at_20_hz_through_the_server_and_not_blind():
    from robot_clients.chunker import ActionChunker
    from robot_clients.client import PolicyClient
    from robot_clients.control_loop import ChunkingAgent, ControlLoop, EpisodeReport
    from robot_clients.sim.demo import ServerSubprocess
    from robot_clients.sim.mujoco_arm import ArmEnvConfig
    from robot_clients.sim.reach_eval import chunker_config
    from robot_clients.sim.reach_task import SUCCESS_RADIUS, ReachChunkPolicy, ReachTaskEnv

    def episodes(client: PolicyClient, ablation: str, seed: int, count: int) -> list[tuple[float, EpisodeReport]]:
        """``count`` episodes of cube places ``seed``, at 20 Hz: each one's final distance from the hand to the
        goal, read from MuJoCo's own state by body name, and the loop's report."""
        config = ArmEnvConfig(image_height=128, image_width=128, wrist_camera=False, seed=seed, episode_steps=24)
        results = []
        with ReachTaskEnv(config) as env:
            for episode in range(count):
                policy = ReachChunkPolicy(client, delay_s=0.0, ablation=ablation, seed=episode)
                with ActionChunker(policy, chunker_config("blend", 20.0, 8)) as chunker:
                    report = ControlLoop(env, ChunkingAgent(chunker), control_hz=20.0).run_episode()
                goal = env.data.body("cube").xpos + np.array([0.0, 0.0, GOAL_HEIGHT])
                results.append((float(np.linalg.norm(env.data.body("hand").xpos - goal)), report))
        return results

    server = ServerSubprocess(["--model", str(SHIPPED), "--log-level", "info"])
    url = server.start(timeout=300.0)
    # The loop's ticks are timed in this pytest process, which holds the heap of every test before it. A full
    # collection of that heap holds the GIL for hundreds of milliseconds (3.4 million objects: 0.55 s here), and a
    # tick then starts that late, however fast the robot's steps (295 ms late with every step under 12 ms, once
    # in a clean-clone run). A robot's process has no such heap: the objects made before the episodes are kept
    # out of the collector, and the robot's own garbage is collected as usual.
    gc.freeze()
    try:
        with PolicyClient(url, connect_timeout=300.0) as client:
            client.configure(domain_name=DOMAIN, action_horizon=16, prompt=TASK, seed=0)
            # The server's first chunks of this prompt and frame size pay one-off costs (torch's first calls
            # at these shapes, the prompt's text): 0.6-0.8 s each under load, where a chunk takes 0.1 s
            # after. A robot pays them once; two episodes of other cube places, not scored, pay them here.
            episodes(client, "none", seed=GATE_SEED + 1, count=2)
            seen = episodes(client, "none", seed=GATE_SEED, count=10)
            black = episodes(client, "black", seed=GATE_SEED, count=10)
    finally:
        gc.unfreeze()
        server.stop()
    overran = []
    for ablation, results in (("camera", seen), ("black image", black)):
        for episode, (_, report) in enumerate(results):
            summary = f"{ablation}, episode {episode}: {report.summary()}"
            assert report.steps == 24 and report.chunker is not None, summary
            assert report.chunker["stalls"] == 0 and report.chunker["errors"] == 0, summary
            if report.overruns == 0:
                assert 19.0 <= report.achieved_hz <= 21.0, summary
            else:
                # The robot's own step overran its 50 ms (the simulator starved of CPU by the tests running
                # beside this one, seen at 18.3 Hz with 2 overruns): the chunker's 0 stalls say the server never
                # kept the loop waiting. Such an episode may lose a few ticks, no more, and only a few may.
                assert 16.0 <= report.achieved_hz <= 21.0, summary
                overran.append(summary)
    assert len(overran) <= 4, overran
    successes = [sum(distance <= SUCCESS_RADIUS for distance, _ in results) for results in (seen, black)]
    distances_cm = [[round(distance * 100, 1) for distance, _ in results] for results in (seen, black)]
    assert successes[0] >= 8 and successes[1] <= 2, (successes, distances_cm)
