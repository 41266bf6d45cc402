"""No robot request holds the engine past a bound: its cost, transformer forwards x tokens in default chunks of
its domain, is judged by the rule keeper against ``--max-request-cost`` and a costlier one is refused at
``configure`` (or at the observation carrying it), naming the bound, before anything runs.

Issue 45.2's request on the tiny base checkpoint: 200 steps, guidance 7, tier 720 (35 steps, guidance 6, tier
480 by default) costs 12.8 default chunks; alone it took 15 s, and beside 4 robots it made all of them time out.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cosmos3_runtime.errors import InvalidRequestError
from cosmos3_runtime.requests import ActionRequest
from policy_server.assembly.cli import DEFAULT_MAX_REQUEST_COST, build_parser
from policy_server.session_config import merge_session_config, observation_request
from robot_clients.client_frames import ObservationFrame
from robot_clients.protocol import ErrorCode, ProtocolError

DOMAIN = "bridge_orig_lerobot"
COSTLY = {"num_steps": 200, "guidance_scale": 7.0, "resolution_tier": 720}


def bounded(description, bound: float = DEFAULT_MAX_REQUEST_COST):
    return dataclasses.replace(description, limits=dataclasses.replace(description.limits, max_chunk_cost=bound))


@pytest.fixture(scope="module")
def base(tiny_engine):
    return bounded(tiny_engine("base").describe())


@pytest.fixture(scope="module")
def distilled(tiny_engine):
    return bounded(tiny_engine("distilled").describe())


def test_the_cost_is_forwards_times_tokens_over_the_domains_default_chunk(base):
    assert base.chunk_cost({}) == 1.0
    assert base.chunk_cost({"num_steps": 70}) == pytest.approx(2.0)  # twice the steps, guidance on each
    assert base.chunk_cost({"guidance_scale": 1.0}) == pytest.approx(0.5)  # no second pass
    assert base.chunk_cost(COSTLY) == pytest.approx(12.84, abs=0.01)


def test_the_costly_request_is_refused_at_configure_naming_the_bound(base):
    with pytest.raises(ProtocolError) as caught:
        merge_session_config(None, {"domain_name": DOMAIN, **COSTLY}, base)
    assert caught.value.code == ErrorCode.INVALID_FIELD and caught.value.field == "num_steps"
    assert "12.8 default chunks" in caught.value.message and "--max-request-cost" in caught.value.message
    assert "bound of 8" in caught.value.message


def test_the_costly_settings_are_refused_on_the_observation_that_carries_them(base):
    session = merge_session_config(None, {"domain_name": DOMAIN, "num_steps": 200}, base)  # 5.7 chunks: within
    frame = ObservationFrame(seq=7, image=np.zeros((64, 64, 3), np.uint8), overrides={"resolution_tier": 720})
    with pytest.raises(ProtocolError) as caught:
        observation_request(session, frame, base)
    assert caught.value.seq == 7 and "--max-request-cost" in caught.value.message


def test_the_next_tier_on_a_distilled_checkpoint_is_within_the_default_bound(distilled):
    tiers = sorted(distilled.resolution_tiers)
    assert distilled.chunk_cost({"resolution_tier": tiers[1]}) < DEFAULT_MAX_REQUEST_COST
    merge_session_config(None, {"domain_name": DOMAIN, "resolution_tier": tiers[1]}, distilled)


def test_the_engine_refuses_it_before_any_forward_with_the_servers_bound(tiny_checkpoint):
    from cosmos3_runtime.description import EngineLimits
    from cosmos3_runtime.engine import Cosmos3Engine

    engine = Cosmos3Engine.load(tiny_checkpoint("base"), device="cpu", limits=EngineLimits(max_chunk_cost=8.0))
    request = ActionRequest(domain_name=DOMAIN, image=np.zeros((64, 64, 3), np.uint8), seed=0, **COSTLY)
    with pytest.raises(InvalidRequestError, match="--max-request-cost"):
        engine.predict_actions(request)


def test_the_server_flag_sets_the_bound_and_zero_lifts_it(base):
    assert build_parser().parse_args(["--tiny", "base"]).max_request_cost == DEFAULT_MAX_REQUEST_COST
    assert build_parser().parse_args(["--tiny", "base", "--max-request-cost", "0"]).max_request_cost == 0
    merge_session_config(None, {"domain_name": DOMAIN, **COSTLY}, bounded(base, 0.0))
    merge_session_config(None, {"domain_name": DOMAIN, **COSTLY}, bounded(base, 13.0))
