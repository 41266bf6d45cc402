"""vla-eval's model-server protocol translated onto ours, with no I/O: its frames, what its observations
mean to the model, which action answers which observation, and the settings a harness does not send.

**Frames.** vla-eval (PyPI ``vla-eval``, allenai/vla-evaluation-harness) drives a model server over one
WebSocket per benchmark shard. Every frame, both ways, is one binary msgpack map::

    {"type": "hello" | "episode_start" | "observation" | "action" | "episode_end" | "error",
     "payload": {...}, "seq": int, "timestamp": float (seconds since the epoch)}

* ``hello`` opens the connection, from the harness (``protocol_version`` 1, ``harness_version``), and
  is answered by a ``hello`` with the same ``seq`` (``protocol_version``, ``model_server``,
  ``capabilities``, optionally ``observation_params`` the harness merges into its benchmark's settings).
* ``episode_start`` (``task``: the task's name, suite, ...; ``mode``: ``live`` in real-time runs;
  ``recording``) and ``episode_end`` (the episode's ``metrics``) expect no reply.
* ``observation`` (``images`` by camera name, ``state`` or ``states``, ``task_description``) is answered
  by an ``action`` with the observation's ``seq`` (``actions``: one action, or a chunk), or an ``error``
  (``{"error": "..."}``; here also the stable ``code``, ``message`` and ``field``).

Arrays travel in openpi's form (``{"__ndarray__": True, "data", "dtype", "shape"}``, read by the shared
wire codec); images, by default, as ``{"__image__": True, "format": "png" | "jpeg" | "raw", "data",
"shape"}``: PNG or JPEG bytes, decoded by the session off the event loop, or raw pixels.

**The observation mapping.** vla-eval's benchmarks send ``{"images": {<camera>: H x W x 3 uint8},
"task_description": str, "states" (or "state"): float array, ...}`` with camera names of their own
(LIBERO ``agentview`` and ``wrist``, CALVIN ``rgb_static`` and ``rgb_gripper``, SimplerEnv ``primary``,
this project's MuJoCo arm ``front`` and ``wrist``). An :class:`ObservationMapping` says, per view point,
which cameras feed the model: a list of alternatives tried in order, an alternative being one camera or
several composed side by side (left to right), exactly like openpi's camera mapping (``docs/openpi.md``).
When no alternative matches and the observation has exactly one camera, that camera is used.

A mapping file (``--vla-eval-mapping FILE``, or the JSON inline) replaces any of its parts::

    {"cameras": {"third_person_view": ["agentview"], "concat_view": [["agentview", "wrist"]]},
     "state": ["states", "state"], "prompt": ["task_description"],
     "unused": ["tcp_pose"], "observation_params": {"send_wrist_image": true}}

* ``state``: the keys read as the robot's state, for a domain that conditions on it (one of them per
  observation). A domain that does not accepts them and does not use them, counted (``/metrics``).
* ``prompt``: the keys read as the prompt (else the episode's task text, else ``--vla-eval-prompt``).
* ``unused``: other observation keys a benchmark sends that the server accepts and does not use. Any key
  neither read nor listed here is refused (``invalid_field`` naming it): silently ignoring it would hide
  a benchmark's mistake.
* ``observation_params``: sent in the ``hello`` reply; vla-eval's orchestrator passes those its benchmark
  class accepts to the benchmark's constructor (e.g. LIBERO's ``send_wrist_image``, ``send_state``).

**Chunks, one action per observation.** A vla-eval benchmark steps its simulator once per action it
receives: one observation out, one action back. A Cosmos3 policy answers an observation with a chunk of H
actions. vla-eval's own chunked model servers (``PredictModelServer(chunk_size=...)``) bridge the two by
playing the chunk out, one action per observation, and running the model again only when it is spent.
:class:`ChunkPlayer` does the same, and asks for the next chunk *early*: when ``ask_ahead`` actions of the
current one remain, the observation of that step goes to the engine while the remaining actions keep
answering observations at once, so the simulator rarely waits a whole inference at a chunk boundary.

A chunk computed from the observation of step ``s`` that arrives when the episode is at step ``t`` starts
playing at its row ``t - s``: the rows before it were meant for steps that have passed (the same
accounting as real-time chunking's inference delay). One that arrives later than its last usable row
plays that last row, and the next observation asks again. ``whole``: every observation runs the engine
and its reply is the whole chunk (H x D), for a client that executes chunks itself. The session drives
it: :meth:`ChunkPlayer.observe` for each observation, :meth:`ChunkPlayer.arrived` for each chunk.

**Settings** (:class:`VlaEvalSettings`, ``--vla-eval-*``): vla-eval's ``episode_start`` carries the task
(its text becomes the prompt) and the mode, not an embodiment or a horizon. Those come from the server's
settings, unless the ``episode_start`` payload carries a ``settings`` map of its own
(:data:`EPISODE_SETTINGS`), which then holds for that episode.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from cosmos3_runtime.description import ModelDescription
from cosmos3_runtime.profiles import PolicyProfile
from robot_clients.client_frames import (
    ACTION_HORIZON,
    DOMAIN_NAME,
    NUM_STEPS,
    PROMPT,
    RESOLUTION_TIER,
    SEED,
    VIEW_POINT,
    check_image_size,
    checked_settings,
    parse_state,
    setting_names,
)
from robot_clients.protocol import CodedError, ErrorCode, FrameLimits, ProtocolError
from robot_clients.wire_codec import WireFormatError, packb, unpackb

from ..foundation.camera_intake import Alternative, camera_alternatives, side_by_side
from ..foundation.mapping_files import load_mapping
from ..session_config import SessionConfig, check_state, fixed_session_config

# -- frames ----------------------------------------------------------------------------------------

PROTOCOL_VERSION = 1
FRAME_KEYS = ("type", "payload", "seq", "timestamp")
_IMAGE = "__image__"


class FrameType(str, enum.Enum):
    HELLO = "hello"
    EPISODE_START = "episode_start"
    OBSERVATION = "observation"
    ACTION = "action"
    EPISODE_END = "episode_end"
    ERROR = "error"


# What a harness sends; ``action`` is the server's alone.
CLIENT_TYPES = (FrameType.HELLO, FrameType.EPISODE_START, FrameType.OBSERVATION, FrameType.EPISODE_END, FrameType.ERROR)


@dataclass(frozen=True)
class VlaEvalFrame:
    type: FrameType
    payload: dict[str, Any]
    seq: int
    timestamp: float


def parse_frame(message: bytes | str, unpack: Callable[[bytes], Any] = unpackb) -> VlaEvalFrame:
    """One frame from the harness, decoded by ``unpack`` (a session's: within its element budget);
    :class:`ProtocolError` (``bad_frame``, ``unknown_type``, ...) naming what is wrong."""
    if isinstance(message, str):
        raise ProtocolError(ErrorCode.BAD_FRAME, "vla-eval frames are binary msgpack maps, not text")
    try:
        raw = unpack(message)
    except WireFormatError as exc:
        raise ProtocolError(ErrorCode.BAD_FRAME, exc.message, exc.field) from None
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.BAD_FRAME, f"a frame must be a msgpack map, got {type(raw).__name__}")
    raw = {key.decode("utf-8", "replace") if isinstance(key, bytes) else key: value for key, value in raw.items()}
    seq = raw.get("seq")
    seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
    for key in raw:
        if key not in FRAME_KEYS:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"unknown frame key `{key}`: a frame has {', '.join(FRAME_KEYS)}",
                str(key),
                seq,
            )
    for key in FRAME_KEYS:
        if key not in raw:
            raise ProtocolError(ErrorCode.MISSING_FIELD, f"a frame needs `{key}`", key, seq)
    if seq is None:
        raise ProtocolError(ErrorCode.INVALID_FIELD, "`seq` must be an integer", "seq")
    names = [t.value for t in CLIENT_TYPES]
    kind = raw["type"]
    if kind not in names:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"unknown frame type {kind!r}; a harness sends {', '.join(names)}", "type", seq
        )
    payload = raw["payload"]
    if not isinstance(payload, dict):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "`payload` must be a map", "payload", seq)
    timestamp = raw["timestamp"]
    if not isinstance(timestamp, (int, float)) or isinstance(timestamp, bool):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "`timestamp` must be a number (seconds)", "timestamp", seq)
    payload = {key.decode("utf-8", "replace") if isinstance(key, bytes) else key: v for key, v in payload.items()}
    return VlaEvalFrame(FrameType(kind), payload, seq, float(timestamp))


def image_of(value: Any, field: str, seq: int | None) -> np.ndarray | bytes:
    """A camera as sent: an array, or vla-eval's image map (PNG/JPEG bytes, or raw pixels)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, dict) and value.get(_IMAGE) is True:
        fmt, data = value.get("format"), value.get("data")
        if not isinstance(data, bytes):
            raise ProtocolError(ErrorCode.INVALID_IMAGE, f"`{field}`: the image's `data` must be bytes", field, seq)
        if fmt in ("png", "jpeg"):
            return data
        if fmt == "raw":
            shape, dtype = value.get("shape"), value.get("dtype")
            try:
                pixels = unpackb(packb({"__ndarray__": True, "data": data, "dtype": dtype, "shape": shape}))
            except (WireFormatError, TypeError) as exc:
                raise ProtocolError(ErrorCode.INVALID_IMAGE, f"`{field}`: {exc}", field, seq) from None
            assert isinstance(pixels, np.ndarray), "the wire codec reads an __ndarray__ map as an array"
            return pixels
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE, f"`{field}`: image format {fmt!r}; vla-eval sends png, jpeg or raw", field, seq
        )
    raise ProtocolError(
        ErrorCode.INVALID_IMAGE,
        f"`{field}` must be an H x W x 3 uint8 array or vla-eval's image map, got {type(value).__name__}",
        field,
        seq,
    )


def frame(kind: FrameType, payload: dict[str, Any], seq: int) -> bytes:
    return packb({"type": kind.value, "payload": payload, "seq": seq, "timestamp": time.time()})


def action_frame(actions: np.ndarray, seq: int, extra: dict[str, Any] | None = None) -> bytes:
    """The answer to observation ``seq``: ``actions`` ((D,) one action, or (H, D) a chunk), float32."""
    payload: dict[str, Any] = {"actions": np.ascontiguousarray(actions, dtype=np.float32), **(extra or {})}
    return frame(FrameType.ACTION, payload, seq)


def error_frame(code: str, message: str, field: str | None, seq: int) -> bytes:
    """vla-eval's ``error`` (its harness reads ``payload["error"]``), with our stable code and the field."""
    text = CodedError(code, message, field).text()
    return frame(FrameType.ERROR, {"error": text, "code": code, "message": message, "field": field}, seq)


# -- the observation mapping -----------------------------------------------------------------------

SINGLE_VIEWS: tuple[Alternative, ...] = (
    ("agentview",),
    ("primary",),
    ("front",),
    ("rgb_static",),
    ("base_camera",),
    ("viewport",),
    ("image",),
)
WRIST_VIEWS: tuple[Alternative, ...] = (("wrist",), ("rgb_gripper",), ("wrist_image",), ("hand_camera",))
DEFAULT_CAMERAS: dict[str, tuple[Alternative, ...]] = {
    "third_person_view": SINGLE_VIEWS,
    "ego_view": SINGLE_VIEWS,
    "wrist_view": WRIST_VIEWS,
    "concat_view": (("agentview", "wrist"), ("front", "wrist"), ("rgb_static", "rgb_gripper"), *SINGLE_VIEWS),
}
IMAGES_KEY = "images"
PARTS = ("cameras", "state", "prompt", "unused", "observation_params")


# These bound a mapping's parts once it is parsed (its size and depth are bounded before: mapping_files). Its
# observation_params go into every hello, so they stay shallow enough for any msgpack reader (its limit is 512).
MAX_MAPPING_KEYS = 64  # names in each of state, prompt and unused
MAX_KEY_CHARS = 256
MAX_PARAMS_DEPTH = 8


class MappingFileError(ValueError):
    """A vla-eval mapping file or string is malformed; the message says where."""


@dataclass(frozen=True)
class ObservationMapping:
    """See the module docstring."""

    cameras: dict[str, tuple[Alternative, ...]] = field(default_factory=lambda: dict(DEFAULT_CAMERAS))
    state: tuple[str, ...] = ("states", "state")
    prompt: tuple[str, ...] = ("task_description",)
    unused: tuple[str, ...] = ()
    observation_params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, source: str | Path | None) -> ObservationMapping:
        """The defaults with ``source``'s parts replacing them (a path to a JSON file, or JSON text)."""
        if source is None:
            return cls()
        data, where = load_mapping(source, "the vla-eval mapping", MappingFileError)
        unknown = sorted(set(data) - set(PARTS))
        if unknown:
            raise MappingFileError(f"{where}: unknown part {unknown[0]!r}; expected some of {', '.join(PARTS)}")
        cameras = dict(DEFAULT_CAMERAS)
        views = data.get("cameras", {})
        if not isinstance(views, dict):
            raise MappingFileError(f"{where}: `cameras` must map view points to camera alternatives")
        for view, entry in views.items():
            if view not in DEFAULT_CAMERAS:
                raise MappingFileError(
                    f"{where}: unknown view point {view!r}; expected one of {', '.join(DEFAULT_CAMERAS)}"
                )
            cameras[view] = camera_alternatives(entry, f"{where}: cameras.{view}", MappingFileError)
        params = data.get("observation_params", {})
        if not isinstance(params, dict):
            raise MappingFileError(f"{where}: `observation_params` must be an object")
        if _nests_deeper_than(params, MAX_PARAMS_DEPTH):
            raise MappingFileError(f"{where}: `observation_params` nests deeper than {MAX_PARAMS_DEPTH} levels")
        return cls(
            cameras=cameras,
            state=_names(data.get("state", list(cls.state)), f"{where}: state"),
            prompt=_names(data.get("prompt", list(cls.prompt)), f"{where}: prompt"),
            unused=_names(data.get("unused", []), f"{where}: unused"),
            observation_params=params,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "cameras": {view: [list(alt) for alt in alts] for view, alts in self.cameras.items()},
            "state": list(self.state),
            "prompt": list(self.prompt),
            "unused": list(self.unused),
        }


def _names(entry: Any, where: str) -> tuple[str, ...]:
    if not isinstance(entry, list) or not all(isinstance(name, str) and name for name in entry):
        raise MappingFileError(f"{where} must be a list of keys")
    if len(entry) > MAX_MAPPING_KEYS or any(len(name) > MAX_KEY_CHARS for name in entry):
        raise MappingFileError(f"{where}: at most {MAX_MAPPING_KEYS} keys of at most {MAX_KEY_CHARS} characters")
    return tuple(entry)


def _nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` holds objects or arrays more than ``limit`` levels deep (``value`` itself is
    one level); walked without recursion."""
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        children = list(item.values()) if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            if level + 1 > limit:
                return True
            stack.extend((child, level + 1) for child in children)
    return False


@dataclass
class VlaEvalObservation:
    """One vla-eval observation, read: the cameras chosen (still encoded where they came as PNG/JPEG),
    the state, the prompt."""

    seq: int
    cameras: Alternative
    frames: list[np.ndarray | bytes]
    image: np.ndarray | None = None  # the chosen cameras composed, once decoded
    state: np.ndarray | None = None
    prompt: str | None = None
    unused_state: tuple[str, ...] = ()  # state keys sent to a domain that does not condition on state

    @property
    def encoded(self) -> bool:
        return any(isinstance(frame, bytes) for frame in self.frames)

    def compose(self, limits: FrameLimits) -> None:
        """The chosen cameras (decoded arrays, H x W x 3 uint8) side by side as :attr:`image`."""
        frames = [np.asarray(frame) for frame in self.frames]
        for name, frame in zip(self.cameras, frames):
            if frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8:
                raise ProtocolError(
                    ErrorCode.INVALID_IMAGE,
                    f"`images/{name}` must be H x W x 3 uint8 (RGB), got {frame.dtype} {list(frame.shape)}",
                    f"images/{name}",
                    self.seq,
                )
        self.image = side_by_side(frames) if len(frames) > 1 else frames[0]
        check_image_size(self.image, "+".join(self.cameras), limits, self.seq)


def parse_observation(
    payload: dict[str, Any],
    seq: int,
    mapping: ObservationMapping,
    view_point: str,
    domain: PolicyProfile,
    limits: FrameLimits,
    *,
    strict_state: bool = False,
) -> VlaEvalObservation:
    """Read an observation's payload; :class:`ProtocolError` naming the key at fault."""
    known = {IMAGES_KEY, *mapping.state, *mapping.prompt, *mapping.unused}
    for key in payload:
        if key not in known:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"unknown observation key `{key}`: this endpoint reads `{IMAGES_KEY}`, the state "
                f"({', '.join(mapping.state)}) and the prompt ({', '.join(mapping.prompt)}); list a key it should "
                "accept and not use under `unused` in the mapping (--vla-eval-mapping)",
                key,
                seq,
            )
    images = payload.get(IMAGES_KEY)
    if not isinstance(images, dict) or not images:
        raise ProtocolError(
            ErrorCode.MISSING_FIELD, f"an observation needs `{IMAGES_KEY}`: camera name -> image", IMAGES_KEY, seq
        )
    names = [key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key) for key in images]
    images = dict(zip(names, images.values()))
    alternatives = mapping.cameras.get(view_point, ())
    chosen = next((alt for alt in alternatives if all(name in images for name in alt)), None)
    if chosen is None and len(images) == 1:
        chosen = (names[0],)
    if chosen is None:
        wanted = " or ".join("+".join(alt) for alt in alternatives) or "(none configured)"
        raise ProtocolError(
            ErrorCode.MISSING_FIELD,
            f"no camera for the {view_point} view: expected {wanted}; got {', '.join(names)} "
            "(map them with --vla-eval-mapping)",
            IMAGES_KEY,
            seq,
        )
    frames = [image_of(images[name], f"{IMAGES_KEY}/{name}", seq) for name in chosen]
    result = VlaEvalObservation(seq=seq, cameras=chosen, frames=frames)

    prompt_key = next((key for key in mapping.prompt if key in payload), None)
    if prompt_key is not None:
        prompt = payload[prompt_key]
        if not isinstance(prompt, str):
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"`{prompt_key}` must be a string", prompt_key, seq)
        result.prompt = prompt

    sent = [key for key in mapping.state if key in payload]
    if len(sent) > 1:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, f"one robot state per observation: got {', '.join(sent)}", sent[-1], seq
        )
    state = parse_state(payload[sent[0]], sent[0], seq) if sent else None
    if state is not None and domain.state_dim is None and not strict_state:
        result.unused_state = (sent[0],)
    else:
        check_state(state, domain, seq, sent[0] if sent else mapping.state[0])
        result.state = state
    if not result.encoded:
        result.compose(limits)
    return result


# -- chunks, one action per observation ------------------------------------------------------------

CHUNK_MODES = ("step", "whole")


@dataclass(frozen=True)
class ChunkPlan:
    """How a session plays chunks out.

    Args:
        chunk: ``step`` (one action per observation) or ``whole`` (each reply is the whole chunk).
        ask_ahead: ask for the next chunk when this many actions of the current one remain (``step``).
        execute: play at most this many actions of a chunk before the next replaces it (None: all of them).
    """

    chunk: str = "step"
    ask_ahead: int = 1
    execute: int | None = None

    def checked(self, horizon: int) -> ChunkPlan:
        """This plan against a chunk of ``horizon`` actions; :class:`ProtocolError` naming a bad setting."""
        if self.chunk not in CHUNK_MODES:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"`chunk` must be one of {', '.join(CHUNK_MODES)}, got {self.chunk!r}", "chunk"
            )
        if self.execute is not None and not 1 <= self.execute <= horizon:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`execute` must be between 1 and the chunk's {horizon} actions, got {self.execute}",
                "execute",
            )
        usable = self.execute or horizon
        if not 0 <= self.ask_ahead < usable:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"`ask_ahead` must be between 0 and {usable - 1} (the actions played of each chunk, minus one), "
                f"got {self.ask_ahead}",
                "ask_ahead",
            )
        return self


@dataclass(frozen=True)
class StepDecision:
    """What to do with the observation of ``step``: answer it with ``action`` now (None: not yet, it waits
    for the chunk being computed), and whether it goes to the engine (``ask``)."""

    step: int
    action: np.ndarray | None
    ask: bool


class ChunkPlayer:
    """One episode's chunks, played out one action per observation (see the module docstring)."""

    def __init__(self, plan: ChunkPlan) -> None:
        self.plan = plan
        self.step = 0  # observations seen this episode
        self._chunk: np.ndarray | None = None
        self._chunk_step = 0  # the step whose observation the current chunk was computed from
        self.pending_step: int | None = None  # the step whose observation the engine is working on

    def _usable(self, chunk: np.ndarray) -> int:
        rows = int(chunk.shape[0])
        return min(self.plan.execute or rows, rows)

    def peek(self) -> StepDecision:
        """What :meth:`observe` would decide for the next observation, deciding nothing."""
        t = self.step
        if self.plan.chunk == "whole":
            return StepDecision(t, None, ask=True)
        action = None
        remaining = 0
        if self._chunk is not None:
            index = t - self._chunk_step
            usable = self._usable(self._chunk)
            if index < usable:
                action = self._chunk[index]
                remaining = usable - index - 1  # actions left after this one
        ask = self.pending_step is None and (action is None or remaining < self.plan.ask_ahead)
        return StepDecision(t, action, ask)

    def observe(self) -> StepDecision:
        """The next observation of the episode arrived."""
        decision = self.peek()
        self.step += 1
        if decision.ask:
            self.pending_step = decision.step
        return decision

    def arrived(self, actions: np.ndarray, step: int, awaiting: bool) -> np.ndarray | None:
        """The engine's chunk for the observation of ``step``. Returns what answers the observation that
        waits for it (``awaiting``: the latest one has no reply yet), else None."""
        if self.pending_step == step:
            self.pending_step = None
        if self.plan.chunk == "whole":
            return actions if awaiting else None
        self._chunk, self._chunk_step = actions, step
        if not awaiting:
            return None
        index = min(max(self.step - 1 - step, 0), self._usable(actions) - 1)
        row: np.ndarray = actions[index]
        return row

    def failed(self, step: int) -> None:
        """The engine could not answer the observation of ``step``: the next observation asks again."""
        if self.pending_step == step:
            self.pending_step = None


# -- settings --------------------------------------------------------------------------------------

VLA_EVAL_PATH = "/v1/vla-eval"
# The request settings an episode may set for itself (and the --vla-eval-* flags for every episode): no mode,
# since an episode plays policy chunks, and of the sampler's only the step count. Then the chunk plan's.
VLA_EVAL_SETTINGS = setting_names(DOMAIN_NAME, ACTION_HORIZON, PROMPT, RESOLUTION_TIER, VIEW_POINT, SEED, NUM_STEPS)
PLAN_KEYS = ("chunk", "ask_ahead", "execute")
EPISODE_SETTINGS = VLA_EVAL_SETTINGS + PLAN_KEYS


@dataclass(frozen=True)
class VlaEvalSettings:
    """What the server's ``--vla-eval-*`` flags set for every episode."""

    # Request settings by name, those of VLA_EVAL_SETTINGS; unset: the model's default domain, and the
    # domain's defaults. An episode's own `settings` override them.
    requested: Mapping[str, Any] = field(default_factory=dict)
    plan: ChunkPlan = field(default_factory=ChunkPlan)
    mapping: ObservationMapping = field(default_factory=ObservationMapping)
    strict_state: bool = False  # refuse a state sent to a domain that does not condition on it

    def __post_init__(self) -> None:
        # Typed and normalized by the table here, so that a bad value fails where it was written.
        object.__setattr__(self, "requested", checked_settings(self.requested, VLA_EVAL_SETTINGS, "vla_eval"))

    def episode(self, description: ModelDescription, overrides: dict[str, Any]) -> tuple[SessionConfig, ChunkPlan]:
        """The session config and chunk plan of one episode: these settings, then the episode's own
        ``settings`` over them; :class:`ProtocolError` naming a bad one."""
        for key in overrides:
            if key not in EPISODE_SETTINGS:
                raise ProtocolError(
                    ErrorCode.INVALID_FIELD,
                    f"unknown episode setting `{key}`; an episode may set {', '.join(EPISODE_SETTINGS)}",
                    f"settings/{key}",
                )
        # A vla-eval episode plays policy chunks (VLA_EVAL_SETTINGS has no mode).
        values = {**self.requested, "action_mode": "policy"}
        values.update({k: v for k, v in overrides.items() if k in VLA_EVAL_SETTINGS})
        config = fixed_session_config(values, description)
        plan = self.plan
        for key in PLAN_KEYS:
            if key in overrides:
                value = overrides[key]
                if key != "chunk" and value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise ProtocolError(ErrorCode.INVALID_FIELD, f"`{key}` must be an integer", f"settings/{key}")
                plan = replace(plan, **{key: value})
        return config, plan.checked(config.settings(description).action_horizon)
