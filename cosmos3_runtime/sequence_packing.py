"""One job's joint sequence: [text][vision][action] tokens with their positions, packed once per job.

The sequence is built by diffusers' own segment helpers (``Cosmos3OmniPipeline._prepare_text_segment``,
``_prepare_vision_segment``, ``_prepare_action_segment``); it does not change across denoising steps, so
the sampler builds it once per pass (cond, and uncond under guidance) of a job. Two changes of the
serving runtime: robot state rows get cosmos-framework's positions (:func:`state_action_positions`), and a
pass whose text keys/values the prefix cache holds can drop its text segment
(:attr:`SequencePass.generation_only`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import get_3d_mrope_ids_vae_tokens

from .denoise_jobs import DenoiseJob
from .prefix_cache import PrefixEntry

# Pack fields holding positions in the joint sequence; they move when items are packed together.
_SEQUENCE_INDEX_FIELDS = (
    "vision_sequence_indexes",
    "vision_mse_loss_indexes",
    "action_sequence_indexes",
    "action_mse_loss_indexes",
)


@dataclass
class SequencePass:
    """One transformer pass of one job (cond, or uncond under guidance) and its text prefix."""

    key: tuple[int, ...]
    full: dict[str, Any]  # the job's whole joint sequence, as the pipeline's segment helpers build it
    entry: PrefixEntry | None = None  # the text keys/values, once known
    _generation_only: dict[str, Any] | None = None

    @property
    def generation_only(self) -> dict[str, Any]:
        """The same inputs with the text segment removed (its keys/values come from the cache)."""
        if self._generation_only is None:
            und_len = self.full["und_len"]
            shifted = {k: self.full[k] - und_len for k in _SEQUENCE_INDEX_FIELDS}
            self._generation_only = {
                **self.full,
                **shifted,
                "input_ids": self.full["input_ids"][:0],
                "text_indexes": self.full["text_indexes"][:0],
                "und_len": 0,
                "position_ids": self.full["position_ids"][:, und_len:],
                "sequence_length": self.full["sequence_length"] - und_len,
            }
        return self._generation_only


def pack_sequence(
    pipe: Any,
    device: torch.device,
    input_ids: list[int],
    latents: torch.Tensor,
    action_latents: torch.Tensor,
    vision_frames: list[int],
    clean_action_frames: list[int],
    job: DenoiseJob,
) -> dict[str, Any]:
    """The step-invariant part of one job's joint sequence, built by the pipeline's own segment helpers."""
    fps = job.fps
    text = pipe._prepare_text_segment(input_ids, device=device)
    vision = pipe._prepare_vision_segment(
        input_vision_tokens=latents,
        has_image_condition=True,
        mrope_offset=text["vision_start_temporal_offset"],
        vision_fps=fps,
        curr=text["und_len"],
        device=device,
        condition_frame_indexes=vision_frames,
    )
    action = pipe._prepare_action_segment(
        input_action_tokens=action_latents,
        condition_frame_indexes=clean_action_frames,
        mrope_offset=text["vision_start_temporal_offset"],
        action_fps=fps,
        curr=text["und_len"] + vision["num_vision_tokens"],
        device=device,
    )
    if job.leading_rows:
        action["action_mrope_ids"] = state_action_positions(
            pipe, device, action["action_len"], job.leading_rows, text["vision_start_temporal_offset"], fps
        )
    return {
        **text,
        **vision,
        **action,
        "position_ids": torch.cat([text["text_mrope_ids"], vision["vision_mrope_ids"], action["action_mrope_ids"]], 1),
        "sequence_length": text["und_len"] + vision["num_vision_tokens"] + action["action_len"],
    }


def state_action_positions(
    pipe: Any, device: torch.device, action_len: int, leading_rows: int, mrope_offset: int, fps: float
) -> torch.Tensor:
    """mRoPE ids of an action segment whose first ``leading_rows`` rows are the robot's state rows.

    diffusers places action row 0 at video frame 1: the first action follows the conditioning frame.
    cosmos-framework places state rows before that, at frames ``1 - leading_rows`` .. 0 (with
    ``use_state`` the current state sits at the conditioning frame 0), so the chunk still starts at
    frame 1: its sequence plan's ``action_start_frame_offset`` is ``1 - leading_rows``. This is the call
    ``Cosmos3OmniPipeline._prepare_action_segment`` makes, with that offset.
    """
    config = pipe.transformer.config
    ids, _ = get_3d_mrope_ids_vae_tokens(
        grid_t=action_len,
        grid_h=1,
        grid_w=1,
        temporal_offset=mrope_offset,
        reset_spatial_indices=config.unified_3d_mrope_reset_spatial_ids,
        fps=fps if config.enable_fps_modulation else None,
        base_fps=float(config.base_fps),
        temporal_compression_factor=1,
        base_temporal_compression_factor=pipe.vae_scale_factor_temporal,
        start_frame_offset=1 - leading_rows,
    )
    positions: torch.Tensor = ids.to(device)
    return positions
