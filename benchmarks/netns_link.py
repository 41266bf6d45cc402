"""A shaped network link between two network namespaces this process makes itself (needs root).

A robot and its policy server rarely share a loopback: they talk over Wi-Fi or a shared lab network.
:class:`ShapedLink` builds that on one Linux machine: a ``server`` namespace and a ``robot`` namespace
(each with its own loopback, addresses and TCP stack), joined by a link with a rate, a one-way delay
and a random loss, both ways::

    with ShapedLink(LinkShape(rate_mbit=20, delay_ms=10, loss=0.005)) as link:
        server = link.popen("server", [python, "-m", "policy_server.assembly.cli", "--host", link.server_ip, ...])
        link.run("robot", [python, "robot.py", f"ws://{link.server_ip}:8000"])

Two ways to shape, chosen at start (``backend="auto"`` takes the first that works here):

* ``netem``: a veth pair straight between the two namespaces, with ``tc qdisc ... netem delay rate
  loss`` on each end (the kernel's network emulator, module ``sch_netem``), offloads off as below.
* ``relay``: for kernels built without ``sch_netem`` (some sandboxes and micro-VMs: ``tc`` answers
  "Specified qdisc kind is unknown"), a third ``link`` namespace in the middle, joined to each side by
  a veth pair, where ``netns_relay.py`` moves Ethernet frames between the two and does what netem does
  (loss, the rate behind a bounded queue, the delay). It is a Python process: on a loaded machine its
  scheduling adds jitter (a fraction of a millisecond when idle), which :func:`measure_link` shows.

Either way, segmentation and checksum offloads are off on the two end interfaces, so every packet on
the link is wire-sized (loss and the rate apply per real packet).

Every name is unique per link (namespaces ``slk<random>-server`` ...), so parallel runs never collide,
and everything is torn down on exit, on error and on Ctrl-C: the processes started in the namespaces
are killed, then the namespaces are deleted (which deletes their interfaces).

:func:`unavailable_reason` says why a link cannot be made here (not root, no ``ip``, no namespaces),
so a test can skip with that reason. Run this file to measure a link::

    sudo .venv/bin/python benchmarks/netns_link.py measure [--backend relay] [--rate-mbit 20 ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

RELAY_FILE = Path(__file__).resolve().parent / "netns_relay.py"
SIDES = ("server", "robot")
SERVER_IP, ROBOT_IP = "10.77.0.1", "10.77.0.2"


@dataclass(frozen=True)
class LinkShape:
    """What the link does to every packet, in each direction (netem's terms)."""

    rate_mbit: float = 20.0
    delay_ms: float = 10.0
    loss: float = 0.005  # probability that a packet is lost
    limit_packets: int = 1000  # netem's default queue limit; beyond it, tail drop

    def netem_args(self) -> list[str]:
        return [
            "delay",
            f"{self.delay_ms}ms",
            "rate",
            f"{self.rate_mbit}mbit",
            "loss",
            f"{self.loss * 100}%",
            "limit",
            str(self.limit_packets),
        ]


class LinkUnavailable(RuntimeError):
    """The link cannot be made on this machine; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise LinkUnavailable(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result


def unavailable_reason() -> str | None:
    """Why no link can be made here (not root, no iproute2, network namespaces refused), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (`ip`, `tc`) is not installed (make test-system-deps installs it)"
    probe = f"slk{secrets.token_hex(3)}-probe"
    result = _ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        return f"cannot create a network namespace: {result.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def netem_available() -> bool:
    """True when the kernel has ``sch_netem`` (probed on a veth pair in a throwaway namespace)."""
    probe = f"slk{secrets.token_hex(3)}-probe"
    _ip("netns", "add", probe)
    try:
        _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        result = subprocess.run(
            ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"],
            capture_output=True,
            text=True,
        )
        return result.returncode == 0
    finally:
        _ip("netns", "del", probe, check=False)


class ShapedLink:
    """Two namespaces, ``server`` and ``robot``, joined by a shaped link (see the module docstring).

    ``server_ip`` / ``robot_ip`` are the addresses on the link. :meth:`popen` and :meth:`run` start
    commands in a namespace; processes from :meth:`popen` are killed on exit. :meth:`cut` takes the
    link down (and :meth:`restore` up again) to simulate an outage.
    """

    def __init__(self, shape: LinkShape = LinkShape(), backend: str = "auto", relay_seed: int | None = None) -> None:
        if backend not in ("auto", "netem", "relay"):
            raise ValueError(f"backend must be auto, netem or relay, got {backend!r}")
        self.shape = shape
        self.requested_backend = backend
        self.backend: str | None = None
        self.relay_seed = relay_seed
        self.prefix = f"slk{secrets.token_hex(3)}"
        self.namespaces = {side: f"{self.prefix}-{side}" for side in SIDES}
        self.server_ip, self.robot_ip = SERVER_IP, ROBOT_IP
        self._made: list[str] = []
        self._processes: list[subprocess.Popen] = []
        self._relay: subprocess.Popen | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------

    def __enter__(self) -> ShapedLink:
        reason = unavailable_reason()
        if reason is not None:
            raise LinkUnavailable(reason)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        # Quiet links: no IPv6 autoconfiguration traffic (router solicitations, DAD) on the shaped wire.
        self.exec_in(
            name, ["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
        )

    def _build(self) -> None:
        backend = self.requested_backend
        if backend == "auto":
            backend = "netem" if netem_available() else "relay"
        self.backend = backend
        server_ns, robot_ns = self.namespaces["server"], self.namespaces["robot"]
        for name in (server_ns, robot_ns):
            self._add_namespace(name)
        if backend == "netem":
            _ip("link", "add", "link0", "netns", server_ns, "type", "veth", "peer", "name", "link0", "netns", robot_ns)
        else:
            link_ns = self.namespaces["link"] = f"{self.prefix}-link"
            self._add_namespace(link_ns)
            _ip(
                "link",
                "add",
                "link0",
                "netns",
                server_ns,
                "type",
                "veth",
                "peer",
                "name",
                "to-server",
                "netns",
                link_ns,
            )
            _ip("link", "add", "link0", "netns", robot_ns, "type", "veth", "peer", "name", "to-robot", "netns", link_ns)
            for port in ("to-server", "to-robot"):
                _ip("-n", link_ns, "link", "set", port, "promisc", "on", "up")
        for side, address in (("server", self.server_ip), ("robot", self.robot_ip)):
            ns = self.namespaces[side]
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "link0")
            _ip("-n", ns, "link", "set", "link0", "up")
            # Wire-sized packets on both backends: netem (like the relay) would otherwise lose, delay and
            # rate-limit 64 KB segmentation-offload super-packets as if each were one packet.
            self.exec_in(ns, [sys.executable, str(RELAY_FILE), "no-offload", "link0"])
            if backend == "netem":
                self.exec_in(ns, ["tc", "qdisc", "add", "dev", "link0", "root", "netem", *self.shape.netem_args()])
        if backend == "relay":
            self._start_relay()
        self.wait_reachable()

    def _start_relay(self) -> None:
        shape = self.shape
        command = [
            "ip",
            "netns",
            "exec",
            self.namespaces["link"],
            sys.executable,
            str(RELAY_FILE),
            "relay",
            "to-server",
            "to-robot",
            "--rate-mbit",
            str(shape.rate_mbit),
            "--delay-ms",
            str(shape.delay_ms),
            "--loss",
            str(shape.loss),
            "--limit-packets",
            str(shape.limit_packets),
        ]
        if self.relay_seed is not None:
            command += ["--seed", str(self.relay_seed)]
        self._relay = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        ready = self._relay.stdout.readline()  # the relay prints one line once its sockets are bound
        if not ready.startswith("relay ready"):
            self._relay.wait(5)
            raise LinkUnavailable(f"the relay did not start: {ready}{self._relay.stderr.read()}")

    def wait_reachable(self, timeout: float = 10.0) -> None:
        """Until a UDP datagram crosses from the robot to the server (ARP done, the relay forwarding)."""
        probe = [sys.executable, "-c", PROBE_RECEIVER, self.server_ip, str(PROBE_PORT), str(timeout)]
        receiver = subprocess.Popen(self.command("server", probe), stdout=subprocess.PIPE, text=True)
        try:
            if receiver.stdout.readline().strip() != "bound":
                raise LinkUnavailable("the reachability probe could not bind in the server namespace")
            sender = self.run(
                "robot",
                [sys.executable, "-c", PROBE_SENDER, self.server_ip, str(PROBE_PORT), str(timeout)],
                check=False,
                timeout=timeout + 5,
            )
            if sender.returncode != 0:
                raise LinkUnavailable(f"{self.server_ip} not reachable from the robot namespace over the link")
        finally:
            if receiver.poll() is None:
                receiver.kill()
                receiver.wait()

    def counts(self) -> dict[str, dict[str, int]]:
        """Packets each way so far: ``{"robot->server": {"packets", "lost", ...}, "server->robot": ...}``."""
        if self.backend == "relay":
            assert self._relay is not None
            self._relay.send_signal(signal.SIGUSR1)
            by_port = json.loads(self._relay.stdout.readline())
            return {"robot->server": by_port["to-robot"], "server->robot": by_port["to-server"]}
        result = {}
        for side, direction in (("robot", "robot->server"), ("server", "server->robot")):
            stats = self.run(side, ["tc", "-s", "qdisc", "show", "dev", "link0"]).stdout
            sent = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+)", stats)
            packets, dropped = (int(sent.group(2)), int(sent.group(3))) if sent else (0, 0)
            result[direction] = {"packets": packets + dropped, "lost": dropped}
        return result

    def close(self) -> None:
        """Stop what runs in the namespaces (each in its own process group: SIGTERM, then SIGKILL after
        10 s), the relay too, then delete the namespaces. Safe to call twice."""
        processes = [*self._processes, *([self._relay] if self._relay else [])]
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            for proc in processes:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, sig)
            for proc in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(grace)
        self._processes.clear()
        self._relay = None
        while self._made:
            _ip("netns", "del", self._made.pop(), check=False)

    # -- running things in a namespace --------------------------------------------------------------------

    def command(self, side: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as a command that runs in ``side``'s namespace (``server``, ``robot``)."""
        return ["ip", "netns", "exec", self.namespaces[side], *argv]

    def exec_in(self, namespace: str, argv: Sequence[str]) -> None:
        result = subprocess.run(["ip", "netns", "exec", namespace, *argv], capture_output=True, text=True)
        if result.returncode != 0:
            raise LinkUnavailable(f"`{' '.join(argv)}` failed in {namespace}: {result.stderr.strip()}")

    def popen(self, side: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` in ``side``'s namespace, in its own process group; it is killed on exit."""
        proc = subprocess.Popen(self.command(side, argv), start_new_session=True, **kwargs)
        self._processes.append(proc)
        return proc

    def run(
        self, side: str, argv: Sequence[str], check: bool = True, timeout: float | None = None, **kwargs
    ) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(side, argv), check=check, timeout=timeout, **kwargs)

    # -- outages -------------------------------------------------------------------------------------------

    def cut(self) -> None:
        """Take the link down on the server's side: nothing passes until :meth:`restore`."""
        _ip("-n", self.namespaces["server"], "link", "set", "link0", "down")

    def restore(self) -> None:
        _ip("-n", self.namespaces["server"], "link", "set", "link0", "up")


PROBE_PORT = 7006
# A UDP round trip from the robot to the server: the link carries packets both ways (ARP done).
PROBE_RECEIVER = r"""
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((sys.argv[1], int(sys.argv[2])))
sock.settimeout(float(sys.argv[3]))
print("bound", flush=True)
data, sender = sock.recvfrom(16)
for _ in range(5):  # a few answers: one of them may be lost on the way back
    sock.sendto(data, sender)
"""
PROBE_SENDER = r"""
import socket, sys, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.settimeout(0.2)
deadline = time.monotonic() + float(sys.argv[3])
while time.monotonic() < deadline:
    sock.sendto(b"probe", (sys.argv[1], int(sys.argv[2])))
    try:
        sock.recv(16)
        sys.exit(0)
    except (TimeoutError, OSError):
        pass
sys.exit(1)
"""


# -- measuring a link ------------------------------------------------------------------------------------

ECHO_PORT = 7007
ECHO_SERVER = r"""
import socket, sys
listener = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        while True:
            data = conn.recv(1 << 16)
            if not data:
                break
            if data[:1] == b"p":  # a ping: answer the same bytes
                conn.sendall(data)
            elif data.endswith(b"!"):  # the end of a bulk transfer: acknowledge it
                conn.sendall(b"k")
"""


@dataclass(frozen=True)
class LinkMeasurement:
    rtt_ms_p50: float
    rtt_ms_min: float
    rtt_ms_p90: float
    throughput_mbit: float


def measure_link(link: ShapedLink, pings: int = 40, bulk_bytes: int = 4 * 2**20) -> LinkMeasurement:
    """Round trip of a small TCP message (p50, min, p90 of ``pings``) and the goodput of one bulk
    transfer of ``bulk_bytes`` from the robot to the server, between the two namespaces."""
    server = link.popen(
        "server", [sys.executable, "-c", ECHO_SERVER, link.server_ip, str(ECHO_PORT)], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout.readline().strip() == "listening"
    client = link.run(
        "robot",
        [sys.executable, "-c", ECHO_CLIENT, link.server_ip, str(ECHO_PORT), str(pings), str(bulk_bytes)],
        timeout=120,
    )
    return LinkMeasurement(**json.loads(client.stdout))


ECHO_CLIENT = r"""
import json, socket, statistics, sys, time
host, port, pings, bulk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sock = socket.create_connection((host, port), timeout=30)
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for i in range(pings):
    started = time.perf_counter()
    sock.sendall(b"p" * 64)
    got = b""
    while len(got) < 64:
        got += sock.recv(64 - len(got))
    rtts.append((time.perf_counter() - started) * 1e3)
    time.sleep(0.01)
started = time.perf_counter()
sock.sendall(b"x" * (bulk - 1) + b"!")
assert sock.recv(1) == b"k"
seconds = time.perf_counter() - started
rtts.sort()
print(json.dumps({"rtt_ms_p50": statistics.median(rtts), "rtt_ms_min": rtts[0],
                  "rtt_ms_p90": rtts[int(0.9 * (len(rtts) - 1))], "throughput_mbit": bulk * 8 / seconds / 1e6}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    measure = sub.add_parser("measure", help="build a link, print its RTT and goodput as JSON")
    measure.add_argument("--backend", default="auto", choices=("auto", "netem", "relay"))
    add_shape_arguments(measure)
    args = parser.parse_args(argv)
    shape = shape_from_arguments(args)
    with ShapedLink(shape, backend=args.backend) as link:
        print(json.dumps({"backend": link.backend, "shape": asdict(shape), **asdict(measure_link(link))}))
    return 0


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate-mbit", type=float, default=LinkShape.rate_mbit)
    parser.add_argument("--delay-ms", type=float, default=LinkShape.delay_ms)
    parser.add_argument("--loss", type=float, default=LinkShape.loss)
    parser.add_argument("--limit-packets", type=int, default=LinkShape.limit_packets)


def shape_from_arguments(args: argparse.Namespace) -> LinkShape:
    return LinkShape(args.rate_mbit, args.delay_ms, args.loss, args.limit_packets)


if __name__ == "__main__":
    sys.exit(main())
