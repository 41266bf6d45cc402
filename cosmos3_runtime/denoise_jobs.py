"""What the sampler is given and what it gives back: one resolved sampling problem, and its result.

:func:`cosmos3_runtime.validation.job_for_actions` and ``job_for_video`` build a :class:`DenoiseJob` from a
validated request; :class:`cosmos3_runtime.sampling.Cosmos3Sampler` runs it into a :class:`DenoiseOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class DenoiseJob:
    """One fully resolved sampling problem (built by the engine from a validated request)."""

    mode: str  # "policy", "inverse_dynamics" or "forward_dynamics"
    frames: np.ndarray  # (T, H, W, 3) uint8: 1 frame for policy/forward_dynamics, the clip for inverse
    horizon: int
    domain_id: int
    raw_action_dim: int
    prompt: str
    view_point: str
    resolution_tier: int
    fps: float
    sigmas: list[float] | None  # a fixed (distilled) schedule, else None
    num_steps: int
    guidance_scale: float
    guidance_interval: tuple[float, float] | None
    seed: int
    # Normalized clean action frames (K x raw_action_dim) kept fixed from the start of the chunk:
    # the raw actions of forward_dynamics, or the real-time-chunking prefix of a policy request.
    clean_actions: np.ndarray | None = None
    decode_video: bool = False
    prompt_format: str = "json"  # the caption format the checkpoint was trained with (cosmos3_runtime.prompts)
    view_description: str | None = None  # how a composed view is laid out, added to the view sentence
    # Normalized robot state rows (history_length x raw_action_dim), clean action frames placed in front
    # of the chunk; the output drops them.
    state_rows: np.ndarray | None = None

    @property
    def leading_rows(self) -> int:
        return 0 if self.state_rows is None else int(self.state_rows.shape[0])

    @property
    def schedule_key(self) -> tuple[Any, ...]:
        """Jobs with equal keys step through the same timesteps and passes, so they can share forwards."""
        sigmas = tuple(self.sigmas) if self.sigmas is not None else None
        return (sigmas, self.num_steps, self.guidance_scale, self.guidance_interval)


@dataclass
class DenoiseOutput:
    actions: np.ndarray | None  # (horizon, raw_action_dim) float32, model space
    video: np.ndarray | None  # (T, H, W, 3) uint8
    transformer_forwards: int
    num_steps: int
    preprocess_s: float
    encode_s: float
    denoise_s: float
    decode_s: float
    batch_size: int = 1
