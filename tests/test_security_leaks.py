"""No answer a client can read says where on the server's disk the model lies (issue 36.5).

A real server process (the command line, both ports) serves a tiny checkpoint from a folder of its own
under a temporary directory. Every hello, metadata and health answer any client gets without a token is
read: the WebSocket port's ``/healthz``, vla-eval's ``/health`` and ``/config``; the native ``metadata``
and ``session`` frames, openpi's metadata, vla-eval's ``hello``, the observer's ``hello`` and session list;
the sidecar's ``/healthz``, ``/readyz``, ``/v1/actions/metadata``, ``/metrics`` and ``/openapi.json``. None
may hold the temporary directory's path; the model is named by its folder's name.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request

import pytest
from server_fixtures import DOMAIN, ServerProcess, tiny_checkpoint
from websockets.sync.client import connect

from cosmos3_runtime.served_weights import checkpoint_sha256
from robot_clients.wire_codec import packb, unpackb

pytestmark = pytest.mark.timeout(300)

MODEL_FOLDER = "cosmos3-tiny-leak-check"


def _get(url: str) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=30) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as exc:
        return bytes(exc.read())


def _ws(url: str, send: list[bytes | str], replies: int, first: int = 0) -> list[bytes | str]:
    """Open ``url``, read ``first`` frames, send ``send``, read ``replies`` more; every frame read."""
    with connect(url, max_size=None, compression=None, proxy=None, open_timeout=30) as ws:
        frames = [ws.recv(timeout=30) for _ in range(first)]
        for frame in send:
            ws.send(frame)
        return frames + [ws.recv(timeout=60) for _ in range(replies)]


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    secret = tmp_path_factory.mktemp("secret-layout")
    model = secret / MODEL_FOLDER
    shutil.copytree(tiny_checkpoint("distilled"), model)
    # int8 weights: the doors must state them (test_every_door_states_the_weights_served).
    process = ServerProcess("--model", str(model), "--no-warmup", "--quantization", "int8").start()
    try:
        ws_base, http_base = f"127.0.0.1:{process.port}", None
        deadline = time.monotonic() + 120
        while b'"ready"' not in _get(f"http://{ws_base}/healthz"):
            assert time.monotonic() < deadline, process.log
            time.sleep(0.2)
        http_base = f"http://127.0.0.1:{process.http_port}"
        got: dict[str, bytes | str] = {}
        for path in ("/healthz", "/health", "/config", "/v1/vla-eval/health", "/v1/vla-eval/config"):
            got[f"ws-port {path}"] = _get(f"http://{ws_base}{path}")
        for path in ("/healthz", "/readyz", "/v1/actions/metadata", "/metrics", "/openapi.json"):
            got[f"sidecar {path}"] = _get(http_base + path)
        metadata, session = _ws(
            f"ws://{ws_base}/v1/actions/realtime", [packb({"type": "configure", "domain_name": DOMAIN})], 1, first=1
        )
        got["native metadata"], got["native session"] = metadata, session
        (got["openpi metadata"],) = _ws(f"ws://{ws_base}/openpi", [], 0, first=1)
        hello = packb({"type": "hello", "payload": {"protocol_version": 1}, "seq": 1, "timestamp": 0.0})
        (got["vla-eval hello"],) = _ws(f"ws://{ws_base}/v1/vla-eval", [hello], 1)
        observer = _ws(f"ws://{ws_base}/v1/observe", [json.dumps({"type": "subscribe", "session_id": None})], 2, 1)
        for index, frame in enumerate(observer):
            got[f"observer frame {index}"] = frame
        yield secret, got, model
    finally:
        process.stop()


def _text(answer: bytes | str) -> str:
    """An answer as text: msgpack frames decoded (their strings are what a client reads), others as sent."""
    if isinstance(answer, str):
        return answer
    try:
        return repr(unpackb(answer))
    except Exception:  # noqa: BLE001 - JSON or plain text
        return answer.decode("utf-8", "replace")


def test_no_answer_shows_where_the_model_lies(answers):
    secret, got, _ = answers
    leaks = {name: _text(answer) for name, answer in got.items() if str(secret) in _text(answer)}
    assert not leaks, leaks
    named = [name for name, answer in got.items() if MODEL_FOLDER in _text(answer)]
    # The model is still named, by its folder: in every hello and metadata answer that names it.
    for name in ("native metadata", "openpi metadata", "vla-eval hello", "ws-port /healthz", "sidecar /readyz"):
        assert name in named, (name, _text(got[name])[:400])


def test_every_door_states_the_weights_served(answers):
    """Every hello, metadata and readiness answer carries the quantization, the checkpoint's SHA-256 and the
    Hub commit (None: a local folder): the same three values everywhere."""
    _, got, model = answers
    expected = {"quantization": "int8", "sha256": checkpoint_sha256(model), "revision": None}

    def weights(name: str, *path: str) -> object:
        answer = got[name]
        # WebSocket frames are msgpack; HTTP answers JSON.
        data = unpackb(answer) if name.startswith(("native", "openpi", "vla-eval")) else json.loads(answer)
        for key in path:
            data = data[key]
        return data["weights"]

    assert weights("native metadata") == expected
    assert weights("openpi metadata") == expected
    assert weights("vla-eval hello", "payload", "cosmos3") == expected
    assert weights("sidecar /readyz") == expected
    assert weights("sidecar /v1/actions/metadata") == expected  # with SGLang's keys merged in
    assert weights("sidecar /healthz") == expected
    assert weights("ws-port /healthz") == expected
