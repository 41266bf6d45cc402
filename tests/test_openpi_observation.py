"""openpi observations to engine inputs: conventions, camera choice per view point, composition, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policy_server.openpi_settings import CameraMapping, CameraMappingError
from policy_server.sessions.openpi_observation import detect_convention, parse_openpi_observation
from robot_clients.protocol import ErrorCode, FrameLimits, ProtocolError

LIMITS = FrameLimits(min_image_side=32, max_image_side=4096, max_clip_frames=65)
MAPPING = CameraMapping()


def image(h: int, w: int, value: int) -> np.ndarray:
    return np.full((h, w, 3), value, dtype=np.uint8)


LIBERO = {
    "observation/image": image(224, 224, 10),
    "observation/wrist_image": image(224, 224, 20),
    "observation/state": np.zeros(8, np.float32),
    "prompt": "put the bowl on the plate",
}
DROID = {
    "observation/exterior_image_1_left": image(180, 320, 30),
    "observation/wrist_image_left": image(90, 160, 40),
    "observation/joint_position": np.zeros(7),
    "observation/gripper_position": np.zeros(1),
    "prompt": "pick",
}
ALOHA = {
    "images": {
        name: np.full((3, 224, 224), v, np.uint8)
        for name, v in (("cam_high", 50), ("cam_low", 60), ("cam_left_wrist", 70), ("cam_right_wrist", 80))
    },
    "state": np.zeros(14, np.float32),
    "prompt": "fold",
}


@pytest.mark.parametrize(
    "obs,convention,view,camera,value",
    [
        (LIBERO, "libero", "third_person_view", "observation/image", 10),
        (LIBERO, "libero", "wrist_view", "observation/wrist_image", 20),
        (DROID, "droid", "ego_view", "observation/exterior_image_1_left", 30),
        (DROID, "droid", "wrist_view", "observation/wrist_image_left", 40),
        (ALOHA, "aloha", "ego_view", "images/cam_high", 50),
        (ALOHA, "aloha", "wrist_view", "images/cam_left_wrist", 70),
    ],
)
def test_each_convention_feeds_the_camera_of_the_view_point(obs, convention, view, camera, value):
    assert detect_convention(obs) == convention
    parsed = parse_openpi_observation(obs, MAPPING, view, LIMITS)
    assert parsed.cameras == (camera,)
    assert parsed.image.shape[-1] == 3 and parsed.image.dtype == np.uint8 and parsed.image.flags.c_contiguous
    assert np.all(parsed.image == value)  # ALOHA's channel-first frames arrive channel-last
    assert parsed.prompt == obs["prompt"] and parsed.video is None


def test_concat_view_composes_cameras_side_by_side_at_one_height():
    droid = parse_openpi_observation(DROID, MAPPING, "concat_view", LIMITS)
    assert droid.cameras == ("observation/exterior_image_1_left", "observation/wrist_image_left")
    assert droid.image.shape == (180, 320 + 320, 3)  # the 90x160 wrist frame is scaled to 180x320
    assert np.all(droid.image[:, :320] == 30) and np.all(droid.image[:, 320:] == 40)

    aloha = parse_openpi_observation(ALOHA, MAPPING, "concat_view", LIMITS)
    assert aloha.image.shape == (224, 3 * 224, 3)
    assert [int(aloha.image[0, i * 224, 0]) for i in range(3)] == [50, 70, 80]


def reference_roboarena_frame(wrist: np.ndarray, exterior_1: np.ndarray, exterior_2: np.ndarray) -> np.ndarray:
    """The reference's layout, written here from its description with torch: wrist on top; the exteriors
    resized by ``interpolate(bilinear, align_corners=False)`` to half the wrist's size, truncated to uint8,
    side by side below."""
    torch = pytest.importorskip("torch")
    half = (wrist.shape[0] // 2, wrist.shape[1] // 2)

    def resized(frame: np.ndarray) -> np.ndarray:
        tensor = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
        out = torch.nn.functional.interpolate(tensor, size=half, mode="bilinear", align_corners=False)
        return out[0].permute(1, 2, 0).numpy().astype(np.uint8)

    return np.concatenate([wrist, np.concatenate([resized(exterior_1), resized(exterior_2)], axis=1)], axis=0)


def roboarena(rng: np.random.Generator, wrist_shape=(180, 320), exterior_shape=(360, 640)) -> dict:
    """strands-robots' DROID observation: RoboArena's three cameras, joints (1, 7), gripper (1, 1)."""
    return {
        "observation/wrist_image_left": rng.integers(0, 256, (*wrist_shape, 3), dtype=np.uint8),
        "observation/exterior_image_1_left": rng.integers(0, 256, (*exterior_shape, 3), dtype=np.uint8),
        "observation/exterior_image_2_left": rng.integers(0, 256, (*exterior_shape, 3), dtype=np.uint8),
        "observation/joint_position": np.zeros((1, 7), np.float32),
        "observation/gripper_position": np.zeros((1, 1), np.float32),
        "prompt": "pick",
    }


@pytest.mark.parametrize("exterior_shape", [(360, 640), (180, 320), (97, 211)])
def test_roboarenas_three_cameras_compose_as_the_reference_composes_them(exterior_shape):
    """Wrist on top at its size, the two exteriors at half its size side by side below: within one grey level
    of torch's bilinear resize (float rounding), whatever the exteriors' own size."""
    obs = roboarena(np.random.default_rng(7), exterior_shape=exterior_shape)
    assert detect_convention(obs) == "roboarena"
    parsed = parse_openpi_observation(obs, MAPPING, "concat_view", LIMITS)
    assert parsed.cameras == (
        "observation/wrist_image_left",
        "observation/exterior_image_1_left",
        "observation/exterior_image_2_left",
    )
    expected = reference_roboarena_frame(
        obs["observation/wrist_image_left"],
        obs["observation/exterior_image_1_left"],
        obs["observation/exterior_image_2_left"],
    )
    assert parsed.image.shape == expected.shape == (270, 320, 3)
    assert np.array_equal(parsed.image[:180], obs["observation/wrist_image_left"])
    difference = np.abs(parsed.image.astype(int) - expected.astype(int))
    assert difference.max() <= 1 and (difference > 0).mean() < 0.01, (difference.max(), (difference > 0).mean())


def test_roboarenas_encoded_cameras_compose_the_same_and_are_checked_as_composed():
    """PNG cameras decode, then compose as the arrays do; the size check counts RoboArena's frame, not three
    frames side by side (1.5 × 320 rows high, 320 wide: fits a 400-pixel side where side by side would not)."""
    import io

    from PIL import Image

    from policy_server.sessions.openpi_observation import openpi_decode

    obs = roboarena(np.random.default_rng(8), wrist_shape=(200, 320), exterior_shape=(200, 320))

    def png(frame: np.ndarray) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, "PNG")
        return buffer.getvalue()

    raw = parse_openpi_observation(obs, MAPPING, "concat_view", LIMITS)
    encoded_obs = {key: png(value) if "image" in key else value for key, value in obs.items()}
    narrow = FrameLimits(min_image_side=32, max_image_side=400, max_clip_frames=65)
    parsed = parse_openpi_observation(encoded_obs, MAPPING, "concat_view", narrow)
    decode = openpi_decode(parsed, False, narrow, seq=0)
    assert decode is not None
    assert np.array_equal(decode().image, raw.image)


def test_a_client_composed_image_wins_over_the_roboarena_cameras():
    """As on NVIDIA's server: ``observation/image`` (RoboLab composes its own) is used when it is sent."""
    obs = {**roboarena(np.random.default_rng(9)), "observation/image": image(120, 160, 99)}
    parsed = parse_openpi_observation(obs, MAPPING, "concat_view", LIMITS)
    assert parsed.cameras == ("observation/image",) and np.all(parsed.image == 99)


def test_operator_mapping_overrides_a_view_point(tmp_path):
    path = tmp_path / "cameras.json"
    path.write_text(
        json.dumps({"ego_view": ["images/cam_low"], "concat_view": [["images/cam_low", "images/cam_high"]]})
    )
    mapping = CameraMapping.load(str(path))
    assert parse_openpi_observation(ALOHA, mapping, "ego_view", LIMITS).cameras == ("images/cam_low",)
    both = parse_openpi_observation(ALOHA, mapping, "concat_view", LIMITS)
    assert int(both.image[0, 0, 0]) == 60 and int(both.image[0, 224, 0]) == 50
    # untouched view points keep the defaults; inline JSON works as well as a file
    assert mapping.alternatives("wrist_view") == MAPPING.alternatives("wrist_view")
    assert CameraMapping.load('{"wrist_view": "observation/wrist_image"}').alternatives("wrist_view") == (
        ("observation/wrist_image",),
    )

    with pytest.raises(CameraMappingError, match="unknown view point 'side_view'"):
        CameraMapping.load('{"side_view": ["image"]}')
    with pytest.raises(CameraMappingError, match="cannot read the camera mapping"):
        CameraMapping.load(str(tmp_path / "missing.json"))


def test_float_images_in_unit_range_are_accepted_and_bad_ones_are_named():
    obs = dict(LIBERO, **{"observation/image": np.full((64, 64, 3), 0.5, np.float32)})
    assert int(parse_openpi_observation(obs, MAPPING, "third_person_view", LIMITS).image[0, 0, 0]) == 128

    cases = [
        ({"observation/image": np.full((64, 64, 3), 7.5, np.float32)}, ErrorCode.INVALID_IMAGE, "observation/image"),
        ({"observation/image": np.zeros((64, 64), np.uint8)}, ErrorCode.INVALID_IMAGE, "observation/image"),
        ({"observation/image": np.zeros((8, 8, 3), np.uint8)}, ErrorCode.INVALID_IMAGE, "observation/image"),
        ({"observation/state": np.zeros(8)}, ErrorCode.MISSING_FIELD, "observation/image"),
        ({"observation/image": image(64, 64, 1), "prompt": 3}, ErrorCode.INVALID_FIELD, "prompt"),
    ]
    for obs, code, field in cases:
        with pytest.raises(ProtocolError) as info:
            parse_openpi_observation(obs, MAPPING, "third_person_view", LIMITS)
        assert (info.value.code, info.value.field) == (code, field), info.value.message
    with pytest.raises(ProtocolError, match="got keys observation/state"):
        parse_openpi_observation({"observation/state": np.zeros(8)}, MAPPING, "third_person_view", LIMITS)


def test_clips_for_inverse_dynamics_and_prefix_actions():
    clip = np.zeros((9, 3, 64, 64), np.uint8)  # T x C x H x W
    parsed = parse_openpi_observation(
        {"observation/image": clip, "prefix_actions": np.ones((3, 10))},
        MAPPING,
        "third_person_view",
        LIMITS,
        video=True,
    )
    assert parsed.video.shape == (9, 64, 64, 3) and parsed.image is None
    assert parsed.prefix_actions.dtype == np.float32 and parsed.prefix_actions.shape == (3, 10)


@pytest.mark.parametrize(
    "obs, chosen",
    [
        (
            LIBERO,
            {
                "third_person_view": ("observation/image",),
                "ego_view": ("observation/image",),
                "wrist_view": ("observation/wrist_image",),
                "concat_view": ("observation/image", "observation/wrist_image"),
            },
        ),
        (
            DROID,
            {
                "third_person_view": ("observation/exterior_image_1_left",),
                "ego_view": ("observation/exterior_image_1_left",),
                "wrist_view": ("observation/wrist_image_left",),
                "concat_view": ("observation/exterior_image_1_left", "observation/wrist_image_left"),
            },
        ),
        (
            ALOHA,
            {
                "third_person_view": ("images/cam_high",),
                "ego_view": ("images/cam_high",),
                "wrist_view": ("images/cam_left_wrist",),
                "concat_view": ("images/cam_high", "images/cam_left_wrist", "images/cam_right_wrist"),
            },
        ),
    ],
)
def test_every_key_of_the_conventions_is_known(obs, chosen):
    """Real openpi clients send state keys and cameras the view point does not use: all accepted, and the
    mapping picks the camera of each view point (the frame fed is that camera's, by its fill value)."""
    fill = {"observation/image": 10, "observation/wrist_image": 20, "observation/exterior_image_1_left": 30}
    fill |= {"observation/wrist_image_left": 40, "images/cam_high": 50, "images/cam_left_wrist": 70}
    for view, cameras in chosen.items():
        parsed = parse_openpi_observation(obs, MAPPING, view, LIMITS)
        assert parsed.cameras == cameras, view
        if len(cameras) == 1:
            assert np.all(parsed.image == fill[cameras[0]]), view


@pytest.mark.parametrize(
    "extra, field, hint",
    [
        ({"observation/imagee": image(64, 64, 1)}, "observation/imagee", "unknown observation key"),
        ({"images": {"cam_top": np.zeros((3, 64, 64), np.uint8)}}, "images/cam_top", "unknown observation key"),
        ({"domain_name": "droid_lerobot"}, "domain_name", "--openpi-*"),
        ({"action_horizon": 8}, "action_horizon", "native protocol"),
    ],
)
def test_a_key_the_server_would_ignore_is_refused_naming_it(extra, field, hint):
    with pytest.raises(ProtocolError) as info:
        parse_openpi_observation({**LIBERO, **extra}, MAPPING, "third_person_view", LIMITS)
    assert (info.value.code, info.value.field) == (ErrorCode.INVALID_FIELD, field)
    assert hint in info.value.message


def test_keys_may_be_bytes_and_maps_nest_only_so_deep():
    parsed = parse_openpi_observation(
        {b"observation/image": image(64, 64, 9), b"prompt": "go"}, MAPPING, "third_person_view", LIMITS
    )
    assert parsed.prompt == "go" and np.all(parsed.image == 9)
    deep: dict = {"x": 1}
    for _ in range(6):
        deep = {"images": deep}
    with pytest.raises(ProtocolError) as info:
        parse_openpi_observation({**LIBERO, "nested": deep}, MAPPING, "third_person_view", LIMITS)
    assert info.value.code == ErrorCode.INVALID_FIELD
