"""vla-eval's frames, observation mapping and chunked-policy convention, in process (no server).

The translator (policy_server/vla_eval) is sans-I/O: frames in, typed values or typed errors out. The
domain profiles come from the real tiny checkpoints' descriptions (bridge takes no state; the DROID
profile conditions on an 8-wide one).
"""

from __future__ import annotations

import io

import msgpack
import numpy as np
import pytest
from PIL import Image

from policy_server.vla_eval.translation import (
    ChunkPlan,
    ChunkPlayer,
    FrameType,
    MappingFileError,
    ObservationMapping,
    VlaEvalSettings,
    action_frame,
    error_frame,
    parse_frame,
    parse_observation,
)
from robot_clients.protocol import ErrorCode, FrameLimits, ProtocolError
from robot_clients.wire_codec import packb, unpackb

LIMITS = FrameLimits(min_image_side=8, max_image_side=4096, max_clip_frames=65)
H = 4


def chunk(offset: float = 0.0, horizon: int = H) -> np.ndarray:
    return np.arange(horizon * 2, dtype=np.float32).reshape(horizon, 2) + offset


# -- the chunk player ----------------------------------------------------------------------------------


def test_step_chunks_play_one_action_per_observation_and_ask_early():
    player = ChunkPlayer(ChunkPlan(ask_ahead=1).checked(H))
    first = player.observe()
    assert (first.step, first.action, first.ask) == (0, None, True)  # nothing yet: it waits for the engine
    np.testing.assert_array_equal(player.arrived(chunk(), 0, awaiting=True), chunk()[0])
    played = [player.observe() for _ in range(H - 1)]
    assert [d.ask for d in played] == [False, False, True]  # the last action of the chunk asks for the next
    np.testing.assert_array_equal(np.stack([d.action for d in played]), chunk()[1:])
    waiting = player.observe()  # the chunk is spent and the next is on its way
    assert (waiting.step, waiting.action, waiting.ask) == (H, None, False)
    # Computed from the observation of step H - 1, it arrives at step H: its row 1 is for now.
    np.testing.assert_array_equal(player.arrived(chunk(100), H - 1, awaiting=True), chunk(100)[1])
    np.testing.assert_array_equal(player.observe().action, chunk(100)[2])


def test_ask_ahead_zero_plays_every_row_as_vla_evals_own_chunked_servers_do():
    player = ChunkPlayer(ChunkPlan(ask_ahead=0).checked(H))
    player.observe()
    rows = [player.arrived(chunk(), 0, awaiting=True)] + [player.observe().action for _ in range(H - 1)]
    np.testing.assert_array_equal(np.stack(rows), chunk())
    spent = player.observe()
    assert spent.action is None and spent.ask


def test_a_chunk_asked_early_that_arrives_before_it_is_needed_is_not_sent_unasked():
    player = ChunkPlayer(ChunkPlan(ask_ahead=2).checked(H))
    player.observe()
    player.arrived(chunk(), 0, awaiting=True)
    assert not player.observe().ask  # row 1: two rows left after it
    decision = player.observe()  # row 2: one left, fewer than ask_ahead
    assert decision.action is not None and decision.ask and decision.step == 2
    assert player.arrived(chunk(100), 2, awaiting=False) is None  # nobody waits: kept, not sent
    np.testing.assert_array_equal(player.observe().action, chunk(100)[1])  # step 3 -> row 3 - 2


def test_a_late_chunk_plays_its_last_row_and_the_next_observation_asks_again():
    player = ChunkPlayer(ChunkPlan(ask_ahead=0).checked(H))
    player.observe()
    for _ in range(H + 3):  # a live run: ticks go by while the engine works
        assert player.observe().action is None
    np.testing.assert_array_equal(player.arrived(chunk(), 0, awaiting=True), chunk()[-1])
    assert player.observe().ask


def test_execute_plays_only_the_first_rows_and_whole_returns_the_chunk():
    player = ChunkPlayer(ChunkPlan(ask_ahead=0, execute=2).checked(H))
    player.observe()
    player.arrived(chunk(), 0, awaiting=True)
    assert player.observe().action is not None
    assert player.observe().ask
    whole = ChunkPlayer(ChunkPlan(chunk="whole").checked(H))
    assert whole.observe().ask and whole.observe().ask
    np.testing.assert_array_equal(whole.arrived(chunk(), 1, awaiting=True), chunk())


@pytest.mark.parametrize(
    "plan, field",
    [(ChunkPlan(chunk="half"), "chunk"), (ChunkPlan(execute=9), "execute"), (ChunkPlan(ask_ahead=H), "ask_ahead")],
)
def test_a_plan_that_does_not_fit_the_chunk_names_its_setting(plan, field):
    with pytest.raises(ProtocolError) as info:
        plan.checked(H)
    assert (info.value.code, info.value.field) == (ErrorCode.INVALID_FIELD, field)


# -- frames -----------------------------------------------------------------------------------------------


def vla_frame(kind="observation", payload=None, seq=3, **changes) -> bytes:
    raw = {"type": kind, "payload": payload if payload is not None else {}, "seq": seq, "timestamp": 1.5}
    raw.update(changes)
    return msgpack.packb({k: v for k, v in raw.items() if v is not None}, use_bin_type=True)


def test_a_frame_is_read_with_its_type_payload_and_seq():
    frame = parse_frame(vla_frame("hello", {"protocol_version": 1}))
    assert (frame.type, frame.payload, frame.seq, frame.timestamp) == (FrameType.HELLO, {"protocol_version": 1}, 3, 1.5)


@pytest.mark.parametrize(
    "message, code, field",
    [
        (b"\xc1not msgpack", ErrorCode.BAD_FRAME, None),
        ("text", ErrorCode.BAD_FRAME, None),
        (msgpack.packb([1, 2]), ErrorCode.BAD_FRAME, None),
        (vla_frame("launch"), ErrorCode.UNKNOWN_TYPE, "type"),
        (vla_frame("action"), ErrorCode.UNKNOWN_TYPE, "type"),  # the server's alone
        (vla_frame(seq=None), ErrorCode.MISSING_FIELD, "seq"),
        (msgpack.packb({"type": "hello", "seq": 1, "timestamp": 0.0}), ErrorCode.MISSING_FIELD, "payload"),
        (vla_frame(seq="7"), ErrorCode.INVALID_FIELD, "seq"),
        (vla_frame(payload=[1]), ErrorCode.INVALID_FIELD, "payload"),
        (vla_frame(timestamp="now"), ErrorCode.INVALID_FIELD, "timestamp"),
        (vla_frame(extra=1), ErrorCode.INVALID_FIELD, "extra"),
    ],
)
def test_a_malformed_frame_is_a_typed_error(message, code, field):
    with pytest.raises(ProtocolError) as info:
        parse_frame(message)
    assert (info.value.code, info.value.field) == (code, field), info.value.message


def test_replies_are_vla_evals_frames_with_our_codes():
    action = unpackb(action_frame(np.ones(7, np.float64), 9))
    assert (action["type"], action["seq"]) == ("action", 9) and action["payload"]["actions"].dtype == np.float32
    error = unpackb(error_frame(ErrorCode.INVALID_IMAGE, "bad camera", "images/front", 4))
    assert error["type"] == "error" and error["seq"] == 4
    assert error["payload"]["error"] == "invalid_image: bad camera (field: images/front)"
    assert (error["payload"]["code"], error["payload"]["field"]) == ("invalid_image", "images/front")


# -- observations ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def description(tiny_engine):
    return tiny_engine("distilled", droid=True).describe()


def png(image: np.ndarray) -> dict:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    return {"__image__": True, "format": "png", "data": buffer.getvalue(), "shape": list(image.shape)}


IMAGE = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)


def read(payload, description, domain="bridge_orig_lerobot", view="concat_view", mapping=None, **options):
    return parse_observation(
        payload, 5, mapping or ObservationMapping(), view, description.domains[domain], LIMITS, **options
    )


def test_cameras_are_chosen_by_view_point_and_composed(description):
    obs = read({"images": {"front": IMAGE, "wrist": IMAGE, "side": IMAGE}, "task_description": "reach"}, description)
    assert obs.cameras == ("front", "wrist") and obs.image.shape == (32, 96, 3) and obs.prompt == "reach"
    single = read({"images": {"side": IMAGE}}, description)  # no alternative matches: the only camera is used
    assert single.cameras == ("side",) and single.image.shape == (32, 48, 3)
    encoded = read({"images": {"agentview": png(IMAGE)}}, description, view="third_person_view")
    assert encoded.encoded and encoded.image is None  # decoded later, off the event loop
    encoded.frames = [IMAGE]
    encoded.compose(LIMITS)
    assert encoded.image.shape == (32, 48, 3)


def test_a_state_the_domain_does_not_use_is_accepted_and_named_unless_strict(description):
    payload = {"images": {"front": IMAGE}, "states": np.zeros(8, np.float32)}
    obs = read(payload, description)
    assert obs.state is None and obs.unused_state == ("states",)
    with pytest.raises(ProtocolError) as info:
        read(payload, description, strict_state=True)
    assert (info.value.code, info.value.field) == (ErrorCode.INVALID_FIELD, "states")
    used = read(payload, description, domain="droid_lerobot")  # the DROID profile conditions on 8 values
    assert used.state.shape == (8,) and used.unused_state == ()


@pytest.mark.parametrize(
    "payload, code, field",
    [
        ({"images": {"front": IMAGE}, "tcp_pose": np.zeros(7)}, ErrorCode.INVALID_FIELD, "tcp_pose"),
        ({"task_description": "reach"}, ErrorCode.MISSING_FIELD, "images"),
        ({"images": {"a": IMAGE, "b": IMAGE}}, ErrorCode.MISSING_FIELD, "images"),
        ({"images": {"front": "pixels"}}, ErrorCode.INVALID_IMAGE, "images/front"),
        ({"images": {"front": IMAGE.astype(np.float32)}}, ErrorCode.INVALID_IMAGE, "images/front"),
        (
            {"images": {"front": {"__image__": True, "format": "gif", "data": b"x"}}},
            ErrorCode.INVALID_IMAGE,
            "images/front",
        ),
        ({"images": {"front": IMAGE}, "task_description": 3}, ErrorCode.INVALID_FIELD, "task_description"),
        ({"images": {"front": IMAGE}, "states": [np.nan] * 8}, ErrorCode.INVALID_FIELD, "states"),
        ({"images": {"front": IMAGE}, "states": np.zeros(8), "state": np.zeros(8)}, ErrorCode.INVALID_FIELD, "state"),
    ],
)
def test_a_bad_observation_names_its_key(description, payload, code, field):
    with pytest.raises(ProtocolError) as info:
        read(payload, description)
    assert (info.value.code, info.value.field, info.value.seq) == (code, field, 5), info.value.message


def test_a_droid_domain_needs_its_state(description):
    with pytest.raises(ProtocolError) as info:
        read({"images": {"front": IMAGE}}, description, domain="droid_lerobot")
    assert (info.value.code, info.value.field) == (ErrorCode.MISSING_FIELD, "states")
    with pytest.raises(ProtocolError) as info:
        read({"images": {"front": IMAGE}, "states": np.zeros(4)}, description, domain="droid_lerobot")
    assert (info.value.code, info.value.field) == (ErrorCode.INVALID_FIELD, "states")


def test_a_mapping_file_replaces_parts_and_unused_keys_are_accepted(description, tmp_path):
    path = tmp_path / "mapping.json"
    path.write_text(
        '{"cameras": {"concat_view": [["side", "front"]]}, "unused": ["tcp_pose"], '
        '"observation_params": {"send_wrist_image": true}}'
    )
    mapping = ObservationMapping.load(str(path))
    assert mapping.observation_params == {"send_wrist_image": True} and mapping.state == ("states", "state")
    obs = read({"images": {"front": IMAGE, "side": IMAGE}, "tcp_pose": np.zeros(7)}, description, mapping=mapping)
    assert obs.cameras == ("side", "front")
    for text in ('{"cameras": {"top_view": ["a"]}}', '{"state": "states"}', '{"colour": 1}', "[1]", "{"):
        with pytest.raises(MappingFileError):
            ObservationMapping.load(text)


def test_episode_settings_override_the_servers_and_unknown_ones_are_refused(description):
    settings = VlaEvalSettings(requested={"action_horizon": 8})
    config, plan = settings.episode(description, {})
    assert (config.domain_name, config.action_horizon, plan.chunk) == (description.defaults.domain_name, 8, "step")
    config, plan = settings.episode(description, {"action_horizon": 4, "chunk": "whole", "seed": 3})
    assert (config.action_horizon, config.seed, plan.chunk) == (4, 3, "whole")
    for overrides, field in (
        ({"horizon": 4}, "settings/horizon"),
        ({"ask_ahead": "one"}, "settings/ask_ahead"),
        ({"domain_name": "mars_rover"}, "domain_name"),
        ({"ask_ahead": 8}, "ask_ahead"),
    ):
        with pytest.raises(ProtocolError) as info:
            settings.episode(description, overrides)
        assert info.value.field == field, info.value.message
