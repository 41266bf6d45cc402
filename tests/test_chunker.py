"""ActionChunker: each strategy against a policy with a simulated latency, on a real clock and threads.

The policy's chunks encode the step each action is meant for, so the executed actions say whether the
robot did the right thing at every tick: with consistent chunks the action executed at step t must be t.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from chunk_fixtures import SimulatedLatencyPolicy

from robot_clients.chunker import ActionChunker, ChunkerConfig, ChunkerError, ChunkRecord, ChunkStrategy

HZ = 50.0


def run_ticks(chunker: ActionChunker, steps: int, hz: float = HZ) -> np.ndarray:
    """Tick the chunker at ``hz`` on an absolute clock; return the executed actions (steps x D)."""
    period = 1.0 / hz
    executed = [chunker.next_action({"step": 0})]  # the first call waits for the first chunk
    next_tick = time.monotonic()
    for step in range(1, steps):
        next_tick += period
        delay = next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        executed.append(chunker.next_action({"step": step}))
    return np.stack(executed)


STRATEGY_CONFIGS = {
    "open_loop": dict(strategy="open_loop", execute_horizon=8),
    "replace": dict(strategy="replace"),
    "blend": dict(strategy="blend"),
    "rtc": dict(strategy="rtc"),
}


@pytest.mark.parametrize("name", list(STRATEGY_CONFIGS))
def test_no_stall_when_latency_is_below_the_executed_horizon(name):
    # 40 ms of inference at 50 Hz is 2 steps, far below the 8 to 16 actions executed per chunk.
    policy = SimulatedLatencyPolicy(latency_s=0.04, horizon=16)
    records: list[ChunkRecord] = []
    with ActionChunker(policy, ChunkerConfig(control_hz=HZ, **STRATEGY_CONFIGS[name]), on_chunk=records.append) as c:
        executed = run_ticks(c, 80)
        stats = c.stats
    assert stats.stalls == 0 and stats.stall_steps == 0
    assert stats.chunks >= 5 and stats.dropped == 0 and stats.errors == 0
    # Chunks are time-aligned: whichever chunk it came from, the action at step t is the one meant for t.
    np.testing.assert_array_equal(executed[:, 0], np.arange(80, dtype=np.float32))
    # The next chunk was asked for early: it took effect on the tick it arrived or, for open loop, when
    # the window ended, never after the robot had to wait for it.
    for record in records[1:]:
        assert record.applied_at_step - record.requested_at_step >= 1
    assert 0.03 <= stats.latency_ms(0.5) / 1e3 <= 0.5


def test_asking_only_at_the_boundary_stalls_every_chunk():
    """The contrast: openpi's ActionChunkBroker behaviour (threshold 0) waits at each chunk boundary."""
    policy = SimulatedLatencyPolicy(latency_s=0.06, horizon=8)
    config = ChunkerConfig(strategy="open_loop", control_hz=HZ, request_threshold=0)
    with ActionChunker(policy, config) as chunker:
        run_ticks(chunker, 60)
        stats = chunker.stats
    assert stats.stalls >= stats.chunks - 2 >= 3
    assert stats.stall_steps >= 2 * stats.stalls  # 60 ms at 50 Hz: at least 2 held ticks per boundary


def test_latency_longer_than_the_chunk_stalls_and_holds_the_last_action():
    policy = SimulatedLatencyPolicy(latency_s=0.25, horizon=8)  # 12.5 steps for an 8-step chunk
    with ActionChunker(policy, ChunkerConfig(strategy="replace", control_hz=HZ)) as chunker:
        executed = run_ticks(chunker, 50)
        stats = chunker.stats
    assert stats.stalls >= 1 and stats.stall_steps >= 4
    # While stalled the robot repeats its last action: runs of equal consecutive actions.
    repeats = np.sum(np.all(executed[1:] == executed[:-1], axis=1))
    assert repeats >= stats.stall_steps


def switch_jumps(executed: np.ndarray, records: list[ChunkRecord]) -> list[float]:
    """How far the executed action moved at each chunk switch, beyond the one-step ramp of the clock."""
    jumps = []
    for record in records[1:]:
        t = record.applied_at_step
        if 1 <= t < len(executed):
            jumps.append(abs(float(executed[t, 0] - executed[t - 1, 0]) - 1.0))
    return jumps


def test_real_time_chunking_sends_the_leftover_actions_and_keeps_them():
    # Every chunk carries its own random offset, so a switch without the prefix would jump by up to 10.
    policy = SimulatedLatencyPolicy(latency_s=0.05, horizon=16, chunk_offsets=True)
    records: list[ChunkRecord] = []
    config = ChunkerConfig(strategy="rtc", control_hz=HZ, execute_horizon=10)
    with ActionChunker(policy, config, on_chunk=records.append) as chunker:
        executed = run_ticks(chunker, 90)
        stats = chunker.stats
    assert stats.stalls == 0 and stats.prefix_overruns == 0 and len(records) >= 6
    # Every request after the first carried the actions still to run: as many as the latency in steps
    # plus the margin (50 ms at 50 Hz: 3 steps, +2), and exactly the ones the robot went on to execute.
    for record in records[1:]:
        assert 5 <= record.prefix_length <= 7
        assert record.prefix_error == 0.0
        s = record.requested_at_step
        k = min(record.prefix_length, len(executed) - s)  # the run may end inside the last prefix
        np.testing.assert_array_equal(executed[s : s + k], record.actions[:k])
    # So the commanded trajectory never jumps at a switch: it keeps the clock's one-step ramp.
    assert max(switch_jumps(executed, records)) < 1e-5

    # The same policy under `replace` does jump: the test above would have seen a missing prefix.
    records_replace: list[ChunkRecord] = []
    policy = SimulatedLatencyPolicy(latency_s=0.05, horizon=16, chunk_offsets=True)
    config = ChunkerConfig(strategy="replace", control_hz=HZ, execute_horizon=10)
    with ActionChunker(policy, config, on_chunk=records_replace.append) as chunker:
        executed = run_ticks(chunker, 60)
    assert max(switch_jumps(executed, records_replace)) > 0.1


def test_blend_ramps_from_the_current_chunk_to_the_new_one():
    policy = SimulatedLatencyPolicy(latency_s=0.04, horizon=16, chunk_offsets=True)
    records: list[ChunkRecord] = []
    config = ChunkerConfig(strategy="blend", control_hz=HZ, execute_horizon=8, blend_steps=4)
    with ActionChunker(policy, config, on_chunk=records.append) as chunker:
        executed = run_ticks(chunker, 70)
    offsets = executed[:, 0] - np.arange(len(executed))  # which chunk's offset each executed action had
    assert len(records) >= 4
    for previous, record in zip(records, records[1:]):
        t = record.applied_at_step
        if t + 4 >= len(executed):
            continue
        old = float(previous.actions[0, 0] - previous.requested_at_step)
        new = float(record.actions[0, 0] - record.requested_at_step)
        expected = [old + (i / 5.0) * (new - old) for i in range(1, 5)]  # weights 1/5 .. 4/5
        np.testing.assert_allclose(offsets[t : t + 4], expected, atol=1e-3)
        assert abs(offsets[t + 4] - new) < 1e-3  # after the overlap: the new chunk alone


def test_dropped_observations_are_counted_and_asked_again():
    policy = SimulatedLatencyPolicy(latency_s=0.02, horizon=16, fail_every=3)
    # Executing 8 of 16 actions per chunk leaves 8 in reserve: a dropped observation is asked again
    # and answered before the robot runs out.
    config = ChunkerConfig(strategy="rtc", control_hz=HZ, execute_horizon=8)
    with ActionChunker(policy, config) as chunker:
        executed = run_ticks(chunker, 80)
        stats = chunker.stats
    assert stats.dropped >= 2 and stats.errors == 0 and stats.stalls == 0
    assert stats.requests - (stats.chunks + stats.dropped) in (0, 1)  # one may still be in flight
    np.testing.assert_array_equal(executed[:, 0], np.arange(80, dtype=np.float32))


def test_first_chunk_failure_and_bad_configuration_name_the_cause():
    class Refusing:
        def infer_chunk(self, observation, prefix_actions):
            raise ValueError("unknown domain_name 'nope'")

    with ActionChunker(Refusing(), ChunkerConfig(startup_timeout_s=5)) as chunker:
        with pytest.raises(ChunkerError, match="unknown domain_name"):
            chunker.next_action({"step": 0})
    with pytest.raises(ValueError, match="unknown chunk strategy 'smooth'"):
        ChunkerConfig(strategy="smooth")
    assert ChunkerConfig(strategy="rtc").strategy is ChunkStrategy.REAL_TIME_CHUNKING


def test_reset_discards_the_chunk_in_flight():
    policy = SimulatedLatencyPolicy(latency_s=0.05, horizon=8)
    with ActionChunker(policy, ChunkerConfig(strategy="replace", control_hz=HZ)) as chunker:
        run_ticks(chunker, 6)  # by now the next request is in flight
        chunker.reset(clear_stats=True)
        executed = run_ticks(chunker, 20)
        assert chunker.stats.steps == 20
    np.testing.assert_array_equal(executed[:, 0], np.arange(20, dtype=np.float32))


class StateRecordingPolicy(SimulatedLatencyPolicy):
    """Records the ``state`` each request carried, with the step it was sent at and its prefix."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[int, np.ndarray, np.ndarray | None]] = []

    def infer_chunk(self, observation, prefix_actions):
        with self.lock:
            prefix = None if prefix_actions is None else np.array(prefix_actions)
            self.sent.append((observation["step"], np.array(observation["state"]), prefix))
        return super().infer_chunk(observation, prefix_actions)


def run_ticks_with_state(chunker: ActionChunker, steps: int, hz: float = HZ) -> np.ndarray:
    """:func:`run_ticks` with a measured state in every observation: the step number, in every dimension."""
    period = 1.0 / hz
    executed = []
    next_tick = time.monotonic()
    for step in range(steps):
        if step:
            next_tick += period
            time.sleep(max(0.0, next_tick - time.monotonic()))
        executed.append(chunker.next_action({"step": step, "state": np.full(3, -step, np.float32)}))
    return np.stack(executed)


def test_rolled_state_is_the_rtc_prefix_end_the_robot_goes_on_to_command():
    policy = StateRecordingPolicy(latency_s=0.06, horizon=16)
    config = ChunkerConfig(strategy="rtc", control_hz=HZ, execute_horizon=8, roll_state_forward=True)
    with ActionChunker(policy, config) as chunker:
        executed = run_ticks_with_state(chunker, 70)
        stats = chunker.stats
    (first_step, first_state, _), *later = policy.sent
    # Nothing planned yet: the first request carries the measured state (here minus the step).
    np.testing.assert_array_equal(first_state, np.full(3, -first_step, np.float32))
    # Every later request was rolled; the last one may have been rolled and not yet reached the policy when the
    # chunker closed.
    assert len(later) >= 4 and len(later) <= stats.rolled_states <= len(later) + 1
    for step, state, prefix in later:
        assert prefix is not None and len(prefix) >= 4  # 60 ms at 50 Hz: 3 steps, +2 of margin
        # The state is the last action the robot commands before the new chunk's own actions start...
        np.testing.assert_array_equal(state, prefix[-1])
        if step + len(prefix) <= len(executed):
            np.testing.assert_array_equal(state, executed[step + len(prefix) - 1])
        # ...which is ahead of the measured state by the prefix, not the measured state itself.
        assert state[0] == step + len(prefix) - 1


def test_rolled_state_without_a_prefix_is_the_plan_at_the_expected_arrival():
    policy = StateRecordingPolicy(latency_s=0.1, horizon=16)  # 5 steps of latency at 50 Hz
    config = ChunkerConfig(strategy="replace", control_hz=HZ, execute_horizon=8, roll_state_forward=True)
    with ActionChunker(policy, config) as chunker:
        executed = run_ticks_with_state(chunker, 70)
    assert len(policy.sent) >= 4
    for step, state, prefix in policy.sent[1:]:
        assert prefix is None
        # An action of the plan (the action for step u is u), at least the latency's 5 steps minus one ahead
        # of the tick it was asked at, at most the plan's last (the chunk covers 16 steps from its origin).
        assert np.all(state == state[0]) and 4 <= state[0] - step < 16
        assert state[0] in executed[:, 0] or state[0] >= len(executed)


def test_rolled_state_while_waiting_is_the_held_action():
    # `wait`: asked only when the plan is used up, the robot holds its last action while the model thinks.
    policy = StateRecordingPolicy(latency_s=0.06, horizon=8)
    config = ChunkerConfig(strategy="open_loop", control_hz=HZ, request_threshold=0, roll_state_forward=True)
    with ActionChunker(policy, config) as chunker:
        executed = run_ticks_with_state(chunker, 50)
    assert len(policy.sent) >= 3
    for step, state, _ in policy.sent[1:]:
        np.testing.assert_array_equal(state, executed[step - 1])


def test_measured_state_is_sent_unless_rolled_forward_and_a_mismatch_is_named():
    policy = StateRecordingPolicy(latency_s=0.06, horizon=16)
    with ActionChunker(policy, ChunkerConfig(strategy="rtc", control_hz=HZ)) as chunker:
        run_ticks_with_state(chunker, 40)
        assert chunker.stats.rolled_states == 0
    for step, state, _ in policy.sent:
        np.testing.assert_array_equal(state, np.full(3, -step, np.float32))

    # A state that is not in the action's units (here the wrong width) cannot be replaced by an action.
    policy = StateRecordingPolicy(latency_s=0.0, horizon=4)
    config = ChunkerConfig(strategy="replace", control_hz=HZ, roll_state_forward=True, request_threshold=3)
    with ActionChunker(policy, config) as chunker:
        chunker.next_action({"step": 0, "state": np.zeros(5, np.float32)})
        with pytest.raises(ValueError, match="action's units"):
            for step in range(1, 8):
                chunker.next_action({"step": step, "state": np.zeros(5, np.float32)})
