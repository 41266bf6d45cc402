"""A session's settings: what a ``configure`` frame sets and every later observation inherits.

An observation may carry any setting for itself only (:func:`observation_request`): it is merged over
the session's and checked the same way. The rules and defaults of the settings have one keeper, the
loaded model's description (:meth:`~cosmos3_runtime.description.ModelDescription.check` and ``resolve``):
this module asks it as soon as settings arrive, so a robot learns that its domain, tier or prompt length
is wrong from the ``configure`` reply (or at once for an observation), never as a failure of every later
observation, and maps the runtime's typed errors onto the protocol's codes. What it keeps is the
session's own: its fields, the merge, and the robot's declared control rate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import numpy as np

from cosmos3_runtime.description import Media, ModelDescription
from cosmos3_runtime.errors import RuntimeErrorBase
from cosmos3_runtime.profiles import STATE_CONTRACT_FIELDS, PolicyProfile
from cosmos3_runtime.requests import SETTING_NAMES, ActionRequest, ActionResult, DomainRequest, ResolvedSettings
from robot_clients.client_frames import REQUEST_SETTINGS, ObservationFrame
from robot_clients.protocol import ErrorCode, ProtocolError

from .engine.request_queue import engine_error_code
from .foundation.camera_intake import compose_named

# The fastest control loop a robot may declare (Hz): a 1 kHz torque loop fits with room to spare; beyond
# it the figure is a mistake (1e308 would be shown to operators as the session's rate).
MAX_CONTROL_HZ = 10_000.0


@dataclass(frozen=True)
class SessionConfig(DomainRequest):
    """Settings of one session: the engine's request settings for its domain (``None``: the model's default for
    this variant and domain), and the session's own, the mode, the horizon and the robot's control rate."""

    # None: each observation's media decide, ``policy`` for an image, ``inverse_dynamics`` for a video.
    action_mode: str | None = None
    action_horizon: int | None = None
    # The robot's control rate, as the robot declares it: shown to operators, never used by the model.
    control_hz: float | None = None

    def settings(
        self, description: ModelDescription, media: Media | None = None, seq: int | None = None
    ) -> ResolvedSettings:
        """What the engine will run these settings with, asked of the model's description once
        (:func:`resolve_settings`): every setting checked and its default filled in, and, given an observation's
        ``media``, its mode and the medium that mode needs."""
        return resolve_settings(vars(self), description, media, seq)

    def resolved(self, description: ModelDescription) -> dict[str, Any]:
        """The values the engine will use, defaults filled in: what the ``session`` reply shows."""
        # Not asdict, which deep-copies: the fields are scalars and a tuple, and every session reply is built here.
        values: dict[str, Any] = dict(vars(self))
        domain = description.domain(self.domain_name)
        if domain is None:  # a session config names a known domain; anything else shows as set
            return {**values, "domain_id": None, "raw_action_dim": None, **dict.fromkeys(STATE_CONTRACT_FIELDS)}
        return self.shown(self.settings(description), description)

    def shown(self, resolved: ResolvedSettings, description: ModelDescription) -> dict[str, Any]:
        """``resolved`` (:meth:`settings`) as the ``session`` reply shows it: with the session's own settings,
        the mode as set (unset: each observation's media decide), the domain's id and action width, and
        whether observations must carry ``state``, and its shape."""
        domain = description.domains[resolved.domain_name]
        return {
            **vars(self),
            **resolved.as_json(),
            "action_mode": self.action_mode,
            "domain_id": domain.domain_id,
            "raw_action_dim": domain.raw_action_dim,
            **domain.state_contract,
        }

    def action_request(
        self, obs: ObservationFrame, description: ModelDescription, resolved: ResolvedSettings | None = None
    ) -> ActionRequest:
        """The engine request for one observation under these (already merged) settings.

        The model's description judges the observation once (:meth:`settings`, with its media as sent): its
        settings, its media against its mode (the mode, when unset, follows the media: a ``video`` asks for
        ``inverse_dynamics``), the view point. ``resolved``: that answer, where the door asked for it before it
        decoded the media (the sidecar). What else the server can judge about the media against the settings
        (the clip's horizon, prefix actions, the state) is checked here by the model's rules, so that it is
        refused with the same codes as a bad ``configure``; the engine checks again. Named ``images`` are
        composed into one frame per the view point: :mod:`policy_server.foundation.camera_intake`.
        """
        # The session decoded its encoded frames before asking for its request: arrays only from here.
        image, video = obs.image, obs.video
        assert not isinstance(image, bytes) and not isinstance(video, list), "frames are decoded first"
        if resolved is None:
            sent = Media(image=image is not None or obs.images is not None, video=video is not None)
            resolved = self.settings(description, sent, obs.seq)
        mode, horizon = resolved.action_mode, resolved.action_horizon
        assert mode in ("policy", "inverse_dynamics"), "the description resolves only modes answered with actions"
        action_mode: Literal["policy", "inverse_dynamics"] = "policy" if mode == "policy" else "inverse_dynamics"
        domain = description.domains[resolved.domain_name]
        if obs.images is not None:
            images = {name: frame for name, frame in obs.images.items() if isinstance(frame, np.ndarray)}
            assert len(images) == len(obs.images), "frames are decoded first"
            image = compose_named(images, resolved.view_point)
        if mode == "inverse_dynamics":  # the clip decides the horizon: its frames are known now
            assert video is not None, "the description refuses inverse_dynamics without a video"
            horizon = _mapped(description.clip_horizon, video.shape[0], self.action_horizon, seq=obs.seq)
        if obs.prefix_actions is not None:
            _mapped(domain.check_prefix, obs.prefix_actions, mode, horizon, seq=obs.seq)
        check_state(obs.state, domain, obs.seq)
        return ActionRequest(
            # The settings the model uses, as set; the rate resolved (unset, the domain's: 15 for DROID), named in
            # the request as the chunk reports it.
            **{**self.named_settings(), "fps": resolved.fps},
            action_mode=action_mode,
            action_horizon=self.action_horizon,
            image=image,
            video=video,
            prefix_actions=obs.prefix_actions,
            state=obs.state,
        )


def resolve_settings(
    settings: Mapping[str, Any],
    description: ModelDescription,
    media: Media | None = None,
    seq: int | None = None,
    *,
    output: str = "actions",
) -> ResolvedSettings:
    """``settings`` (by name; the session's own, ``control_hz``, are left out) as the model's description
    resolves them (:meth:`~cosmos3_runtime.description.ModelDescription.resolve`, the one keeper of a request's
    settings and shape), its typed errors as the protocol's, tagged ``seq``."""
    resolved: ResolvedSettings = _mapped(
        partial(description.resolve, output=output), _model_settings(settings), media, seq=seq
    )
    return resolved


def request_config(
    settings: Mapping[str, Any], description: ModelDescription, media: Media | None = None
) -> tuple[SessionConfig, ResolvedSettings]:
    """Settings that are not a session's merge (a one-shot request of the sidecar, with its ``media`` as sent;
    a dialect's fixed settings, without media) asked of the model's description once: as a session config (on
    the model's default domain unless they name one) and resolved."""
    resolved = resolve_settings(settings, description, media)
    _check_control_hz(settings, None)
    return _merged(None, {**settings, "domain_name": resolved.domain_name}, None), resolved


# The settings the model's rules take, as a set: every observation's settings are filtered by it.
MODEL_SETTINGS = frozenset(SETTING_NAMES)


def _model_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Of ``values`` (settings by name), those the model's rules take: not the session's own (control_hz)."""
    return {name: value for name, value in values.items() if name in MODEL_SETTINGS}


def _mapped(rule: Callable[..., Any], *args: Any, seq: int | None) -> Any:
    """``rule(*args)``, a rule of the model's description, its typed errors as the protocol's: the code the
    engine's errors map to (:func:`~policy_server.engine.request_queue.engine_error_code`), tagged ``seq``."""
    try:
        return rule(*args)
    except RuntimeErrorBase as exc:
        raise ProtocolError(engine_error_code(exc), exc.message, exc.field, seq) from None


# What an action chunk reports about the settings it was made with, by the wire table.
CHUNK_ECHOED_SETTINGS = frozenset(setting.name for setting in REQUEST_SETTINGS if setting.in_chunk)


def settings_used(result: ActionResult) -> dict[str, Any]:
    """The settings an action chunk reports (:data:`CHUNK_ECHOED_SETTINGS`) as the engine ran ``result`` with
    them, defaults resolved (:attr:`ActionResult.settings`)."""
    return {name: value for name, value in result.settings.as_json().items() if name in CHUNK_ECHOED_SETTINGS}


def chunk_report(result: ActionResult) -> dict[str, Any]:
    """How ``result`` was made, as a chunk reports it: the settings it ran with (:func:`settings_used`), its
    horizon, the domain id that selected the action head and the action width."""
    return {
        **settings_used(result),
        "action_horizon": result.action_horizon,
        "domain_id": result.domain_id,
        "raw_action_dim": result.raw_action_dim,
    }


def check_state(
    state: np.ndarray | None,
    domain: PolicyProfile,
    seq: int | None = None,
    field: str = "state",
    shown: str | None = None,
) -> None:
    """A parsed state against the domain's profile, or its absence: the profile's own rule
    (:meth:`~cosmos3_runtime.profiles.PolicyProfile.check_state`), its errors as the protocol's, naming
    ``field`` (``state``, or the openpi key it came from); ``shown``: the keys it was built from."""
    try:
        domain.check_state(state)
    except RuntimeErrorBase as exc:
        message = exc.message if shown is None else f"{exc.message} (the state is sent as {shown})"
        raise ProtocolError(engine_error_code(exc), message, field, seq) from None


def merge_session_config(
    current: SessionConfig | None, settings: dict[str, Any], description: ModelDescription, seq: int | None = None
) -> SessionConfig:
    """Apply settings (a ``configure`` frame's) over ``current``, checking each against the model's
    ``describe()`` with the engine's own limits, so that nothing accepted here is refused later. A ``None``
    value unsets that setting (back to the model's default). ``seq`` tags the errors."""
    config = _merged(current, settings, seq)
    check_settings(vars(config), description, seq)
    return config


def _merged(current: SessionConfig | None, settings: dict[str, Any], seq: int | None) -> SessionConfig:
    """``settings`` over ``current``, not yet checked: the session's own rules of a merge (a first one names its
    domain; the domain cannot be unset)."""
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
    return dataclasses.replace(current, **{**settings, **unset})


def fixed_session_config(requested: Mapping[str, Any], description: ModelDescription) -> SessionConfig:
    """The session config of a dialect whose clients cannot send settings (openpi, a vla-eval episode):
    the operator's ``requested`` settings by name, on the model's default domain unless they name one."""
    if "domain_name" not in requested and description.defaults.domain_name is None:
        # No domain to take (a checkpoint without an action head): refused as a first configure naming none.
        return merge_session_config(None, dict(requested), description)
    return request_config(requested, description)[0]


def check_settings(settings: Mapping[str, Any], description: ModelDescription, seq: int | None = None) -> None:
    """A session's settings checked by the model's own rules (:meth:`ModelDescription.check`), as ``configure``
    asks, plus the session's own ``control_hz``.

    ``settings`` holds settings by name (those absent or ``None`` are not checked). Raises
    :class:`ProtocolError` naming the field."""
    _mapped(description.check, _model_settings(settings), seq=seq)
    _check_control_hz(settings, seq)


def _check_control_hz(settings: Mapping[str, Any], seq: int | None) -> None:
    """The robot's declared control rate, the one setting that is the session's own."""
    control_hz = settings.get("control_hz")
    if control_hz is not None and not 0 < control_hz <= MAX_CONTROL_HZ:  # NaN fails too
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"control_hz must be > 0 and at most {MAX_CONTROL_HZ:g}, got {control_hz:g}",
            "control_hz",
            seq,
        )


def observation_request(
    config: SessionConfig | None, obs: ObservationFrame, description: ModelDescription
) -> ActionRequest:
    """The engine request for one observation: its own settings over the session's, for it alone.

    Its settings are checked by the same rules as a ``configure`` (same codes, tagged with its ``seq``). Without
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
    # Merged unchecked: the request's one resolve checks the merged settings (same codes, tagged with its seq).
    effective = _merged(config, obs.overrides, obs.seq) if obs.overrides else config
    assert effective is not None
    return effective.action_request(obs, description)
