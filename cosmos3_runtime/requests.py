"""What callers ask the engine for, and what they get back.

These dataclasses are the boundary between the network side and the model side: the server builds
requests from protocol frames, the engine validates them against the loaded checkpoint and answers
with results. They carry numpy arrays and plain values only, never tensors.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, asdict, dataclass, field, fields
from typing import Any, Literal

import numpy as np

ActionMode = Literal["policy", "inverse_dynamics", "forward_dynamics"]
ACTION_MODES: tuple[str, ...] = ("policy", "inverse_dynamics", "forward_dynamics")


@dataclass(frozen=True)
class RequestSettings:
    """The settings every request may name; ``None`` takes the engine's default for the domain.

    Both :class:`ActionRequest` and :class:`VideoRequest` carry them, as keyword arguments.
    """

    _: KW_ONLY
    prompt: str = ""
    resolution_tier: int | None = None
    view_point: str | None = None
    seed: int | None = None
    num_steps: int | None = None
    guidance_scale: float | None = None
    guidance_interval: tuple[float, float] | None = None
    # The flow shift of the checkpoint's scheduler (UniPC's ``flow_shift``, Euler's ``shift``).
    shift: float | None = None
    fps: float | None = None

    @property
    def schedule(self) -> tuple[object, ...]:
        """The settings that decide the denoising schedule and its passes (steps, guidance, its interval, the
        shift), as asked: requests with equal ones resolve to one schedule and can share transformer forwards."""
        return (self.num_steps, self.guidance_scale, self.guidance_interval, self.shift)


@dataclass(frozen=True)
class DomainRequest(RequestSettings):
    """Settings for one embodiment: the ``domain_name`` of a profile of the loaded checkpoint."""

    domain_name: str

    def named_settings(self) -> dict[str, Any]:
        """The settings this request names, by name (unset ones None), as
        :meth:`~cosmos3_runtime.description.ModelDescription.check` and ``resolve`` take them. Here, those
        :class:`DomainRequest` declares: what a request of another kind carries over (a session's settings
        becoming one observation's :class:`ActionRequest`)."""
        return {setting.name: getattr(self, setting.name) for setting in fields(DomainRequest)}


@dataclass(frozen=True)
class ActionRequest(DomainRequest):
    """One observation to turn into a chunk of actions (``policy`` or ``inverse_dynamics``).

    ``image`` is one H×W×3 uint8 frame (policy); ``video`` is a T×H×W×3 uint8 clip (inverse dynamics,
    or policy, which then uses only its first frame). ``None`` fields take the engine's defaults for the
    domain (``describe().domain_defaults[name]``): steps and guidance from the variant; horizon,
    fps, view point, guidance interval and tier from the domain's profile where it sets them, else the
    variant's.

    ``prefix_actions`` are raw actions (K×D, K < horizon) that the new chunk must start with: the actions
    the robot will still execute while this request is being answered (real-time chunking). They are
    conditioned as clean action frames, the mechanism diffusers uses for forward dynamics.

    ``state`` is the robot's proprioceptive state in raw units, for a domain whose profile conditions on
    it (``describe().domains[name].state_dim`` is set): float, ``[state_dim]`` or
    ``[history_length, state_dim]``, oldest row first; with ``use_state`` the last row is the state at the
    conditioning frame. The rows become clean action frames in front of the chunk; the chunk returned
    does not include them.

    ``decode_video`` also VAE-decodes the video the model predicted alongside the chunk (cosmos-framework's
    ``--decode-video``): it costs a VAE decode of every frame, so it is off unless asked for.
    """

    action_mode: ActionMode = "policy"
    image: np.ndarray | None = None
    video: np.ndarray | None = None
    action_horizon: int | None = None
    prefix_actions: np.ndarray | None = None
    state: np.ndarray | None = None
    decode_video: bool = False

    def named_settings(self) -> dict[str, Any]:
        """The settings this request names, by name (unset ones None): its domain's, its mode and its horizon."""
        settings = super().named_settings()
        settings.update(action_mode=self.action_mode, action_horizon=self.action_horizon)
        return settings


@dataclass(frozen=True)
class VideoRequest(DomainRequest):
    """A ``forward_dynamics`` rollout: a first frame plus raw actions in, predicted frames out."""

    image: np.ndarray
    actions: np.ndarray


@dataclass
class Timing:
    """Where the time of one engine call went, in milliseconds."""

    preprocess_ms: float = 0.0
    encode_ms: float = 0.0
    denoise_ms: float = 0.0
    decode_ms: float = 0.0
    postprocess_ms: float = 0.0

    @property
    def model_ms(self) -> float:
        """Time spent in the networks (VAE encode, transformer loop, VAE decode)."""
        return self.encode_ms + self.denoise_ms + self.decode_ms

    @property
    def total_ms(self) -> float:
        return self.preprocess_ms + self.model_ms + self.postprocess_ms

    def as_dict(self) -> dict[str, float]:
        """Every stage, then the two sums."""
        return {**asdict(self), "model_ms": self.model_ms, "total_ms": self.total_ms}


@dataclass(frozen=True, kw_only=True)
class ResolvedSettings:
    """Every setting of one request with the model's defaults filled in: what it ran with, or will.

    :meth:`~cosmos3_runtime.description.ModelDescription.resolve` builds it, the one place where a request's
    settings meet the domain's and the variant's defaults. ``seed`` is None until a seed is drawn for an
    unseeded request (a result's settings always carry the seed that reproduces it). ``shift`` is None
    where no shift applies (a distilled checkpoint's fixed sigma list).
    """

    domain_name: str
    action_mode: str
    action_horizon: int
    prompt: str
    resolution_tier: int
    view_point: str
    fps: float
    num_steps: int
    guidance_scale: float
    guidance_interval: tuple[float, float] | None
    shift: float | None
    seed: int | None

    def as_json(self) -> dict[str, object]:
        """The settings as JSON values (the interval as a list)."""
        # Not asdict: it deep-copies each value, and every chunk's echo is built here (the values are scalars).
        data: dict[str, object] = dict(vars(self))
        data["guidance_interval"] = list(self.guidance_interval) if self.guidance_interval is not None else None
        return data


# The settings a request may name, by name: what ModelDescription.check and .resolve take.
SETTING_NAMES: tuple[str, ...] = tuple(setting.name for setting in fields(ResolvedSettings))


@dataclass(kw_only=True)
class Provenance:
    """How a result was made, as every result reports it: the settings it ran with (the seed among them),
    the id that selected the action head's weights, how many transformer forwards it took, and where the
    time went."""

    settings: ResolvedSettings
    domain_id: int
    transformer_forwards: int
    timing: Timing = field(default_factory=Timing)

    @property
    def domain_name(self) -> str:
        return self.settings.domain_name

    @property
    def num_steps(self) -> int:
        return self.settings.num_steps

    @property
    def seed(self) -> int:
        assert self.settings.seed is not None, "a result's settings carry the seed it ran with"
        return self.settings.seed


@dataclass(kw_only=True)
class ActionResult(Provenance):
    """The engine's answer to an :class:`ActionRequest`: a chunk of continuous actions, float32, shape
    (action_horizon, raw_action_dim), in raw units, and how it was made. ``video``: the predicted frames,
    uint8 (T, H, W, 3), when the request asked for ``decode_video`` (its time is ``timing.decode_ms``)."""

    actions: np.ndarray
    raw_action_dim: int
    batch_size: int = 1  # how many requests shared this chunk's transformer calls
    video: np.ndarray | None = None

    @property
    def action_mode(self) -> str:
        return self.settings.action_mode

    @property
    def action_horizon(self) -> int:
        return int(self.actions.shape[0])


@dataclass(kw_only=True)
class VideoResult(Provenance):
    """Frames predicted by ``forward_dynamics``: uint8, shape (T, H, W, 3)."""

    frames: np.ndarray
    fps: float
