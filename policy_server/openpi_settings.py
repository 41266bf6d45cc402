"""openpi as the operator sets it up: the clients' conventions the server knows (their camera and state keys),
which cameras feed the model (:class:`CameraMapping`, ``--openpi-cameras``), and the ``--openpi-*`` settings
that say what openpi clients cannot say for themselves (:class:`OpenpiSettings`).

A :class:`CameraMapping` holds, for each view point, a list of alternatives tried in order; an alternative
is one camera key, or a list of keys composed side by side (RoboArena's three DROID cameras,
:data:`ROBOARENA_CAMERAS`, as NVIDIA's cosmos-framework server lays them out). The first alternative whose
cameras are all present wins, so one mapping serves every convention. An operator overrides entries with a
JSON file or string (``{"third_person_view": ["images/cam_low"]}``). Reading an observation by them is
``sessions/openpi_observation.py``'s; the server's settings hold these (``ServerSettings.openpi``), outside
``sessions/`` so that the settings and the metadata read them without loading a session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.profiles import VIEW_POINTS
from robot_clients.client_frames import (
    ACTION_HORIZON,
    ACTION_MODE,
    DOMAIN_NAME,
    PROMPT,
    RESOLUTION_TIER,
    SEED,
    VIEW_POINT,
    checked_settings,
    setting_names,
)

from .foundation.camera_intake import Alternative, camera_alternatives
from .foundation.mapping_files import load_mapping
from .session_config import SessionConfig, fixed_session_config

# The conventions in use, for detection (logs, metadata) and for the docs; the mapping does the work.
CONVENTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "libero": {
        "cameras": ("observation/image", "observation/wrist_image"),
        "state": ("observation/state",),
    },
    # RoboArena's DROID (NVIDIA's cosmos-framework server, strands-robots): DROID's with a second exterior camera.
    "roboarena": {
        "cameras": (
            "observation/exterior_image_2_left",
            "observation/wrist_image_left",
            "observation/exterior_image_1_left",
        ),
        "state": ("observation/joint_position", "observation/gripper_position"),
    },
    "droid": {
        "cameras": ("observation/exterior_image_1_left", "observation/wrist_image_left"),
        "state": ("observation/joint_position", "observation/gripper_position"),
    },
    "aloha": {
        "cameras": ("images/cam_high", "images/cam_low", "images/cam_left_wrist", "images/cam_right_wrist"),
        "state": ("state",),
    },
}

# The three cameras composed as cosmos-framework's DROID server composes them (wrist on top, the exteriors
# at half size below it), in the order wrist_over_exteriors takes them.
ROBOARENA_CAMERAS: Alternative = (
    "observation/wrist_image_left",
    "observation/exterior_image_1_left",
    "observation/exterior_image_2_left",
)

DEFAULT_VIEWS: dict[str, tuple[Alternative, ...]] = {
    "third_person_view": (
        ("observation/image",),
        ("observation/exterior_image_1_left",),
        ("images/cam_high",),
        ("image",),
    ),
    "ego_view": (
        ("images/cam_high",),
        ("observation/image",),
        ("observation/exterior_image_1_left",),
        ("image",),
    ),
    "wrist_view": (
        ("observation/wrist_image",),
        ("observation/wrist_image_left",),
        ("images/cam_left_wrist",),
        ("images/cam_right_wrist",),
    ),
    "concat_view": (
        ("observation/image", "observation/wrist_image"),
        ("observation/image",),  # a frame the client composed itself wins, as on NVIDIA's server (RoboLab's)
        ROBOARENA_CAMERAS,
        ("observation/exterior_image_1_left", "observation/wrist_image_left"),
        ("images/cam_high", "images/cam_left_wrist", "images/cam_right_wrist"),
        ("observation/exterior_image_1_left",),
        ("images/cam_high",),
        ("image",),
    ),
}

DROID_JOINTS, DROID_GRIPPER = CONVENTIONS["droid"]["state"]
STATE_KEYS = (CONVENTIONS["libero"]["state"][0], CONVENTIONS["aloha"]["state"][0])
JOINT_STATE_KEYS = (DROID_JOINTS, DROID_GRIPPER, *STATE_KEYS)
# The midtrain action space's state, as NVIDIA's reference server reads it.
EEF_POSITION, EEF_QUATERNION = "observation/eef_pos", "observation/eef_quat"
POSE_STATE_KEYS = (EEF_POSITION, EEF_QUATERNION, DROID_GRIPPER)
ALL_STATE_KEYS = (*JOINT_STATE_KEYS, EEF_POSITION, EEF_QUATERNION)


class CameraMappingError(ValueError):
    """A camera mapping file or string is malformed; the message says where."""


@dataclass(frozen=True)
class CameraMapping:
    """For each view point, the camera alternatives tried in order (see the module docstring)."""

    views: dict[str, tuple[Alternative, ...]] = field(default_factory=lambda: dict(DEFAULT_VIEWS))

    @classmethod
    def load(cls, source: str | Path | None) -> CameraMapping:
        """The default mapping with ``source``'s entries replacing whole view points.

        ``source`` is a path to a JSON file, or the JSON text itself (it starts with ``{``).
        """
        if source is None:
            return cls()
        data, where = load_mapping(source, "the camera mapping", CameraMappingError)
        views = dict(DEFAULT_VIEWS)
        for view_point, entry in data.items():
            if view_point not in VIEW_POINTS:
                raise CameraMappingError(
                    f"{where}: unknown view point {view_point!r}; expected one of {', '.join(VIEW_POINTS)}"
                )
            views[view_point] = camera_alternatives(entry, f"{where}: {view_point}", CameraMappingError)
        return cls(views)

    def alternatives(self, view_point: str) -> tuple[Alternative, ...]:
        return self.views.get(view_point, ())

    def describe(self) -> dict[str, list[list[str]]]:
        return {view: [list(alt) for alt in alts] for view, alts in self.views.items()}

    def camera_keys(self) -> set[str]:
        """Every camera key this mapping or a known convention names (used by some view point)."""
        keys = {key for alts in self.views.values() for alt in alts for key in alt}
        return keys | {key for convention in CONVENTIONS.values() for key in convention["cameras"]}


# The request settings the server's --openpi-* flags set for every openpi session (openpi clients cannot send
# settings themselves): what the policy is asked, never the sampler's settings (the domain's are used).
OPENPI_SETTINGS = setting_names(ACTION_MODE, DOMAIN_NAME, ACTION_HORIZON, PROMPT, RESOLUTION_TIER, VIEW_POINT, SEED)


@dataclass(frozen=True)
class OpenpiSettings:
    """What openpi clients cannot say for themselves."""

    # The request settings of every openpi session, by name: those of OPENPI_SETTINGS (the --openpi-* flags).
    # Unset ones take the model's default domain, `policy`, and the domain's defaults.
    requested: Mapping[str, Any] = field(default_factory=dict)
    cameras: CameraMapping = field(default_factory=CameraMapping)
    # A state sent to a domain that does not condition on it: refused (True), or accepted and counted unused.
    strict_state: bool = False
    # Every reply also carries the video the model predicted, uint8 [T, H, W, 3] (cosmos-framework's
    # --decode-video): a VAE decode per chunk and T×H×W×3 bytes per reply, so off unless the operator asks.
    decode_video: bool = False

    def __post_init__(self) -> None:
        # Typed and normalized by the table here, so that a bad value fails where it was written.
        object.__setattr__(self, "requested", checked_settings(self.requested, OPENPI_SETTINGS, "openpi"))

    def session_config(self, description: ModelDescription) -> SessionConfig:
        """Resolve against the loaded model; raises :class:`ProtocolError` naming a bad setting."""
        return fixed_session_config({"action_mode": "policy", **self.requested}, description)
