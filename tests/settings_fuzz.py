"""Hypothesis strategies and the check for "every field is honoured or refused, never dropped".

Shared by the WebSocket fuzz (``test_fuzz_protocols.py``) and the HTTP one-shot tests
(``test_observation_settings.py``). A request is built from a random mix of the session settings, valid
and invalid values, the observation's own fields and the odd unknown field; :func:`check_honoured_or_refused`
then says whether the server's reply honoured every field (its value visible in the reply) or refused
the request naming a field it carried.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from server_fixtures import DOMAIN, rgb_image

IMAGE = rgb_image(64, seed=2)
CLIP = np.stack([IMAGE] * 9)
WIDTH = 10  # raw_action_dim of DOMAIN and droid_lerobot in the tiny checkpoints

# Each setting: (values the model takes, values it refuses). Invalid values are drawn now and then, so
# that most requests run and show their echo while the refusals still get exercised.
SETTING_VALUES: dict[str, tuple[list[Any], list[Any]]] = {
    "domain_name": ([DOMAIN, "droid_lerobot"], ["spaceship", 7]),
    "action_mode": (["policy", " Policy ", "INVERSE_DYNAMICS"], ["forward_dynamics", "dance", 1]),
    "action_horizon": ([4, 8, 16], [7, 0, 1000, 8.0]),
    "prompt": (["", "pick", "ünïcode ✓"], ["x" * 2001, b"bytes"]),
    "resolution_tier": ([256, 480], [333, "256"]),
    "view_point": (["ego_view", "third_person_view", "wrist_view", "concat_view"], ["top"]),
    "seed": ([0, 7, 2**63 - 1], [-1, 2**63, 2**64 - 1]),
    "num_steps": ([4], [2, 10**9, True]),
    "num_inference_steps": ([4], [3]),
    "guidance_scale": ([1.0, 1], [2.0, -1.0, float("nan")]),
    "fps": ([1, 24.0, 240, 7.5], [0.5, 241.0, 1e-300]),
    "control_hz": ([15, 50.0], [0.0, -1]),  # a session setting: configure takes it, an observation refuses it
}
UNKNOWN_FIELDS = ("horizon", "proprio", "actionmode", "camera")
TIMESTAMPS = st.sampled_from(["t0", b"\x01", 3, 2.5, True, 2**64 - 1]) | st.just([1])
PREFIXES = (
    [np.random.default_rng(0).normal(scale=0.05, size=(2, WIDTH)).astype(np.float32)],
    [np.zeros((2, 3), np.float32), np.full((1, WIDTH), np.nan, np.float32), np.zeros((40, WIDTH), np.float32)],
)


# Invalid on the WebSocket (strict msgpack types) but read as a number or text by HTTP's form-friendly
# parsing (a multipart field is always text): left out of HTTP requests, where they are not invalid.
COERCIBLE = ("256", 8.0, b"bytes")


def _value(draw, choices: tuple[list[Any], list[Any]], strict: bool = True) -> Any:
    valid, invalid = choices
    if not strict:
        invalid = [v for v in invalid if not any(v is c or (type(v) is type(c) and v == c) for c in COERCIBLE)]
    return draw(st.sampled_from(invalid if invalid and draw(st.integers(0, 7)) == 0 else valid))


@st.composite
def requests(draw, observation: bool, strict: bool = True) -> dict[str, Any]:
    """A map of fields: some settings (mostly valid, sometimes invalid or null), media, timestamp and
    prefix for an observation, and now and then an unknown field. ``strict``: the WebSocket's typing
    (see :data:`COERCIBLE`)."""
    names = sorted(SETTING_VALUES) if not observation else sorted(set(SETTING_VALUES) - {"control_hz"})
    fields: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(names), max_size=4, unique=True)):
        fields[name] = None if draw(st.integers(0, 6)) == 0 else _value(draw, SETTING_VALUES[name], strict)
    if observation and draw(st.integers(0, 9)) == 0:
        fields["control_hz"] = 15  # known, but not allowed in an observation
    if draw(st.integers(0, 7)) == 0:
        fields[draw(st.sampled_from(UNKNOWN_FIELDS))] = draw(st.sampled_from([1, "x", None, [1]]))
    if observation:
        # Over HTTP, `timestamp` and `images` are unknown fields: sent there only now and then.
        rarely = 1 if strict else 7
        if draw(st.integers(0, rarely)) == 0:
            fields["timestamp"] = draw(TIMESTAMPS)
        inverse = str(fields.get("action_mode", "")).strip().lower() == "inverse_dynamics"
        cameras = ["images"] if draw(st.integers(0, rarely)) == 0 else []
        media = "video" if inverse else draw(st.sampled_from(["image", "image", "video", *cameras]))
        fields[media] = {"image": IMAGE, "video": CLIP, "images": {"front": IMAGE}}[media]
        if media == "video" and fields.get("action_horizon") in (4, 16):
            fields["action_horizon"] = 8  # the clip's 9 frames give 8 actions
        if draw(st.integers(0, 2)) == 0:
            fields["prefix_actions"] = _value(draw, PREFIXES)
    return fields


def _expected(name: str, value: Any) -> tuple[str, Any]:
    """The reply key that shows ``name`` and the value it must show for ``value``."""
    if name == "num_inference_steps":
        return "num_steps", value
    if name == "action_mode":
        return name, value.strip().lower()
    if name in ("fps", "guidance_scale"):
        return name, float(value)
    return name, value


def check_honoured_or_refused(
    sent: dict[str, Any], reply: dict[str, Any], error: dict[str, Any] | None, defaults: dict[str, Any]
) -> None:
    """``reply`` (the chunk's or session's fields) honours every field ``sent``, or ``error`` refused it.

    ``defaults``: what a setting sent as null must show (the session's value, or the model's default).
    """
    if error is not None:
        # Refused: a known code, and the field it names was sent (or is the media, or the session's domain).
        assert error["code"] and error["message"], error
        named = error.get("field")
        if named is not None:
            top = named.split("/", 1)[0]
            alias = top == "num_steps" and "num_inference_steps" in sent
            assert top in sent or alias or top in ("image", "video", "images", "seq", "domain_name"), (
                named,
                sorted(sent),
            )
        return
    unknown = [name for name in sent if name in UNKNOWN_FIELDS]
    assert not unknown, f"accepted a frame with unknown fields {unknown}: {reply}"
    for name, value in sent.items():
        if name in SETTING_VALUES:
            key, shown = _expected(name, value) if value is not None else (name, defaults.get(name))
            if name == "num_inference_steps" and value is None:
                continue  # null alias: absent
            if key in reply and shown is not None:
                assert reply[key] == shown, (name, value, reply[key])
            else:
                assert shown is None or key in reply, (name, value, sorted(reply))
        elif name == "prefix_actions" and "actions" in reply:
            assert np.asarray(reply["actions"], np.float32)[: len(value)].tobytes() == value.tobytes()
        elif name == "timestamp" and value is not None:
            assert reply["timestamp"] == value and type(reply["timestamp"]) is type(value), (value, reply)
