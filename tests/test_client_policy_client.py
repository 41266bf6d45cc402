"""robot_clients against a real server: blocking and asyncio clients, streaming, errors, stale replies,
reconnection with the configuration re-sent, extra headers and wss://."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
import time

import numpy as np
import pytest
from server_fixtures import DOMAIN, ServerThread, rgb_image, tiny_engine_loader
from tls_fixtures import self_signed_certificate

from robot_clients import (
    ActionChunk,
    AsyncPolicyClient,
    ConnectionLost,
    ObservationDropped,
    PolicyClient,
    ServerError,
)

IMAGE = rgb_image(64)


@pytest.fixture(scope="module")
def server():
    with ServerThread(tiny_engine_loader("distilled")) as running:
        yield running


def test_blocking_client_round_trip(server):
    base_url = f"ws://127.0.0.1:{server.port}"  # the endpoint path is added by the client
    with PolicyClient(base_url, headers={"Authorization": "Bearer robot-7"}) as client:
        assert client.metadata["protocol_version"] == 1
        width = client.metadata["domains"][DOMAIN]["raw_action_dim"]
        session = client.configure(domain_name=DOMAIN, action_horizon=8)
        assert session["action_horizon"] == 8
        chunk = client.infer({"image": rgb_image()}, timeout=30)
        assert isinstance(chunk, ActionChunk)
        assert chunk.actions.shape == (8, width) and chunk.actions.dtype == np.float32
        chunk.actions[0, 0] = 1.0  # the robot may edit its copy
        assert chunk.round_trip_ms > 0 and chunk.timing["model_ms"] > 0
        assert chunk.round_trip_ms >= chunk.timing["model_ms"]
        # A bare image is accepted as an observation too.
        assert client.infer(IMAGE, timeout=30).seq == chunk.seq + 1
        # The extra headers reached the server's handshake.
        headers = server.run(
            lambda: [s.connection.request.headers.get("Authorization") for s in server.server.context.sessions.values()]
        )
        assert "Bearer robot-7" in headers


def test_blocking_client_streaming(server):
    with PolicyClient(server.url) as client:
        client.configure(domain_name=DOMAIN)
        sent = [client.submit({"image": rgb_image(64, seed=i)}) for i in range(10)]
        chunks = []
        while not chunks or chunks[-1].seq != sent[-1]:
            chunks.append(client.receive(timeout=30))
        seqs = [c.seq for c in chunks]
        assert seqs == sorted(set(seqs))  # increasing, never an older one after a newer one
        # Every observation is accounted for, answered or dropped, once the last `dropped` notices arrived
        # (they may trail the last chunk).
        deadline = time.monotonic() + 10
        while client.stats.answered + sum(client.stats.dropped.values()) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.stats.answered + sum(client.stats.dropped.values()) == len(sent)


async def test_async_client_errors_name_their_cause(server):
    async with AsyncPolicyClient(server.url) as client:
        with pytest.raises(ServerError) as info:
            await client.configure(domain_name="spaceship")
        assert info.value.code == "unknown_domain" and info.value.field == "domain_name"
        await client.configure(domain_name=DOMAIN)
        with pytest.raises(ServerError) as info:
            await client.infer({"image": IMAGE.astype(np.float32)}, timeout=30)
        assert info.value.code == "invalid_image" and info.value.field == "image"
        # Streaming: a refused observation surfaces from receive().
        await client.submit({"image": IMAGE[..., :2]})
        with pytest.raises(ServerError) as info:
            await client.receive(timeout=30)
        assert info.value.code == "invalid_image"
        # And the session goes on.
        chunk = await client.infer({"image": IMAGE}, timeout=30)
        assert chunk.domain_name == DOMAIN


async def test_infer_timeout_cancels_and_the_late_chunk_never_reaches_the_robot(server):
    async with AsyncPolicyClient(server.url) as client:
        await client.configure(domain_name=DOMAIN)
        with pytest.raises(TimeoutError):
            await client.infer({"image": IMAGE}, timeout=0.001)
        chunk = await client.infer({"image": IMAGE}, timeout=30)
        assert chunk.seq == 1
        with pytest.raises(TimeoutError):
            await client.receive(timeout=0.3)  # seq 0 was cancelled: nothing else arrives
        assert client.stats.dropped["cancelled"] == 1


async def test_a_chunk_older_than_the_latest_delivered_is_never_handed_over(server):
    """seq 0 is streamed, seq 1 is inferred; once seq 1's chunk is delivered, seq 0's (if the engine ran
    it at all) is stale and receive() must not return it."""
    async with AsyncPolicyClient(server.url) as client:
        await client.configure(domain_name=DOMAIN)
        first = await client.submit({"image": IMAGE})
        chunk = await client.infer({"image": IMAGE}, timeout=30)
        assert chunk.seq == first + 1
        await asyncio.sleep(0.2)
        with pytest.raises(TimeoutError):
            await client.receive(timeout=0.3)
        assert client.stats.stale + client.stats.dropped["superseded"] == 1


def test_reconnects_with_backoff_and_resends_its_configuration():
    first = ServerThread(tiny_engine_loader("distilled"), warmup=False).start()
    port = first.port
    client = PolicyClient(f"ws://127.0.0.1:{port}", backoff_initial=0.05, backoff_max=0.5)
    try:
        client.connect()
        client.configure(domain_name=DOMAIN, action_horizon=8, seed=5)
        before = client.infer(IMAGE, timeout=30)
        first_session = client.metadata["session_id"]
        first.stop()  # closes the session with 1001, like a server restart

        with pytest.raises((ConnectionLost, TimeoutError)):
            client.infer(IMAGE, timeout=0.5)  # nobody is listening now
        second = ServerThread(tiny_engine_loader("distilled"), port=port, warmup=False).start()
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    after = client.infer(IMAGE, timeout=10)
                    break
                except (ConnectionLost, TimeoutError, ObservationDropped):
                    assert time.monotonic() < deadline, "the client never reconnected"
            assert client.stats.reconnects >= 1
            assert client.metadata["session_id"] != first_session
            # The configuration was re-sent: same horizon and seed, hence the same actions.
            assert after.actions.shape == before.actions.shape == (8, before.raw_action_dim)
            np.testing.assert_array_equal(after.actions, before.actions)
            assert after.seq > before.seq
        finally:
            second.stop()
    finally:
        client.close()


@pytest.mark.skipif(sys.platform == "win32", reason="uses the openssl command line")
async def test_wss_with_a_private_certificate(tmp_path):
    try:
        cert, key = self_signed_certificate(tmp_path)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"openssl is not available to make a certificate: {exc}")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=cert)
    with ServerThread(tiny_engine_loader("distilled"), warmup=False, ssl_context=server_context) as tls_server:
        async with AsyncPolicyClient(f"wss://127.0.0.1:{tls_server.port}", ssl=client_context) as client:
            await client.configure(domain_name=DOMAIN)
            chunk = await client.infer(IMAGE, timeout=30)
            assert chunk.actions.ndim == 2


def test_robot_clients_import_nothing_of_the_server_side():
    """The client runs on the robot: importing it must not pull in torch, the runtime or the server."""
    code = (
        "import sys, robot_clients, robot_clients.wire_codec, robot_clients.client\n"
        "heavy = [m for m in ('torch', 'diffusers', 'cosmos3_runtime', 'policy_server') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""
