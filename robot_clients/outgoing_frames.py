"""What the clients do to camera frames before they go on the wire: shrink them to the served canvas and
encode them, as the client's ``images`` and ``resize`` options say.

``images``: ``"raw"`` (the arrays as they are), ``"jpeg"``, ``"webp"`` or ``"png"`` (quality 90), or an
:class:`~robot_clients.frame_encoding.ImageEncoding` for another quality. ``resize``: shrink every camera
to the size the server would shrink it to anyway (:func:`robot_clients.frame_sizing.send_size` of the
session's resolution tier, from the ``canvases`` of the server's metadata frame), so the link carries
only pixels the model conditions on. Named cameras under the ``concat_view`` view point are sized as the
composed frame the server makes of them (side by side).

Encoding needs Pillow (the ``images`` extra); resizing needs numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from .frame_sizing import canvas_bins, resize_frame, send_size

__all__ = ["OutgoingFrames"]

_CAMERA_FIELDS = ("image", "images", "video")


class OutgoingFrames:
    """A client's image options, applied to each observation's cameras (``prepare``)."""

    def __init__(self, images: Any = "raw", resize: bool = False) -> None:
        self.encoding = None
        if images != "raw":
            from .frame_encoding import ImageEncoding

            self.encoding = images if isinstance(images, ImageEncoding) else ImageEncoding(str(images))
        self.resize = resize
        self._sizes: dict[tuple[Any, ...], tuple[int, int]] = {}

    @property
    def active(self) -> bool:
        return self.encoding is not None or self.resize

    def prepare(
        self,
        obs: Mapping[str, Any],
        metadata: Mapping[str, Any],
        session: Mapping[str, Any],
        settings: Mapping[str, Any],
    ) -> dict[str, Any]:
        """``obs`` with its cameras resized and encoded (a new map; the caller's arrays are not touched).
        ``session``: the server's resolved configuration; ``settings``: this observation's own."""
        fields = dict(obs)
        if not self.active:
            return fields
        view_point = settings.get("view_point") or session.get("view_point")
        tier = (
            settings.get("resolution_tier")
            or session.get("resolution_tier")
            or (metadata.get("defaults") or {}).get("resolution_tier")
        )
        if isinstance(fields.get("image"), np.ndarray):
            fields["image"] = self._frame(fields["image"], metadata, tier, 1)
        if isinstance(fields.get("video"), np.ndarray):
            fields["video"] = [self._frame(frame, metadata, tier, 1) for frame in fields["video"]]
            if self.encoding is None:
                fields["video"] = np.stack(fields["video"])
        if isinstance(fields.get("images"), Mapping):
            cameras = fields["images"]
            side_by_side = len(cameras) if view_point == "concat_view" else 1
            fields["images"] = {
                name: self._frame(frame, metadata, tier, side_by_side) if isinstance(frame, np.ndarray) else frame
                for name, frame in cameras.items()
            }
        return fields

    def _size(self, frame: np.ndarray, metadata: Mapping[str, Any], tier: Any, side_by_side: int) -> tuple[int, int]:
        height, width = frame.shape[:2]
        key = (height, width, tier, side_by_side)
        if key not in self._sizes:
            canvases = metadata.get("canvases")
            if not canvases or tier is None:
                raise ValueError(
                    "resize=True needs the server's canvases and resolution tier in its metadata frame "
                    "(servers with encoded-frame support send them); pass resize=False"
                )
            size = send_size(height, width * side_by_side, canvas_bins(canvases, int(tier)), side_by_side=side_by_side)
            self._sizes[key] = (size.height, size.width // side_by_side)
        return self._sizes[key]

    def _frame(self, frame: np.ndarray, metadata: Mapping[str, Any], tier: Any, side_by_side: int) -> Any:
        size = self._size(frame, metadata, tier, side_by_side) if self.resize else None
        if self.encoding is None:
            return resize_frame(frame, *size) if size is not None and size != frame.shape[:2] else frame
        from .frame_encoding import encode_frame

        return encode_frame(frame, replace(self.encoding, size=size) if size is not None else self.encoding)
