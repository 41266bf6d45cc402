"""Operator controls of a native session: pause, resume, stop, and a new prompt.

An operator (the dashboard, through the observer channel) acts on a robot's session; the server tells
the robot with a ``session_state`` or ``session_updated`` frame, and the robot's client honours it
(``robot_clients`` holds position while paused). This module is pure data: the session states, the
typed control an operator sends, its parsing (raising :class:`ControlError` with a stable code), and the
frames the robot receives. :class:`~policy_server.sessions.native.NativeSession` applies controls;
``docs/protocol.md`` ("Operator controls") is the user-facing description.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from robot_clients.protocol import CodedError

from ..foundation.log_hygiene import printable

# Prompts from an operator are held to the same bound the model states for any prompt.
DEFAULT_MAX_PROMPT_CHARS = 2000
MAX_REASON_CHARS = 200


class ControlAction(str, enum.Enum):
    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"
    SET_PROMPT = "set_prompt"
    RECORD = "record"  # start recording the session (any protocol; needs --record-dir)
    STOP_RECORDING = "stop_recording"


# Controls about the server's recording of a session, not the robot: every session kind takes them.
RECORDING_ACTIONS = {ControlAction.RECORD: True, ControlAction.STOP_RECORDING: False}


class ControlErrorCode:
    """Stable codes of refused controls (observer channel). Never rename one, only add."""

    BAD_CONTROL = "bad_control"  # malformed: missing or wrong-typed fields, unknown action
    UNKNOWN_SESSION = "unknown_session"  # no live session with that id
    NOT_CONTROLLABLE = "not_controllable"  # the session's protocol cannot carry controls (openpi)
    INVALID_STATE = "invalid_state"  # e.g. resuming a stopped session, a prompt before `configure`
    RECORDING_UNAVAILABLE = "recording_unavailable"  # `record` on a server started without --record-dir


class ControlError(CodedError):
    """An operator control was refused; the observer is told ``code``, ``message`` and ``field``."""


@dataclass(frozen=True)
class OperatorControl:
    """One control, as an operator sent it. ``prompt`` is set for ``set_prompt`` only."""

    session_id: str
    action: ControlAction
    reason: str = ""
    prompt: str | None = None


def parse_control(message: Mapping[str, Any], max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS) -> OperatorControl:
    """Turn an observer's ``control`` frame into an :class:`OperatorControl`, or raise :class:`ControlError`."""
    session_id = message.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        raise ControlError(ControlErrorCode.BAD_CONTROL, "`control` needs a `session_id` (a string)", "session_id")
    try:
        action = ControlAction(message.get("action"))
    except ValueError:
        known = ", ".join(a.value for a in ControlAction)
        raise ControlError(
            ControlErrorCode.BAD_CONTROL, f"unknown action {message.get('action')!r}; expected one of {known}", "action"
        ) from None
    reason = message.get("reason") or ""
    if not isinstance(reason, str):
        raise ControlError(ControlErrorCode.BAD_CONTROL, "`reason` must be a string", "reason")
    # The reason reaches the log, the dashboard and the robot: a newline in it must not forge a log line.
    reason = printable(reason)
    prompt = None
    if action is ControlAction.SET_PROMPT:
        prompt = message.get("prompt")
        if not isinstance(prompt, str):
            raise ControlError(ControlErrorCode.BAD_CONTROL, "`set_prompt` needs a `prompt` (a string)", "prompt")
        if len(prompt) > max_prompt_chars:
            raise ControlError(
                ControlErrorCode.BAD_CONTROL,
                f"the prompt has {len(prompt)} characters; at most {max_prompt_chars}",
                "prompt",
            )
    return OperatorControl(session_id, action, reason[:MAX_REASON_CHARS], prompt)
