"""The session rules without sockets: sequence order, one terminal reply per observation, latest wins.

:class:`~policy_server.sessions.observation_rules.ObservationRules` is the sans-I/O core every session
keeps; these tests drive it with real queue items and no connection, engine or event loop.
"""

from __future__ import annotations

import numpy as np
import pytest

from cosmos3_runtime.requests import ActionRequest
from policy_server.engine.request_queue import PendingObservation, RequestQueue
from policy_server.sessions.observation_rules import (
    DROP_MESSAGES,
    UNREAD_CHUNK_MESSAGE,
    ChunkReply,
    Drop,
    ObservationRules,
)
from robot_clients.protocol import DropReason, ErrorCode, ProtocolError


class Owner:
    """The queue's owner of these items; these tests read the rules' decisions, not the owner."""

    request_kind = "realtime"

    def on_result(self, item, outcome):  # pragma: no cover - no engine here
        raise AssertionError("no engine runs in these tests")

    def on_dropped(self, item, reason):  # pragma: no cover
        raise AssertionError("the tests call the rules directly")


def item(seq: int, session: str = "s") -> PendingObservation:
    return PendingObservation(
        session_id=session, seq=seq, request=ActionRequest(domain_name="d"), owner=Owner(), received_at=0.0
    )


def chunk(seq: int) -> ChunkReply:
    return ChunkReply(seq, np.zeros((2, 3), np.float32), 0, {}, 0.0, b"", 0)


def test_seq_must_increase_until_a_reset():
    rules = ObservationRules()
    rules.check_order(3)
    rules.check_order(7)
    for stale in (7, 5):
        with pytest.raises(ProtocolError) as refused:
            rules.check_order(stale)
        assert (refused.value.code, refused.value.field, refused.value.seq) == (ErrorCode.INVALID_FIELD, "seq", stale)
        assert "after 7" in refused.value.message
    rules.restart()
    rules.check_order(0)
    assert rules.last_seq == 0


def test_a_newer_observation_replacing_the_waiting_one_makes_it_a_superseded_drop():
    rules, queue = ObservationRules(), RequestQueue()
    first, second = item(1), item(2)
    assert rules.admitted(first, queue.put(first)) is None
    drop = rules.admitted(second, queue.put(second))
    assert drop == Drop(1, DropReason.SUPERSEDED, DROP_MESSAGES[DropReason.SUPERSEDED])
    assert list(rules.in_flight) == [2] and rules.dropped == 1
    # The replaced one's late outcome is nobody's: no second reply for seq 1.
    assert rules.engine_dropped(first, DropReason.SHUTDOWN) is None
    assert not rules.engine_answered(first)


def test_every_observation_ends_exactly_once():
    rules = ObservationRules()
    answered, errored, dropped = item(1), item(2), item(3)
    for pending in (answered, errored, dropped):
        rules.admitted(pending, None)
    assert rules.engine_answered(answered)
    rules.chunk_made()
    assert rules.engine_answered(errored)  # an engine error is its terminal reply
    assert rules.engine_dropped(dropped, DropReason.DEADLINE) == Drop(3, DropReason.DEADLINE, DROP_MESSAGES["deadline"])
    # A second outcome for any of them is discarded.
    for pending in (answered, errored, dropped):
        assert not rules.engine_answered(pending)
        assert rules.engine_dropped(pending, DropReason.SHUTDOWN) is None
    assert (rules.answered, rules.dropped, rules.in_flight) == (1, 1, {})


def test_cancelled_observations_end_as_drops_and_their_late_results_are_discarded():
    rules = ObservationRules()
    one, two = item(1), item(2)
    rules.admitted(one, None)
    rules.admitted(two, None)
    cancelled = rules.cancel(2)
    assert cancelled == [two] and two.cancelled and not one.cancelled
    assert rules.end_in_flight(two, DropReason.CANCELLED).reason == DropReason.CANCELLED
    assert not rules.engine_answered(two)  # still running when cancelled: its chunk goes nowhere
    assert rules.cancel(None) == [one]  # a reset cancels the rest
    rules.end_in_flight(one, DropReason.CANCELLED)
    assert (rules.dropped, rules.in_flight) == (2, {})


def test_an_unread_chunk_replaced_by_a_newer_one_becomes_a_drop_in_its_place():
    rules = ObservationRules()
    rules.admitted(item(4), None)
    assert rules.engine_answered(rules.in_flight[4])
    rules.chunk_made()
    drop = rules.unread_chunk_replaced(chunk(4))
    assert drop == Drop(4, DropReason.SUPERSEDED, UNREAD_CHUNK_MESSAGE)
    assert (rules.answered, rules.dropped) == (0, 1)


def test_after_close_nothing_is_expected():
    rules = ObservationRules()
    pending = item(1)
    rules.admitted(pending, None)
    rules.close()
    assert not rules.expects(pending) and rules.in_flight == {}
    assert rules.engine_dropped(pending, DropReason.SHUTDOWN) is None
    assert not rules.engine_answered(pending)


def test_a_drop_without_a_message_gets_its_reasons_message():
    rules = ObservationRules()
    assert rules.drop(9, DropReason.PAUSED).message == DROP_MESSAGES[DropReason.PAUSED]
    assert rules.drop(9, "custom", "said so").message == "said so"
    assert rules.drop(9, "unheard_of").message == "unheard_of"
