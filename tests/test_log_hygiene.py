"""Issue 18, items 4 and 13: log lines a client can neither forge nor multiply.

* control characters in client text (an operator's pause reason, a request path) are escaped, so a
  newline cannot start a forged log record;
* a line repeated by a flood (each refused handshake, each ``accept()`` failing with EMFILE) is written
  ``burst`` times per interval, then summarised as "suppressed K similar lines".

Unit tests drive :class:`policy_server.foundation.log_hygiene.LogHygieneFilter` directly (and asyncio's own EMFILE
message through it); the end-to-end test floods a real ``cosmos3-serve`` process with refused handshakes
and pauses a session with a reason that tries to forge a line.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import time

import pytest
from server_fixtures import DOMAIN, ServerProcess
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from policy_server.foundation.log_hygiene import LogHygieneFilter, printable
from policy_server.sessions.controls import parse_control
from robot_clients.wire_codec import packb, unpackb

TOKEN = "hygiene-token-0123456789"


def capture(name: str, log_filter: LogHygieneFilter) -> tuple[logging.Logger, io.StringIO, logging.Handler]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(log_filter)
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, stream, handler


def test_printable_escapes_what_could_forge_a_line():
    assert printable("pause\n2026-01-01 INFO forged") == "pause\\n2026-01-01 INFO forged"
    assert printable("a\rb\x1b[31mc\x00d\u2028e\u202ef\x85") == "a\\rb\\x1b[31mc\\x00d\\u2028e\\u202ef\\x85"
    assert printable("tab\tand ünïcode stay") == "tab\tand ünïcode stay"
    assert "\n" not in parse_control({"session_id": "s", "action": "pause", "reason": "a\nb"}).reason


def test_repeated_lines_pass_a_burst_then_are_summarised():
    log_filter = LogHygieneFilter(burst=3, interval_s=0.3)
    logger, stream, handler = capture("test.hygiene.repeat", log_filter)
    summaries = logging.getLogger("policy_server.foundation.log_hygiene")
    summaries.addHandler(handler)
    summaries.setLevel(logging.INFO)
    try:
        for port in range(50):  # lines that differ only by a number are one kind
            logger.info("refused a handshake from 10.0.0.1:%d: no token", 40000 + port)
        logger.info("another kind of line")
        lines = stream.getvalue().splitlines()
        assert sum("refused a handshake" in line for line in lines) == 3
        assert any("another kind" in line for line in lines)
        time.sleep(0.6)  # the summary comes on its own, after the interval
        assert "suppressed 47 similar lines" in stream.getvalue()
        assert log_filter.suppressed_total == 47
        for _ in range(2):  # a new window: the kind passes again
            logger.info("refused a handshake from 10.0.0.1:%d: no token", 1)
        assert stream.getvalue().count("test.hygiene.repeat: refused a handshake") == 5
    finally:
        summaries.removeHandler(handler)
        summaries.setLevel(logging.NOTSET)
        logger.removeHandler(handler)


def test_control_characters_in_any_record_are_escaped():
    logger, stream, handler = capture("test.hygiene.escape", LogHygieneFilter(burst=0))
    try:
        logger.info("operator paused session %s (%s)", "abc", "reason\nERROR forged line")
        logger.info("an f-string with a raw \r carriage return")
        assert stream.getvalue().count("\n") == 2  # two records, two lines
        assert "reason\\nERROR forged line" in stream.getvalue() and "raw \\r carriage" in stream.getvalue()
    finally:
        logger.removeHandler(handler)


def test_asyncios_emfile_accept_errors_are_rate_limited():
    """What asyncio logs when accept() fails for lack of file descriptors, repeated: a burst, then silence."""
    log_filter = LogHygieneFilter(burst=5, interval_s=60)
    logger, stream, handler = capture("asyncio", log_filter)
    loop = asyncio.new_event_loop()
    try:
        with socket.socket() as listener:
            for _ in range(200):
                loop.call_exception_handler(
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(24, "Too many open files"),
                        "socket": listener,
                    }
                )
        assert stream.getvalue().count("out of system resource") == 5
        assert log_filter.suppressed_total == 195
    finally:
        log_filter.cancel_summaries()
        loop.close()
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


@pytest.fixture(scope="module")
def serving():
    process = ServerProcess(
        "--tiny",
        "distilled",
        "--no-http",
        "--no-warmup",
        "--auth-token",
        TOKEN,
        "--log-repeat-burst",
        "5",
        "--log-repeat-interval-s",
        "3",
    )
    process.start(timeout=180)
    process.wait_for_log("ready: serving", timeout=180)
    yield process
    process.signal()
    process.wait(60)


def test_a_flood_of_refused_handshakes_writes_a_bounded_log(serving):
    for _ in range(60):
        with pytest.raises(InvalidStatus):
            connect(serving.url, proxy=None, open_timeout=10)
    serving.wait_for_log("suppressed 55 similar lines", timeout=20)
    assert serving.log.count("policy_server.assembly.server: refused a handshake") == 5, serving.log[-3000:]


def test_a_pause_reason_cannot_forge_a_log_line(serving):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    forged = "2026-01-01 00:00:00,000 ERROR policy_server.assembly.server: forged"
    with (
        connect(serving.url, additional_headers=headers, proxy=None, max_size=None) as robot,
        connect(f"ws://127.0.0.1:{serving.port}/v1/observe", additional_headers=headers, proxy=None) as obs,
    ):
        session_id = unpackb(robot.recv(timeout=10))["session_id"]
        robot.send(packb({"type": "configure", "domain_name": DOMAIN}))
        assert unpackb(robot.recv(timeout=10))["type"] == "session"
        obs.send(
            json.dumps({"type": "control", "session_id": session_id, "action": "pause", "reason": "gripper\n" + forged})
        )
        state = unpackb(robot.recv(timeout=10))
        assert state["type"] == "session_state" and "\n" not in state["reason"]
    serving.wait_for_log("pause on session", timeout=10)
    assert not any(line.startswith(forged) for line in serving.log.splitlines())
    assert "gripper\\n" + forged in serving.log
