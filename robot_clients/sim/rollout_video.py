"""Records a rollout and writes it as a video: the camera on the left, the action chunks on the right.

:class:`RolloutRecorder` is a control-loop :class:`~robot_clients.control_loop.Subscriber` (it keeps each
tick's camera frame and executed action) and an ``on_chunk`` callback of the
:class:`~robot_clients.chunker.ActionChunker` (it keeps every chunk the robot used). The plot
beside each frame shows, for the first few action dimensions over a sliding window of steps: the
actions executed so far (white), the chunk being executed (bright, over the steps it was predicted for)
and the chunks before it (faded), and a marker at the current step. With real-time chunking the bright
curve starts exactly on the white one; with ``replace`` it may start off it.

pillow draws the plots; imageio with its bundled ffmpeg writes the MP4. Both are imported when a video
is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..chunker import ChunkRecord
from ..control_loop import Subscriber

PLOT_COLORS = [(255, 170, 40), (80, 200, 255), (140, 230, 120), (240, 110, 200)]
BACKGROUND = (24, 26, 30)


@dataclass
class RolloutRecorder(Subscriber):
    """Keeps what a video needs. ``camera_key``: which observation field is the frame to show."""

    camera_key: str = "image"
    frames: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    chunks: list[ChunkRecord] = field(default_factory=list)

    def on_episode_start(self) -> None:
        self.frames.clear()
        self.actions.clear()
        self.chunks.clear()

    def on_step(self, observation: dict[str, Any], action: dict[str, Any]) -> None:
        self.frames.append(observation[self.camera_key])
        self.actions.append(np.asarray(action["actions"], dtype=np.float32))

    def on_episode_end(self) -> None:
        pass

    def on_chunk(self, record: ChunkRecord) -> None:
        self.chunks.append(record)

    def write_video(
        self,
        path: str | Path,
        fps: float,
        *,
        dims: int = 4,
        past_steps: int = 40,
        future_steps: int = 20,
        panel_height: int = 448,
        title: str = "",
    ) -> Path:
        """Write the rollout as an H.264 MP4 at ``fps`` (the control rate plays it in real time)."""
        import imageio.v2 as imageio

        if not self.frames:
            raise ValueError("nothing was recorded: no steps")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        executed = np.stack(self.actions)
        dims = min(dims, executed.shape[1])
        ranges = self._value_ranges(executed, dims)
        with imageio.get_writer(
            path, fps=fps, codec="libx264", quality=7, macro_block_size=16, ffmpeg_log_level="error"
        ) as writer:
            for step, frame in enumerate(self.frames):
                camera = _resize(frame, panel_height)
                plot = self._plot(
                    step,
                    executed,
                    dims,
                    ranges,
                    past_steps,
                    future_steps,
                    (camera.shape[1] // 16 * 16 or 16, panel_height),
                    title,
                )
                # imageio's v2 stubs type get_writer() as the base class; the ffmpeg writer has append_data.
                writer.append_data(  # type: ignore[attr-defined]
                    np.concatenate([camera[:, : camera.shape[1] // 16 * 16], plot], axis=1)
                )
        return path

    def _value_ranges(self, executed: np.ndarray, dims: int) -> list[tuple[float, float]]:
        values = [executed[:, :dims]] + [c.actions[:, :dims] for c in self.chunks]
        stacked = np.concatenate(values, axis=0)
        low, high = np.percentile(stacked, 1, axis=0), np.percentile(stacked, 99, axis=0)
        return [(float(lo) - 0.1, float(hi) + 0.1) for lo, hi in zip(low, high)]

    def _plot(
        self,
        step: int,
        executed: np.ndarray,
        dims: int,
        ranges: list[tuple[float, float]],
        past: int,
        future: int,
        size: tuple[int, int],
        title: str,
    ) -> np.ndarray:
        from PIL import Image, ImageDraw

        width, height = size
        image = Image.new("RGB", (width, height), BACKGROUND)
        draw = ImageDraw.Draw(image)
        header, margin = 34, 8
        row_height = (height - header) // dims
        first, last = step - past, step + future

        def x_of(s: float) -> float:
            return margin + (s - first) / (last - first) * (width - 2 * margin)

        visible = [c for c in self.chunks if c.applied_at_step <= step]
        active = visible[-1] if visible else None
        draw.text((margin, 4), title or "executed (white) and predicted chunks", fill=(230, 230, 230))
        info = f"step {step}"
        if active is not None:
            info += f"   chunk #{active.index}: latency {active.latency_s * 1e3:.0f} ms"
            if active.prefix_length:
                info += f", prefix {active.prefix_length}"
        draw.text((margin, 18), info, fill=(170, 170, 170))
        for d in range(dims):
            top = header + d * row_height
            low, high = ranges[d]

            def y_of(v: float, top: float = top, low: float = low, high: float = high) -> float:
                return top + row_height - 4 - (v - low) / (high - low) * (row_height - 8)

            draw.rectangle([margin, top + 2, width - margin, top + row_height - 2], outline=(60, 62, 68))
            draw.text((margin + 4, top + 4), f"a[{d}]", fill=(150, 150, 150))
            for chunk in visible[-4:]:
                color: tuple[int, ...] = PLOT_COLORS[d % len(PLOT_COLORS)]
                if chunk is not active:
                    color = tuple(int(c * 0.35 + b * 0.65) for c, b in zip(color, BACKGROUND))
                steps = chunk.requested_at_step + np.arange(len(chunk.actions))
                keep = (steps >= first) & (steps <= last)
                points = [(x_of(s), y_of(v)) for s, v in zip(steps[keep], chunk.actions[keep, d])]
                if len(points) >= 2:
                    draw.line(points, fill=color, width=2)
            past_steps = np.arange(max(0, first), step + 1)
            points = [(x_of(int(s)), y_of(executed[s, d])) for s in past_steps]
            if len(points) >= 2:
                draw.line(points, fill=(245, 245, 245), width=2)
            x_now = x_of(step)
            draw.line([(x_now, top + 2), (x_now, top + row_height - 2)], fill=(110, 110, 120), width=1)
        return np.asarray(image)


def _resize(frame: np.ndarray, height: int) -> np.ndarray:
    from PIL import Image

    if frame.shape[0] == height:
        return frame
    width = max(16, round(frame.shape[1] * height / frame.shape[0]))
    return np.asarray(Image.fromarray(frame).resize((width, height), Image.Resampling.BILINEAR))
