"""Several cameras into the one frame the model conditions on, per the session's view point.

Cosmos3 conditions on one image (or one clip). A robot with several cameras names them; which ones
feed the model, and how, follows the view point the model was trained with:

- ``concat_view``: every named camera, side by side, in the order the robot sent them;
- ``wrist_view``: the first camera whose name contains ``wrist``;
- ``ego_view`` and ``third_person_view``: the first camera whose name does not contain ``wrist``.

A single camera is used as it is. (The openpi endpoint and vla-eval's map their clients' camera names
with an operator-set table instead, each entry a list of :data:`Alternative` s read by
:func:`camera_alternatives`; all compose with :func:`side_by_side`.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from robot_clients.protocol import ErrorCode, ProtocolError

Alternative = tuple[str, ...]  # camera names, composed side by side when more than one


def compose_named(images: Mapping[str, np.ndarray], view_point: str | None) -> np.ndarray:
    """The frame for ``view_point`` from named H×W×3 (or T×H×W×3) frames; raises naming the problem."""
    names = list(images)
    if len(names) == 1:
        return images[names[0]]
    if view_point == "concat_view":
        return side_by_side([images[name] for name in names])
    wants_wrist = view_point == "wrist_view"
    for name in names:
        if ("wrist" in name.lower()) == wants_wrist:
            return images[name]
    kind = "a wrist camera (a name containing 'wrist')" if wants_wrist else "a camera whose name has no 'wrist'"
    raise ProtocolError(
        ErrorCode.INVALID_FIELD,
        f"the {view_point or 'default'} view needs {kind}; got {', '.join(names)} "
        "(or configure view_point 'concat_view' to use them all side by side)",
        "images",
    )


def side_by_side(frames: list[np.ndarray]) -> np.ndarray:
    """Concatenate along width, each resized (nearest neighbour) to the first one's height."""
    height = frames[0].shape[-3]
    resized = []
    for frame in frames:
        h, w = frame.shape[-3], frame.shape[-2]
        if h != height:
            width = max(1, round(w * height / h))
            rows = (np.arange(height) * h // height).clip(0, h - 1)
            cols = (np.arange(width) * w // width).clip(0, w - 1)
            frame = frame[..., rows, :, :][..., :, cols, :]
        resized.append(frame)
    if resized[0].ndim == 4:
        frames_per_clip = {f.shape[0] for f in resized}
        if len(frames_per_clip) != 1:
            raise ProtocolError(ErrorCode.INVALID_IMAGE, "composed camera clips must have the same number of frames")
    return np.ascontiguousarray(np.concatenate(resized, axis=-2))


def camera_alternatives(entry: Any, where: str, error: type[ValueError]) -> tuple[Alternative, ...]:
    """A camera mapping entry as its alternatives, tried in order: one camera name, or a list whose items
    are names or lists of names. ``error`` is the mapping's own error, raised naming ``where``."""
    if isinstance(entry, str):
        entry = [entry]
    if not isinstance(entry, list) or not entry:
        raise error(f"{where} must be a camera name or a non-empty list of alternatives")
    alternatives = []
    for alternative in entry:
        names = [alternative] if isinstance(alternative, str) else alternative
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise error(f"{where}: each alternative is a camera name or a list of them, got {alternative!r}")
        alternatives.append(tuple(names))
    return tuple(alternatives)
