"""Where a validated request becomes tensors: conditioning, the denoising loop, and decoding.

This is diffusers' ``Cosmos3OmniPipeline`` action path, driven step by step through the pipeline's own
components and helpers (its video processor, VAE encode, tokenizer and prompt templates, sequence
packing, velocity masking, scheduler and transformer). Nothing here re-implements the network. What the
serving runtime changes, and why:

- **Encode only what conditions the model.** For ``policy`` and ``forward_dynamics`` the pipeline pads
  the single conditioning image into a (horizon + 1)-frame clip and VAE-encodes all of it, then keeps
  only latent frame 0 and replaces the rest with noise. The Wan VAE is causal in time, so encoding the
  conditioning frame alone yields the same first latent; that encode was ~90 % of a tiny policy chunk.
- **Distilled schedules.** The checkpoint's fixed sigma list is used as is (the scheduler's shift is
  neutralised at load), one transformer forward per step, and the request's generator is passed to the
  stochastic scheduler step so a seed reproduces a chunk.
- **Re-anchoring.** After every step the conditioned vision frames and clean action frames are put
  back to their clean values; a stochastic (SDE) step would otherwise drift them.
- **Guidance interval.** Classifier-free guidance only on the steps whose sigma lies inside the
  interval; one forward elsewhere.
- **No decode for action modes.** Action chunks come from the action stream; the VAE decoder is only
  called for ``forward_dynamics`` video.
"""

from __future__ import annotations

import copy
import inspect
from functools import cached_property
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from diffusers.utils.torch_utils import randn_tensor

from .prefix_cache import PrefixEntry, PrefixMode, TextPrefixCache, generation_only, install_prefix_processors

_TOKEN_CACHE_SIZE = 64


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


@dataclass
class _Pass:
    """One of the (at most two) transformer passes per step: cond, and uncond under guidance."""

    name: str
    key: tuple[int, ...]
    full: dict  # the whole joint sequence
    entry: PrefixEntry | None = None  # the text keys/values, once known

    @cached_property
    def generation_only(self) -> dict:
        return generation_only(self.full)


class Cosmos3Sampler:
    """Runs :class:`DenoiseJob` s on a loaded ``Cosmos3OmniPipeline``. One thread at a time.

    With ``prefix_cache_bytes > 0`` the text tokens' per-layer keys and values are computed once per
    token sequence and reused (see :mod:`cosmos3_runtime.prefix_cache`).
    """

    def __init__(self, pipe, device: torch.device, prefix_cache_bytes: int = 0):
        self.pipe = pipe
        self.device = device
        self.transformer = pipe.transformer
        self.prefix_cache = TextPrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self._prefix_state = install_prefix_processors(self.transformer) if self.prefix_cache is not None else None
        self._token_cache: OrderedDict[tuple, tuple[list[int], list[int]]] = OrderedDict()
        self._step_takes_generator = "generator" in inspect.signature(pipe.scheduler.step).parameters

    # ------------------------------------------------------------------ conditioning

    def preprocess(self, frames: np.ndarray, tier: int, num_frames: int):
        """uint8 frames -> the pipeline's padded canvas in [-1, 1], plus the canvas and content sizes."""
        clip = frames.astype(np.float32) / 255.0  # the video processor expects floats in [0, 1]
        vision, image_size, canvas_h, canvas_w = self.pipe._prepare_action_video_conditioning(
            clip, tier, num_frames, device=self.device, dtype=torch.float32
        )
        return vision, image_size, canvas_h, canvas_w

    def encode(self, vision: torch.Tensor, image_size: torch.Tensor) -> torch.Tensor:
        """VAE-encode a preprocessed clip to normalized latents with the canvas padding removed."""
        latents = self.pipe._encode_video(vision).contiguous().float()
        return self.pipe._remove_action_video_padding_from_latent(latents, image_size)

    def tokenize(self, prompt: str, horizon: int, canvas_h: int, canvas_w: int, fps: float, mode: str, view_point: str):
        """Token ids of the structured action caption (cached: the same settings recur every tick)."""
        key = (prompt, horizon, canvas_h, canvas_w, fps, mode, view_point)
        ids = self._token_cache.get(key)
        if ids is None:
            ids = self.pipe.tokenize_prompt(
                prompt,
                None,
                num_frames=horizon + 1,
                height=canvas_h,
                width=canvas_w,
                fps=fps,
                action_mode=mode,
                action_view_point=view_point,
            )
            self._token_cache[key] = ids
            if len(self._token_cache) > _TOKEN_CACHE_SIZE:
                self._token_cache.popitem(last=False)
        else:
            self._token_cache.move_to_end(key)
        return ids

    # ------------------------------------------------------------------ the loop

    @torch.no_grad()
    def run(self, job: DenoiseJob, clock) -> DenoiseOutput:
        """Condition, denoise and (for video) decode one job. ``clock()`` returns seconds."""
        pipe, device = self.pipe, self.device
        num_frames = job.horizon + 1
        temporal = pipe.vae_scale_factor_temporal
        latent_t = (num_frames - 1) // temporal + 1

        t0 = clock()
        if job.mode == "inverse_dynamics":
            vision, image_size, canvas_h, canvas_w = self.preprocess(job.frames, job.resolution_tier, num_frames)
            preprocess_s, t0 = clock() - t0, clock()
            x0_vision = self.encode(vision, image_size)
            vision_condition_frames = list(range(latent_t))
        else:
            # Causal VAE: the first latent of the padded clip is the encoding of frame 0 alone.
            vision, image_size, canvas_h, canvas_w = self.preprocess(job.frames[:1], job.resolution_tier, 1)
            preprocess_s, t0 = clock() - t0, clock()
            first = self.encode(vision, image_size)
            x0_vision = first.new_zeros((*first.shape[:2], latent_t, *first.shape[3:]))
            x0_vision[:, :, :1] = first
            vision_condition_frames = [0]
        encode_s = clock() - t0

        t0 = clock()
        generator = torch.Generator(device=device).manual_seed(job.seed)
        cond_ids, uncond_ids = self.tokenize(
            job.prompt, job.horizon, canvas_h, canvas_w, job.fps, job.mode, job.view_point
        )
        use_cfg = job.guidance_scale != 1.0

        vision_mask = torch.zeros((latent_t, 1, 1), device=device)
        vision_mask[vision_condition_frames] = 1.0
        noise = randn_tensor(tuple(x0_vision.shape), generator=generator, device=device, dtype=torch.float32)
        latents = vision_mask * x0_vision + (1.0 - vision_mask) * noise

        action_dim = self.transformer.config.action_dim
        x0_action = torch.zeros((job.horizon, action_dim), device=device)
        clean_frames: list[int] = []
        if job.clean_actions is not None:
            k = job.clean_actions.shape[0]
            x0_action[:k, : job.raw_action_dim] = torch.from_numpy(job.clean_actions).to(device)
            clean_frames = list(range(k))
        action_mask = torch.zeros((job.horizon, 1), device=device)
        action_mask[clean_frames] = 1.0
        action_noise = randn_tensor((job.horizon, action_dim), generator=generator, device=device, dtype=torch.float32)
        action_latents = action_mask * x0_action + (1.0 - action_mask) * action_noise
        action_latents[:, job.raw_action_dim :] = 0
        domain_id = torch.tensor([job.domain_id], dtype=torch.long, device=device)

        cond = self._pass("cond", cond_ids, latents, action_latents, vision_condition_frames, clean_frames, job.fps)
        uncond = (
            self._pass("uncond", uncond_ids, latents, action_latents, vision_condition_frames, clean_frames, job.fps)
            if use_cfg
            else None
        )

        scheduler = copy.deepcopy(pipe.scheduler)
        if job.sigmas is not None:
            scheduler.set_timesteps(sigmas=list(job.sigmas), device=device)
        elif pipe.config.use_native_flow_schedule:
            sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, job.num_steps + 1)[:-1]
            scheduler.set_timesteps(job.num_steps, device=device, sigmas=sigmas)
        else:
            scheduler.set_timesteps(job.num_steps, device=device)
        action_scheduler = copy.deepcopy(scheduler)
        step_kwargs = {"generator": generator} if self._step_takes_generator else {}

        forwards = 0
        has_noisy_action = len(clean_frames) < job.horizon
        for i, t in enumerate(scheduler.timesteps):
            sigma = float(scheduler.sigmas[i])
            v_vision, v_action = self._velocity(cond, latents, action_latents, domain_id, t, i, sigma,
                                                vision_mask, action_mask, job.raw_action_dim, len(scheduler.timesteps))
            forwards += 1
            if use_cfg and _inside(sigma, job.guidance_interval):
                u_vision, u_action = self._velocity(uncond, latents, action_latents, domain_id, t, i,
                                                    sigma, vision_mask, action_mask, job.raw_action_dim,
                                                    len(scheduler.timesteps))
                forwards += 1
                v_vision = u_vision + job.guidance_scale * (v_vision - u_vision)
                v_action = u_action + job.guidance_scale * (v_action - u_action)

            latents = scheduler.step(v_vision.unsqueeze(0), t, latents.unsqueeze(0), return_dict=False,
                                     **step_kwargs)[0].squeeze(0)
            latents = vision_mask * x0_vision + (1.0 - vision_mask) * latents
            if has_noisy_action:
                action_latents = action_scheduler.step(v_action.unsqueeze(0), t, action_latents.unsqueeze(0),
                                                       return_dict=False, **step_kwargs)[0].squeeze(0)
                action_latents = action_mask * x0_action + (1.0 - action_mask) * action_latents
                action_latents[:, job.raw_action_dim :] = 0
        denoise_s = clock() - t0

        video, decode_s = None, 0.0
        if job.decode_video:
            t0 = clock()
            video = self._decode(latents)
            decode_s = clock() - t0
        actions = None
        if job.mode != "forward_dynamics":
            actions = action_latents[:, : job.raw_action_dim].float().cpu().numpy()
        return DenoiseOutput(actions, video, forwards, len(scheduler.timesteps), preprocess_s, encode_s, denoise_s, decode_s)

    def _pass(self, name, input_ids, latents, action_latents, vision_frames, clean_action_frames, fps) -> _Pass:
        full = self._pack(input_ids, latents, action_latents, vision_frames, clean_action_frames, fps)
        key = tuple(input_ids)
        entry = self.prefix_cache.get(key) if self.prefix_cache is not None else None
        return _Pass(name, key, full, entry)

    def _pack(self, input_ids, latents, action_latents, vision_frames, clean_action_frames, fps):
        """The step-invariant part of the joint sequence, built by the pipeline's own segment helpers."""
        pipe = self.pipe
        text = pipe._prepare_text_segment(input_ids, device=self.device)
        vision = pipe._prepare_vision_segment(
            input_vision_tokens=latents,
            has_image_condition=True,
            mrope_offset=text["vision_start_temporal_offset"],
            vision_fps=fps,
            curr=text["und_len"],
            device=self.device,
            condition_frame_indexes=vision_frames,
        )
        action = pipe._prepare_action_segment(
            input_action_tokens=action_latents,
            condition_frame_indexes=clean_action_frames,
            mrope_offset=text["vision_start_temporal_offset"],
            action_fps=fps,
            curr=text["und_len"] + vision["num_vision_tokens"],
            device=self.device,
        )
        return {
            **text,
            **vision,
            **action,
            "position_ids": torch.cat([text["text_mrope_ids"], vision["vision_mrope_ids"], action["action_mrope_ids"]], 1),
            "sequence_length": text["und_len"] + vision["num_vision_tokens"] + action["action_len"],
        }

    def _velocity(self, p: _Pass, latents, action_latents, domain_id, t, step, sigma, vision_mask, action_mask,
                  raw_action_dim, num_steps):
        """One transformer forward; returns float32 velocities with conditioned positions zeroed."""
        pack, recording = p.full, None
        if self.prefix_cache is not None:
            if p.entry is not None:
                self._prefix_state.mode, self._prefix_state.entry = PrefixMode.REPLAY, p.entry
                pack = p.generation_only
            else:
                recording = PrefixEntry()
                self._prefix_state.mode, self._prefix_state.entry = PrefixMode.RECORD, recording
        try:
            preds_vision, preds_action = self._forward(pack, p.name, latents, action_latents, domain_id, t, step,
                                                       sigma, num_steps)
        finally:
            if self._prefix_state is not None:
                self._prefix_state.mode, self._prefix_state.entry = PrefixMode.OFF, None
        if recording is not None:
            p.entry = recording
            self.prefix_cache.put(p.key, recording)
        v_vision, _, v_action = self.pipe._mask_velocity_predictions(
            preds_vision,
            None,
            vision_condition_mask=[vision_mask],
            preds_action=preds_action,
            action_condition_mask=[action_mask],
            raw_action_dim=raw_action_dim,
        )
        return v_vision.float(), v_action.float()

    def _forward(self, pack, name, latents, action_latents, domain_id, t, step, sigma, num_steps):
        dtype = self.transformer.dtype
        timestep = t.item()
        with self.transformer.cache_context(name, step_index=step, sigma=sigma, num_inference_steps=num_steps):
            preds_vision, _, preds_action = self.transformer(
                input_ids=pack["input_ids"],
                text_indexes=pack["text_indexes"],
                position_ids=pack["position_ids"],
                und_len=pack["und_len"],
                sequence_length=pack["sequence_length"],
                vision_tokens=[latents.to(dtype)],
                vision_token_shapes=pack["vision_token_shapes"],
                vision_sequence_indexes=pack["vision_sequence_indexes"],
                vision_mse_loss_indexes=pack["vision_mse_loss_indexes"],
                vision_timesteps=torch.full((pack["num_noisy_vision_tokens"],), timestep, device=self.device),
                vision_noisy_frame_indexes=pack["vision_noisy_frame_indexes"],
                action_tokens=[action_latents.to(dtype)],
                action_token_shapes=pack["action_token_shapes"],
                action_sequence_indexes=pack["action_sequence_indexes"],
                action_mse_loss_indexes=pack["action_mse_loss_indexes"],
                action_timesteps=torch.full((pack["num_noisy_action_tokens"],), timestep, device=self.device),
                action_noisy_frame_indexes=pack["action_noisy_frame_indexes"],
                action_domain_ids=[domain_id],
                return_dict=False,
            )
        return preds_vision, preds_action

    def _decode(self, latents: torch.Tensor) -> np.ndarray:
        """Denormalize and VAE-decode vision latents to uint8 frames (T, H, W, 3)."""
        pipe = self.pipe
        vae_dtype = pipe.vae.dtype
        mean = pipe._vae_latents_mean.to(device=latents.device, dtype=vae_dtype).view(1, -1, 1, 1, 1)
        inv_std = pipe._vae_latents_inv_std.to(device=latents.device, dtype=vae_dtype).view(1, -1, 1, 1, 1)
        decoded = pipe.vae.decode(latents.to(vae_dtype) / inv_std + mean).sample.float()
        frames = pipe.video_processor.postprocess_video(decoded, output_type="np")[0]
        return (np.clip(frames, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _inside(sigma: float, interval: tuple[float, float] | None) -> bool:
    return interval is None or interval[0] <= sigma <= interval[1]
