"""The request settings are declared once (``robot_clients.client_frames.REQUEST_SETTINGS``: names, types,
where a native frame may carry each); every other form of them is checked against it here.

The native parser (``configure`` and ``observation``) takes exactly the settings the table says. Each other
door declares the settings it takes itself, by name, and must name only the table's settings and take them
with the table's types: the HTTP sidecar's request schemas (``ACTION_SETTINGS``, ``VIDEO_SETTINGS``), the
``--openpi-*`` settings (``OPENPI_SETTINGS``), a vla-eval episode's settings (``VLA_EVAL_SETTINGS``) and
SGLang's request keys (``SGLANG_NAMES``). Then the server's ``SessionConfig``, what each recorded row keeps
(and what ``cosmos3-replay`` may override), what an action chunk reports, the engine's ``ActionRequest`` and
the user-facing table in ``docs/protocol.md``. A setting added to the table and missing from a form it
claims, or added to a form and missing from the table, fails here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from cosmos3_runtime.requests import ActionRequest
from policy_server import cli as cli_module
from policy_server.api_errors import ApiError
from policy_server.cli import build_parser
from policy_server.http.requests import ACTION_SETTINGS, VIDEO_SETTINGS, action_request, video_submission
from policy_server.http.schemas import ActionGenerationParams, VideoCreateParams
from policy_server.openpi_settings import OPENPI_SETTINGS, OpenpiSettings
from policy_server.recording.episode_writer import REQUEST_FIELDS
from policy_server.recording.replay import OVERRIDABLE
from policy_server.session_config import CHUNK_ECHOED_SETTINGS, SessionConfig, merge_session_config
from policy_server.sglang import actions as sglang_actions
from policy_server.sglang import parameters as sglang_videos
from policy_server.sglang.parameters import SGLANG_NAMES
from policy_server.vla_eval.translation import VLA_EVAL_SETTINGS, VlaEvalSettings
from robot_clients import ActionChunk
from robot_clients.client_frames import (
    OBSERVATION_SETTINGS,
    REQUEST_SETTINGS,
    SESSION_SETTINGS,
    SETTING_ALIASES,
    ConfigureFrame,
    ObservationFrame,
    RequestSetting,
    SettingChannel,
    parse_client_frame,
)
from robot_clients.protocol import ErrorCode, FrameLimits, ProtocolError

ROOT = Path(__file__).resolve().parent.parent
LIMITS = FrameLimits(min_image_side=8, max_image_side=4096, max_clip_frames=65)
IMAGE = np.zeros((16, 16, 3), np.uint8)
# A value of each primary type, for frames that carry every setting.
SAMPLES = {str: "policy", int: 3, float: 2.5}


TABLE = [setting.name for setting in REQUEST_SETTINGS]
# Each door's own declaration of the settings it takes, by name.
DOORS = {
    "http actions": ACTION_SETTINGS,
    "http videos": VIDEO_SETTINGS,
    "openpi": OPENPI_SETTINGS,
    "vla-eval": VLA_EVAL_SETTINGS,
    "sglang": tuple(SGLANG_NAMES),
}


def names(channel: SettingChannel) -> set[str]:
    return {setting.name for setting in REQUEST_SETTINGS if channel in setting.channels}


def setting(name: str) -> RequestSetting:
    return next(s for s in REQUEST_SETTINGS if s.name == name)


@pytest.mark.parametrize("door", DOORS)
def test_each_door_takes_only_the_tables_settings_in_the_tables_order(door):
    taken = DOORS[door]
    assert taken and set(taken) <= set(TABLE), set(taken) - set(TABLE)
    assert list(taken) == [name for name in TABLE if name in taken]  # no name twice, flags in the table's order


def test_the_table_names_each_setting_once_with_a_doc_and_a_type():
    table = [setting.name for setting in REQUEST_SETTINGS]
    assert len(table) == len(set(table))
    for setting in REQUEST_SETTINGS:
        assert setting.doc and setting.types and setting.channels, setting.name
        assert (setting.not_per_observation is None) == (SettingChannel.OBSERVATION in setting.channels), setting.name
    aliases = [alias for setting in REQUEST_SETTINGS for alias in setting.aliases]
    assert not set(aliases) & set(table) and len(aliases) == len(set(aliases))


def test_the_native_parser_takes_the_tables_settings_where_the_table_says():
    assert set(SESSION_SETTINGS) == names(SettingChannel.CONFIGURE)
    assert set(OBSERVATION_SETTINGS) == names(SettingChannel.OBSERVATION)
    assert SETTING_ALIASES == {"num_inference_steps": "num_steps"}
    values = {setting.name: SAMPLES[setting.types[0]] for setting in REQUEST_SETTINGS}

    configure = parse_client_frame({"type": "configure", **values}, LIMITS)
    assert isinstance(configure, ConfigureFrame) and set(configure.settings) == names(SettingChannel.CONFIGURE)
    observed = {name: values[name] for name in names(SettingChannel.OBSERVATION)}
    obs = parse_client_frame({"type": "observation", "seq": 0, "image": IMAGE, **observed}, LIMITS)
    assert isinstance(obs, ObservationFrame) and set(obs.overrides) == set(observed)
    for setting in REQUEST_SETTINGS:
        if float in setting.types:  # a number setting takes an int and hands on a float
            assert isinstance(configure.settings[setting.name], float), setting.name
        if setting.not_per_observation is not None:
            with pytest.raises(ProtocolError) as info:
                parse_client_frame({"type": "observation", "seq": 0, "image": IMAGE, setting.name: 1}, LIMITS)
            assert (info.value.code, info.value.field) == (ErrorCode.INVALID_FIELD, setting.name)
            assert setting.not_per_observation in info.value.message
        with pytest.raises(ProtocolError) as info:  # every setting is a scalar: a list is refused
            parse_client_frame({"type": "configure", setting.name: [1]}, LIMITS)
        assert info.value.field == setting.name


def test_the_session_config_has_a_field_per_configure_setting_of_the_same_type():
    fields = {field.name: str(field.type) for field in dataclasses.fields(SessionConfig)}
    # The guidance interval comes with the runtime's DomainRequest; no client sends it, so a session leaves it
    # unset (the profile's) and the parser never puts it in a `configure`.
    assert set(fields) - {"guidance_interval"} == names(SettingChannel.CONFIGURE)
    assert "guidance_interval" not in SESSION_SETTINGS
    for setting in REQUEST_SETTINGS:
        assert setting.types[0].__name__ in fields[setting.name], (setting.name, fields[setting.name])


def test_the_http_schemas_name_the_settings_each_endpoint_takes():
    # Besides the settings: the media, the real-time chunking prefix, the state, the model's name.
    actions_media = {"image", "video", "prefix_actions", "state", "model"}
    videos_media = {"action", "input_reference", "model"}
    # The request builders hand on the settings the schemas declare, each a setting of the table.
    assert set(ActionGenerationParams.model_fields) - actions_media == set(ACTION_SETTINGS)
    assert set(VideoCreateParams.model_fields) - videos_media == set(VIDEO_SETTINGS)
    assert set(ACTION_SETTINGS) == set(TABLE) - {"control_hz"}  # shown to operators, never the model's
    assert set(VIDEO_SETTINGS) == set(ACTION_SETTINGS) - {"action_horizon"}  # a rollout's length is its actions'
    for model in (ActionGenerationParams, VideoCreateParams):
        for name in set(model.model_fields) - actions_media - videos_media:
            shown = str(model.model_fields[name].annotation)
            kind = setting(name).types[0]
            assert kind.__name__ in shown or "Literal" in shown, (model.__name__, name, shown)


def test_the_openpi_and_vla_eval_flags_are_the_settings_each_feature_takes():
    parser = build_parser()
    flags = {option for action in parser._actions for option in action.option_strings}
    for prefix, taken_by_feature in (("--openpi-", OPENPI_SETTINGS), ("--vla-eval-", VLA_EVAL_SETTINGS)):
        taken = {s.name for s in REQUEST_SETTINGS if f"{prefix}{s.option}" in flags}
        assert taken == set(taken_by_feature), prefix
    # Every flag lands in the settings under its setting's name, typed and normalized by the table.
    values = {str: "droid_lerobot", int: "8", float: "2.5"}
    argv = ["--tiny", "distilled"]
    for s in REQUEST_SETTINGS:
        for prefix, taken_by_feature in (("--openpi-", OPENPI_SETTINGS), ("--vla-eval-", VLA_EVAL_SETTINGS)):
            if s.name in taken_by_feature:
                argv += [f"{prefix}{s.option}", " POLICY " if s.name == "action_mode" else values[s.types[0]]]
    args = parser.parse_args(argv)
    openpi, vla_eval = cli_module._openpi_settings(args), cli_module._vla_eval_settings(args)
    assert openpi is not None and vla_eval is not None
    assert set(openpi.requested) == set(OPENPI_SETTINGS)
    assert set(vla_eval.requested) == set(VLA_EVAL_SETTINGS)
    assert openpi.requested["action_mode"] == "policy" and openpi.requested["action_horizon"] == 8


@pytest.mark.parametrize("form", [OpenpiSettings, VlaEvalSettings])
def test_the_operator_settings_take_only_their_features_settings_and_check_their_types(form):
    taken = OPENPI_SETTINGS if form is OpenpiSettings else VLA_EVAL_SETTINGS
    refused = next(name for name in TABLE if name not in taken)
    with pytest.raises(ProtocolError) as info:
        form(requested={refused: 1})
    assert (info.value.code, info.value.field) == (ErrorCode.INVALID_FIELD, refused)
    with pytest.raises(ProtocolError) as info:
        form(requested={"action_horizon": "eight"})
    assert (info.value.code, info.value.field) == (ErrorCode.INVALID_FIELD, "action_horizon")
    assert form(requested={"seed": None}).requested == {}  # unset


def test_a_vla_eval_episode_takes_the_vla_eval_settings_and_no_mode():
    assert set(VLA_EVAL_SETTINGS) <= set(TABLE)
    assert "action_mode" not in VLA_EVAL_SETTINGS  # an episode plays policy chunks


def sglang_names() -> dict[str, str]:
    """SGLang's keys that carry a setting, each with the setting it carries (from SGLang's mapping)."""
    return {key: name for name, keys in SGLANG_NAMES.items() for key in keys}


def test_sglangs_keys_carry_the_tables_settings_under_sglangs_names():
    carried = sglang_names()
    assert len(carried) == sum(len(keys) for keys in SGLANG_NAMES.values())  # each key carries one setting
    assert set(carried.values()) == set(SGLANG_NAMES) <= set(TABLE)
    assert set(TABLE) - set(SGLANG_NAMES) == {"shift", "control_hz"}  # SGLang has no shift; control_hz is ours
    # SGLang's action keys that are no setting: media, the batch's candidates, output shaping, checks.
    not_settings = {
        "observation",
        *sglang_actions.MEDIA_KEYS,
        "action_normalization",
        "candidate_count",
        "candidate_reducer",
        "return_candidates",
        "use_guardrails",
        "output_format",
    }
    action_keys = set(sglang_actions.PARAMETER_KEYS) | set(sglang_actions.INPUT_KEYS)
    assert action_keys - not_settings == set(carried) - {"size"}  # `size` is the videos' way to say width+height
    # /v1/videos takes our own names, SGLang's renamed ones and the keys it resolves into a setting.
    native = set(sglang_videos.NATIVE_FIELDS) - {"action", "input_reference", "model"}
    assert native == set(VIDEO_SETTINGS)
    for key, name in sglang_videos.RENAMED.items():
        assert carried[key] == name, key
    # Its resolved keys say a setting another way; num_frames is only checked against the actions' length
    # (a rollout has no horizon setting).
    resolved = {carried[key] for key in sglang_videos.CHECKED_FIELDS if key in carried and key != "num_frames"}
    assert resolved == {"domain_name", "resolution_tier", "fps"}
    assert resolved <= set(VIDEO_SETTINGS)


def test_sglangs_action_parser_reads_every_setting_key_it_accepts():
    # PARAMETER_KEYS takes its setting keys from the table: each must be read, never accepted and ignored.
    source = Path(sglang_actions.__file__).read_text(encoding="utf-8")
    read = set(re.findall(r'parameters(?:\.get\(|\[)"([a-z_]+)"', source))
    accepted = set(sglang_names()) & set(sglang_actions.PARAMETER_KEYS)
    assert accepted and accepted <= read, accepted - read


def test_recording_keeps_the_recorded_settings_and_replay_overrides_only_those():
    recorded = {setting.name for setting in REQUEST_SETTINGS if setting.recorded}
    # guidance_interval is the engine's, set by no client: recorded so that a replay sends the same request.
    assert set(REQUEST_FIELDS) - {"guidance_interval"} == recorded
    # What a row writes (the request's named settings) is what a replay reads back.
    assert set(ActionRequest(domain_name="any").named_settings()) == set(REQUEST_FIELDS)
    assert set(OVERRIDABLE) <= recorded
    for name, kind in OVERRIDABLE.items():
        assert kind in next(s for s in REQUEST_SETTINGS if s.name == name).types, name


def test_the_chunk_reports_the_settings_it_was_made_with():
    fields = {field.name for field in dataclasses.fields(ActionChunk)}
    not_settings = {"seq", "actions", "domain_id", "raw_action_dim", "timing", "round_trip_ms", "session_id"}
    reported = {setting.name for setting in REQUEST_SETTINGS if setting.in_chunk}
    assert fields - not_settings == reported
    assert set(CHUNK_ECHOED_SETTINGS) <= reported


def test_every_setting_the_model_uses_reaches_the_engine_request():
    request_fields = {field.name for field in dataclasses.fields(ActionRequest)}
    used = {setting.name for setting in REQUEST_SETTINGS if setting.recorded}
    assert used <= request_fields
    session_fields = {field.name for field in dataclasses.fields(SessionConfig)}
    assert used <= session_fields  # a session holds each of them, and its request carries them on
    assert "control_hz" not in request_fields  # shown to operators, never the model's


def test_the_protocol_docs_table_lists_the_configure_settings():
    text = (ROOT / "docs" / "protocol.md").read_text()
    table = text[text.index("| field | type | default |") :].split("\n\n", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)`", table, flags=re.MULTILINE))
    assert documented == names(SettingChannel.CONFIGURE)


@pytest.fixture(scope="module")
def described(tiny_engine):
    return tiny_engine("distilled").describe()


# One bad value of each setting the model judges, with the code that refuses it.
BAD_SETTINGS = [
    ("domain_name", "no_such_robot", ErrorCode.UNKNOWN_DOMAIN),
    ("resolution_tier", 12345, ErrorCode.UNSUPPORTED_TIER),
    ("view_point", "no_such_view", ErrorCode.INVALID_FIELD),
    ("prompt", "x" * 100_000, ErrorCode.INVALID_FIELD),
    ("num_steps", 999, ErrorCode.INVALID_FIELD),
    ("guidance_scale", 7.0, ErrorCode.INVALID_FIELD),
]


@pytest.mark.parametrize(("name", "value", "code"), BAD_SETTINGS)
def test_sessions_and_http_refuse_a_bad_setting_by_the_same_check(described, name, value, code):
    """One server-side check of settings: a ``configure``, an action generation and a video job refuse the
    same bad value with the same code, the same field and the same message."""
    domain = described.defaults.domain_name or next(iter(described.domains))
    with pytest.raises(ProtocolError) as session:
        merge_session_config(None, {"domain_name": domain, name: value}, described)
    image = np.zeros((64, 64, 3), np.uint8).tolist()
    with pytest.raises(ApiError) as actions:
        action_request({"domain_name": domain, "image": image, name: value}, described)
    answers = [actions.value]
    if name in VIDEO_SETTINGS:
        width = described.domains[domain].raw_action_dim or 7
        with pytest.raises(ApiError) as videos:
            video_submission(
                {"domain_name": domain, "input_reference": image, "action": [[0.0] * width] * 8, name: value},
                described,
            )
        answers.append(videos.value)
    for answer in answers:
        assert (answer.code, answer.field, answer.message) == (code, name, session.value.message), name
        assert session.value.code == code
