"""Schema-driven fuzzing of the HTTP sidecar with schemathesis, against a live server (tiny model).

schemathesis reads the sidecar's own ``/openapi.json`` and, per route, generates requests that follow
the schema and requests that break it (wrong types, missing fields, out-of-range values, odd strings,
NaN where the schema allows numbers). The server runs with a bearer token, so the fuzzing goes through
the authenticated path. What must hold for every request:

* never a 5xx (an unhandled error is a bug: the typed ``internal_error`` would show up here);
* every 4xx carries the one typed error body (``{"error": {"code", "message", "field"}}``), except the
  401s of requests without a token, which carry it too;
* afterwards the server is healthy and still serves a robot's request.

Examples per route: ``FUZZ_EXAMPLES`` (a few dozen in ``make test``; ``benchmarks/fuzz_long.py`` raises it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from server_fixtures import DOMAIN, ServerThread, tiny_engine_loader
from sidecar_fixtures import png_b64, rgb

from policy_server.foundation.auth import TokenSet
from policy_server.sidecar_settings import RetentionPolicy, SidecarSettings

TOKEN = "fuzz-token-7d1c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = max(5, int(os.environ.get("FUZZ_EXAMPLES", "120")) // 5)


@pytest.fixture(scope="module")
def sidecar_server():
    with tempfile.TemporaryDirectory(prefix="fuzz-sidecar-") as tmp:
        server = ServerThread(
            tiny_engine_loader("distilled"),
            warmup=False,
            auth_tokens=TokenSet([TOKEN]),
            # Few queued jobs: a schema-valid video request may be generated; it must not pile up work.
            http=SidecarSettings(
                data_dir=Path(tmp), port=0, retention=RetentionPolicy(max_queued=2), max_body_bytes=4 * 2**20
            ),
        )
        with server:
            server.http_url = f"http://127.0.0.1:{server.sidecar.port}"
            yield server


def check_case(case, server: ServerThread) -> None:
    response = case.call_and_validate(base_url=server.http_url, headers=AUTH, checks=[not_a_server_error], timeout=60)
    if 400 <= response.status_code < 500:
        body = response.json()
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "field"}, body
        assert body["error"]["code"] and body["error"]["message"], body
    # The same request without a token: refused, typed, before anything else.
    anonymous = case.call(base_url=server.http_url, headers={"Authorization": "Bearer not-it"}, timeout=60)
    if case.path != "/healthz" and not case.path.startswith("/dashboard"):
        assert anonymous.status_code == 401, (case.path, anonymous.status_code)
        assert anonymous.json()["error"]["code"] == "unauthorized"


def test_the_sidecar_never_fails_on_generated_requests(sidecar_server):
    # schemathesis' own pytest integration (from_fixture) does not work with this pytest; its schema
    # loader and case strategies are used directly, one hypothesis run per operation.
    schema = schemathesis.openapi.from_url(f"{sidecar_server.http_url}/openapi.json", headers=AUTH)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8, [op.label for op in operations]
    for operation in operations:
        # Both modes: requests that follow the schema, and requests that break it.
        strategy = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(GenerationMode.NEGATIVE)

        @given(case=strategy)
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize="FUZZ_SEED" not in os.environ,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case):
            check_case(case, sidecar_server)

        fuzz()


def test_the_sidecar_still_serves_after_the_fuzzing(sidecar_server):
    with httpx.Client(base_url=sidecar_server.http_url, headers=AUTH, trust_env=False, timeout=60) as client:
        assert client.get("/readyz").status_code == 200
        response = client.post("/v1/actions/generations", json={"domain_name": DOMAIN, "image": png_b64(rgb(64))})
        assert response.status_code == 200, response.text


raw_bodies = st.one_of(
    st.binary(max_size=2048),
    st.builds(lambda depth: b"[" * depth + b"]" * depth, st.integers(1, 100000)),  # deep JSON nesting
    st.builds(lambda depth: b"\x91" * depth + b"\xc0", st.integers(1, 100000)),  # deep msgpack nesting
    st.builds(
        lambda field, depth: b'{"' + field.encode() + b'": ' + b"[" * depth + b"1" + b"]" * depth + b"}",
        st.sampled_from(["action", "image", "prefix_actions", "video", "domain_name"]),
        st.integers(1, 3000),
    ),
    st.sampled_from(
        [
            b'{"action": [[NaN, Infinity]], "input_reference": "x"}',
            b"\xdd\xff\xff\xff\xff",
            b'{"image": {"__ndarray__": true, "data": "", "dtype": "|u1", "shape": [99999, 99999, 3]}}',
            b'--b\r\nContent-Disposition: form-data; name="image"; filename="../../x"\r\n\r\nzz\r\n--b--',
        ]
    ),
)
content_types = st.sampled_from(
    [
        "application/json",
        "application/msgpack",
        "application/x-msgpack",
        "multipart/form-data; boundary=b",
        "multipart/form-data",
        "text/plain",
        "",
    ]
)


def test_raw_hostile_bodies_get_typed_4xx(sidecar_server):
    with httpx.Client(base_url=sidecar_server.http_url, headers=AUTH, trust_env=False, timeout=60) as client:

        @given(
            body=raw_bodies, content_type=content_types, path=st.sampled_from(["/v1/videos", "/v1/actions/generations"])
        )
        @settings(
            max_examples=EXAMPLES * 3,
            deadline=None,
            database=None,
            derandomize="FUZZ_SEED" not in os.environ,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(body, content_type, path):
            response = client.post(path, content=body, headers={"Content-Type": content_type})
            assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
            error = response.json()["error"]
            assert error["code"] and error["message"]

        fuzz()
