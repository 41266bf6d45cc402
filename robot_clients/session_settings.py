"""The session settings a client frame may carry: their names and types, and how a frame's are read.

``configure`` sets them for every later observation (``null`` unsets one); an observation may carry
them for itself only, except the few that belong to the session as a whole. ``docs/protocol.md`` lists
them for users; keep the two in step. It imports numpy (through the field checks) and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .frame_fields import check_field_type
from .protocol import ErrorCode, ProtocolError

__all__ = [
    "CONFIGURE_FIELDS",
    "OBSERVATION_SETTINGS",
    "SESSION_ONLY_SETTINGS",
    "SESSION_SETTINGS",
    "SETTING_ALIASES",
    "parse_settings",
]

# Session settings, with the Python types each accepts: what `configure` sets for every later
# observation, and what one observation may carry for itself only (docs/protocol.md).
SESSION_SETTINGS: dict[str, tuple[type, ...]] = {
    "action_mode": (str,),
    "domain_name": (str,),
    "action_horizon": (int,),
    "prompt": (str,),
    "resolution_tier": (int,),
    "view_point": (str,),
    "seed": (int,),
    "num_steps": (int,),
    "guidance_scale": (float, int),
    "fps": (float, int),
    "control_hz": (float, int),
}
# The fields `configure` takes (every session setting).
CONFIGURE_FIELDS = SESSION_SETTINGS
# Other names a client may use for a setting: diffusers calls the step count `num_inference_steps`.
SETTING_ALIASES = {"num_inference_steps": "num_steps"}
# Settings of the session as a whole that an observation may not carry, and why.
SESSION_ONLY_SETTINGS = {
    "control_hz": "`control_hz` is the robot's control rate, shown to operators for the whole session; set it "
    "with `configure`",
}
# Settings an observation may carry for itself only.
OBSERVATION_SETTINGS = tuple(name for name in SESSION_SETTINGS if name not in SESSION_ONLY_SETTINGS)


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
                types = SESSION_SETTINGS[name]
                settings[name] = None if frame[alias] is None else _setting(frame, alias, types, seq)
    for name in names:
        if name not in frame:
            continue
        if frame[name] is None:
            if keep_null:
                settings[name] = None
            continue
        settings[name] = _setting(frame, name, SESSION_SETTINGS[name], seq)
    return settings


def _setting(frame: Mapping[str, Any], name: str, types: tuple[type, ...], seq: int | None) -> Any:
    value = check_field_type(frame, name, types, seq)
    if float in types:
        return float(value)
    if name == "action_mode":
        return value.strip().lower()  # " Policy" is what a person typing a config file means by "policy"
    return value
