"""The ``cosmos3-serve`` process: health while loading, worker thread policy, graceful shutdown.

These run the real command line in a subprocess (signals and exit codes need a process of their own)
on a tiny distilled checkpoint built once for the test session.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import time

import pytest
from server_fixtures import DOMAIN, ServerProcess, http_get, rgb_image, tiny_checkpoint
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from robot_clients.wire_codec import packb, unpackb


def wait_ready(proc: ServerProcess, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status, health, _ = http_get(proc.health_url)
        if health.get("status") == "ready":
            return health
        assert time.monotonic() < deadline, proc.log
        assert proc.proc.poll() is None, proc.log
        time.sleep(0.1)


def test_healthz_answers_while_loading_then_ready_with_a_passive_worker():
    """The port opens before the model loads; /healthz answers at once and reports progress. The worker
    runs torch on every available core but one, with OMP_WAIT_POLICY=PASSIVE
    (policy_server.engine.thread_policy
    explains the choice; benchmarks/worker_threads.py measures it)."""
    proc = ServerProcess("--model", str(tiny_checkpoint("distilled"))).start()
    try:
        status, health, elapsed = http_get(proc.health_url)
        assert status == 200
        assert health["status"] in ("starting", "loading", "warming_up", "ready")
        assert elapsed < 1.0
        statuses = {health["status"]}
        health = wait_ready(proc)
        worker = health["worker"]
        assert worker["omp_wait_policy"] == "PASSIVE"
        assert worker["torch_threads"] == max(1, worker["cores"] - 1)
        assert worker["interop_threads"] == 1
        statuses.add(health["status"])
        assert "ready" in statuses
    finally:
        # SIGINT here, SIGTERM below: both signals stop the server gracefully in the default suite.
        proc.signal(signal.SIGINT)
        assert proc.wait(60) == 0, proc.log
        assert "shut down" in proc.log


# The CLI installs one handler for both signals; SIGINT's graceful exit is covered by the health test
# above, so its full drain scenario (a second server process, ~30 s here) runs only with the slow tests.
@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_signal_finishes_the_running_inference_closes_sessions_with_1001_and_exits_0(sig):
    proc = ServerProcess("--model", str(tiny_checkpoint("distilled")), "--no-warmup").start()
    try:
        wait_ready(proc)

        async def scenario():
            ws = await connect(proc.url, compression=None, proxy=None)
            unpackb(await ws.recv())
            await ws.send(packb({"type": "configure", "domain_name": DOMAIN}))
            unpackb(await ws.recv())
            # Seq 0 must still be running when the signal comes, 50 ms after seq 1: an unwarmed first call at the
            # 480 tier (its VAE encode alone is several times the 256 tier's) outlasts that on a busy machine, where
            # a small first call once finished first and seq 1 ran instead of waiting.
            await ws.send(packb({"type": "observation", "seq": 0, "image": rgb_image(480), "resolution_tier": 480}))
            while not (await asyncio.to_thread(http_get, proc.health_url))[1]["busy"]:
                await asyncio.sleep(0.01)  # until seq 0 is in the engine
            await ws.send(packb({"type": "observation", "seq": 1, "image": rgb_image(64)}))
            await asyncio.sleep(0.05)
            proc.signal(sig)
            frames = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    frames.append(unpackb(await asyncio.wait_for(ws.recv(), 30)))
            return frames, closed.value.rcvd

        frames, close = asyncio.run(scenario())
        by_seq = {f["seq"]: f for f in frames}
        # What was running finished and was delivered; what was waiting was dropped, and said so.
        assert by_seq[0]["type"] == "action_chunk"
        assert (by_seq[1]["type"], by_seq[1]["reason"]) == ("dropped", "shutdown")
        assert close is not None and close.code == 1001
        assert proc.wait(60) == 0, proc.log
        assert "shut down" in proc.log
    finally:
        proc.kill()


def test_a_model_that_cannot_load_exits_nonzero(tmp_path):
    # Its config files and safetensors headers are whole (it passes inspection and the memory plan), its
    # weights are cut short: the load itself fails, after the server started.
    model = shutil.copytree(tiny_checkpoint(), tmp_path / "truncated")
    weights = next((model / "transformer").glob("*.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 4096])
    proc = ServerProcess("--model", str(model)).start()
    try:
        assert proc.wait(60) == 1
        assert "could not load the model" in proc.log
    finally:
        proc.kill()


def test_a_missing_checkpoint_is_refused_before_the_server_starts(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    serve = Path(sys.executable).parent / "cosmos3-serve"
    done = subprocess.run(
        [str(serve), "--model", str(tmp_path / "no-such-checkpoint"), "--no-http"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("cosmos3-serve: error:")]
    assert len(lines) == 1 and "does not exist" in lines[0], done.stderr
