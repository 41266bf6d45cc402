"""The packet relay of :mod:`netns_link`: netem's job, in a namespace of its own, for kernels without netem.

Runs inside the link's middle namespace (``ShapedLink`` starts it): it moves Ethernet frames between two
interfaces with raw packet sockets, and in each direction loses a frame with probability ``loss``,
serialises the rest at ``rate_mbit`` behind a queue of at most ``limit_packets`` (tail drop beyond, as
netem's ``limit``), and delivers each ``delay_ms`` after it left the queue. SIGUSR1 prints the counts so
far (one JSON line); SIGTERM stops it.

``no-offload IFACE`` (run in an end namespace) turns segmentation and checksum offloads off, so that the
relay sees wire-sized frames with their checksums filled in.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time

from netns_link import LinkShape, add_shape_arguments, shape_from_arguments

# -- offloads off (run inside a namespace) ---------------------------------------------------------------

SIOCETHTOOL = 0x8946
# Legacy ethtool "set" commands (linux/ethtool.h): TX checksum, scatter-gather, TSO, GSO, GRO.
ETHTOOL_SETTINGS = {"tx-checksum": 0x17, "scatter-gather": 0x19, "tso": 0x1F, "gso": 0x24, "gro": 0x2C}


def disable_offloads(interface: str) -> None:
    """Turn off segmentation and checksum offloads on ``interface`` (``ethtool -K ... off``), so that every
    frame a packet socket sees on the other end of the veth is one wire-sized packet with a valid checksum."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name, command in ETHTOOL_SETTINGS.items():
            value = ctypes.create_string_buffer(struct.pack("II", command, 0))
            request = struct.pack("16sP", interface.encode(), ctypes.addressof(value)).ljust(40, b"\0")
            try:
                fcntl.ioctl(sock.fileno(), SIOCETHTOOL, request)
            except OSError as exc:
                raise OSError(f"cannot turn {name} off on {interface}: {exc}") from None


# -- the relay (run inside the link namespace) -------------------------------------------------------------

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


class Direction:
    """One way across the link: a queue serialised at the rate, then the delay, loss on arrival."""

    def __init__(self, shape: LinkShape, rng: random.Random) -> None:
        self.shape = shape
        self.rng = rng
        self.busy_until = 0.0
        self.queued = 0
        self.counts = {"packets": 0, "bytes": 0, "lost": 0, "overflow": 0}

    def admit(self, frame_bytes: int, now: float) -> float | None:
        """When this frame leaves the far end, or None if it is lost or the queue is full."""
        self.counts["packets"] += 1
        if self.rng.random() < self.shape.loss:
            self.counts["lost"] += 1
            return None
        if self.queued >= self.shape.limit_packets:
            self.counts["overflow"] += 1
            return None
        start = max(now, self.busy_until)
        self.busy_until = start + frame_bytes * 8 / (self.shape.rate_mbit * 1e6)
        self.queued += 1
        self.counts["bytes"] += frame_bytes
        return self.busy_until + self.shape.delay_ms / 1e3


def run_relay(port_a: str, port_b: str, shape: LinkShape, seed: int | None) -> None:
    """Move frames between two interfaces through a :class:`Direction` each way, until SIGTERM."""
    sockets = {}
    for name in (port_a, port_b):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.bind((name, 0))
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 2**20)
        sockets[name] = sock
    other = {port_a: port_b, port_b: port_a}
    rng = random.Random(seed)
    directions = {port_a: Direction(shape, rng), port_b: Direction(shape, rng)}
    pending: list[tuple[float, int, str, bytes]] = []  # (leave at, order, out port, frame)
    order = 0
    stop = False

    report = False

    def on_term(signum, frame):
        nonlocal stop
        stop = True

    def on_report(signum, frame):
        nonlocal report
        report = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGUSR1, on_report)  # ShapedLink.counts(): print the counts, one JSON line
    with contextlib.suppress(PermissionError, OSError):
        os.nice(-10)  # the relay is the wire: let it run before the processes it carries
    print("relay ready", flush=True)
    by_fd = {sock.fileno(): name for name, sock in sockets.items()}
    while not stop:
        if report:
            report = False
            print(json.dumps({name: d.counts for name, d in directions.items()}), flush=True)
        timeout = max(0.0, pending[0][0] - time.monotonic()) if pending else 0.5
        try:
            readable, _, _ = select.select(list(by_fd), [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in readable:
            port = by_fd[fd]
            while True:
                try:
                    frame, address = sockets[port].recvfrom(65536)
                except BlockingIOError:
                    break
                if address[2] == PACKET_OUTGOING:
                    continue  # our own transmissions on this port
                leave_at = directions[port].admit(len(frame), now)
                if leave_at is not None:
                    heapq.heappush(pending, (leave_at, order, other[port], frame))
                    order += 1
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            _, _, out_port, frame = heapq.heappop(pending)
            directions[other[out_port]].queued -= 1
            with contextlib.suppress(BlockingIOError, OSError):
                sockets[out_port].send(frame)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    relay = sub.add_parser("relay", help="move frames between two interfaces through the shaped link")
    relay.add_argument("port_a")
    relay.add_argument("port_b")
    relay.add_argument("--seed", type=int, default=None)
    add_shape_arguments(relay)
    offload = sub.add_parser("no-offload", help="turn segmentation and checksum offloads off on an interface")
    offload.add_argument("interface")
    args = parser.parse_args(argv)
    if args.command == "no-offload":
        disable_offloads(args.interface)
    else:
        run_relay(args.port_a, args.port_b, shape_from_arguments(args), args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
