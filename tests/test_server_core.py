"""The server's core serves robots with none of the optional features loaded.

In a fresh interpreter, :class:`~policy_server.assembly.server.PolicyServer` is built directly (no command line, so
no dialect, no recording, no sidecar) on 127.0.0.1 with the tiny distilled checkpoint; a native session
and an openpi session each get one observation answered with actions; then the interpreter's
``sys.modules`` must hold no module of SGLang's API, the recording, video jobs, Ray, the HTTP sidecar or
vla-eval's protocol, and no pydantic: those are attached at the edge (``policy_server.assembly.cli.assemble_server``)
or not at all.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from server_fixtures import DOMAIN, REPO_ROOT, ServerProcess, http_get, rgb_image, tiny_checkpoint

from policy_server.assembly.cli import build_parser, server_from_args
from robot_clients.client import PolicyClient

FEATURE_PACKAGES = ("policy_server.sglang", "policy_server.recording", "policy_server.videos", "policy_server.ray")
FEATURE_PACKAGES += ("policy_server.http", "policy_server.vla_eval", "pydantic")

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys

    import numpy as np
    from websockets.asyncio.client import connect

    from policy_server.assembly.server import PolicyServer
    from policy_server.server_settings import ServerSettings
    from policy_server.sessions.openpi import openpi_arrays
    from policy_server.openpi_settings import OpenpiSettings
    from robot_clients.wire_codec import packb, unpackb

    checkpoint, domain, features = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])


    def load():
        from cosmos3_runtime.engine import Cosmos3Engine

        return Cosmos3Engine.load(checkpoint, device="cpu", dtype="float32")


    async def main():
        image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        openpi = OpenpiSettings(requested={"domain_name": "droid_lerobot", "action_horizon": 8})
        settings = ServerSettings(host="127.0.0.1", port=0, warmup=False, openpi=openpi)
        async with PolicyServer(load, settings) as server:
            base = f"ws://127.0.0.1:{server.port}"
            async with connect(base + "/v1/actions/realtime", compression=None, max_size=None) as ws:
                hello = unpackb(await ws.recv())
                await ws.send(packb({"type": "configure", "domain_name": domain, "action_horizon": 8, "seed": 0}))
                session = unpackb(await ws.recv())
                await ws.send(packb({"type": "observation", "seq": 1, "image": image}))
                chunk = unpackb(await asyncio.wait_for(ws.recv(), 120))
            async with connect(base + "/openpi", compression=None, max_size=None) as ws:
                openpi_hello = unpackb(await ws.recv())
                obs = {"observation/exterior_image_1_left": image, "observation/wrist_image_left": image}
                await ws.send(packb(openpi_arrays({**obs, "prompt": "pick"})))
                reply = unpackb(await asyncio.wait_for(ws.recv(), 120))
        loaded = sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in features))
        print(json.dumps({
            "hello": hello["type"], "session": session["type"],
            "chunk": [chunk["type"], chunk["seq"], list(np.asarray(chunk["actions"]).shape)],
            "openpi_hello": openpi_hello["protocol"], "openpi_actions": list(np.asarray(reply["actions"]).shape),
            "sglang_keys_in_hello": "policy_family" in hello,
            "loaded": loaded,
        }))


    asyncio.run(main())
    """
)


def _run_in_a_fresh_interpreter(script: str, modules: tuple[str, ...]) -> dict:
    """``script`` run with the tiny distilled checkpoint, the domain and ``modules`` (the packages it reports
    loaded) as its arguments, in an interpreter of its own: what it printed last, as JSON."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    result = subprocess.run(
        [sys.executable, "-c", script, str(tiny_checkpoint("distilled")), DOMAIN, json.dumps(modules)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_websocket_only_server_serves_native_and_openpi_without_loading_a_feature():
    seen = _run_in_a_fresh_interpreter(SCRIPT, FEATURE_PACKAGES)
    assert (seen["hello"], seen["session"]) == ("metadata", "session")
    assert seen["chunk"][:2] == ["action_chunk", 1] and seen["chunk"][2][0] == 8
    assert seen["openpi_hello"] == "openpi" and seen["openpi_actions"][0] == 8
    assert not seen["sglang_keys_in_hello"]  # no dialect attached: the hello is the native protocol's alone
    assert seen["loaded"] == []


async def test_a_start_that_fails_stops_the_features_it_had_started(tmp_path):
    """A taken WebSocket port fails the start after the features started: they are stopped again (here
    the recorder, whose writer thread would otherwise outlive the failed server)."""
    from policy_server.assembly.cli import assemble_server
    from policy_server.recording import RecorderState
    from policy_server.recording.feature import RecordingFeature, RecordingOptions
    from policy_server.server_settings import ServerSettings

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = ServerSettings(host="127.0.0.1", port=taken.getsockname()[1], warmup=False)
        server = assemble_server(lambda: None, settings, recording=RecordingOptions(root=tmp_path / "rec"))
        with pytest.raises(OSError):
            await server.start()
    (feature,) = server.features
    assert isinstance(feature, RecordingFeature) and feature.recorder is not None
    assert feature.recorder.state is RecorderState.STOPPED


# What the WebSocket-only command must never load: a module of one of these packages (imported, as the
# interpreter reports every import: PYTHONPROFILEIMPORTTIME), or a shared library of one mapped into it.
SIDECAR_PACKAGES = ("policy_server.http", "policy_server.videos", "policy_server.sglang", "pydantic", "fastapi")
SIDECAR_LIBRARIES = ("pydantic_core", "fastapi", "uvicorn")
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| +(\S+)\s*$")


def test_the_installed_command_with_the_sidecar_off_loads_no_sidecar_no_sglang_and_no_pydantic():
    """The installed ``cosmos3-serve --tiny distilled --no-http`` (the console script, in a process of its own)
    serves a robot a chunk; while it serves, no pydantic_core (or other sidecar library) is mapped into the
    process (``/proc/<pid>/maps``), and by its graceful exit it never imported the sidecar, video jobs,
    SGLang's dialect, pydantic or FastAPI (the interpreter's own report of every import)."""
    command = Path(sys.executable).with_name("cosmos3-serve")
    assert command.is_file(), f"{command}: the package is installed in this interpreter's environment"
    env = {"PYTHONPROFILEIMPORTTIME": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = ServerProcess("--tiny", "distilled", "--no-http", "--no-warmup", env=env, command=(str(command),)).start()
    try:
        deadline = time.monotonic() + 300
        while http_get(proc.health_url)[1].get("status") != "ready":
            assert time.monotonic() < deadline and proc.proc is not None and proc.proc.poll() is None, proc.log[-3000:]
            time.sleep(0.2)
        with PolicyClient(proc.url) as robot:
            hello = robot.metadata
            robot.configure(domain_name=DOMAIN, action_horizon=8, seed=0)
            chunk = robot.infer({"image": rgb_image(64)}, timeout=120)
            assert proc.proc is not None
            mapped = Path(f"/proc/{proc.proc.pid}/maps").read_text()
        proc.signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.log[-3000:]
    finally:
        proc.kill()
    assert chunk.actions.shape[0] == 8
    assert "policy_family" not in hello  # no dialect attached: the hello is the native protocol's alone
    libraries = {line.split()[-1] for line in mapped.splitlines() if line.split()[-1].endswith(".so") or ".so." in line}
    assert any("torch" in path for path in libraries)  # the maps are the serving process's: the model is in it
    assert [path for path in libraries if any(name in path for name in SIDECAR_LIBRARIES)] == []
    imported = [match.group(1) for line in proc.lines if (match := _IMPORTED.match(line))]
    assert (
        "policy_server.assembly.cli" in imported and "websockets" in imported
    )  # the report covers the command's imports
    unwanted = [name for name in imported if any(name == p or name.startswith(p + ".") for p in SIDECAR_PACKAGES)]
    assert unwanted == []


def test_sglangs_dialect_is_attached_by_its_flag_or_with_the_sidecar(tmp_path):
    parser = build_parser()
    for argv, attached in (([], 1), (["--no-http"], 0), (["--no-http", "--sglang"], 1)):
        args = parser.parse_args(["--tiny", "distilled", "--data-dir", str(tmp_path), *argv])
        assert len(server_from_args(args, tmp_path).dialects) == attached, argv
