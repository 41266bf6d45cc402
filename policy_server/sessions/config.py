"""A session's settings: what a ``configure`` frame sets and every later observation inherits.

An observation may carry any setting for itself only (:func:`observation_request`): it is merged over
the session's and checked the same way. Settings are checked here against the loaded model's
description (:class:`~cosmos3_runtime.description.ModelDescription`), with the engine's own limits,
as soon as they arrive, so a robot learns that its domain, tier or prompt length is wrong from the
``configure`` reply (or at once for an observation), never as a failure of every later observation. The
engine checks requests again (it is the authority); this is the early, cheap answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from cosmos3_runtime.description import ModelDescription, RequestDefaults
from cosmos3_runtime.profiles import PolicyProfile
from cosmos3_runtime.requests import ActionRequest, ActionResult
from robot_clients.client_frames import REQUEST_SETTINGS, SETTINGS_BY_NAME, ObservationFrame
from robot_clients.protocol import ErrorCode, ProtocolError

from ..media import compose_named

# The settings an engine request carries as the session holds them (the table's recorded ones: those the
# model uses), less the two resolved for each observation.
ENGINE_SETTINGS = tuple(s.name for s in REQUEST_SETTINGS if s.recorded and s.name not in ("action_mode", "fps"))

# The settings the engine has a default for (RequestDefaults' fields), besides the domain itself.
DEFAULTED_SETTINGS = tuple(
    f.name for f in dataclasses.fields(RequestDefaults) if f.name in SETTINGS_BY_NAME and f.name != "domain_name"
)

# What a domain's profile says about the proprio state its observations carry.
STATE_PROFILE_FIELDS = ("state_dim", "use_state", "history_length")
# The fastest control loop a robot may declare (Hz): a 1 kHz torque loop fits with room to spare; beyond
# it the figure is a mistake (1e308 would be shown to operators as the session's rate).
MAX_CONTROL_HZ = 10_000.0


@dataclass(frozen=True)
class SessionConfig:
    """Settings of one session. ``None`` means "the model's default for this variant and domain"."""

    domain_name: str
    # None: each observation's media decide, ``policy`` for an image, ``inverse_dynamics`` for a video.
    action_mode: str | None = None
    action_horizon: int | None = None
    prompt: str = ""
    resolution_tier: int | None = None
    view_point: str | None = None
    seed: int | None = None
    num_steps: int | None = None
    guidance_scale: float | None = None
    # The rate the actions are meant for; None: the domain's profile says (15 for DROID), else the model's.
    fps: float | None = None
    # The robot's control rate, as the robot declares it: shown to operators, never used by the model.
    control_hz: float | None = None

    def resolved(self, description: ModelDescription) -> dict[str, Any]:
        """The values the engine will use, defaults filled in: what the ``session`` reply shows."""
        values = _with_defaults(dataclasses.asdict(self), description)
        domain = description.domain(self.domain_name)
        values["domain_id"] = domain.domain_id if domain is not None else None
        values["raw_action_dim"] = domain.raw_action_dim if domain is not None else None
        for name in STATE_PROFILE_FIELDS:  # whether observations must carry `state`, and its shape
            values[name] = getattr(domain, name) if domain is not None else None
        return values

    def action_request(self, obs: ObservationFrame, description: ModelDescription) -> ActionRequest:
        """The engine request for one observation under these (already merged and checked) settings.

        The mode, when unset, follows the media (a ``video`` asks for ``inverse_dynamics``). What the
        server can judge about the media against the settings is checked here, so that it is refused
        with the same codes as a bad ``configure``; the engine checks again. Named ``images`` are
        composed into one frame per the view point: :mod:`policy_server.media`.
        """
        mode = self.action_mode or ("inverse_dynamics" if obs.video is not None else "policy")
        assert mode in ("policy", "inverse_dynamics"), "merge_session_config admits only the realtime modes"
        action_mode: Literal["policy", "inverse_dynamics"] = "policy" if mode == "policy" else "inverse_dynamics"
        domain = description.domains[self.domain_name]  # checked by merge_session_config
        view_point = self.view_point or domain.view_point
        # The session decoded its encoded frames before asking for its request: arrays only from here.
        image, video = obs.image, obs.video
        assert not isinstance(image, bytes) and not isinstance(video, list), "frames are decoded first"
        if obs.images is not None:
            images = {name: frame for name, frame in obs.images.items() if isinstance(frame, np.ndarray)}
            assert len(images) == len(obs.images), "frames are decoded first"
            image = compose_named(images, view_point)
        horizon = self.action_horizon
        if mode == "inverse_dynamics":
            if video is None:
                raise ProtocolError(
                    ErrorCode.MISSING_FIELD,
                    "inverse_dynamics needs a `video` (T×H×W×3 uint8, action_horizon + 1 frames)",
                    "video",
                    obs.seq,
                )
            frames = video.shape[0]
            if horizon is None:
                _check_horizon(
                    frames - 1,
                    description,
                    "video",
                    obs.seq,
                    f"a {frames}-frame `video` asks for {frames - 1} actions, ",
                )
            elif frames != horizon + 1:
                raise ProtocolError(
                    ErrorCode.INVALID_FIELD,
                    f"inverse_dynamics with action_horizon {horizon} needs a `video` of "
                    f"{horizon + 1} frames, got {frames}",
                    "video",
                    obs.seq,
                )
        if obs.prefix_actions is not None:
            _check_prefix(obs.prefix_actions, mode, horizon or domain.default_horizon, domain.raw_action_dim, obs.seq)
        check_state(obs.state, domain, obs.seq)
        # Unset, the rate is the domain's (15 for DROID), named in the request as the chunk reports it.
        fps = self.fps if self.fps is not None else description.domain_defaults[self.domain_name].fps
        return ActionRequest(
            **{name: getattr(self, name) for name in ENGINE_SETTINGS},  # the settings the model uses, as set
            action_mode=action_mode,  # mode and rate resolved here
            fps=fps,
            image=image,
            video=video,
            prefix_actions=obs.prefix_actions,
            state=obs.state,
        )


def _with_defaults(values: dict[str, Any], description: ModelDescription) -> dict[str, Any]:
    """``values`` (settings by name, ``None`` for unset) with the engine's defaults filled in: the
    domain's own (:attr:`ModelDescription.domain_defaults`: its profile's where it sets them), else the
    model's."""
    domain = description.domain(values.get("domain_name"))
    own = description.domain_defaults[domain.domain_name] if domain is not None else None
    values = dict(values)
    for name in DEFAULTED_SETTINGS:
        if values.get(name) is None:
            values[name] = next(
                (
                    value
                    for value in (getattr(own, name, None), getattr(description.defaults, name))
                    if value is not None
                ),
                None,
            )
    return values


# What an action chunk reports about the settings it was made with, besides what the engine reports
# itself (ActionResult's mode, domain, steps, seed): every other setting that changes the computation.
CHUNK_ECHOED_SETTINGS = tuple(
    s.name for s in REQUEST_SETTINGS if s.in_chunk and s.name not in {f.name for f in dataclasses.fields(ActionResult)}
)


def settings_used(request: ActionRequest, description: ModelDescription) -> dict[str, Any]:
    """The values of :data:`CHUNK_ECHOED_SETTINGS` the engine used for ``request`` (defaults resolved)."""
    values = _with_defaults(
        {name: getattr(request, name) for name in ("domain_name", *CHUNK_ECHOED_SETTINGS)}, description
    )
    return {name: values[name] for name in CHUNK_ECHOED_SETTINGS}


# Of ActionResult's fields, those a chunk reports as they are: all but the actions themselves and the
# engine's accounting (the timing and the batching, which each protocol shows its own way).
_UNREPORTED_RESULT_FIELDS = ("actions", "timing", "transformer_forwards", "batch_size")


def chunk_report(result: ActionResult, request: ActionRequest, description: ModelDescription) -> dict[str, Any]:
    """How ``result`` was made, as a chunk reports it: the engine's own account (ActionResult's fields:
    mode, domain, width, steps, seed), the horizon, and every other setting used (:func:`settings_used`)."""
    report = {
        f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name not in _UNREPORTED_RESULT_FIELDS
    }
    report["action_horizon"] = result.action_horizon
    return {**report, **settings_used(request, description)}


def _check_horizon(value: int, description: ModelDescription, field: str, seq: int | None, what: str = "") -> None:
    horizon = description.action_horizon
    if not horizon.accepts(value):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"{what or ''}action_horizon {value} is out of range: between {horizon.min} and "
            f"{horizon.max}, a multiple of {horizon.multiple_of}",
            field,
            seq,
        )


def _check_prefix(prefix: np.ndarray, mode: str, horizon: int | None, width: int | None, seq: int | None) -> None:
    """Real-time-chunking prefix against the settings (finite float32 is the parser's check)."""
    if mode != "policy":
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`prefix_actions` apply to policy requests only, not {mode}",
            "prefix_actions",
            seq,
        )
    if width is not None and prefix.shape[1] != width:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`prefix_actions` rows must have {width} values (the domain's raw_action_dim), got {prefix.shape[1]}",
            "prefix_actions",
            seq,
        )
    if horizon is not None and prefix.shape[0] >= horizon:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"`prefix_actions` must be shorter than the chunk ({horizon} actions), got {prefix.shape[0]} rows",
            "prefix_actions",
            seq,
        )


def check_state(
    state: np.ndarray | None,
    domain: PolicyProfile,
    seq: int | None = None,
    field: str = "state",
    shown: str | None = None,
) -> None:
    """A parsed state (float32, ``[D]`` or ``[rows, D]``) against the domain's profile, or its absence.

    A domain whose profile has a ``state_dim`` conditions on the robot's state: it needs one, of that
    width, with ``history_length`` rows. Any other domain refuses one (``invalid_field``) rather than
    dropping it. ``field`` names where the state came from (``state``, or an openpi key); ``shown`` is
    how the messages call it when it was built from several keys.
    """
    shown = shown or f"`{field}`"
    if domain.state_dim is None:
        if state is not None:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"domain {domain.domain_name!r} does not condition on the robot's state (its profile has no "
                f"state_dim, see the metadata's `domains`): leave {shown} out",
                field,
                seq,
            )
        return
    rows = domain.history_length or 1
    shape = f"[{domain.state_dim}]" if rows == 1 else f"[{rows}, {domain.state_dim}]"
    if state is None:
        raise ProtocolError(
            ErrorCode.MISSING_FIELD,
            f"domain {domain.domain_name!r} conditions on the robot's state: send {shown}, a float array "
            f"{shape}" + (" (oldest row first)" if rows > 1 else ""),
            field,
            seq,
        )
    matrix = state[None] if state.ndim == 1 else state
    if matrix.shape[1] != domain.state_dim or matrix.shape[0] != rows:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"{shown} has shape {list(state.shape)}; domain {domain.domain_name!r} has state_dim "
            f"{domain.state_dim} and history_length {rows}, so it must be {shape}",
            field,
            seq,
        )


def merge_session_config(
    current: SessionConfig | None, settings: dict[str, Any], description: ModelDescription, seq: int | None = None
) -> SessionConfig:
    """Apply settings (a ``configure`` frame's, or one observation's) over ``current``, checking each
    against the model's ``describe()`` with the engine's own limits, so that nothing accepted here is
    refused later. A ``None`` value unsets that setting (back to the model's default). ``seq`` tags the
    errors of an observation's settings."""
    if "domain_name" in settings and settings["domain_name"] is None:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            "`domain_name` cannot be unset: the embodiment decides the action width",
            "domain_name",
            seq,
        )
    if current is None:
        if "domain_name" not in settings:
            raise ProtocolError(
                ErrorCode.MISSING_FIELD,
                "the first `configure` of a session needs `domain_name` (see `domains` in the metadata)",
                "domain_name",
                seq,
            )
        current = SessionConfig(domain_name=settings["domain_name"])
    unset = {f.name: f.default for f in dataclasses.fields(SessionConfig) if settings.get(f.name, 0) is None}
    config = dataclasses.replace(current, **{**settings, **unset})
    check_settings(dataclasses.asdict(config), description, seq)
    return config


def fixed_session_config(requested: Mapping[str, Any], description: ModelDescription) -> SessionConfig:
    """The session config of a dialect whose clients cannot send settings (openpi, a vla-eval episode):
    the operator's ``requested`` settings by name, on the model's default domain unless they name one."""
    default_domain = description.defaults.domain_name
    settings = {"domain_name": default_domain} if default_domain is not None else {}
    return merge_session_config(None, {**settings, **requested}, description)


def check_settings(
    settings: Mapping[str, Any], description: ModelDescription, seq: int | None = None, *, modes: bool = True
) -> None:
    """The server's one check of request settings against the loaded model, with the engine's own limits:
    sessions (``configure``, an observation's own settings) and the HTTP routes alike call it.

    ``settings`` holds settings by name (those absent or ``None`` are not checked); ``modes``: check
    ``action_mode`` against the realtime modes (a video job's mode is its endpoint's). Raises
    :class:`ProtocolError` naming the field; HTTP answers it as a 400 (``ApiError.of``)."""
    limits, domains = description.limits, description.domains
    domain_name = settings.get("domain_name")
    if domain_name is not None and domain_name not in domains:
        raise ProtocolError(
            ErrorCode.UNKNOWN_DOMAIN,
            f"unknown domain {domain_name!r}; this model knows: {', '.join(sorted(domains)) or 'none'}",
            "domain_name",
            seq,
        )
    action_mode = settings.get("action_mode")
    action_modes = description.action_modes
    if modes and action_mode is not None and action_mode not in action_modes:
        if action_mode == "forward_dynamics":
            hint = "forward_dynamics produces video; use the HTTP /v1/videos API"
        else:
            hint = f"this model serves {', '.join(action_modes) or 'no action modes'} here"
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_MODE,
            f"action_mode {action_mode!r} is not supported: {hint}",
            "action_mode",
            seq,
        )
    tier, tiers = settings.get("resolution_tier"), list(description.resolution_tiers)
    if tier is not None and tiers and tier not in tiers:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_TIER,
            f"resolution_tier {tier} is not supported by this {description.variant or ''} model; choose one of {tiers}",
            "resolution_tier",
            seq,
        )
    view_point, view_points = settings.get("view_point"), list(description.view_points)
    if view_point is not None and view_points and view_point not in view_points:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"unknown view_point {view_point!r}; choose one of {view_points}",
            "view_point",
            seq,
        )
    if settings.get("action_horizon") is not None:
        _check_horizon(settings["action_horizon"], description, "action_horizon", seq)
    prompt, max_prompt = settings.get("prompt"), limits.max_prompt_chars
    if prompt is not None and max_prompt is not None and len(prompt) > max_prompt:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"prompt must be at most {max_prompt} characters, got {len(prompt)}",
            "prompt",
            seq,
        )
    seed, max_seed = settings.get("seed"), limits.max_seed
    if seed is not None and not 0 <= seed <= max_seed:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"seed must be in [0, {max_seed}], got {seed}", "seed", seq)
    _check_schedule(settings.get("num_steps"), settings.get("guidance_scale"), description, seq)
    fps, low_fps, high_fps = settings.get("fps"), limits.min_fps, limits.max_fps
    if fps is not None and not (fps > 0 and low_fps <= fps <= high_fps):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, f"fps must be in [{low_fps:g}, {high_fps:g}], got {fps:g}", "fps", seq
        )
    control_hz = settings.get("control_hz")
    if control_hz is not None and not 0 < control_hz <= MAX_CONTROL_HZ:  # NaN fails too
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"control_hz must be > 0 and at most {MAX_CONTROL_HZ:g}, got {control_hz:g}",
            "control_hz",
            seq,
        )


def _check_schedule(
    steps: int | None, guidance: float | None, description: ModelDescription, seq: int | None = None
) -> None:
    """Steps and guidance: a distilled model's schedule is fixed; a base model's is bounded by the
    engine's limits. Raises :class:`ProtocolError` (``invalid_field``) naming the field."""
    limits = description.limits
    if description.is_distilled:
        fixed = description.defaults.num_steps
        if steps is not None and steps != fixed:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"this distilled model runs its fixed {fixed}-step schedule; num_steps must be {fixed} or unset",
                "num_steps",
                seq,
            )
        if guidance is not None and guidance != 1.0:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                "guidance is distilled into this model's weights; guidance_scale must be 1.0 or unset",
                "guidance_scale",
                seq,
            )
    max_steps = limits.max_steps
    if steps is not None and not (1 <= steps and (max_steps is None or steps <= max_steps)):
        raise ProtocolError(
            ErrorCode.INVALID_FIELD, f"num_steps must be in [1, {max_steps}], got {steps}", "num_steps", seq
        )
    max_guidance = limits.max_guidance_scale
    if guidance is not None and not 0 <= guidance <= max_guidance:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"guidance_scale must be in [0, {max_guidance:g}], got {guidance:g}",
            "guidance_scale",
            seq,
        )


def observation_request(
    config: SessionConfig | None, obs: ObservationFrame, description: ModelDescription
) -> ActionRequest:
    """The engine request for one observation: its own settings over the session's, for it alone.

    Its settings are checked exactly like a ``configure`` (same codes, tagged with its ``seq``). Without
    a session configuration the observation must name its ``domain_name`` itself.
    """
    if config is None and "domain_name" not in obs.overrides:
        raise ProtocolError(
            ErrorCode.NOT_CONFIGURED,
            "send `configure` (with at least `domain_name`) before the first observation, or name `domain_name` "
            "in the observation itself",
            None,
            obs.seq,
        )
    effective = merge_session_config(config, obs.overrides, description, obs.seq) if obs.overrides else config
    assert effective is not None
    return effective.action_request(obs, description)
