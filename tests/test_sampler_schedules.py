"""Sampler settings the checkpoint's scheduler cannot run are refused by the rule keeper, at ``configure``.

diffusers' schedulers find their first step by its timestep and start at the second occurrence of a
repeated one, so a schedule whose first timestep repeats (UniPC's whole-number timesteps at many steps and a
large shift: 200 steps at shift 9) runs past its end and fails an assertion inside the scheduler. The
property test runs diffusers' own schedulers, built and set as the engine builds and sets them, over steps x
shift x scheduler, and holds the rule keeper's verdict against whether the schedule ran to its end.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cosmos3_runtime.checkpoints import ScheduleRule, build_scheduler, inspect_checkpoint, set_schedule
from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.errors import InvalidRequestError
from cosmos3_runtime.profiles import MAX_SHIFT, MAX_STEPS, MIN_SHIFT
from cosmos3_runtime.requests import ActionRequest
from policy_server.session_config import merge_session_config
from robot_clients.protocol import ErrorCode, ProtocolError

DOMAIN = "bridge_orig_lerobot"


@pytest.fixture(scope="module")
def base_info(tiny_checkpoint):
    return inspect_checkpoint(tiny_checkpoint("base"))


@pytest.fixture(scope="module")
def base(tiny_engine) -> ModelDescription:
    return tiny_engine("base").describe()


def scheduler_variants(info):
    """The schedulers a non-distilled checkpoint may ship, as the engine would build them: the tiny base's
    UniPC, and flow-matching Euler, each with the scheduler's own spacing and with the native flow schedule."""
    euler = dataclasses.replace(
        info,
        scheduler_class="FlowMatchEulerDiscreteScheduler",
        scheduler_config={"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0},
        ignored_scheduler_keys=[],
    )
    return [
        info,
        dataclasses.replace(info, native_flow_schedule=True),
        euler,
        dataclasses.replace(euler, native_flow_schedule=True),
    ]


def diffusers_runs(info, steps: int, shift: float) -> bool:
    """Whether diffusers' scheduler runs every step of the schedule, as the sampler steps it (a zero velocity
    on a small latent), to a finite end."""
    scheduler = build_scheduler(info, shift)
    set_schedule(scheduler, info, steps)
    latents = torch.zeros(1, 4)
    try:
        for t in scheduler.timesteps:
            latents = scheduler.step(torch.zeros_like(latents), t, latents, return_dict=False)[0]
    except (AssertionError, IndexError, ValueError, RuntimeError):
        return False
    return len(scheduler.timesteps) == steps and bool(torch.isfinite(latents).all())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    variant=st.integers(0, 3),
    steps=st.integers(1, MAX_STEPS),
    shift=st.floats(MIN_SHIFT, MAX_SHIFT, allow_nan=False, allow_infinity=False),
)
@example(variant=0, steps=200, shift=9.0)  # the case
@example(variant=0, steps=150, shift=9.0)
@example(variant=0, steps=35, shift=100.0)
def test_the_rule_keeper_accepts_exactly_the_schedules_diffusers_runs(base, base_info, variant, steps, shift):
    info = scheduler_variants(base_info)[variant]
    description = dataclasses.replace(base, schedules=ScheduleRule(info))
    try:
        description.check({"num_steps": steps, "shift": shift})
        accepted = True
    except InvalidRequestError as exc:
        assert exc.field == "num_steps" and "first timestep" in exc.message
        accepted = False
    assert accepted == diffusers_runs(info, steps, shift), (info.scheduler_class, info.native_flow_schedule)


def test_200_steps_at_shift_9_are_refused_at_configure_naming_the_steps(base):
    with pytest.raises(ProtocolError) as caught:
        merge_session_config(None, {"domain_name": DOMAIN, "num_steps": 200, "shift": 9.0}, base)
    assert caught.value.code == ErrorCode.INVALID_FIELD and caught.value.field == "num_steps"
    assert "shift 9" in caught.value.message


def test_a_shift_sent_after_the_steps_is_judged_with_the_steps_already_set(base):
    session = merge_session_config(None, {"domain_name": DOMAIN, "num_steps": 200}, base)  # at the default shift 3
    with pytest.raises(ProtocolError) as caught:
        merge_session_config(session, {"shift": 9.0}, base)
    # The merged session holds both; the refusal names the steps and says the shift.
    assert caught.value.field == "num_steps" and "200 steps at shift 9" in caught.value.message
    assert merge_session_config(session, {"shift": 5.0}, base).shift == 5.0


def test_the_engine_refuses_the_schedule_with_a_typed_error_before_any_forward(tiny_engine):
    request = ActionRequest(domain_name=DOMAIN, image=np.zeros((64, 64, 3), np.uint8), num_steps=200, shift=9.0, seed=0)
    with pytest.raises(InvalidRequestError, match="first timestep"):
        tiny_engine("base").predict_actions(request)


def test_every_default_schedule_of_the_base_checkpoint_runs(base):
    for defaults in base.domain_defaults.values():
        assert base.schedules is not None
        assert base.schedules.fault(defaults.num_steps, defaults.shift) is None
        assert math.isfinite(defaults.shift or 1.0)
