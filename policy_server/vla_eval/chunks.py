"""Which action answers which vla-eval observation: the chunked-policy convention, with no I/O.

A vla-eval benchmark steps its simulator once per action it receives: one observation out, one action
back. A Cosmos3 policy answers an observation with a chunk of H actions. vla-eval's own chunked model
servers (``PredictModelServer(chunk_size=...)``) bridge the two by playing the chunk out, one action per
observation, and running the model again only when it is spent. :class:`ChunkPlayer` does the same, and
asks for the next chunk *early*: when ``ask_ahead`` actions of the current one remain, the observation of
that step goes to the engine while the remaining actions keep answering observations at once, so the
simulator rarely waits a whole inference at a chunk boundary.

A chunk computed from the observation of step ``s`` that arrives when the episode is at step ``t`` starts
playing at its row ``t - s``: the rows before it were meant for steps that have passed (the same
accounting as real-time chunking's inference delay). One that arrives later than its last usable row
plays that last row, and the next observation asks again.

``whole``: every observation runs the engine and its reply is the whole chunk (H x D), for a client that
executes chunks itself.

Pure state, driven by the session (:mod:`.session`): :meth:`ChunkPlayer.observe` for each observation,
:meth:`ChunkPlayer.arrived` for each chunk the engine answers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robot_clients.protocol import ErrorCode, ProtocolError

CHUNK_MODES = ("step", "whole")


@dataclass(frozen=True)
class ChunkPlan:
    """How a session plays chunks out.

    Args:
        chunk: ``step`` (one action per observation) or ``whole`` (each reply is the whole chunk).
        ask_ahead: ask for the next chunk when this many actions of the current one remain (``step``).
        execute: play at most this many actions of a chunk before the next replaces it (None: all of them).
    """

    chunk: str = "step"
    ask_ahead: int = 1
    execute: int | None = None

    def checked(self, horizon: int) -> ChunkPlan:
        """This plan against a chunk of ``horizon`` actions; :class:`ProtocolError` naming a bad setting."""
        if self.chunk not in CHUNK_MODES:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"`chunk` must be one of {', '.join(CHUNK_MODES)}, got {self.chunk!r}", "chunk"
            )
        if self.execute is not None and not 1 <= self.execute <= horizon:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`execute` must be between 1 and the chunk's {horizon} actions, got {self.execute}",
                "execute",
            )
        usable = self.execute or horizon
        if not 0 <= self.ask_ahead < usable:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`ask_ahead` must be between 0 and {usable - 1} (the actions played of each chunk, minus one), "
                f"got {self.ask_ahead}",
                "ask_ahead",
            )
        return self


@dataclass(frozen=True)
class StepDecision:
    """What to do with the observation of ``step``: answer it with ``action`` now (None: not yet, it waits
    for the chunk being computed), and whether it goes to the engine (``ask``)."""

    step: int
    action: np.ndarray | None
    ask: bool


class ChunkPlayer:
    """One episode's chunks, played out one action per observation (see the module docstring)."""

    def __init__(self, plan: ChunkPlan) -> None:
        self.plan = plan
        self.step = 0  # observations seen this episode
        self._chunk: np.ndarray | None = None
        self._chunk_step = 0  # the step whose observation the current chunk was computed from
        self.pending_step: int | None = None  # the step whose observation the engine is working on

    def _usable(self, chunk: np.ndarray) -> int:
        rows = int(chunk.shape[0])
        return min(self.plan.execute or rows, rows)

    def peek(self) -> StepDecision:
        """What :meth:`observe` would decide for the next observation, deciding nothing."""
        t = self.step
        if self.plan.chunk == "whole":
            return StepDecision(t, None, ask=True)
        action = None
        remaining = 0
        if self._chunk is not None:
            index = t - self._chunk_step
            usable = self._usable(self._chunk)
            if index < usable:
                action = self._chunk[index]
                remaining = usable - index - 1  # actions left after this one
        ask = self.pending_step is None and (action is None or remaining < self.plan.ask_ahead)
        return StepDecision(t, action, ask)

    def observe(self) -> StepDecision:
        """The next observation of the episode arrived."""
        decision = self.peek()
        self.step += 1
        if decision.ask:
            self.pending_step = decision.step
        return decision

    def arrived(self, actions: np.ndarray, step: int, awaiting: bool) -> np.ndarray | None:
        """The engine's chunk for the observation of ``step``. Returns what answers the observation that
        waits for it (``awaiting``: the latest one has no reply yet), else None."""
        if self.pending_step == step:
            self.pending_step = None
        if self.plan.chunk == "whole":
            return actions if awaiting else None
        self._chunk, self._chunk_step = actions, step
        if not awaiting:
            return None
        index = min(max(self.step - 1 - step, 0), self._usable(actions) - 1)
        row: np.ndarray = actions[index]
        return row

    def failed(self, step: int) -> None:
        """The engine could not answer the observation of ``step``: the next observation asks again."""
        if self.pending_step == step:
            self.pending_step = None
