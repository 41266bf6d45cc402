"""openpi observations: which cameras feed the model and how several become one frame, by the conventions and
the camera mapping of :mod:`policy_server.openpi_settings` (with the ``--openpi-*`` settings that say what
openpi clients cannot say for themselves).

openpi clients send a flat (or, for ALOHA, nested) dict per observation, with key names set by their
benchmark's convention, and never say which camera is which view. This module knows the conventions in
use and turns one such dict into what the Cosmos3 engine takes: one H×W×3 uint8 frame (or a T×H×W×3
clip for inverse dynamics), the prompt, and optional real-time-chunking prefix actions.

Conventions (keys as the clients send them)::

    LIBERO  observation/image, observation/wrist_image (H×W×3), observation/state, prompt
    DROID   observation/exterior_image_1_left, observation/wrist_image_left (H×W×3),
            observation/joint_position, observation/gripper_position, prompt
    RoboArena  DROID's, plus observation/exterior_image_2_left (the second exterior camera)
    ALOHA   images/{cam_high, cam_low, cam_left_wrist, cam_right_wrist} (nested, 3×H×W), state, prompt

Every key is honoured or refused (:func:`check_keys`): a camera the mapping or a convention knows (the
view point uses some of them; the others are read by other view points), ``prompt``, ``prefix_actions``
and the conventions' state keys. Anything else is refused with ``invalid_field`` naming it (a native
session setting such as ``domain_name`` with a word on where it goes instead).

The state keys become the request's proprio state (:func:`openpi_state`): LIBERO's ``observation/state``
and ALOHA's ``state`` as sent; DROID's ``observation/joint_position`` (7, or rows of 7) and
``observation/gripper_position`` (1, or one per row) as one row ``[joints..., gripper]`` per step, the
gripper as the robot reports it (the domain's profile says which index the model sees flipped, and the
engine flips it, both ways). A domain in the ``midtrain`` action space reads, as NVIDIA's reference server
does, the end-effector pose instead: ``observation/eef_pos`` (3, or rows of 3), ``observation/eef_quat``
(4, xyzw) and ``observation/gripper_position``, one row ``[x, y, z, qx, qy, qz, qw, gripper]`` per step;
the other family's keys, if sent too, are accepted and not used. A domain whose profile has a
``state_dim`` needs them. Any other accepts and
does not use them (every LIBERO, DROID and ALOHA client sends its state, and openpi's own servers take it
whether the policy uses it or not): :attr:`OpenpiObservation.unused_state` names them, so that the session
can say so; ``strict_state`` (``--openpi-strict-state``) refuses them instead.

Which cameras are used comes from a :class:`~policy_server.openpi_settings.CameraMapping`: for each view
point, a list of alternatives tried in order; an alternative is one camera key, or a list of keys composed
side by side (left to right, each resized to the first one's height; RoboArena's three DROID cameras, as
the alternative :data:`~policy_server.openpi_settings.ROBOARENA_CAMERAS`, are laid out as NVIDIA's
cosmos-framework server lays them out instead: the wrist camera on top, the two exteriors at half size side
by side below, :func:`~policy_server.foundation.camera_intake.wrist_over_exteriors`). The first alternative whose
cameras are all present wins, so one mapping serves every convention. The session's view point (the
``--openpi-view-point`` flag, else the domain's profile) picks the list. A key is looked up as written first
(openpi's flat keys contain ``/``), then as a path into nested dicts.

Images may arrive H×W×3 or 3×H×W (channel-first, ALOHA's layout), as uint8, or as floats in [0, 1], or
encoded: PNG, JPEG or WebP bytes in place of the array (a list of them for a clip), decoded by the
session off the event loop before the cameras are composed.
Pure data: no sockets, no model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosmos3_runtime.poses import MIN_QUATERNION_NORM
from cosmos3_runtime.profiles import PolicyProfile
from robot_clients.client_frames import (
    SESSION_SETTINGS,
    check_image_size,
    is_encoded_clip,
    is_encoded_frame,
    parse_state,
    str_keys,
)
from robot_clients.protocol import ErrorCode, FrameLimits, ProtocolError

from ..foundation.camera_intake import (
    Alternative,
    check_cameras,
    decoded_image,
    side_by_side,
    wrist_over_exteriors,
)
from ..openpi_settings import (
    ALL_STATE_KEYS,
    CONVENTIONS,
    DROID_GRIPPER,
    DROID_JOINTS,
    EEF_POSITION,
    EEF_QUATERNION,
    JOINT_STATE_KEYS,
    POSE_STATE_KEYS,
    ROBOARENA_CAMERAS,
    CameraMapping,
)
from ..session_config import check_state

# Keys of an observation besides cameras and state: read by the server for this observation.
OBSERVATION_KEYS = ("prompt", "prefix_actions")


@dataclass
class OpenpiObservation:
    """What the engine takes from one openpi observation."""

    image: np.ndarray | None = None
    video: np.ndarray | None = None
    prompt: str | None = None
    prefix_actions: np.ndarray | None = None
    state: np.ndarray | None = None  # float32 [D] or [rows, D], from the convention's state keys
    # The state keys sent to a domain that does not condition on state: accepted, not used.
    unused_state: tuple[str, ...] = ()
    cameras: Alternative = ()  # the keys whose images were used, left to right
    # The chosen cameras as sent when one of them is encoded (bytes, or a list of bytes for a clip): the
    # server decodes them off the event loop, then composes them (:func:`compose_cameras`).
    encoded: list[Any] | None = None


def lookup(obs: Mapping[str, Any], key: str) -> Any:
    """``obs[key]`` if present as written, else the nested path ``key.split("/")``; None if absent."""
    if key in obs:
        return obs[key]
    node: Any = obs
    for part in key.split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def detect_convention(obs: Mapping[str, Any]) -> str | None:
    """``libero``, ``droid`` or ``aloha`` when the observation has that convention's first camera."""
    for name, convention in CONVENTIONS.items():
        if lookup(obs, convention["cameras"][0]) is not None:
            return name
    return None


def parse_openpi_observation(
    obs: Any,
    mapping: CameraMapping,
    view_point: str,
    limits: FrameLimits,
    *,
    video: bool = False,
    domain: PolicyProfile | None = None,
    strict_state: bool = False,
) -> OpenpiObservation:
    """Pick and compose the cameras for ``view_point``; raise :class:`ProtocolError` naming the key.

    ``video``: the session serves inverse dynamics, so cameras carry T×H×W×3 clips, composed frame by
    frame. ``domain``: the session's domain, whose profile the state is checked against (its width, its
    rows, whether it takes one at all), so that an error names the openpi key the state came from.
    ``strict_state``: a state sent to a domain without a ``state_dim`` is refused, not set aside unused.
    """
    if not isinstance(obs, Mapping):
        raise ProtocolError(ErrorCode.BAD_FRAME, f"an observation must be a msgpack map, got {type(obs).__name__}")
    obs = _decoded_keys(obs)
    check_keys(obs, mapping)
    alternatives = mapping.alternatives(view_point)
    chosen = next((alt for alt in alternatives if all(lookup(obs, key) is not None for key in alt)), None)
    if chosen is None:
        wanted = " or ".join("+".join(alt) for alt in alternatives) or "(none configured)"
        raise ProtocolError(
            ErrorCode.MISSING_FIELD,
            f"no camera for the {view_point} view: expected {wanted}; got keys {', '.join(_keys(obs))}",
            alternatives[0][0] if alternatives else None,
        )
    frames = [_frames(lookup(obs, key), key, video, limits) for key in chosen]
    result = OpenpiObservation(cameras=chosen)
    arrays = [frame for frame in frames if isinstance(frame, np.ndarray)]
    if len(arrays) < len(frames):
        result.encoded = frames
    else:
        compose_cameras(result, arrays, video, limits)

    prompt = obs.get("prompt")
    if isinstance(prompt, bytes):
        prompt = prompt.decode("utf-8", errors="replace")
    if prompt is not None and not isinstance(prompt, str):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, f"`prompt` must be a string, got {type(prompt).__name__}", "prompt"
        )
    result.prompt = prompt

    prefix = obs.get("prefix_actions")
    if prefix is not None:
        if not isinstance(prefix, np.ndarray) or prefix.ndim != 2 or prefix.dtype.kind not in "fiu":
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                "`prefix_actions` must be a K×D numeric array (the actions still to execute)",
                "prefix_actions",
            )
        result.prefix_actions = prefix.astype(np.float32)

    space = domain.action_space if domain is not None else "joint_pos"
    result.state, state_key, shown = openpi_state(obs, space)
    unread = tuple(key for key in unread_state_keys(space) if lookup(obs, key) is not None)
    if unread and domain is not None and domain.state_dim is not None:
        if strict_state:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"domain {domain.domain_name!r} acts in {space} and does not read `{unread[0]}` "
                "(--openpi-strict-state refuses state it would not use; docs/openpi.md)",
                unread[0],
            )
        result.unused_state = unread
    if domain is not None and domain.state_dim is None and result.state is not None and not strict_state:
        result.unused_state = tuple(key for key in ALL_STATE_KEYS if lookup(obs, key) is not None)
        result.state = None
    elif domain is not None:
        if state_key is None:  # missing: name the keys this observation's convention sends it in
            keys = CONVENTIONS.get(detect_convention(obs) or "", {}).get("state", ("state",))
            keys = POSE_STATE_KEYS if space == "midtrain" else keys
            state_key, shown = keys[0], " + ".join(f"`{key}`" for key in keys)
        check_state(result.state, domain, None, state_key, shown)
    return result


def unread_state_keys(action_space: str) -> tuple[str, ...]:
    """The state keys a domain of ``action_space`` does not read: the other family's."""
    read = POSE_STATE_KEYS if action_space == "midtrain" else JOINT_STATE_KEYS
    return tuple(key for key in ALL_STATE_KEYS if key not in read)


def openpi_state(
    obs: Mapping[str, Any], action_space: str = "joint_pos"
) -> tuple[np.ndarray | None, str | None, str | None]:
    """The observation's proprio state, the key it is named by in errors, and how messages call it.

    DROID's joints and gripper become one ``[joints..., gripper]`` row per step: ``[8]``, or ``[T, 8]``
    for T rows of joints with one gripper value per row. For a ``midtrain`` domain the pose keys are read
    instead (:func:`openpi_pose_state`).
    """
    if action_space == "midtrain":
        return openpi_pose_state(obs)
    sent = [key for key in JOINT_STATE_KEYS if lookup(obs, key) is not None]
    if not sent:
        return None, None, None
    droid = [key for key in sent if key in (DROID_JOINTS, DROID_GRIPPER)]
    if droid and len(droid) != len(sent) or len(sent) > (2 if droid else 1):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, f"one robot state per observation: got {', '.join(sent)}", sent[-1]
        )
    if not droid:
        return parse_state(lookup(obs, sent[0]), sent[0]), sent[0], None
    shown = f"the state built from `{DROID_JOINTS}` + `{DROID_GRIPPER}`"
    for key in (DROID_JOINTS, DROID_GRIPPER):
        if lookup(obs, key) is None:
            raise ProtocolError(
                ErrorCode.MISSING_FIELD,
                f"DROID's state is `{DROID_JOINTS}` with `{DROID_GRIPPER}`: `{key}` is missing",
                key,
            )
    joints = parse_state(lookup(obs, DROID_JOINTS), DROID_JOINTS)
    gripper = _gripper_column(obs)
    rows = 1 if joints.ndim == 1 else joints.shape[0]
    if gripper.shape[0] != rows:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{DROID_GRIPPER}` has {gripper.shape[0]} value(s) for "
            f"{rows} row(s) of `{DROID_JOINTS}`: send one gripper value per row",
            DROID_GRIPPER,
        )
    state = np.concatenate([joints.reshape(rows, -1), gripper], axis=1)
    return (state[0] if joints.ndim == 1 else state), DROID_JOINTS, shown


def openpi_pose_state(obs: Mapping[str, Any]) -> tuple[np.ndarray | None, str | None, str | None]:
    """A midtrain domain's state: ``[x, y, z, qx, qy, qz, qw, gripper]``, ``[8]`` or ``[T, 8]``, from
    ``observation/eef_pos`` (3 or T x 3), ``observation/eef_quat`` (4 or T x 4, xyzw, any nonzero norm: the
    engine normalizes it, as SciPy does for the reference) and ``observation/gripper_position``."""
    if not any(lookup(obs, key) is not None for key in POSE_STATE_KEYS):
        return None, None, None
    shown = f"the pose built from `{EEF_POSITION}` + `{EEF_QUATERNION}` + `{DROID_GRIPPER}`"
    for key in POSE_STATE_KEYS:
        if lookup(obs, key) is None:
            raise ProtocolError(
                ErrorCode.MISSING_FIELD,
                f"a midtrain domain's state is `{EEF_POSITION}`, `{EEF_QUATERNION}` (xyzw) and `{DROID_GRIPPER}`: "
                f"`{key}` is missing",
                key,
            )
    parts = []
    for key, width in ((EEF_POSITION, 3), (EEF_QUATERNION, 4)):
        value = parse_state(lookup(obs, key), key)
        if value.shape[-1] != width:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"`{key}` must be [{width}] or [T, {width}], got {list(value.shape)}", key
            )
        parts.append(value.reshape(-1, width))
    position, quaternion = parts
    gripper = _gripper_column(obs)
    if not position.shape[0] == quaternion.shape[0] == gripper.shape[0]:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{EEF_POSITION}`, `{EEF_QUATERNION}` and `{DROID_GRIPPER}` have {position.shape[0]}, "
            f"{quaternion.shape[0]} and {gripper.shape[0]} row(s): send one of each per step",
            EEF_QUATERNION,
        )
    if np.any(np.linalg.norm(quaternion, axis=1) < MIN_QUATERNION_NORM):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{EEF_QUATERNION}` has a quaternion of norm below {MIN_QUATERNION_NORM:g}: it names no rotation",
            EEF_QUATERNION,
        )
    state = np.concatenate([position, quaternion, gripper], axis=1)
    single = lookup(obs, EEF_POSITION)
    return (state[0] if np.ndim(single) == 1 else state), EEF_POSITION, shown


def _gripper_column(obs: Mapping[str, Any]) -> np.ndarray:
    """``observation/gripper_position`` as one value per row: a scalar, ``[T]`` or ``[T, 1]``."""
    gripper_value = lookup(obs, DROID_GRIPPER)
    if isinstance(gripper_value, (int, float, np.generic)) and not isinstance(gripper_value, bool):
        gripper_value = np.asarray([gripper_value])  # a scalar reading is one value
    return parse_state(gripper_value, DROID_GRIPPER).reshape(-1, 1)


def compose_cameras(result: OpenpiObservation, frames: list[np.ndarray], video: bool, limits: FrameLimits) -> None:
    """The chosen cameras' pixels side by side (left to right), or RoboArena's three as cosmos-framework lays
    them out, as the observation's image or clip."""
    if result.cameras == ROBOARENA_CAMERAS:
        composed = wrist_over_exteriors(frames)
    else:
        composed = side_by_side(frames) if len(frames) > 1 else frames[0]
    if video:
        result.video = composed
    else:
        result.image = composed
    check_image_size(composed, "+".join(result.cameras), limits)


# Conventions nest at most one level (ALOHA's images/cam_high); deeper maps are nobody's observation.
MAX_NESTING = 4


def openpi_decode(
    obs: OpenpiObservation, video: bool, limits: FrameLimits, seq: int, fit_side: int | None = None
) -> Callable[[], Any] | None:
    """Check an openpi observation's chosen cameras now (composed side by side, before anything is
    decoded); the decoding (then the composition) to run on the pool (None: composed already)."""
    if obs.encoded is None:
        return None
    encoded = obs.encoded
    roboarena = obs.cameras == ROBOARENA_CAMERAS
    cameras = list(zip(obs.cameras, encoded))
    check_cameras(cameras, limits, seq, side_by_side=not roboarena, over_exteriors=roboarena, fit_side=fit_side)

    def decode() -> OpenpiObservation:
        frames = [decoded_image(value, key, limits, seq, fit_side) for key, value in zip(obs.cameras, encoded)]
        compose_cameras(obs, frames, video, limits)
        obs.encoded = None
        return obs

    return decode


def _decoded_keys(obs: Any, where: str | None = None, depth: int = 0) -> Any:
    """Maps with ``bytes`` keys decoded, at every level: the wire codec lets a sender write keys either way."""
    if not isinstance(obs, dict):
        return obs
    if depth >= MAX_NESTING:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"`{where}` nests maps more than {MAX_NESTING} deep", where)
    return {
        key: _decoded_keys(value, f"{where}/{key}" if where else key, depth + 1)
        for key, value in str_keys(obs, where).items()
    }


def check_keys(obs: Mapping[Any, Any], mapping: CameraMapping) -> None:
    """Refuse a key the server would otherwise accept and ignore (``invalid_field`` naming it)."""
    state = {key for convention in CONVENTIONS.values() for key in convention["state"]} | set(ALL_STATE_KEYS)
    known = mapping.camera_keys() | state | set(OBSERVATION_KEYS)
    for key in _keys(obs):
        if key in known or any(key.startswith(k + "/") for k in known):
            continue  # a camera (or its array map, for a nested convention), the state, the prompt
        top = key.split("/", 1)[0]
        if key in SESSION_SETTINGS or top in SESSION_SETTINGS:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`{key}` cannot be set per observation on the openpi endpoint: its sessions take their settings "
                "from the server's --openpi-* flags; send per-observation settings over the native protocol "
                "(/v1/actions/realtime)",
                key,
            )
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"unknown observation key `{key}`: this endpoint reads cameras "
            f"({', '.join(sorted(mapping.camera_keys()))}), state ({', '.join(sorted(state))}), `prompt` and "
            "`prefix_actions` (docs/openpi.md)",
            key,
        )


def _keys(obs: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in obs.items():
        name = f"{prefix}{key}"
        keys.extend(_keys(value, name + "/") if isinstance(value, Mapping) else [name])
    return keys


def _frames(array: Any, key: str, video: bool, limits: FrameLimits) -> np.ndarray | bytes | list[bytes]:
    """One camera's image as H×W×3 uint8 (or clip as T×H×W×3), from HWC or CHW, uint8 or [0, 1] floats;
    an encoded image (clip) stays bytes (a list of bytes)."""
    rank = 4 if video else 3
    layout = "T×H×W×3 (or T×3×H×W)" if video else "H×W×3 (or 3×H×W)"
    if is_encoded_frame(array) if not video else is_encoded_clip(array):
        # PNG/JPEG/WebP bytes (a list of them for a clip): the server checks each header, then decodes.
        return bytes(array) if not video else [bytes(frame) for frame in array]
    if not isinstance(array, np.ndarray):
        encoded = "a list of PNG/JPEG/WebP bytes" if video else "PNG/JPEG/WebP bytes"
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{key}` must be an array ({layout}) or {encoded}, got {type(array).__name__}",
            key,
        )
    if array.ndim != rank:
        raise ProtocolError(ErrorCode.INVALID_IMAGE, f"`{key}` must be {layout}, got shape {list(array.shape)}", key)
    if array.shape[-1] != 3:
        if array.shape[-3] != 3:
            raise ProtocolError(
                ErrorCode.INVALID_IMAGE, f"`{key}` must be {layout} RGB, got shape {list(array.shape)}", key
            )
        array = np.moveaxis(array, -3, -1)  # channel-first (ALOHA) to channel-last
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if array.dtype.kind == "f":
        if not np.isfinite(array).all() or array.min() < 0.0 or array.max() > 1.0:
            raise ProtocolError(
                ErrorCode.INVALID_IMAGE, f"`{key}` is a float image: its values must be in [0, 1] (or send uint8)", key
            )
        return np.ascontiguousarray(np.round(array * 255.0).astype(np.uint8))
    raise ProtocolError(ErrorCode.INVALID_IMAGE, f"`{key}` must be uint8 (or float in [0, 1]), got {array.dtype}", key)
