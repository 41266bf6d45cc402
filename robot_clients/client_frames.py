"""What a client frame of the native protocol may contain, and the typed frames it is parsed into.

:func:`parse_client_frame` turns one decoded frame into a typed dataclass, or raises :class:`ProtocolError`
with a stable code and the offending field. :data:`REQUEST_SETTINGS` declares the request settings once:
their names and types, which every other form of them is checked against, and where a native frame may
carry each. The field checks (cameras, state, prefix actions) serve every protocol, so all of them refuse
the same things in the same words. Numpy only, so a robot can check its frames before sending.
``docs/protocol.md`` is the user-facing description.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np

from .protocol import (
    CANCEL,
    CLIENT_FRAME_TYPES,
    CONFIGURE,
    MAX_SESSION_ID_CHARS,
    OBSERVATION,
    RESET,
    SESSION_ID,
    ErrorCode,
    FrameLimits,
    ProtocolError,
)

# ---------------------------------------------------------------------------------------------------
# Any field: its type, its map's keys
# ---------------------------------------------------------------------------------------------------


def _type_name(types: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def check_field_type(frame: Mapping[str, Any], name: str, types: tuple[type, ...], seq: int | None = None) -> Any:
    """``frame[name]`` if it is one of ``types`` (a finite one, for a number), else ``invalid_field``."""
    value = frame[name]
    # bool is an int subclass in Python; a `true` is never a valid count, seed or tier.
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if isinstance(value, (np.integer, np.floating)) and (int in types or float in types):
        value = value.item()  # numpy scalars (a sender's np.int64 seed) are accepted as numbers
        ok = isinstance(value, types)
    if not ok:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{name}` must be {_type_name(types)}, got {type(value).__name__}",
            name,
            seq,
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"`{name}` must be finite, got {value}", name, seq)
    return value


def str_keys(frame: dict[Any, Any], where: str | None, seq: int | None = None) -> dict[str, Any]:
    """The map with ``bytes`` keys decoded: the wire codec lets a sender write keys either way."""
    if all(isinstance(key, str) for key in frame):
        return frame
    decoded: dict[str, Any] = {}
    for key, value in frame.items():
        name = key.decode("utf-8", errors="backslashreplace") if isinstance(key, bytes) else str(key)
        if name in decoded:
            inside = f" in `{where}`" if where else ""
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`{name}` is sent twice{inside} (once as bytes)",
                f"{where}/{name}" if where else name,
                seq,
            )
        decoded[name] = value
    return decoded


# ---------------------------------------------------------------------------------------------------
# The session settings a frame may carry
# ---------------------------------------------------------------------------------------------------


class SettingChannel(str, enum.Enum):
    """Where a client of the native protocol may send a request setting."""

    CONFIGURE = "configure"  # a `configure` frame: for every later observation of the session
    OBSERVATION = "observation"  # an `observation`: for that observation only


_CONFIGURE_AND_OBSERVATION = frozenset(SettingChannel)


def _lower_mode(value: Any) -> Any:
    return value.strip().lower()  # " Policy" is what a person typing a config file means by "policy"


@dataclass(frozen=True)
class RequestSetting:
    """One setting of an action request: its name, what values it takes, where a client may send it."""

    name: str
    types: tuple[type, ...]  # the Python types a frame's value may have (a float setting takes ints too)
    doc: str
    channels: frozenset[SettingChannel] = _CONFIGURE_AND_OBSERVATION
    # Other names the native protocol accepts for it (diffusers calls the step count num_inference_steps).
    aliases: tuple[str, ...] = ()
    # Why an observation may not carry it (None: an observation may).
    not_per_observation: str | None = None
    # Whether each recorded row keeps the value the engine used (the server's recordings), and whether an
    # action chunk reports it (ActionChunk).
    recorded: bool = True
    in_chunk: bool = True
    normalize: Callable[[Any], Any] | None = None
    # Its name on command lines (``--domain`` for ``domain_name``); empty: the name, dashed.
    flag: str = ""

    @property
    def option(self) -> str:
        """The command-line name: ``domain`` for ``domain_name``, ``view-point`` for ``view_point``."""
        return self.flag or self.name.replace("_", "-")

    def parse_text(self, text: str) -> Any:
        """A command line's ``text`` as this setting's value (argparse's ``type``)."""
        value = self.types[0](text)
        return self.normalize(value) if self.normalize is not None else value

    def check(self, frame: Mapping[str, Any], key: str, seq: int | None) -> Any:
        """``frame[key]`` (the setting under its name or an alias) type-checked and normalized."""
        value = check_field_type(frame, key, self.types, seq)
        if float in self.types:
            return float(value)
        return self.normalize(value) if self.normalize is not None else value


# The request settings, declared once, each by its own name so that a list of some of them is checked by
# mypy rather than spelled in strings. Every other form of them is checked against this table
# (tests/test_request_settings_table.py); docs/protocol.md lists them for users.
ACTION_MODE = RequestSetting(
    "action_mode",
    (str,),
    "policy, inverse_dynamics or forward_dynamics; unset: follows the media (a video asks inverse_dynamics), "
    "or policy where the media cannot tell",
    normalize=_lower_mode,
    flag="mode",
)
DOMAIN_NAME = RequestSetting("domain_name", (str,), "the embodiment, one of the metadata's `domains`", flag="domain")
ACTION_HORIZON = RequestSetting(
    "action_horizon",
    (int,),
    "actions per chunk (default: the domain's)",
    in_chunk=False,  # the chunk's actions have that many rows
    flag="horizon",
)
PROMPT = RequestSetting("prompt", (str,), "text conditioning")
RESOLUTION_TIER = RequestSetting(
    "resolution_tier", (int,), "the resolution tier, one of the metadata's `resolution_tiers`"
)
VIEW_POINT = RequestSetting(
    "view_point",
    (str,),
    "how named cameras are composed, one of the metadata's `view_points` (default: the domain's)",
)
SEED = RequestSetting("seed", (int,), "random seed (default: drawn)")
NUM_STEPS = RequestSetting(
    "num_steps",
    (int,),
    "denoising steps (distilled: the fixed count or unset)",
    aliases=("num_inference_steps",),
)
GUIDANCE_SCALE = RequestSetting("guidance_scale", (float, int), "classifier-free guidance (distilled: 1.0 or unset)")
SHIFT = RequestSetting(
    "shift",
    (float, int),
    "the flow shift of the scheduler's sigmas (default: the domain's profile, else the checkpoint's; distilled: unset)",
)
FPS = RequestSetting(
    "fps", (float, int), "the rate the actions are meant for (default: the domain's profile, else the model's)"
)
CONTROL_HZ = RequestSetting(
    "control_hz",
    (float, int),
    "the robot's control rate, as it declares it: shown to operators, never used by the model",
    frozenset({SettingChannel.CONFIGURE}),
    not_per_observation="`control_hz` is the robot's control rate, shown to operators for the whole session; "
    "set it with `configure`",
    recorded=False,
    in_chunk=False,
)
REQUEST_SETTINGS: tuple[RequestSetting, ...] = (
    ACTION_MODE,
    DOMAIN_NAME,
    ACTION_HORIZON,
    PROMPT,
    RESOLUTION_TIER,
    VIEW_POINT,
    SEED,
    NUM_STEPS,
    GUIDANCE_SCALE,
    SHIFT,
    FPS,
    CONTROL_HZ,
)
SETTINGS_BY_NAME = {setting.name: setting for setting in REQUEST_SETTINGS}

# What the native protocol's parser uses, derived from the table: the settings with the types each
# accepts, the other names a client may use, the settings an observation may not carry (and why), and
# those it may carry for itself only.
SESSION_SETTINGS: dict[str, tuple[type, ...]] = {
    setting.name: setting.types for setting in REQUEST_SETTINGS if SettingChannel.CONFIGURE in setting.channels
}
SETTING_ALIASES = {alias: setting.name for setting in REQUEST_SETTINGS for alias in setting.aliases}
SESSION_ONLY_SETTINGS = {
    setting.name: setting.not_per_observation for setting in REQUEST_SETTINGS if setting.not_per_observation is not None
}
OBSERVATION_SETTINGS = tuple(
    setting.name for setting in REQUEST_SETTINGS if SettingChannel.OBSERVATION in setting.channels
)


def parse_settings(
    frame: Mapping[str, Any], names: tuple[str, ...], seq: int | None, keep_null: bool
) -> dict[str, Any]:
    """The session settings among ``names`` that ``frame`` carries, type-checked.

    ``keep_null``: a ``null`` value is kept as ``None`` (``configure``: unset the setting); otherwise it
    counts as absent (an observation: the session's value applies).
    """
    settings: dict[str, Any] = {}
    for alias, name in SETTING_ALIASES.items():
        if alias in frame and name in names:
            if name in frame and frame[name] != frame[alias]:
                raise ProtocolError(
                    ErrorCode.INVALID_FIELD, f"`{alias}` is another name for `{name}`; send one of them", alias, seq
                )
            if frame[alias] is not None or keep_null:
                settings[name] = None if frame[alias] is None else SETTINGS_BY_NAME[name].check(frame, alias, seq)
    for name in names:
        if name not in frame:
            continue
        if frame[name] is None:
            if keep_null:
                settings[name] = None
            continue
        settings[name] = SETTINGS_BY_NAME[name].check(frame, name, seq)
    return settings


def setting_names(*settings: RequestSetting) -> tuple[str, ...]:
    """The names of ``settings``, in the table's order: how a feature declares the settings it takes."""
    return tuple(setting.name for setting in REQUEST_SETTINGS if setting in settings)


def checked_settings(values: Mapping[str, Any], taken: tuple[str, ...], taker: str) -> dict[str, Any]:
    """``values`` (settings by name; ``None``: unset, dropped) as ``taker`` takes them, ``taken`` being the
    names of the settings it takes: each type-checked and normalized by the table. :class:`ProtocolError`
    names a setting outside ``taken``."""
    settings: dict[str, Any] = {}
    for name in values:
        if name not in taken:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"`{name}` is not a {taker} setting; those are {', '.join(taken)}", name
            )
        if values[name] is not None:
            settings[name] = SETTINGS_BY_NAME[name].check(values, name, None)
    return settings


# ---------------------------------------------------------------------------------------------------
# An observation's cameras, state and prefix actions
# ---------------------------------------------------------------------------------------------------


# More cameras than a robot has, fewer than a frame-size attack would want.
MAX_NAMED_CAMERAS = 8
# A proprioceptive state has at most this many numbers: the widest embodiments have tens per row and
# a profile conditions on a few rows; a JSON body of millions of numbers is an attack, not a robot.
MAX_STATE_VALUES = 4096

# One camera as parsed: an H×W×3 array, or the encoded bytes the server decodes before queueing.
Frame = np.ndarray | bytes
# A clip as parsed: a T×H×W×3 array, or a list of encoded frames.
Clip = np.ndarray | list[bytes]


def is_encoded_frame(value: Any) -> bool:
    """True for a frame sent as encoded bytes (PNG, JPEG or WebP) in place of an H×W×3 array."""
    return isinstance(value, (bytes, bytearray, memoryview))


def is_encoded_clip(value: Any) -> bool:
    """True for a clip sent as a list of encoded frames in place of a T×H×W×3 array."""
    return isinstance(value, (list, tuple)) and bool(value) and all(is_encoded_frame(frame) for frame in value)


def _check_encoded(value: Any, name: str, rank: int, limits: FrameLimits, seq: int) -> bytes | list[bytes]:
    """An encoded frame (rank 3) or clip (rank 4: a list of encoded frames), as bytes. Only what needs no
    image library is checked here (non-empty, the clip's frame count); the server reads each header and
    checks its size against the limits before decoding a pixel (``policy_server.foundation.camera_intake``)."""
    frames = [value] if rank == 3 else list(value)
    if rank == 4 and not 1 <= len(frames) <= limits.max_clip_frames:
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{name}` has {len(frames)} frames; between 1 and {limits.max_clip_frames} are allowed",
            name,
            seq,
        )
    if not all(frames):
        raise ProtocolError(ErrorCode.INVALID_IMAGE, f"`{name}` holds an empty encoded frame", name, seq)
    return bytes(value) if rank == 3 else [bytes(frame) for frame in frames]


@overload
def _check_frames(array: Any, name: str, rank: Literal[3], limits: FrameLimits, seq: int) -> Frame: ...


@overload
def _check_frames(array: Any, name: str, rank: Literal[4], limits: FrameLimits, seq: int) -> Clip: ...


def _check_frames(array: Any, name: str, rank: Literal[3, 4], limits: FrameLimits, seq: int) -> Frame | Clip:
    """Validate an image (rank 3: H×W×3) or a video (rank 4: T×H×W×3) of uint8, or its encoded form: PNG,
    JPEG or WebP bytes for an image, a list of them for a video."""
    shape_text = "H×W×3" if rank == 3 else "T×H×W×3"
    if is_encoded_frame(array) if rank == 3 else is_encoded_clip(array):
        return _check_encoded(array, name, rank, limits, seq)
    if not isinstance(array, np.ndarray):
        encoded = "PNG/JPEG/WebP bytes" if rank == 3 else "a list of PNG/JPEG/WebP bytes"
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{name}` must be a numpy array ({shape_text} uint8) or {encoded}, got {type(array).__name__}",
            name,
            seq,
        )
    if array.dtype != np.uint8:
        raise ProtocolError(ErrorCode.INVALID_IMAGE, f"`{name}` must have dtype uint8, got {array.dtype}", name, seq)
    if array.ndim != rank or array.shape[-1] != 3:
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{name}` must have shape {shape_text} (RGB), got {list(array.shape)}",
            name,
            seq,
        )
    check_image_size(array, name, limits, seq)
    if rank == 4 and not 1 <= array.shape[0] <= limits.max_clip_frames:
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{name}` has {array.shape[0]} frames; between 1 and {limits.max_clip_frames} are allowed",
            name,
            seq,
        )
    return array


def check_image_size(frames: np.ndarray, name: str, limits: FrameLimits, seq: int | None = None) -> None:
    """Each side of an H×W×3 frame (or T×H×W×3 clip) within the limits; both protocols use this."""
    check_image_sides(frames.shape[-3], frames.shape[-2], name, limits, seq)


def check_image_sides(height: int, width: int, name: str, limits: FrameLimits, seq: int | None = None) -> None:
    """A frame's height and width within the limits (read from an encoded frame's header, before decoding)."""
    if min(height, width) < limits.min_image_side or max(height, width) > limits.max_image_side:
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            f"`{name}` is {height}×{width} pixels; each side must be between {limits.min_image_side} "
            f"and {limits.max_image_side}",
            name,
            seq,
        )


def parse_cameras(
    frame: Mapping[str, Any], limits: FrameLimits, seq: int
) -> tuple[Frame | None, Clip | None, dict[str, Frame] | None]:
    """An observation's cameras as ``(image, video, images)``: exactly one of an ``image``, a ``video`` or
    named ``images`` (1 to :data:`MAX_NAMED_CAMERAS`), each checked; the others are ``None``.

    This is the frame's form, the same whatever model serves it, checked as the frame is parsed: before a
    session's settings are known (a frame without cameras is malformed, not a request of some mode) and before
    anything is decoded. It cannot be the model's rule, which lives in ``cosmos3_runtime`` (the robot side
    imports none of it): what a request's media mean (the mode they ask for, the medium a mode needs, a clip's
    horizon) is resolved by the server's model description, once per request, with the same codes."""
    image = video = images = None
    if frame.get("images") is not None:
        named = str_keys(frame["images"], "images", seq) if isinstance(frame["images"], dict) else None
        if named is None or not 1 <= len(named) <= MAX_NAMED_CAMERAS:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`images` must map 1 to {MAX_NAMED_CAMERAS} camera names to H×W×3 uint8 frames",
                "images",
                seq,
            )
        images = {name: _check_frames(value, f"images/{name}", 3, limits, seq) for name, value in named.items()}
        if frame.get("image") is not None or frame.get("video") is not None:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, "send one of `image`, `video` or `images` in an observation", "images", seq
            )
    if frame.get("image") is not None:
        image = _check_frames(frame["image"], "image", 3, limits, seq)
    if frame.get("video") is not None:
        video = _check_frames(frame["video"], "video", 4, limits, seq)
    if image is None and video is None and images is None:
        raise ProtocolError(
            ErrorCode.MISSING_FIELD,
            "`observation` needs an `image` (H×W×3 uint8), named `images` or a `video` (T×H×W×3 uint8)",
            "image",
            seq,
        )
    if image is not None and video is not None:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, "send either `image` or `video` in one observation, not both", "video", seq
        )
    return image, video, images


def parse_prefix_actions(prefix: Any, seq: int) -> np.ndarray:
    """The actions still to execute, as a finite float32 K×D array (K >= 1)."""
    if not isinstance(prefix, np.ndarray) or prefix.ndim != 2 or prefix.dtype.kind != "f" or not len(prefix):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            "`prefix_actions` must be a K×D float array, K >= 1 (the actions still to execute)",
            "prefix_actions",
            seq,
        )
    with np.errstate(over="ignore"):
        actions: np.ndarray = prefix.astype(np.float32)
    if not np.isfinite(actions).all():
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            "`prefix_actions` must be finite float32 values (no NaN, no infinity, |x| < 3.4e38)",
            "prefix_actions",
            seq,
        )
    return actions


def parse_state(value: Any, name: str = "state", seq: int | None = None) -> np.ndarray:
    """A proprio state as float32: ``[D]`` or ``[rows, D]``, finite, at most :data:`MAX_STATE_VALUES`.

    Takes a numeric array, or (from JSON senders) a list or nested lists of numbers. Whether the width
    and the row count fit the domain is for the server to judge against the domain's profile; this is
    the shape every protocol shares. Raises :class:`ProtocolError` (``invalid_field``) naming ``name``.
    """
    wanted = f"`{name}` must be a float array [state_dim] or [history_length, state_dim]"
    if isinstance(value, list):
        try:
            value = np.asarray(value, dtype=np.float64)
        except (ValueError, TypeError):
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"{wanted}, of numbers in rows of equal length", name, seq
            ) from None
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiu":
        got = f"dtype {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"{wanted}, got {got}", name, seq)
    if value.ndim not in (1, 2) or value.size == 0 or value.size > MAX_STATE_VALUES:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"{wanted} of 1 to {MAX_STATE_VALUES} values, got shape {list(value.shape)}",
            name,
            seq,
        )
    with np.errstate(over="ignore"):
        state = value.astype(np.float32)
    if not np.isfinite(state).all():
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{name}` must be finite float32 values (no NaN, no infinity, |x| < 3.4e38)",
            name,
            seq,
        )
    return np.ascontiguousarray(state)


# ---------------------------------------------------------------------------------------------------
# The typed frames and their parser
# ---------------------------------------------------------------------------------------------------


# An observation's own fields (besides `type` and the session settings it may carry).
OBSERVATION_FIELDS = (
    "seq",
    "image",
    "images",
    "video",
    "deadline_ms",
    "prefix_actions",
    "state",
    "timestamp",
    SESSION_ID,
)
CANCEL_FIELDS = ("seq", SESSION_ID)
RESET_FIELDS = (SESSION_ID,)
# `configure` only, not a setting an observation may carry: whether the server records this session.
RECORD_FIELD = "record"


@dataclass
class ConfigureFrame:
    """Session settings to merge over the current ones; only the keys the client sent are present.

    A ``None`` value unsets that setting: it goes back to the model's default (``seed``: random again).
    """

    settings: dict[str, Any]
    # `record`: True records this session from now on, False stops recording it; None (absent): unchanged.
    record: bool | None = None


@dataclass
class ObservationFrame:
    """One observation. A camera may hold encoded bytes (an image, each named image) or a list of them (a
    video) as parsed; the server decodes them to arrays before the observation is queued."""

    seq: int
    image: np.ndarray | bytes | None = None
    video: np.ndarray | list[bytes] | None = None
    # Named cameras (H×W×3 each), composed into ``image`` per the session's view point.
    images: dict[str, np.ndarray | bytes] | None = None
    prefix_actions: np.ndarray | None = None
    # The robot's proprioceptive state, float32: one row ``[state_dim]`` or history rows
    # ``[history_length, state_dim]`` (oldest first), for a domain whose profile conditions on it.
    state: np.ndarray | None = None
    deadline_ms: float | None = None
    # Session settings for this observation only, merged over the session's (see SESSION_SETTINGS).
    overrides: dict[str, Any] = field(default_factory=dict)
    # Opaque to the server: any msgpack scalar, echoed unchanged in the chunk.
    client_timestamp: Any = None
    # The policy session it belongs to, among several on the connection (None: the connection's own).
    session_id: str | None = None


@dataclass
class CancelFrame:
    seq: int | None  # None: every observation of this session that is waiting or running
    session_id: str | None = None  # which policy session (None: the connection's own)


@dataclass
class ResetFrame:
    session_id: str | None = None  # which policy session (None: the connection's own)


ClientFrame = ConfigureFrame | ObservationFrame | CancelFrame | ResetFrame


def has_encoded_frames(obs: ObservationFrame) -> bool:
    """Whether any camera of ``obs`` still carries encoded bytes (the server decodes them before queueing)."""
    images = obs.images.values() if obs.images is not None else ()
    return (
        is_encoded_frame(obs.image) or isinstance(obs.video, list) or any(is_encoded_frame(image) for image in images)
    )


def parse_session_id(value: Any, seq: int | None = None) -> str:
    """A policy session's name as a client sends it (``session_id``): a non-empty string of printable
    characters, at most :data:`~robot_clients.protocol.MAX_SESSION_ID_CHARS`; else ``invalid_field``."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="backslashreplace")
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_SESSION_ID_CHARS or not value.isprintable():
        got = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{SESSION_ID}` names a policy session on this connection: a string of 1 to {MAX_SESSION_ID_CHARS} "
            f"printable characters, got {got}",
            SESSION_ID,
            seq,
        )
    return value


def _session_id(frame: Mapping[str, Any], seq: int | None = None) -> str | None:
    value = frame.get(SESSION_ID)
    return None if value is None else parse_session_id(value, seq)


def _refuse_unknown(frame: Mapping[str, Any], frame_type: str, known: tuple[str, ...], seq: int | None = None) -> None:
    """Every field a client sends is honoured or refused: an unknown one is ``invalid_field`` naming it."""
    unknown = sorted(set(frame) - set(known) - {"type"})
    if unknown:
        name = unknown[0]
        if frame_type == OBSERVATION and name in SESSION_ONLY_SETTINGS:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"{SESSION_ONLY_SETTINGS[name]}, not in an observation", name, seq
            )
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{frame_type}` has unknown field `{name}`; known fields: {', '.join(known) or 'none'}",
            name,
            seq,
        )


def _parse_configure(frame: Mapping[str, Any]) -> ConfigureFrame:
    _refuse_unknown(frame, CONFIGURE, tuple(SESSION_SETTINGS) + tuple(SETTING_ALIASES) + (RECORD_FIELD,))
    record = frame.get(RECORD_FIELD)
    if record is not None and not isinstance(record, bool):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`{RECORD_FIELD}` must be true or false, got {type(record).__name__}",
            RECORD_FIELD,
        )
    return ConfigureFrame(parse_settings(frame, tuple(SESSION_SETTINGS), None, keep_null=True), record)


def _parse_observation(frame: Mapping[str, Any], limits: FrameLimits) -> ObservationFrame:
    if "seq" not in frame:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "`observation` needs an integer `seq`", "seq")
    seq = check_field_type(frame, "seq", (int,))
    if seq < 0:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"`seq` must be >= 0, got {seq}", "seq")
    _refuse_unknown(frame, OBSERVATION, OBSERVATION_FIELDS + OBSERVATION_SETTINGS + tuple(SETTING_ALIASES), seq)
    obs = ObservationFrame(seq=seq)
    obs.image, obs.video, obs.images = parse_cameras(frame, limits, seq)

    if frame.get("prefix_actions") is not None:
        obs.prefix_actions = parse_prefix_actions(frame["prefix_actions"], seq)

    if frame.get("state") is not None:
        obs.state = parse_state(frame["state"], "state", seq)

    if frame.get("deadline_ms") is not None:
        deadline = check_field_type(frame, "deadline_ms", (float, int), seq)
        if deadline <= 0:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"`deadline_ms` must be > 0, got {deadline}", "deadline_ms", seq
            )
        obs.deadline_ms = float(deadline)

    timestamp = frame.get("timestamp")
    if timestamp is not None:
        if not isinstance(timestamp, (bool, int, float, str, bytes, np.generic)):
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`timestamp` is echoed as sent and must be a scalar (number, string, bytes or boolean), got "
                f"{type(timestamp).__name__}",
                "timestamp",
                seq,
            )
        obs.client_timestamp = timestamp

    obs.session_id = _session_id(frame, seq)
    obs.overrides = parse_settings(frame, OBSERVATION_SETTINGS, seq, keep_null=False)
    return obs


def _parse_cancel(frame: Mapping[str, Any]) -> CancelFrame:
    _refuse_unknown(frame, CANCEL, CANCEL_FIELDS)
    session_id = _session_id(frame)
    if frame.get("seq") is None:
        return CancelFrame(seq=None, session_id=session_id)
    return CancelFrame(seq=check_field_type(frame, "seq", (int,)), session_id=session_id)


def parse_client_frame(message: Any, limits: FrameLimits) -> ClientFrame:
    """Turn one decoded client frame into a typed frame, or raise :class:`ProtocolError`."""
    if not isinstance(message, dict):
        raise ProtocolError(ErrorCode.BAD_FRAME, f"a frame must be a msgpack map, got {type(message).__name__}", None)
    message = str_keys(message, None)
    frame_type = message.get("type")
    if frame_type is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"frame has no `type`; expected one of {', '.join(CLIENT_FRAME_TYPES)}", "type"
        )
    if frame_type == OBSERVATION:
        return _parse_observation(message, limits)
    if frame_type == CONFIGURE:
        return _parse_configure(message)
    if frame_type == CANCEL:
        return _parse_cancel(message)
    if frame_type == RESET:
        _refuse_unknown(message, RESET, RESET_FIELDS)
        return ResetFrame(session_id=_session_id(message))
    raise ProtocolError(
        ErrorCode.UNKNOWN_TYPE,
        f"unknown frame type {frame_type!r}; expected one of {', '.join(CLIENT_FRAME_TYPES)}",
        "type",
    )
