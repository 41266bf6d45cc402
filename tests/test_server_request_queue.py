"""The request queue on its own: latest wins per session, sessions in turn, cancel, close."""

from __future__ import annotations

import threading
import time

import pytest

from cosmos3_runtime.requests import ActionRequest
from policy_server.engine.request_queue import PendingObservation, QueueClosed, RequestQueue


def item(session: str, seq: int) -> PendingObservation:
    return PendingObservation(
        session_id=session, seq=seq, request=ActionRequest(domain_name="d"), owner=None, received_at=time.monotonic()
    )


def test_a_newer_observation_replaces_the_waiting_one():
    queue = RequestQueue()
    first = item("a", 0)
    assert queue.put(first) is None
    assert queue.put(item("a", 1)) is first  # handed back so the caller reports it superseded
    assert len(queue) == 1
    assert queue.take().seq == 1


def test_sessions_are_served_in_turn_however_fast_one_sends():
    """Session a sends 100 observations for every one of b and c; each still gets every third slot."""
    queue = RequestQueue()
    served = []
    seqs = {"a": 0, "b": 0, "c": 0}

    def submit(session):
        queue.put(item(session, seqs[session]))
        seqs[session] += 1

    for session in "abc":
        submit(session)
    for _ in range(9):
        for _ in range(100):
            submit("a")
        taken = queue.take()
        served.append(taken.session_id)
        if taken.session_id != "a":
            submit(taken.session_id)  # b and c send again only after being served
    assert served == list("abcabcabc")


def test_replacing_keeps_the_sessions_place_in_line():
    queue = RequestQueue()
    queue.put(item("a", 0))
    queue.put(item("b", 0))
    queue.put(item("a", 1))
    assert [queue.take().session_id for _ in range(2)] == ["a", "b"]


def test_cancel_removes_only_the_matching_seq():
    queue = RequestQueue()
    queue.put(item("a", 3))
    assert queue.cancel("a", seq=2) is None
    assert queue.cancel("a", seq=3).seq == 3
    assert len(queue) == 0
    assert queue.cancel("a") is None


def test_a_cancelled_wakeup_does_not_look_like_close():
    """put() wakes the worker; if the observation is cancelled before the worker runs, take() must keep
    waiting (returning None would stop the worker for good)."""
    queue = RequestQueue()
    queue.put(item("a", 0))
    queue.cancel("a")
    assert queue.take(timeout=0.05) is None and not queue.closed
    result = []
    worker = threading.Thread(target=lambda: result.append(queue.take()))
    worker.start()
    time.sleep(0.05)
    queue.put(item("b", 7))
    worker.join(2)
    assert result[0].seq == 7


def test_close_returns_what_waited_and_wakes_the_worker():
    queue = RequestQueue()
    waiter_result = []
    worker = threading.Thread(target=lambda: waiter_result.append(queue.take()))
    worker.start()
    time.sleep(0.05)
    assert queue.close() == []
    worker.join(2)
    assert waiter_result == [None]
    with pytest.raises(QueueClosed):
        queue.put(item("a", 0))


def _obs(session, seq, **request):
    from cosmos3_runtime.requests import ActionRequest

    return PendingObservation(
        session_id=session,
        seq=seq,
        owner=None,
        received_at=time.monotonic(),
        request=ActionRequest(domain_name="fractal", **request),
    )


def test_take_batch_groups_compatible_sessions_in_ring_order():
    from policy_server.engine.worker import BatchPolicy

    queue = RequestQueue()
    for session, steps in [("a", None), ("b", 8), ("c", None), ("d", None)]:
        queue.put(_obs(session, 1, num_steps=steps))
    batch = queue.take_batch(3, compatible=BatchPolicy.compatible)
    assert [item.session_id for item in batch] == ["a", "c", "d"]  # b runs another schedule
    assert [item.session_id for item in queue.take_batch(3, compatible=BatchPolicy.compatible)] == ["b"]
    assert queue.take_batch(3, timeout=0.01) == []


def test_take_batch_waits_for_company_only_up_to_max_wait():
    queue = RequestQueue()
    queue.put(_obs("a", 1))
    joiner = threading.Timer(0.05, lambda: queue.put(_obs("b", 1)))
    joiner.start()
    batch = queue.take_batch(2, max_wait=2.0)
    assert [item.session_id for item in batch] == ["a", "b"]
    queue.put(_obs("c", 1))
    started = time.monotonic()
    assert [item.session_id for item in queue.take_batch(4, max_wait=0.1)] == ["c"]
    assert time.monotonic() - started < 1.0  # held for max_wait, not forever


def _http(client: str, n: int) -> PendingObservation:
    """One one-shot HTTP request of ``client``: a session of its own that waits for the client's turn."""
    request = item(f"http-{client}-{n}", 0)
    request.turn = client
    return request


def test_many_requests_of_one_client_share_one_turn_with_a_robot():
    """The attack of issue 18 (item 8): one HTTP client with 16 requests waiting and one robot. Each
    request used to be a session with a place of its own in the ring (16 slots for the client per robot
    slot); now the client's requests wait for one turn, oldest first, and the worker alternates."""
    queue = RequestQueue()
    for n in range(16):
        queue.put(_http("client", n))
    queue.put(item("robot", 0))
    served = []
    for seq in range(1, 9):
        taken = queue.take()
        served.append(taken.session_id)
        if taken.session_id == "robot":
            queue.put(item("robot", seq))  # the robot sends again once answered
    assert served == [
        "http-client-0",
        "robot",
        "http-client-1",
        "robot",
        "http-client-2",
        "robot",
        "http-client-3",
        "robot",
    ]
    assert len(queue) == 16 - 4 + 1


def test_a_robot_that_arrives_while_a_clients_request_runs_goes_next():
    """A robot in closed loop sends its next observation while the engine runs someone else's request.
    The client's backlog must not have rejoined the ring ahead of it: the robot waits for the one
    request that was running, not for the next one as well."""
    queue = RequestQueue()
    for n in range(4):
        queue.put(_http("client", n))
    assert queue.take(timeout=0).session_id == "http-client-0"
    queue.put(item("robot", 0))  # arrives while http-client-0 runs
    assert queue.take(timeout=0).session_id == "robot"
    assert queue.take(timeout=0).session_id == "http-client-1"
    assert queue.take(timeout=0).session_id == "http-client-2"  # nobody else waits: the client goes on


def test_a_batch_takes_one_request_per_turn():
    queue = RequestQueue()
    for n in range(4):
        queue.put(_http("client", n))
    queue.put(item("robot", 0))
    queue.put(_http("other", 0))
    batch = queue.take_batch(4)
    assert [taken.session_id for taken in batch] == ["http-client-0", "robot", "http-other-0"]
    assert [taken.session_id for taken in queue.take_batch(4)] == ["http-client-1"]


def test_cancelling_a_request_that_shares_a_turn_keeps_the_others_in_line():
    queue = RequestQueue()
    for n in range(3):
        queue.put(_http("client", n))
    queue.put(item("robot", 0))
    assert queue.cancel("http-client-0").session_id == "http-client-0"
    assert queue.cancel("http-client-2").session_id == "http-client-2"
    assert [queue.take(timeout=0).session_id for _ in range(2)] == ["http-client-1", "robot"]
    assert queue.take(timeout=0) is None and len(queue) == 0
    for n in range(2):
        queue.put(_http("client", n + 10))
    assert {left.session_id for left in queue.close()} == {"http-client-10", "http-client-11"}


def test_a_robots_batch_never_carries_a_one_shot_request():
    from policy_server.engine.worker import BatchPolicy

    queue = RequestQueue()
    queue.put(item("robot-a", 0))
    queue.put(_http("client", 0))
    queue.put(_http("other", 0))
    queue.put(item("robot-b", 0))
    assert [taken.session_id for taken in queue.take_batch(4, compatible=BatchPolicy.compatible)] == [
        "robot-a",
        "robot-b",
    ]
    assert [taken.session_id for taken in queue.take_batch(4, compatible=BatchPolicy.compatible)] == [
        "http-client-0",
        "http-other-0",
    ]  # one-shot requests of different clients still batch together


def test_a_session_whose_frames_cost_more_host_time_waits_for_its_own_turns():
    """Turns fair in cost (issue 25.2): a session whose observations each took 0.4 s to decode, against
    robots taking 1 ms, gives up turns while robots wait (one per turn length of lead), is left out of
    batches and of what the host prepares ahead, and is still served at once when nobody else waits."""
    queue = RequestQueue()

    def costly(seq: int) -> PendingObservation:
        observation = item("costly", seq)
        observation.decode_cpu_s = 0.4
        return observation

    def robot(name: str, seq: int) -> PendingObservation:
        observation = item(name, seq)
        observation.decode_cpu_s = 0.001
        return observation

    queue.put(costly(0))
    assert queue.take().session_id == "costly"  # alone: served at once, nobody to yield to
    for name in ("a", "b"):
        queue.put(robot(name, 0))
    queue.put(costly(1))
    assert queue.host_lead_s("costly") > 0.3 and queue.host_lead_s("a") == 0.0
    assert [waiting.session_id for waiting in queue.waiting(4)] == ["a", "b"]  # not prepared ahead
    assert {taken.session_id for taken in queue.take_batch(4)} == {"a", "b"}  # not batched along
    served, seq = [], 2
    for name in ("a", "b"):
        queue.put(robot(name, seq))
    for _ in range(12):
        queue.put(costly(seq))  # it keeps streaming: each frame costs its turn 0.4 s more
        taken = queue.take()
        served.append(taken.session_id)
        seq += 1
        if taken.session_id != "costly":
            queue.put(robot(taken.session_id, seq))  # a robot in closed loop sends again once served
        time.sleep(0.01)
    # 0.4 s of lead per frame against turns of at most 0.1 s: the robots get nearly every turn.
    assert served.count("costly") <= 1, served
    assert queue.host_lead_s("costly") <= 2.0  # capped: it can be made to wait so long, no longer
    while len(queue) > 1:  # once the robots stop, the costly session is served: nobody to yield to
        queue.take()
    assert queue.take().session_id == "costly"


def test_a_costly_session_alone_gives_a_robot_between_two_observations_time_to_send():
    """A robot in closed loop is absent from the ring while its chunk travels back; a session that owes
    turns and streams would take every such gap. Alone but owing, it waits one turn's length first."""
    queue = RequestQueue()
    robot = item("robot", 0)
    robot.decode_cpu_s = 0.001
    queue.put(robot)
    assert queue.take().session_id == "robot"
    costly = item("costly", 0)
    costly.decode_cpu_s = 0.5
    queue.put(costly)
    assert queue.host_lead_s("costly") > 0.3
    taken = []
    taker = threading.Thread(target=lambda: taken.append(queue.take(timeout=5)))
    taker.start()
    time.sleep(0.03)  # the robot's next observation arrives a moment later
    queue.put(item("robot", 1))
    taker.join(5)
    assert taken[0].session_id == "robot"
    assert queue.take(timeout=5).session_id == "costly"  # then it is served: nobody else waits


def test_decoding_is_held_while_the_observation_waits_or_the_session_owes_active_others():
    """Issue 36.2: a session's next frame is decoded neither while its last observation still waits
    (decoded now, it could only replace that one unserved) nor while it leads active sessions by more
    than a turn of host time (its decoding is host time like its turns'); once the others are idle for
    two turn lengths the hold lifts, so nobody waits for the absent."""
    queue = RequestQueue()
    robot = item("robot", 0)
    robot.decode_cpu_s = 0.001
    queue.put(robot)
    assert queue.holds_back_decoding("robot")  # its observation waits
    assert queue.take().session_id == "robot"
    assert not queue.holds_back_decoding("robot")
    costly = item("costly", 0)
    costly.decode_cpu_s = 0.5
    queue.put(costly)
    assert queue.take().session_id == "costly"
    assert queue.host_lead_s("costly") > 0.3  # nothing of it waits, but it leads the robot charged just now
    assert queue.holds_back_decoding("costly")
    assert not queue.holds_back_decoding("robot")
    time.sleep(0.25)  # the robot idle for two turn lengths (0.1 s each with no turns measured yet)
    assert not queue.holds_back_decoding("costly")


def named(connection: str, name: str, seq: int = 0) -> PendingObservation:
    """An observation of policy session ``name`` of ``connection``: on the connection's turn, as sessions put it."""
    pending = item(f"{connection}/{name}", seq)
    pending.turn, pending.turn_shares_call = (connection, 0), True
    return pending


def test_a_connections_names_share_its_turn_beside_robots_on_their_own():
    """16 names of one connection and 4 robots, all waiting: each round serves every robot once and the
    connection once (its oldest name), so the names take a fifth of the takes, not 16 of 20."""
    queue = RequestQueue()
    for k in range(16):
        queue.put(named("robolab", f"env-{k}"))
    for r in range(4):
        queue.put(item(f"robot-{r}", 0))
    taken = []
    for _ in range(10):
        got = queue.take(timeout=1)
        assert got is not None
        taken.append(got.session_id)
        if got.session_id.startswith("robot"):
            queue.put(item(got.session_id, 1))  # robots in closed loop send again at once
    first_rounds = taken[:10]
    assert sum(s.startswith("robolab/") for s in first_rounds) == 2, first_rounds
    assert [s for s in first_rounds if s.startswith("robolab/")] == ["robolab/env-0", "robolab/env-1"]


def test_a_connections_names_ride_in_its_turns_engine_call_together_and_an_http_clients_do_not():
    queue = RequestQueue()
    for k in range(4):
        queue.put(named("robolab", f"env-{k}"))
    batch = queue.take_batch(8)  # nobody else waits: the names use the engine together
    assert [p.session_id for p in batch] == [f"robolab/env-{k}" for k in range(4)]
    for k in range(4):
        queue.put(named("robolab", f"env-{k}", 1))
    queue.put(item("robot", 0))
    batch = queue.take_batch(8)  # a robot waits: the connection is one place in the batch, like the robot
    assert [p.session_id for p in batch] == ["robolab/env-0", "robot"]
    queue = RequestQueue()
    for k in range(3):  # one HTTP client's requests: one place in a batch, one per round
        one_shot = item(f"http-{k}", 0)
        one_shot.turn = "client"
        queue.put(one_shot)
    assert [p.session_id for p in queue.take_batch(8)] == ["http-0"]
    assert [p.session_id for p in queue.take_batch(8)] == ["http-1"]


def test_a_batch_of_names_stops_at_the_batch_size_and_the_rest_keep_their_turn():
    queue = RequestQueue()
    for k in range(5):
        queue.put(named("robolab", f"env-{k}"))
    assert [p.session_id for p in queue.take_batch(3)] == ["robolab/env-0", "robolab/env-1", "robolab/env-2"]
    queue.put(item("robot", 0))  # arrived meanwhile: served before the connection's next turn
    assert [p.session_id for p in queue.take_batch(1)] == ["robot"]
    assert [p.session_id for p in queue.take_batch(3)] == ["robolab/env-3", "robolab/env-4"]
    assert queue.take(timeout=0.05) is None
