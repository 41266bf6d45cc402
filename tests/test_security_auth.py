"""Bearer-token authentication and TLS, end to end, against one real server (tiny model, real sockets).

The module's server runs with TLS (a certificate this test makes with ``openssl``) and two accepted
tokens, one given directly and one from a token file, and with its HTTP sidecar: so every check here
also shows that wss:// and https:// work with the same certificate. What must hold:

* without a valid token every WebSocket endpoint (native, openpi, the dashboard's observer channel,
  even an unknown path) is refused with HTTP 401 before the upgrade, and nothing reaches a session or
  the engine;
* a token works from the ``Authorization`` header (``Bearer``, or openpi's ``Api-Key``), the
  ``token``/``access_token`` query parameters and the ``bearer.<token>`` subprotocol (which the server then
  selects, as browsers require);
* the sidecar answers 401 with the typed error body on every route but ``/healthz`` and the dashboard's
  static files, before reading the body (a huge body without a token is 401, not 413);
* the robot client passes a token, and fails at once with a clear error without one.
* vla-eval's doors on the same port (issue 36.6): its session path ``/v1/vla-eval`` and ``/config`` (also
  under ``/v1/vla-eval/``) want the token like every closed endpoint; ``/health``, its readiness probe, stays
  open like ``/healthz`` and says nothing but the engine's state.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest
from server_fixtures import DOMAIN, ServerThread, rgb_image, tiny_engine_loader
from tls_fixtures import self_signed_certificate
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from policy_server.assembly.cli import _ssl_context, build_parser
from policy_server.foundation.auth import TokenConfigError, TokenSet
from policy_server.sidecar_settings import SidecarSettings
from robot_clients import AsyncPolicyClient
from robot_clients.wire_codec import packb, unpackb

TOKEN = "tok-A_3f9c1d2e7b"
FILE_TOKEN = "tok-B_from-the-file"


@pytest.fixture(scope="module")
def secured():
    with tempfile.TemporaryDirectory(prefix="security-auth-") as tmp:
        tmp_path = Path(tmp)
        try:
            cert, key = self_signed_certificate(tmp_path)
        except (OSError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"openssl is not available to make a certificate: {exc}")
        token_file = tmp_path / "tokens.txt"
        token_file.write_text(f"# robots of cell 3\n{FILE_TOKEN}\n\n")
        # The CLI's own flags and context builder, so the documented names are what is tested.
        args = build_parser().parse_args(["--tiny", "distilled", "--tls-cert", cert, "--tls-key", key])
        server = ServerThread(
            tiny_engine_loader("distilled"),
            warmup=False,
            ssl_context=_ssl_context(args),
            auth_tokens=TokenSet.load(TOKEN, token_file),
            http=SidecarSettings(data_dir=tmp_path / "data", port=0),
        )
        with server:
            server.cert = cert
            server.client_ssl = ssl.create_default_context(cafile=cert)
            server.https = httpx.Client(
                base_url=f"https://127.0.0.1:{server.sidecar.port}",
                verify=server.client_ssl,
                trust_env=False,
                timeout=30,
            )
            try:
                yield server
            finally:
                server.https.close()


def wss(server: ServerThread, path: str = "/v1/actions/realtime") -> str:
    return f"wss://127.0.0.1:{server.port}{path}"


async def refused(server: ServerThread, url: str, **kwargs) -> InvalidStatus:
    with pytest.raises(InvalidStatus) as caught:
        await connect(url, ssl=server.client_ssl, proxy=None, **kwargs)
    return caught.value


def reached_nothing(server: ServerThread, before: tuple[int, int, int]) -> bool:
    """Whether nothing reached the model and no session opened since ``before`` (:func:`engine_and_sessions`).
    The module's server is shared: a session of the test before may still be closing, so the count of sessions
    may fall, never rise."""
    completed, failed, sessions = engine_and_sessions(server)
    return (completed, failed) == before[:2] and sessions <= before[2]


def engine_and_sessions(server: ServerThread) -> tuple[int, int, int]:
    return server.run(
        lambda: (
            server.server.context.worker.completed,
            server.server.context.worker.failed,
            len(server.server.context.sessions),
        )
    )


async def test_every_websocket_endpoint_refuses_a_missing_or_wrong_token_before_the_upgrade(secured):
    before = engine_and_sessions(secured)
    for path in ("/v1/actions/realtime", "/", "/openpi", "/v1/observe", "/no/such/path"):
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "Api-Key wrong"},
            {"Authorization": f"Basic {TOKEN}"},
        ):
            error = await refused(secured, wss(secured, path), additional_headers=headers)
            assert error.response.status_code == 401, (path, headers)
            assert error.response.headers["WWW-Authenticate"].startswith("Bearer")
        error = await refused(secured, wss(secured, path) + "?token=wrong")
        assert error.response.status_code == 401
        assert b"not valid" in error.response.body
    assert reached_nothing(secured, before)  # nothing reached a session or the model


async def test_a_token_opens_the_realtime_endpoint_from_header_query_or_subprotocol(secured):
    ways = [
        (wss(secured), {"additional_headers": {"Authorization": f"Bearer {TOKEN}"}}, None),
        (wss(secured), {"additional_headers": {"Authorization": f"bearer {FILE_TOKEN}"}}, None),
        (wss(secured) + f"?token={TOKEN}", {}, None),
        (wss(secured) + f"?access_token={FILE_TOKEN}", {}, None),
        (wss(secured), {"subprotocols": [f"bearer.{TOKEN}"]}, f"bearer.{TOKEN}"),
    ]
    for url, kwargs, subprotocol in ways:
        async with connect(url, ssl=secured.client_ssl, proxy=None, compression=None, max_size=None, **kwargs) as ws:
            assert ws.subprotocol == subprotocol
            assert unpackb(await ws.recv())["type"] == "metadata"
    # A full round trip over wss with a token.
    async with connect(
        wss(secured),
        ssl=secured.client_ssl,
        proxy=None,
        compression=None,
        max_size=None,
        additional_headers={"Authorization": f"Bearer {TOKEN}"},
    ) as ws:
        await ws.recv()
        await ws.send(packb({"type": "configure", "domain_name": DOMAIN, "action_horizon": 8}))
        assert unpackb(await ws.recv())["type"] == "session"
        await ws.send(packb({"type": "observation", "seq": 0, "image": rgb_image(64)}))
        assert unpackb(await asyncio.wait_for(ws.recv(), 60))["type"] == "action_chunk"


async def test_openpis_api_key_scheme_opens_both_ports_where_bearer_does(secured):
    """openpi-client and strands-robots send ``Authorization: Api-Key <token>``: the same token, the same doors."""
    before = engine_and_sessions(secured)
    for path in ("/v1/actions/realtime", "/", "/openpi", "/v1/observe"):
        for wrong in ("Api-Key wrong", f"Api-Key {TOKEN}x", "Api-Key", f"ApiKey {TOKEN}"):
            error = await refused(secured, wss(secured, path), additional_headers={"Authorization": wrong})
            assert error.response.status_code == 401, (path, wrong)
    assert reached_nothing(secured, before)  # a wrong key reached nothing
    for path, header in (
        ("/v1/actions/realtime", f"Api-Key {TOKEN}"),
        ("/", f"api-key {FILE_TOKEN}"),
        ("/openpi", f"API-KEY {TOKEN}"),
    ):
        async with connect(
            wss(secured, path),
            ssl=secured.client_ssl,
            proxy=None,
            compression=None,
            max_size=None,
            additional_headers={"Authorization": header},
        ) as ws:
            hello = unpackb(await ws.recv())
            assert hello.get("type") == "metadata" or hello.get("protocol") == "openpi", hello
    for header, status in ((f"Api-Key {TOKEN}", 200), (f"api-key {FILE_TOKEN}", 200), ("Api-Key nope", 401)):
        response = secured.https.get("/v1/actions/metadata", headers={"Authorization": header})
        assert response.status_code == status, (header, response.text)


async def test_the_observer_channel_takes_the_dashboards_access_token(secured):
    async with connect(
        wss(secured, "/v1/observe") + f"?access_token={TOKEN}", ssl=secured.client_ssl, proxy=None
    ) as ws:
        hello = json.loads(await ws.recv())
        assert hello["type"] == "hello"


async def test_the_robot_client_sends_its_token_and_fails_fast_without_one(secured):
    async with AsyncPolicyClient(f"wss://127.0.0.1:{secured.port}", token=TOKEN, ssl=secured.client_ssl) as client:
        await client.configure(domain_name=DOMAIN, action_horizon=8)
        chunk = await client.infer(rgb_image(64), timeout=60)
        assert chunk.actions.shape[0] == 8
    client = AsyncPolicyClient(f"wss://127.0.0.1:{secured.port}", ssl=secured.client_ssl, connect_timeout=30)
    started = asyncio.get_running_loop().time()
    with pytest.raises(ConnectionError, match="401"):
        await client.connect()
    assert asyncio.get_running_loop().time() - started < 5  # no retrying a refusal that cannot change


def test_open_paths_stay_open_without_a_token(secured):
    import urllib.request

    context = ssl.create_default_context(cafile=secured.cert)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    with opener.open(f"https://127.0.0.1:{secured.port}/healthz", timeout=10) as response:
        assert response.status == 200 and json.loads(response.read())["status"] == "ready"
    with opener.open(f"https://127.0.0.1:{secured.port}/dashboard/", timeout=10) as response:
        assert response.status == 200
    assert secured.https.get("/healthz").status_code == 200
    assert secured.https.get("/dashboard/").status_code == 200


def test_healthz_shows_where_the_model_lies_only_behind_the_token(secured):
    """The attack run read the model's absolute path on the server from an open ``/healthz``."""
    import urllib.request

    context = ssl.create_default_context(cafile=secured.cert)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    model = secured.server.context.description.model
    assert Path(model).is_absolute()  # a local folder: the tiny checkpoint
    for url in (f"https://127.0.0.1:{secured.port}/healthz", f"https://127.0.0.1:{secured.port}/healthz?token=nope"):
        with opener.open(url, timeout=10) as response:
            shown = json.loads(response.read())["model"]
        assert shown == Path(model).name and "/" not in shown, shown
    with opener.open(f"https://127.0.0.1:{secured.port}/healthz?access_token={TOKEN}", timeout=10) as response:
        assert json.loads(response.read())["model"] == model
    assert secured.https.get("/healthz").json()["model"] == Path(model).name
    authorized = secured.https.get("/healthz", headers={"Authorization": f"Bearer {FILE_TOKEN}"})
    assert authorized.json()["model"] == model


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/v1/actions/metadata"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/v1/videos"),
        ("GET", "/v1/videos/video_0123"),
        ("POST", "/v1/videos"),
        ("POST", "/v1/actions/generations"),
        ("DELETE", "/v1/videos/video_0123"),
        ("GET", "/no/such/route"),
    ],
)
def test_every_sidecar_route_but_healthz_wants_a_token(secured, method, path):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Api-Key nope"}):
        response = secured.https.request(method, path, headers=headers, json={})
        assert response.status_code == 401, (method, path, response.text)
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["error"]["code"] == "unauthorized"
    response = secured.https.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"}, json={})
    assert response.status_code != 401
    response = secured.https.request(method, path, params={"access_token": FILE_TOKEN}, json={})
    assert response.status_code != 401
    response = secured.https.request(method, path, headers={"Authorization": f"Api-Key {FILE_TOKEN}"}, json={})
    assert response.status_code != 401


def test_the_sidecar_refuses_before_reading_the_body(secured):
    big = b"x" * (80 * 2**20)  # over the 64 MiB body limit: with a token this would be 413
    response = secured.https.post("/v1/videos", content=big, headers={"Content-Type": "application/json"})
    assert response.status_code == 401
    response = secured.https.post(
        "/v1/videos",
        headers={
            "Content-Type": "application/json",
            "Content-Length": str(len(big)),
            "Authorization": f"Bearer {TOKEN}",
        },
        content=big,
    )
    assert response.status_code == 413


def test_token_sets_load_from_flags_and_files(tmp_path):
    assert TokenSet.load(None, None) is None
    tokens = tmp_path / "t"
    tokens.write_text("# comment\n alpha \n\nbeta\n")
    loaded = TokenSet.load("gamma", tokens)
    assert len(loaded) == 3
    assert loaded.matches("alpha") and loaded.matches("beta") and loaded.matches("gamma")
    assert not loaded.matches("alph") and not loaded.matches("") and not loaded.matches(None)
    with pytest.raises(TokenConfigError):
        TokenSet.load(None, tmp_path / "missing")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(TokenConfigError):
        TokenSet.load(None, tmp_path / "empty")
    with pytest.raises(TokenConfigError):
        TokenSet(["has space"])


def test_the_old_tls_flag_names_still_work():
    args = build_parser().parse_args(["--tiny", "distilled", "--certfile", "c.pem", "--keyfile", "k.pem"])
    assert (args.tls_cert, args.tls_key) == ("c.pem", "k.pem")


VLA_EVAL_CONFIG_PATHS = ("/config", "/v1/vla-eval/config")
VLA_EVAL_HEALTH_PATHS = ("/health", "/v1/vla-eval/health")


def _get(server: ServerThread, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=server.cert)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(f"https://127.0.0.1:{server.port}{path}", headers=headers or {})
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def test_the_vla_eval_session_path_wants_a_token(secured):
    before = engine_and_sessions(secured)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        error = await refused(secured, wss(secured, "/v1/vla-eval"), additional_headers=headers)
        assert error.response.status_code == 401, headers
        assert error.response.headers["WWW-Authenticate"].startswith("Bearer")
    assert (await refused(secured, wss(secured, "/v1/vla-eval") + "?token=wrong")).response.status_code == 401
    assert reached_nothing(secured, before)
    hello = {"type": "hello", "payload": {"protocol_version": 1}, "seq": 1, "timestamp": 0.0}
    for url, kwargs in (
        (wss(secured, "/v1/vla-eval"), {"additional_headers": {"Authorization": f"Bearer {TOKEN}"}}),
        (wss(secured, "/v1/vla-eval") + f"?token={FILE_TOKEN}", {}),
    ):
        async with connect(url, ssl=secured.client_ssl, proxy=None, compression=None, max_size=None, **kwargs) as ws:
            await ws.send(packb(hello))
            assert unpackb(await ws.recv())["type"] == "hello"


@pytest.mark.parametrize("path", VLA_EVAL_CONFIG_PATHS)
def test_vla_eval_config_wants_a_token(secured, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, answer_headers, body = _get(secured, path, headers)
        assert status == 401, (path, headers, body)
        assert answer_headers["WWW-Authenticate"].startswith("Bearer")
        assert b"config" not in body  # nothing of the configuration before the token
    status, _, body = _get(secured, path, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and "config" in json.loads(body), body
    status, _, body = _get(secured, path + f"?access_token={FILE_TOKEN}")
    assert status != 401, body  # the token's query parameter is the token, not a setting to change


@pytest.mark.parametrize("path", VLA_EVAL_HEALTH_PATHS)
def test_vla_eval_health_stays_open_and_says_only_the_state(secured, path):
    status, _, body = _get(secured, path)
    assert status == 200 and json.loads(body) == {"status": "ok"}, body
