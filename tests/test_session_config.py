"""Session settings, in process: merging ``configure`` frames, defaults, and every refusal (no server)."""

from __future__ import annotations

import numpy as np
import pytest

from cosmos3_runtime.description import ModelDescription
from policy_server.assembly.websocket_routes import Route, route
from policy_server.session_config import SessionConfig, merge_session_config
from policy_server.sessions.endpoints import EdgeEndpoints
from robot_clients.protocol import ErrorCode, ProtocolError


@pytest.fixture(scope="module")
def described(tiny_engine) -> ModelDescription:
    return tiny_engine("distilled").describe()


@pytest.fixture(scope="module")
def domain(described) -> str:
    return described.defaults.domain_name or next(iter(described.domains))


def refused(settings, described, current=None, seq=None) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        merge_session_config(current, settings, described, seq)
    return info.value


def test_the_first_configure_needs_a_domain_and_later_ones_keep_it(described, domain):
    error = refused({"prompt": "pick"}, described)
    assert (error.code, error.field) == (ErrorCode.MISSING_FIELD, "domain_name")
    first = merge_session_config(None, {"domain_name": domain, "prompt": "pick"}, described)
    later = merge_session_config(first, {"seed": 3}, described)
    assert (later.domain_name, later.prompt, later.seed) == (domain, "pick", 3)
    assert first.seed is None  # merging makes a new config; the old one is unchanged


def test_none_unsets_a_setting_but_never_the_domain(described, domain):
    config = merge_session_config(None, {"domain_name": domain, "seed": 7, "prompt": "x"}, described)
    unset = merge_session_config(config, {"seed": None, "prompt": None}, described)
    assert (unset.seed, unset.prompt) == (None, "")
    error = refused({"domain_name": None}, described, current=config, seq=4)
    assert (error.code, error.field, error.seq) == (ErrorCode.INVALID_FIELD, "domain_name", 4)


@pytest.mark.parametrize(
    "settings,code,field",
    [
        ({"domain_name": "no_such_robot"}, ErrorCode.UNKNOWN_DOMAIN, "domain_name"),
        ({"action_mode": "forward_dynamics"}, ErrorCode.UNSUPPORTED_MODE, "action_mode"),
        ({"resolution_tier": 12345}, ErrorCode.UNSUPPORTED_TIER, "resolution_tier"),
        ({"view_point": "from_the_moon"}, ErrorCode.INVALID_FIELD, "view_point"),
        ({"seed": -1}, ErrorCode.INVALID_FIELD, "seed"),
        ({"fps": 0.0}, ErrorCode.INVALID_FIELD, "fps"),
        ({"control_hz": -5.0}, ErrorCode.INVALID_FIELD, "control_hz"),
        ({"control_hz": 1e308}, ErrorCode.INVALID_FIELD, "control_hz"),  # accepted once, shown to operators
        ({"control_hz": float("inf")}, ErrorCode.INVALID_FIELD, "control_hz"),
        ({"control_hz": float("nan")}, ErrorCode.INVALID_FIELD, "control_hz"),
        ({"prompt": "p" * 1_000_000}, ErrorCode.INVALID_FIELD, "prompt"),
    ],
)
def test_each_bad_setting_is_refused_naming_its_field(described, domain, settings, code, field):
    error = refused({"domain_name": domain, **settings}, described, seq=9)
    assert (error.code, error.field, error.seq) == (code, field, 9)


def test_resolved_fills_the_models_defaults_for_the_domain(described, domain):
    profile = described.domains[domain]
    resolved = SessionConfig(domain_name=domain).resolved(described)
    assert resolved["domain_name"] == domain
    assert resolved["domain_id"] == profile.domain_id and resolved["raw_action_dim"] == profile.raw_action_dim
    assert resolved["action_horizon"] == (profile.default_horizon or described.defaults.action_horizon)
    assert resolved["view_point"] == (profile.view_point or described.defaults.view_point)
    for name in ("resolution_tier", "num_steps", "guidance_scale"):
        assert resolved[name] == getattr(described.defaults, name)
    chosen = SessionConfig(domain_name=domain, seed=11, action_horizon=resolved["action_horizon"]).resolved(described)
    assert chosen["seed"] == 11


def test_resolved_names_no_ids_for_an_unknown_domain(described):
    resolved = SessionConfig(domain_name="no_such_robot").resolved(described)
    assert resolved["domain_id"] is None and resolved["raw_action_dim"] is None


@pytest.mark.parametrize(
    "target,openpi,expected",
    [
        ("/healthz", True, Route.HEALTH),
        ("/dashboard", True, Route.DASHBOARD),
        ("/dashboard/app.js", True, Route.DASHBOARD),
        ("/v1/observe?access_token=t", True, Route.OBSERVER),
        ("/v1/actions/realtime", True, Route.NATIVE),
        ("/", True, Route.OPENPI),
        ("/openpi", True, Route.OPENPI),
        ("/openpi", False, Route.UNKNOWN),
        ("/dashboardx", True, Route.UNKNOWN),
        ("/nowhere", True, Route.UNKNOWN),
    ],
)
def test_the_routing_table(target, openpi, expected):
    assert route(target, openpi) is expected


def test_a_features_paths_are_routed_only_when_it_is_served():
    from policy_server.vla_eval import VlaEvalSettings
    from policy_server.vla_eval.session import vla_eval_endpoints

    endpoints = vla_eval_endpoints(VlaEvalSettings())
    assert route("/v1/vla-eval?token=t", True, endpoints) is Route.EDGE_SESSION
    assert route("/health", True, endpoints) is Route.EDGE_HTTP and endpoints.http["/health"].open
    assert route("/v1/vla-eval/config", True, endpoints) is Route.EDGE_HTTP
    assert not endpoints.http["/config"].open  # behind the bearer token, unlike the readiness probe
    assert route("/healthz", True, endpoints) is Route.HEALTH
    for target in ("/v1/vla-eval", "/health", "/config"):
        assert route(target, True) is Route.UNKNOWN  # a server assembled without vla-eval serves none of them


def test_an_endpoint_cannot_take_a_path_the_server_or_another_endpoint_serves():
    from dataclasses import replace

    from policy_server.assembly.server import PolicyServer
    from policy_server.vla_eval import VlaEvalSettings
    from policy_server.vla_eval.session import vla_eval_endpoints

    health = vla_eval_endpoints(VlaEvalSettings()).http["/health"]
    for path in ("/healthz", "/v1/actions/realtime", "/openpi", "/dashboard/app.js"):
        with pytest.raises(ValueError, match="served by the server itself"):
            PolicyServer(None, endpoints=EdgeEndpoints.of(replace(health, path=path)))
    with pytest.raises(ValueError, match="more than one endpoint at /health"):
        EdgeEndpoints.of(health, health)


def test_the_keeper_remembers_an_answer_only_for_the_same_typed_settings(described, domain):
    """Every observation asks ``resolve`` twice (session, engine): it answers from its memo, and only where the
    arguments are the same values of the same types."""
    from cosmos3_runtime.description import RESOLVED_MEMO_SIZE, Media
    from cosmos3_runtime.errors import InvalidRequestError

    settings = {"domain_name": domain, "seed": 1, "fps": 10.0}
    first = described.resolve(settings, Media(image=True))
    assert described.resolve(dict(settings), Media(image=True)) is first  # remembered
    assert first == described._resolve(settings, Media(image=True), "actions")  # the same answer as asked anew
    assert described.resolve(settings, Media(video=True, clip_frames=5)).action_mode == "inverse_dynamics"
    # Equal but not the same: True == 1, yet a boolean seed is refused.
    with pytest.raises(InvalidRequestError):
        described.resolve({**settings, "seed": True}, Media(image=True))
    # A value of a type the key does not hold is answered, not remembered.
    size = len(described._resolved)
    assert described.resolve({**settings, "fps": np.float16(12.0)}, Media(image=True)).fps == 12.0
    assert len(described._resolved) == size
    # Bounded, whatever a client varies.
    for seed in range(RESOLVED_MEMO_SIZE + 10):
        described.resolve({**settings, "seed": seed}, Media(image=True))
    assert 0 < len(described._resolved) <= RESOLVED_MEMO_SIZE
