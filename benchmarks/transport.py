"""Transport cost of a policy round trip: ``policy_server`` against an echo floor and a lock-step server.

Three processes serve, side by side, while this one acts as the robot:

* ``ours``: ``cosmos3-serve --tiny distilled --no-http --openpi-view-point concat_view`` (queue, engine
  worker thread, an event loop that never runs the model; the HTTP sidecar, not measured, is off),
  reached on the openpi endpoint ``/`` and on the native protocol ``/v1/actions/realtime``;
* ``lock-step``: ``benchmarks/lockstep_baseline.py lockstep``, an openpi-style server that runs the same
  tiny engine inline on its event loop;
* ``echo``: ``benchmarks/lockstep_baseline.py echo``: ``/echo`` returns the same bytes, ``/ack`` returns a
  reply-sized frame (the floor: the observation's bytes up, one reply's bytes down).

Observations (random uint8 pixels, prompt, float32 state):

* ``2cam``: LIBERO keys, two 224×224 cameras plus an 8-float state. The native protocol carries one
  camera per observation (named ``images`` are reserved for a later version), so two cameras go through
  the openpi endpoint, whose ``concat_view`` mapping composes them side by side (224×448) — and the
  lock-step server composes them the same way, so the model sees the same frame on both.
* ``480x640``: one 480×640 camera plus state: openpi endpoint and native protocol.
* ``clip17``: a 17-frame 256×256 clip, ``inverse_dynamics``, horizon 16: native protocol (a session
  ``configure``s its mode; the openpi endpoint's mode is one per server) and the lock-step server.

Each round sends one observation to every (scenario, target) pair, in a shuffled order, each over its
own persistent connection and waiting for the reply (a closed loop), so every target sees the same
machine load. Frames are packed before the clock starts. For each reply the server's own engine time
(the ``predict_actions`` call, which both servers time the same way) is subtracted from the client's
round trip: what remains, ``overhead``, is the serving cost (codec, socket, queue, thread hand-offs).
The table prints p50/p99 of round trip and overhead, and overhead as a multiple of the ``ack`` floor and
of the lock-step server's overhead.

    .venv/bin/python benchmarks/transport.py                      # 45 rounds (clip every 3rd), ~2 min
    .venv/bin/python benchmarks/transport.py --rounds 200 --clip-every 2 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS.parent))
sys.path.insert(0, str(BENCHMARKS))

from lockstep_baseline import BaselineProcess, serving  # noqa: E402
from realtime_roundtrip import ServerProcess, percentile  # noqa: E402

from robot_clients.protocol import REALTIME_PATH  # noqa: E402
from robot_clients.wire_codec import packb, unpackb  # noqa: E402

PROMPT = "pick up the red cube and put it in the bowl"
HORIZON = 16
VIEW_POINT = "concat_view"  # the openpi mapping that composes two cameras; used by every target alike
CONNECT = dict(compression=None, max_size=None, proxy=None, open_timeout=30)


# -- observations ----------------------------------------------------------------------------------


def libero_observation(rng: np.random.Generator, cameras: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """An openpi (LIBERO-keyed) observation: the given cameras, an 8-float state, a prompt."""
    obs: dict[str, Any] = {key: rng.integers(0, 256, shape, dtype=np.uint8) for key, shape in cameras.items()}
    obs["observation/state"] = rng.standard_normal(8).astype(np.float32)
    obs["prompt"] = PROMPT
    return obs


@dataclass
class Scenario:
    name: str
    description: str
    cameras: dict[str, tuple[int, ...]]
    openpi: bool  # ours serves it on the openpi endpoint
    native: bool  # ours serves it on the native protocol (one camera: `image`, or a clip: `video`)
    mode: str = "policy"

    def observations(self, seed: int, variants: int = 2) -> list[dict[str, Any]]:
        """A few distinct observations, sent in turn (nothing can be cached by content)."""
        rng = np.random.default_rng(seed)
        return [libero_observation(rng, self.cameras) for _ in range(variants)]


SCENARIOS = (
    Scenario(
        "2cam",
        "two 224x224 RGB cameras + 8-float state (LIBERO keys)",
        {"observation/image": (224, 224, 3), "observation/wrist_image": (224, 224, 3)},
        openpi=True,
        native=False,
    ),
    Scenario(
        "480x640",
        "one 480x640 RGB camera + 8-float state",
        {"observation/image": (480, 640, 3)},
        openpi=True,
        native=True,
    ),
    Scenario(
        "clip17",
        "17-frame 256x256 clip, inverse_dynamics, horizon 16",
        {"observation/image": (17, 256, 256, 3)},
        openpi=False,
        native=True,
        mode="inverse_dynamics",
    ),
)


# -- client connections: one round trip each, the engine time the server reports ----------------------


@dataclass
class Sample:
    round_trip_ms: float
    engine_ms: float = 0.0
    model_ms: float = 0.0


class Connection:
    """A blocking websockets client connection, opened as websockets wants (a context manager)."""

    def __init__(self, url: str) -> None:
        from websockets.sync.client import connect

        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(url, **CONNECT))

    def close(self) -> None:
        self._stack.close()


class OpenpiConnection(Connection):
    """openpi's client protocol on raw websockets: metadata first, then one reply per observation frame."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.metadata = unpackb(self.ws.recv())

    def prepare(self, obs: dict[str, Any]) -> bytes:
        return packb(obs)

    def round_trip(self, frame: bytes) -> Sample:
        started = time.perf_counter()
        self.ws.send(frame)
        reply = self.ws.recv()
        elapsed = (time.perf_counter() - started) * 1e3
        if isinstance(reply, str):
            raise RuntimeError(f"server error: {reply}")
        timing = unpackb(reply).get("server_timing", {})
        return Sample(elapsed, timing.get("infer_ms", 0.0), timing.get("model_ms", 0.0))


class NativeConnection(Connection):
    """Protocol v1: configure once, then an ``observation`` per round trip, answered by its ``action_chunk``."""

    def __init__(self, url: str, mode: str) -> None:
        super().__init__(url)
        self.metadata = unpackb(self.ws.recv())
        self.ws.send(
            packb(
                {
                    "type": "configure",
                    "domain_name": self.metadata["defaults"]["domain_name"],
                    "action_mode": mode,
                    "action_horizon": HORIZON,
                    "prompt": PROMPT,
                    "view_point": VIEW_POINT,
                }
            )
        )
        reply = unpackb(self.ws.recv())
        if reply.get("type") != "session":
            raise RuntimeError(f"configure refused: {reply}")
        self.mode = mode
        self.seq = 0

    def prepare(self, obs: dict[str, Any]) -> bytes:
        camera = obs["observation/image"]
        self.seq += 1
        return packb({"type": "observation", "seq": self.seq, ("video" if camera.ndim == 4 else "image"): camera})

    def round_trip(self, frame: bytes) -> Sample:
        started = time.perf_counter()
        self.ws.send(frame)
        while True:
            reply = self.ws.recv()
            elapsed = (time.perf_counter() - started) * 1e3
            message = unpackb(reply)
            if message.get("type") == "action_chunk" and message.get("seq") == self.seq:
                return Sample(elapsed, message["timing"]["engine_ms"], message["timing"]["model_ms"])
            if message.get("type") in ("error", "dropped"):
                raise RuntimeError(f"server answered {message}")


class EchoConnection(Connection):
    """``/echo`` or ``/ack``: no metadata, no model; the round trip is all transport."""

    def prepare(self, obs: dict[str, Any]) -> bytes:
        return packb(obs)

    def round_trip(self, frame: bytes) -> Sample:
        started = time.perf_counter()
        self.ws.send(frame)
        self.ws.recv()
        return Sample((time.perf_counter() - started) * 1e3)


# -- the run -------------------------------------------------------------------------------------------


TARGETS = ("ours /openpi", "ours native v1", "lock-step", "echo (same bytes)", "ack (reply-sized)")


@dataclass
class Pair:
    """One (scenario, target) connection and what it measured."""

    scenario: Scenario
    target: str
    connection: Any
    observations: list[dict[str, Any]]
    samples: list[Sample] = field(default_factory=list)
    frame_bytes: int = 0

    def send_one(self, index: int, record: bool) -> None:
        frame = self.connection.prepare(self.observations[index % len(self.observations)])
        self.frame_bytes = len(frame)
        sample = self.connection.round_trip(frame)
        if record:
            self.samples.append(sample)


def connect_pairs(ports: dict[str, int]) -> list[Pair]:
    ours, lockstep, echo = (f"ws://127.0.0.1:{ports[k]}" for k in ("ours", "lockstep", "echo"))
    pairs = []
    for index, scenario in enumerate(SCENARIOS):
        observations = scenario.observations(seed=index)
        openers: dict[str, Callable[[], Any]] = {}
        if scenario.openpi:
            openers["ours /openpi"] = lambda: OpenpiConnection(ours + "/")
        if scenario.native:
            openers["ours native v1"] = lambda s=scenario: NativeConnection(ours + REALTIME_PATH, s.mode)
        openers["lock-step"] = lambda: OpenpiConnection(lockstep + "/")
        openers["echo (same bytes)"] = lambda: EchoConnection(echo + "/echo")
        openers["ack (reply-sized)"] = lambda: EchoConnection(echo + "/ack")
        pairs += [Pair(scenario, target, open_(), observations) for target, open_ in openers.items()]
    return pairs


def run_rounds(pairs: list[Pair], rounds: int, warmup: int, clip_every: int, seed: int = 0) -> None:
    """Closed loop, interleaved: every round visits every pair once in a fresh random order."""
    order = random.Random(seed)
    for round_index in range(-warmup, rounds):
        visiting = [p for p in pairs if p.scenario.name != "clip17" or round_index % clip_every == 0]
        order.shuffle(visiting)
        for pair in visiting:
            pair.send_one(round_index, record=round_index >= 0)
        if round_index >= 0 and (round_index + 1) % 10 == 0:
            print(f"  round {round_index + 1}/{rounds}", file=sys.stderr, flush=True)


# -- the report ----------------------------------------------------------------------------------------


def machine_description() -> str:
    """One line for the record: the date, cores, load, versions."""
    import websockets

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; {platform.node()}: "
        f"{len(os.sched_getaffinity(0))} cores, load average {load}; Python {platform.python_version()}, "
        f"websockets {websockets.__version__}"
    )


def overhead(sample: Sample) -> float:
    return sample.round_trip_ms - sample.engine_ms


def report(pairs: list[Pair]) -> None:
    header = (
        f"{'target':<18} {'n':>3} | {'rt p50':>7} {'rt p99':>7} | {'engine p50':>10} | "
        f"{'over p50':>8} {'over p99':>8} | {'p50 x ack':>9} {'p50 x lock':>10} {'p99 x lock':>10}"
    )
    for scenario in SCENARIOS:
        rows = [p for p in pairs if p.scenario is scenario]
        by_target = {p.target: p for p in rows}
        ack = [overhead(s) for s in by_target["ack (reply-sized)"].samples]
        lock = [overhead(s) for s in by_target["lock-step"].samples]
        print(
            f"\n{scenario.name}: {scenario.description}; observation frame "
            f"{by_target['lock-step'].frame_bytes / 1024:.0f} KiB (openpi dict)"
        )
        print(header)
        print("-" * len(header))
        for target in TARGETS:
            pair = by_target.get(target)
            if pair is None:
                continue
            rt = [s.round_trip_ms for s in pair.samples]
            over = [overhead(s) for s in pair.samples]
            engine = [s.engine_ms for s in pair.samples]
            p50, p99 = percentile(over, 50), percentile(over, 99)
            engine_text = f"{percentile(engine, 50):10.1f}" if any(engine) else f"{'-':>10}"
            print(
                f"{target:<18} {len(rt):>3} | {percentile(rt, 50):7.1f} {percentile(rt, 99):7.1f} | {engine_text} | "
                f"{p50:8.2f} {p99:8.2f} | {p50 / percentile(ack, 50):9.2f} "
                f"{p50 / percentile(lock, 50):10.2f} {p99 / percentile(lock, 99):10.2f}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=45, help="measured rounds (default 45)")
    parser.add_argument("--warmup", type=int, default=3, help="unrecorded rounds first (default 3)")
    parser.add_argument(
        "--clip-every",
        type=int,
        default=3,
        help="send the 1.5 s clip only every Nth round, to keep the run short (default 3)",
    )
    parser.add_argument("--json", help="also write every sample to this file")
    args = parser.parse_args(argv)

    print(machine_description())
    starters = {
        "ours": lambda: ServerProcess(
            ["--tiny", "distilled", "--no-http", "--openpi-view-point", VIEW_POINT, "--openpi-prompt", PROMPT]
        ),
        "lockstep": lambda: BaselineProcess("lockstep", ["--view-point", VIEW_POINT]),
        "echo": lambda: BaselineProcess("echo"),
    }
    with serving(starters) as servers:
        pairs = connect_pairs({name: process.port for name, process in servers.items()})
        try:
            started = time.monotonic()
            run_rounds(pairs, args.rounds, args.warmup, args.clip_every)
            print(f"measured in {time.monotonic() - started:.0f} s; after: {machine_description()}")
        finally:
            for pair in pairs:
                pair.connection.close()
    report(pairs)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [
                    {
                        "scenario": p.scenario.name,
                        "target": p.target,
                        "frame_bytes": p.frame_bytes,
                        "samples": [vars(s) for s in p.samples],
                    }
                    for p in pairs
                ]
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
