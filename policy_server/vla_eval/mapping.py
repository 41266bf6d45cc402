"""A vla-eval observation as a Cosmos3 observation: which cameras, which state, which prompt.

vla-eval's benchmarks send ``{"images": {<camera>: H x W x 3 uint8}, "task_description": str,
"states" (or "state"): float array, ...}`` with camera names of their own (LIBERO ``agentview`` and
``wrist``, CALVIN ``rgb_static`` and ``rgb_gripper``, SimplerEnv ``primary``, this project's MuJoCo arm
``front`` and ``wrist``). An :class:`ObservationMapping` says, per view point, which cameras feed the
model: a list of alternatives tried in order, an alternative being one camera or several composed side
by side (left to right), exactly like openpi's camera mapping (``docs/openpi.md``). When no alternative
matches and the observation has exactly one camera, that camera is used.

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

Pure data: no sockets, no model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cosmos3_runtime.profiles import PolicyProfile
from robot_clients.client_frames import check_image_size, parse_state
from robot_clients.protocol import ErrorCode, FrameLimits, ProtocolError

from ..media import Alternative, camera_alternatives, side_by_side
from ..sessions.config import check_state
from .frames import image_of

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
        text, where = str(source), "the vla-eval mapping"
        if not text.lstrip().startswith("{"):
            where = text
            try:
                text = Path(text).read_text()
            except OSError as exc:
                raise MappingFileError(f"cannot read the vla-eval mapping {where}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MappingFileError(f"{where} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise MappingFileError(f"{where} must be a JSON object with some of {', '.join(PARTS)}")
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
    return tuple(entry)


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
