"""The shaped link (benchmarks/netns_link.py): two network namespaces joined at 20 Mbit/s, 10 ms each way,
0.5 % loss. Needs root and network namespaces; where they cannot be made, the tests say why and skip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from netns_link import LinkShape, ShapedLink, measure_link, unavailable_reason  # noqa: E402

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no shaped link here: {REASON}")
SHAPE = LinkShape(rate_mbit=20, delay_ms=10, loss=0.005)


def namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


def test_the_link_delays_caps_and_loses_packets_both_ways():
    with ShapedLink(SHAPE, relay_seed=0) as link:
        measured = measure_link(link, pings=20, bulk_bytes=3 * 2**20)
        counts = link.counts()
    print(f"{link.backend}: {measured}, {counts}")
    # Every round trip crosses the link twice: at least the two one-way delays.
    assert measured.rtt_ms_min >= 2 * SHAPE.delay_ms - 0.5
    # The bulk transfer cannot beat the rate; it is slowed by loss and the machine, not stopped.
    assert SHAPE.rate_mbit * 0.2 < measured.throughput_mbit <= SHAPE.rate_mbit * 1.02
    up = counts["robot->server"]
    assert up["packets"] > 2000  # 3 MiB in wire-sized packets: segmentation offloads are off
    assert 0 < up["lost"] < up["packets"] * SHAPE.loss * 3  # about 0.5 %: ~11 of 2200


def test_everything_is_torn_down_even_when_the_body_fails():
    with pytest.raises(RuntimeError, match="boom"):
        with ShapedLink(SHAPE) as first, ShapedLink(SHAPE) as second:
            ours = set(first.namespaces.values()) | set(second.namespaces.values())
            assert len(ours) == len(first.namespaces) + len(second.namespaces)  # parallel links share no name
            assert ours <= namespaces()
            sleeper = first.popen("server", ["sleep", "300"])
            raise RuntimeError("boom")
    assert not ours & namespaces()  # (other runs' namespaces may come and go meanwhile)
    assert sleeper.poll() is not None  # processes started in a namespace are gone too


@pytest.mark.slow
def test_robots_reach_the_real_servers_over_the_shaped_link():
    """benchmarks/shaped_link.py in short: the policy server (tiny distilled) and the lock-step server in
    the server namespace, a streaming and a lock-step robot in the robot namespace, raw 480×640 frames."""
    from shaped_link import Row, measure

    backend, summaries, _ = measure([Row("stream-unbounded", 1), Row("lockstep", 1)], SHAPE, hz=15, seconds=8)
    print(backend, *summaries, sep="\n")
    for row in summaries:
        assert row.errors == 0 and row.answered_hz > 0, row
        assert row.bytes_per_frame > 480 * 640 * 3  # the raw frame, packed
        # 921 KB cannot cross 20 Mbit/s faster than its wire time (~0.39 s): the link, not loopback, carries it.
        assert row.age_p50 >= 0.9 * row.wire_ms, row
        assert row.latency_p50 > row.age_p50
    stream, lockstep = summaries
    assert stream.sent_hz < 15 / 2  # the link, not the camera, sets the pace of raw frames


@pytest.mark.slow
def test_encoded_frames_and_a_reconnect_over_the_shaped_link():
    """benchmarks/shaped_link.py in short, with what robots on real networks do: two cameras as JPEG resized
    on the robot (the native client's options, and by hand for the openpi lock-step client), raw frames
    with and without the client's in-flight bound, then a 2 s outage mid-episode that the client rides out:
    it reconnects, re-sends its configuration, and never hands the robot a chunk older than one it had."""
    from shaped_link import Row, measure

    rows = [
        Row("stream", 2, "jpeg-resized"),
        Row("lockstep", 2, "jpeg-resized"),
        Row("stream", 1, "raw"),
        Row("stream-nowait", 1, "raw"),
    ]
    backend, summaries, (outage, counts) = measure(rows, SHAPE, hz=15, seconds=8, outage=(3.0, 2.0))
    print(backend, *summaries, outage, counts, sep="\n")
    encoded, lockstep, bounded, unbounded = summaries
    for row in (encoded, lockstep):
        assert row.errors == 0 and row.answered_hz > 0, row
        assert row.bytes_per_frame < 2 * 480 * 640 * 3 / 20, row  # resized JPEG: a small fraction of raw
    # Raw frames: the bound keeps the robot's backlog to about one frame; without it, frames pile up.
    assert bounded.errors == 0 and bounded.superseded > 0, bounded
    assert bounded.queued_max_kb < 2 * 921_600 / 1024, bounded
    assert unbounded.queued_max_kb > 3 * bounded.queued_max_kb, (bounded, unbounded)
    # The outage: reconnected, configured again, answered after it, never an older chunk after a newer one.
    assert counts["reconnects"] >= 1 and counts["configured_after_reconnect"], counts
    assert counts["answered_after_reconnect"] > 0, counts
    assert counts["older_than_delivered"] == 0, counts


def test_the_link_can_be_cut_and_restored():
    """For outages (a robot's Wi-Fi dropping): nothing crosses while cut, everything again once restored."""
    from netns_link import LinkUnavailable

    with ShapedLink(SHAPE) as link:
        link.cut()
        with pytest.raises(LinkUnavailable, match="not reachable"):
            link.wait_reachable(timeout=1.0)
        link.restore()
        link.wait_reachable(timeout=10.0)
