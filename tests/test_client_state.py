"""The robot client's protocol state without I/O (robot_clients.client_state.ClientState), as tables.

Each row is one interleaving that once lost an observation, a chunk or a waiting call in the asyncio client
(the commit that fixed it is named), or one way a broken or hostile server tried to take the robot down. A
row is a list of steps, the caller's calls, what the link did and the frames received, in the order the race
had them; what comes out (the events for the caller, the observations written, the counters) is compared
with what must. No socket, no task, no sleep: the clock is a number the steps move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from robot_clients.client_state import (
    MAX_COUNTED_REASONS,
    ClientState,
    CloseConnection,
    ControlAnswered,
    ControlFailed,
    InferAnswered,
    InferFailed,
    ObservationDropped,
    StateChanged,
    Streamed,
)
from robot_clients.protocol import (
    ActionChunkFrame,
    DroppedFrame,
    ErrorFrame,
    MetadataFrame,
    ResetDoneFrame,
    SessionFrame,
    SessionState,
    SessionUpdatedFrame,
)
from robot_clients.wire_codec import packb, unpackb

ACTIONS = np.zeros((2, 3), np.float32)


class Run:
    """A ClientState driven by a row's steps, with what came out in ``out`` (events and writes, in order)."""

    def __init__(self, **options: Any) -> None:
        self.now = 100.0
        self.state = ClientState(lambda: self.now, **options)
        self.out: list[tuple[Any, ...]] = []

    def settle(self) -> None:
        for event in self.state.events():
            if isinstance(event, InferAnswered):
                self.out.append(("answered", event.seq))
            elif isinstance(event, InferFailed):
                reason = event.error.reason if isinstance(event.error, ObservationDropped) else ""
                self.out.append(("failed", event.seq, type(event.error).__name__, reason))
            elif isinstance(event, ControlAnswered):
                self.out.append(("control", type(event.reply).__name__))
            elif isinstance(event, ControlFailed):
                self.out.append(("control failed", type(event.error).__name__))
            elif isinstance(event, Streamed):
                self.out.append(("streamed",))
            elif isinstance(event, CloseConnection):
                self.out.append(("close", event.code))
            else:
                assert isinstance(event, StateChanged)  # followed by the shell's running event; not compared


Step = Callable[[Run], None]


def _step(action: Callable[[Run], Any]) -> Step:
    def run(r: Run) -> None:
        action(r)
        r.settle()

    return run


def opened() -> Step:
    def action(r: Run) -> None:
        r.out.append(("opened", r.state.connection_opened(MetadataFrame("s", {}), None)))

    return _step(action)


def opened_quietly() -> Step:
    return _step(lambda r: r.state.connection_opened(MetadataFrame("s", {}), None))


def lost() -> Step:
    return _step(lambda r: r.state.connection_lost(1006, ""))


def gave_up() -> Step:
    return _step(lambda r: r.state.reconnect_failed("the server answered HTTP 403"))


def close() -> Step:
    return _step(lambda r: r.state.close())


def connect_again() -> Step:
    return _step(lambda r: r.state.opening())


def infer(seq: int, session: str | None = None) -> Step:
    """An infer call begins; its observation is put by ``put`` next."""

    def action(r: Run) -> None:
        assert r.state.new_seq() == seq
        r.state.infer_begun(seq, session)

    return _step(action)


def put(seq: int, link_free: bool, session: str | None = None, new: bool = False) -> Step:
    """Observation ``seq`` is ready to send (``new``: a streamed submit, which takes its seq now)."""

    def action(r: Run) -> None:
        if new:
            assert r.state.new_seq() == seq
        r.state.observation_ready(seq, packb({"seq": seq}), session, link_free)

    return _step(action)


def write() -> Step:
    """The sender's task finds the link free: it writes what the state gives."""

    def action(r: Run) -> None:
        item = r.state.next_write()
        r.out.append(("write", None if item is None else item.seq))

    return _step(action)


def written(seq: int) -> Step:
    return _step(lambda r: r.state.written(seq, 10))


def write_failed(seq: int) -> Step:
    return _step(lambda r: r.state.write_failed(seq))


def timed_out(seq: int) -> Step:
    return _step(lambda r: r.state.infer_timed_out(seq))


def ended(seq: int, session: str | None = None) -> Step:
    return _step(lambda r: r.state.infer_ended(seq, session))


def control(reset: str | None | bool = False) -> Step:
    """A configure (or, with ``reset``, a reset of that policy session) begins and its frame is sent."""

    def action(r: Run) -> None:
        if reset is not False:
            r.state.reset_begun(None if reset is True else reset)
        r.state.control_begun()
        r.state.control_sent()

    return _step(action)


def control_waits_for_connection() -> Step:
    return _step(lambda r: r.state.control_begun())


def control_ended() -> Step:
    return _step(lambda r: r.state.control_ended())


def reset_done() -> Step:
    """The reset call got its reply: it ends (as the shell's reset() does)."""

    def action(r: Run) -> None:
        r.state.control_ended()
        r.state.reset_done(None)

    return _step(action)


def frame(server_frame: Any) -> Step:
    return _step(lambda r: r.state.receive_frame(packb(server_frame.wire())))


def raw(message: Any) -> Step:
    return _step(lambda r: r.state.receive_frame(packb(message)))


def chunk(seq: int, **fields: Any) -> Step:
    return frame(ActionChunkFrame(seq, ACTIONS, {}, 2, 0, 3, {}, **fields))


def receive(timeout: float | None) -> Step:
    """A receive() call's next step, given ``timeout`` from now."""

    def action(r: Run) -> None:
        step = r.state.receive_step(None if timeout is None else r.now + timeout)
        if step.item is None:
            r.out.append(("receive", "wait" if step.wait is not None else "timeout"))
        else:
            r.out.append(("receive", getattr(step.item, "seq", None), type(step.item).__name__))

    return _step(action)


@dataclass
class Row:
    name: str
    fixed_by: str  # the commit that fixed the race in the asyncio client (or the issue item)
    steps: list[Step]
    out: list[tuple[Any, ...]]  # the events and writes, in order
    stats: dict[str, Any] = field(default_factory=dict)  # ClientStats fields; "unsent" is dropped["unsent"]
    options: dict[str, Any] = field(default_factory=dict)


def check(row: Row) -> Run:
    r = Run(**row.options)
    for step in row.steps:
        step(r)
    assert r.out == row.out
    stats = r.state.stats
    seen = {name: (stats.dropped["unsent"] if name == "unsent" else getattr(stats, name)) for name in row.stats}
    assert seen == row.stats
    return r


RACES = [
    Row(
        "the sender takes the observation a put took while its task waited for the link",
        "1baef8a",
        [opened(), put(0, link_free=False, new=True), put(1, link_free=True, new=True), put(2, False, new=True)]
        + [write(), written(1), write(), written(2), write()],
        [("opened", True), ("write", 1), ("write", 2), ("write", None)],
        {"sent": 2, "unsent": 1},
    ),
    Row(
        "calls made while reconnecting fail at once when reconnecting gives up",
        "65df631",
        [opened(), lost(), infer(0), put(0, link_free=False), control_waits_for_connection(), gave_up()],
        [("opened", True), ("failed", 0, "ConnectionLost", ""), ("control failed", "ConnectionLost")],
        {"sent": 0},
    ),
    Row(
        "giving up reconnecting counts what the sender held unsent",
        "493c315",
        [opened(), lost(), put(0, False, "env-a", new=True), put(1, False, "env-b", new=True), gave_up(), write()],
        [("opened", True), ("write", None)],
        {"sent": 0, "unsent": 2},
    ),
    Row(
        "an observation whose write failed while a newer one waited is reported replaced",
        "041646f",
        [opened(), put(0, True, new=True), put(1, False, new=True), write(), write_failed(0), write(), written(1)]
        + [write()],
        [("opened", True), ("write", 0), ("write", 1), ("write", None)],
        {"sent": 1, "unsent": 1},
    ),
    Row(
        "an infer sent after a reset gets its chunk",
        "1ef9d91",
        [opened(), control(reset=True), infer(0), put(0, True), write(), written(0), frame(ResetDoneFrame("s"))]
        + [reset_done(), chunk(0), receive(0.0)],
        [("opened", True), ("write", 0), ("control", "ResetDoneFrame"), ("answered", 0), ("receive", "timeout")],
        {"answered": 1, "unsent": 0},
    ),
    Row(
        "a reset drops the observation still waiting on the robot",
        "1ef9d91",
        [opened(), put(0, True, new=True), write(), written(0), infer(1), put(1, False), control(reset=True), write()],
        [("opened", True), ("write", 0), ("failed", 1, "ObservationDropped", "unsent"), ("write", None)],
        {"unsent": 1},
    ),
    Row(
        "receive without time to wait returns a chunk that already came",
        "448b2aa",
        [opened(), put(0, True, new=True), write(), written(0), chunk(0), receive(0.0), receive(0.0)],
        [("opened", True), ("write", 0), ("streamed",), ("receive", 0, "ActionChunk"), ("receive", "timeout")],
        {"answered": 1},
    ),
    Row(
        "closing while a reconnect is being made refuses the new connection",
        "fef2864",
        [opened(), lost(), close(), opened()],
        [("opened", True), ("opened", False)],
    ),
    Row(
        "an infer that timed out while reconnecting leaves nothing to be sent",
        "d19d5b2",
        [opened(), lost(), infer(0), put(0, False), timed_out(0), ended(0), opened(), write()],
        [("opened", True), ("opened", True), ("write", None)],
        {"unsent": 1},
    ),
    Row(
        "a chunk that comes after its infer timed out does not make older chunks stale",
        "fb96c82",
        [opened(), put(0, True, new=True), write(), written(0), infer(1), put(1, True), write(), written(1)]
        + [chunk(0), timed_out(1), chunk(1), ended(1), receive(1.0)],
        [("opened", True), ("write", 0), ("write", 1), ("streamed",), ("receive", 0, "ActionChunk")],
        {"answered": 2, "stale": 0},
    ),
    Row(
        "a late reply to a configure that timed out does not answer the next control call",
        "7990216",
        [opened(), control(), control_ended(), control(reset=True)]
        + [frame(SessionFrame("s", {"domain_name": "slow"}, SessionState.RUNNING))]
        + [frame(SessionUpdatedFrame("s", {"prompt": "marker"}, ("prompt",), "test"))]
        + [frame(ResetDoneFrame("s")), reset_done(), control()]
        + [frame(SessionFrame("s", {"action_horizon": 8}, SessionState.RUNNING)), control_ended()],
        [("opened", True), ("control", "ResetDoneFrame"), ("control", "SessionFrame")],
    ),
    Row(
        "an observation waiting when the client closes is not sent after it connects again",
        "1fdcd81",
        [opened(), lost(), put(0, False, new=True), close(), connect_again(), opened(), put(1, True, "env-b", new=True)]
        + [write()],
        [("opened", True), ("opened", True), ("write", 1)],
        {"unsent": 1},
    ),
    Row(
        "an observation being written when the client closes is counted sent",
        "e341a11",
        [opened(), put(0, True, new=True), write(), close(), written(0)],
        [("opened", True), ("write", 0)],
        {"sent": 1, "unsent": 0},
    ),
]


@pytest.mark.parametrize("row", RACES, ids=[f"{row.fixed_by}: {row.name}" for row in RACES])
def test_race(row: Row) -> None:
    check(row)


# ---------------------------------------------------------------------------------------------------
# A broken or hostile server
# ---------------------------------------------------------------------------------------------------

HOSTILE = [
    Row(
        "a chunk whose actions are a string ends its infer with a typed error; the next infer gets its chunk",
        "issue 46 item 4",
        [opened(), infer(0), put(0, True), write(), written(0)]
        + [raw({"type": "action_chunk", "seq": 0, "actions": "not actions", "timing": {}})]
        + [ended(0), infer(1), put(1, True), write(), written(1), chunk(1)],
        [("opened", True), ("write", 0), ("failed", 0, "MalformedServerFrame", ""), ("write", 1), ("answered", 1)],
        {"malformed": 1, "answered": 1},
    ),
    Row(
        "a chunk whose seq is a list cannot be placed: the connection is closed, its calls end",
        "issue 46 item 4",
        [opened(), infer(0), put(0, True), write(), written(0)]
        + [raw({"type": "action_chunk", "seq": [0], "actions": ACTIONS}), lost(), ended(0)]
        + [opened(), infer(1), put(1, True), write(), written(1), chunk(1)],
        [("opened", True), ("write", 0), ("close", 1002), ("failed", 0, "ConnectionLost", "")]
        + [("opened", True), ("write", 1), ("answered", 1)],
        {"malformed": 1, "answered": 1},
    ),
    Row(
        "a chunk without a seq cannot be placed either",
        "issue 46 item 4",
        [opened(), infer(0), put(0, True), write(), written(0), raw({"type": "action_chunk", "actions": ACTIONS})],
        [("opened", True), ("write", 0), ("close", 1002)],
        {"malformed": 1},
    ),
    Row(
        "a malformed answer to a streamed observation is what receive raises",
        "issue 46 item 4",
        [opened(), put(0, True, new=True), write(), written(0), raw({"type": "dropped", "seq": 0, "reason": 7})]
        + [receive(1.0)],
        [("opened", True), ("write", 0), ("streamed",), ("receive", 0, "MalformedServerFrame")],
        {"malformed": 1},
    ),
    Row(
        "a malformed reply to a control call ends that call",
        "issue 46 item 4",
        [opened(), control(), raw({"type": "session", "session_id": "s", "config": "not a map"}), control_ended()]
        + [control(), frame(SessionFrame("s", {}, SessionState.RUNNING))],
        [("opened", True), ("control failed", "MalformedServerFrame"), ("control", "SessionFrame")],
        {"malformed": 1},
    ),
    Row(
        "chunks, drops and errors about observations the robot never sent are counted and dropped",
        "issue 46 item 4",
        [opened(), chunk(5), chunk(7), frame(DroppedFrame(9, "deadline", "")), frame(ErrorFrame("x", "y", seq=3))]
        + [receive(0.0)],
        [("opened", True), ("receive", "timeout")],
        {"unsolicited": 3, "answered": 0, "errors": 1},
    ),
    Row(
        "frames of unknown types, text frames and frames that are not maps are counted and dropped",
        "issue 46 item 4",
        [opened(), raw({"type": "surprise"}), raw([1, 2, 3]), raw({"no": "type"})]
        + [_step(lambda r: r.state.receive_frame("text"))],
        [("opened", True)],
        {"unsolicited": 4},
    ),
    Row(
        "a frame past the element budget closes the connection (1009)",
        "issue 46 item 4",
        [opened(), _step(lambda r: r.state.receive_frame(b"\xdd" + (2_000_000).to_bytes(4, "big") + b"\xc0" * 10))],
        [("opened", True), ("close", 1009)],
        {"malformed": 1},
    ),
]


@pytest.mark.parametrize("row", HOSTILE, ids=[row.name for row in HOSTILE])
def test_hostile_server(row: Row) -> None:
    check(row)


def test_drops_with_unique_reasons_keep_a_bounded_count():
    """200,000 ``dropped`` frames, each with its own reason, about observations the robot sent: the counters
    keep MAX_COUNTED_REASONS names and count the rest as "other"; none is lost."""
    r = Run()
    opened_quietly()(r)
    n = 200_000
    for seq in range(n):
        r.state.observation_ready(r.state.new_seq(), b"", None, True)
        r.state.next_write()
        r.state.written(seq, 1)
        r.state.frame_received(DroppedFrame(seq, f"reason {seq}", "x"))
    dropped = r.state.stats.dropped
    assert len(dropped) == MAX_COUNTED_REASONS + 1
    assert sum(dropped.values()) == n and dropped["other"] == n - MAX_COUNTED_REASONS
    assert r.state.events() == []


def test_observations_never_answered_are_forgotten_past_the_bound():
    """A server that never answers: the client remembers the newest ``max_awaited`` observations it sent (a
    late answer to an older one is counted unsolicited), and never one an infer still waits for."""
    r = Run(max_awaited=100)
    opened_quietly()(r)
    infer(0)(r)
    put(0, True)(r)
    write()(r)
    written(0)(r)
    for _ in range(1000):
        seq = r.state.new_seq()
        r.state.observation_ready(seq, b"", "streamed", True)
        r.state.next_write()
        r.state.written(seq, 1)
    assert len(r.state._awaited) == 100  # noqa: SLF001
    chunk(0)(r)  # the infer's answer still counts
    chunk(5)(r)  # an old streamed one's is unsolicited now
    assert r.out == [("write", 0), ("answered", 0)]
    assert r.state.stats.unsolicited == 1


def test_the_stream_keeps_a_bounded_number_of_bytes():
    """Chunks for streamed observations that the robot does not receive: past ``max_stream_bytes`` the oldest
    are discarded as stale (newer ones wait behind them) and the newest is what receive returns first."""
    big = np.zeros((1024, 256), np.float32)  # 1 MiB
    r = Run(max_stream_bytes=4 * 2**20)
    opened_quietly()(r)
    for seq in range(10):
        r.state.observation_ready(r.state.new_seq(), b"", None, True)
        r.state.next_write()
        r.state.written(seq, 1)
        r.state.frame_received(ActionChunkFrame(seq, big, {}, 1024, 0, 256, {}))
    assert r.state.stream_bytes <= 4 * 2**20
    assert r.state.stats.stale == 6 and r.state.stats.answered == 10
    step = r.state.receive_step(None)
    assert step.item is not None and getattr(step.item, "seq", None) == 6


def test_the_state_module_does_no_io():
    """The module imports none of the I/O modules: no socket, task, thread or clock of its own."""
    import ast

    import robot_clients.client_state as module

    tree = ast.parse(open(module.__file__).read())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not imported & {"asyncio", "websockets", "socket", "threading", "time", "selectors", "ssl"}, imported


def test_every_frame_the_client_sends_comes_out_of_the_state_as_bytes():
    """The state builds the frames, its clock stamping an observation; the I/O shell only writes them."""
    state = ClientState(lambda: 12.5)
    sent = unpackb(state.observation_frame(3, {"image": np.zeros((2, 2, 3), np.uint8)}, {"seed": 4}, [0.5], "arm"))
    assert sent["type"] == "observation" and sent["seq"] == 3 and sent["seed"] == 4
    assert sent["timestamp"] == 12.5 and sent["session_id"] == "arm"
    assert sent["state"].dtype == np.float32 and sent["state"].tolist() == [0.5]
    assert (
        unpackb(state.observation_frame(4, {"image": np.zeros((2, 2, 3), np.uint8), "timestamp": 1.0}, {}, None, None))[
            "timestamp"
        ]
        == 1.0
    )  # the robot's own stamp wins
    assert unpackb(ClientState.configure_frame({"domain_name": "d"})) == {"type": "configure", "domain_name": "d"}
    assert unpackb(ClientState.reset_frame("arm"))["type"] == "reset"
    assert unpackb(ClientState.cancel_frame(7, None))["seq"] == 7
