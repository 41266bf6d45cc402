"""The engine's two halves: requests prepared on the host (another thread, while a batch runs) and then
run give the chunks of the one-call path."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cosmos3_runtime.engine import Cosmos3Engine
from cosmos3_runtime.errors import InvalidRequestError, UnknownDomainError
from cosmos3_runtime.frame_preprocessing import PreparedActions
from cosmos3_runtime.requests import ActionRequest

TOLERANCE = 2e-5


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return Cosmos3Engine.load(tiny_checkpoint("distilled"), prefix_cache_mb=64)


def _requests(seed_base: int) -> list[ActionRequest]:
    """A mixed batch: policy at two sizes and tiers, inverse dynamics, a real-time-chunking prefix."""
    rng = np.random.default_rng(seed_base)
    image = rng.integers(0, 256, (180, 240, 3), dtype=np.uint8)
    square = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    clip = rng.integers(0, 256, (9, 160, 208, 3), dtype=np.uint8)
    prefix = rng.uniform(-0.5, 0.5, (3, 10)).astype(np.float32)
    return [
        ActionRequest(domain_name="bridge_orig_lerobot", image=image, prompt="pick up the cube", seed=seed_base),
        ActionRequest(
            domain_name="droid_lerobot", image=square, seed=seed_base + 1, resolution_tier=480, action_horizon=8
        ),
        ActionRequest(
            domain_name="bridge_orig_lerobot", action_mode="inverse_dynamics", video=clip, seed=seed_base + 2
        ),
        ActionRequest(domain_name="bridge_orig_lerobot", image=image, prefix_actions=prefix, seed=seed_base + 3),
    ]


def _assert_same_chunks(expected, got):
    for a, b in zip(expected, got, strict=True):
        assert not isinstance(a, Exception) and not isinstance(b, Exception), (a, b)
        assert a.actions.shape == b.actions.shape
        assert np.abs(a.actions - b.actions).max() <= TOLERANCE
        assert (a.transformer_forwards, a.batch_size) == (b.transformer_forwards, b.batch_size)


def test_prepared_on_another_thread_equals_the_one_call_path(engine):
    requests = _requests(10)
    expected = engine.predict_actions_batch(requests)
    prepared: list[PreparedActions] = []
    thread = threading.Thread(target=lambda: prepared.extend(engine.prepare_actions(r) for r in requests))
    thread.start()
    thread.join()
    assert all(p.error is None and p.frames is not None and p.frames.preprocess_s > 0 for p in prepared)
    _assert_same_chunks(expected, engine.predict_prepared(prepared))


def test_preparing_the_next_batch_while_one_runs_changes_neither(engine):
    """The overlap itself: batch 2 is prepared on a second thread while batch 1's forwards run."""
    first, second = _requests(20), _requests(30)
    expected_first, expected_second = engine.predict_actions_batch(first), engine.predict_actions_batch(second)
    ready_first = [engine.prepare_actions(r) for r in first]
    forwards_started = threading.Event()
    handle = engine.pipe.transformer.register_forward_pre_hook(lambda *a: forwards_started.set())
    prepared_second: list[PreparedActions] = []

    def prepare_second():
        forwards_started.wait(30)
        prepared_second.extend(engine.prepare_actions(r) for r in second)

    helper = threading.Thread(target=prepare_second)
    helper.start()
    try:
        got_first = engine.predict_prepared(ready_first)
    finally:
        handle.remove()
        helper.join()
    _assert_same_chunks(expected_first, got_first)
    _assert_same_chunks(expected_second, engine.predict_prepared(prepared_second))


def test_a_request_that_fails_preparation_is_answered_with_its_error_in_place(engine):
    good = _requests(40)[:2]
    unknown = ActionRequest(domain_name="no_such_robot", image=good[0].image)
    no_image = ActionRequest(domain_name="bridge_orig_lerobot")
    prepared = [engine.prepare_actions(r) for r in (good[0], unknown, no_image, good[1])]
    assert isinstance(prepared[1].error, UnknownDomainError) and prepared[1].frames is None
    assert isinstance(prepared[2].error, InvalidRequestError)
    results = engine.predict_prepared(prepared)
    assert results[1] is prepared[1].error and results[2] is prepared[2].error
    _assert_same_chunks(engine.predict_actions_batch(good), [results[0], results[3]])
