"""Where a validated request becomes tensors: conditioning, the denoising loop, and decoding.

This is diffusers' ``Cosmos3OmniPipeline`` action path, driven step by step through the pipeline's own
components and helpers (its VAE encode, tokenizer and prompt templates, sequence packing, velocity
masking, scheduler and transformer). Nothing here re-implements the network. What the
serving runtime changes, and why:

- **Preprocess uint8.** The pipeline's conditioning preprocessing, reordered so the uint8 frames go to
  the device and are resized before anything is normalised (:mod:`cosmos3_runtime.frame_preprocessing`;
  within one uint8 level of the pipeline's, tested).
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
- **Robot state.** A job's state rows are clean action frames in front of the chunk, held by the same
  condition mask as a real-time-chunking prefix or forward-dynamics actions, and positioned as
  cosmos-framework's sequence plan places them
  (:func:`cosmos3_runtime.sequence_packing.state_action_positions`); diffusers' pipeline has no state.
  The output is the chunk without them.
- **No decode for action modes.** Action chunks come from the action stream; the VAE decoder is only
  called for ``forward_dynamics`` video.
- **Batching.** Several jobs on the same schedule share each transformer call: their sequences are
  packed into one joint sequence (:mod:`cosmos3_runtime.sequence_packing`; diffusers' transformer takes
  per-item lists) and attention is kept per item there too. Each job
  keeps its own noise, scheduler and generator, so a batched chunk equals the unbatched one up to float
  rounding.
- **Text prefix cache.** A job whose text keys/values are cached runs its generation tokens only
  (:class:`~cosmos3_runtime.sequence_packing.TextPrefixCache`).
- **The caption in the checkpoint's training format** (:func:`action_caption`): the task plus the clip's
  metadata, in the format the domain's profile names: ``json``, diffusers' structured action caption
  (``_build_action_json_prompt``; cosmos-framework's ``format_prompt_as_json``, as Edge is trained), or
  ``prose``, cosmos-framework's default sentences after the task, with diffusers' templates. A composed
  view's ``view_description`` extends the view sentence in both (docs/runtime.md, "Prompt formats").
"""

from __future__ import annotations

import copy
import inspect
import json
from collections import OrderedDict
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _ACTION_VIEWPOINT_TEMPLATES
from diffusers.utils.torch_utils import randn_tensor

from .checkpoints import CheckpointInfo, build_scheduler, configured_shift, set_schedule
from .frame_preprocessing import ConditioningFrames, PreparedFrames, condition_frames, prepare_frames
from .sequence_packing import SequencePass, TextPrefixCache, install_packed_attention, pack_batch, pack_sequence
from .validation import DenoiseJob

_TOKEN_CACHE_SIZE = 64
# The step-invariant sequences kept (their index and position tensors), by size: about 10 KB for a tiny
# model's 256-pixel job, a few MB for a large model's largest; a session's shape recurs every control tick.
_PACK_CACHE_BYTES = 32 * 2**20
_SCHEDULE_CACHE_SIZE = 16  # schedules set once per (shift, steps), copied per job

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Memo(Generic[K, V]):
    """What the sampler builds once per key and reuses: least recently used first out once the entries' costs
    (``cost(value)``: 1 each by default, or bytes) pass ``limit``; the newest entry is always kept."""

    def __init__(self, limit: int, cost: Callable[[V], int] = lambda value: 1) -> None:
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._limit = limit
        self._cost = cost
        self._total = 0

    def get(self, key: K, build: Callable[[], V]) -> V:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry[0]
        value = build()
        cost = self._cost(value)
        self._entries[key] = (value, cost)
        self._total += cost
        while self._total > self._limit and len(self._entries) > 1:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._total -= evicted
        return value


def _tensor_bytes(pack: dict[str, Any]) -> int:
    return sum(v.nbytes for v in pack.values() if isinstance(v, torch.Tensor))


# Returns seconds: the engine passes time.perf_counter.
Clock = Callable[[], float]


@dataclass
class DenoiseOutput:
    """What the sampler gives back for one :class:`~cosmos3_runtime.validation.DenoiseJob`."""

    actions: np.ndarray | None  # (horizon, raw_action_dim) float32, model space
    video: np.ndarray | None  # (T, H, W, 3) uint8
    transformer_forwards: int
    num_steps: int
    preprocess_s: float
    encode_s: float
    denoise_s: float
    decode_s: float
    batch_size: int = 1


@dataclass
class _Item:
    """The evolving state of one job inside a (possibly batched) run."""

    job: DenoiseJob
    x0_vision: torch.Tensor
    vision_mask: torch.Tensor
    latents: torch.Tensor
    x0_action: torch.Tensor
    action_mask: torch.Tensor
    action_latents: torch.Tensor
    domain_id: torch.Tensor
    generator: torch.Generator
    scheduler: Any  # a diffusers scheduler, copied per job
    action_scheduler: Any
    passes: dict[str, SequencePass]
    has_noisy_action: bool
    preprocess_s: float
    encode_s: float
    forwards: int = 0
    velocities: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class Cosmos3Sampler:
    """Runs :class:`DenoiseJob` s on a loaded ``Cosmos3OmniPipeline``. One thread at a time.

    With ``prefix_cache_bytes > 0`` the text tokens' per-layer keys and values are computed once per
    token sequence and reused (see :class:`~cosmos3_runtime.sequence_packing.TextPrefixCache`).
    """

    def __init__(self, pipe: Any, info: CheckpointInfo, device: torch.device, prefix_cache_bytes: int = 0) -> None:
        self.pipe = pipe
        self.info = info
        # The shift the loaded scheduler applies: a job that asks for another gets a scheduler of its own.
        self.loaded_shift = configured_shift(info)
        self.device = device
        self.transformer = pipe.transformer
        # diffusers' ``ModelMixin.dtype`` walks every submodule on each read (0.1 ms for a tiny transformer,
        # more for a real one); the loaded weights keep their dtype, so it is read once.
        self.compute_dtype: torch.dtype = self.transformer.dtype
        self.prefix_cache = TextPrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self._attention = install_packed_attention(self.transformer)
        self._token_ids: _Memo[tuple[Any, ...], tuple[list[int], list[int]]] = _Memo(_TOKEN_CACHE_SIZE)
        self._packs: _Memo[tuple[Any, ...], dict[str, Any]] = _Memo(_PACK_CACHE_BYTES, _tensor_bytes)
        self._schedules: _Memo[tuple[float | None, int], Any] = _Memo(_SCHEDULE_CACHE_SIZE)
        self._step_takes_generator = "generator" in inspect.signature(pipe.scheduler.step).parameters
        # Frames prepared ahead of their batch are copied and resized on their own stream, so that work
        # runs beside the forwards on the default stream instead of queueing behind them.
        self._frames_stream = (
            torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # torch leaves its constructor unannotated
            if device.type == "cuda"
            else None
        )

    # ------------------------------------------------------------------ conditioning

    def preprocess(self, frames: np.ndarray, tier: int, num_frames: int) -> PreparedFrames:
        """uint8 frames -> the pipeline's padded canvas in [-1, 1], plus the canvas and content sizes.

        The pipeline's own conditioning preprocessing, reordered to touch the fewest bytes (uint8 to the
        device, resize, then normalise): see :mod:`cosmos3_runtime.frame_preprocessing`.
        """
        return prepare_frames(
            frames, tier, num_frames, self.device, size_multiple=self.pipe.video_processor.config.vae_scale_factor
        )

    def condition_frames(self, job: DenoiseJob, clock: Clock) -> ConditioningFrames:
        """The job's conditioning frames through :meth:`preprocess` (:func:`~cosmos3_runtime.frame_preprocessing.
        condition_frames`); safe on another thread than the one running forwards."""
        return condition_frames(self.preprocess, job, clock, self._frames_stream)

    def encode(self, vision: torch.Tensor, image_size: torch.Tensor) -> torch.Tensor:
        """VAE-encode a preprocessed clip to normalized latents with the canvas padding removed."""
        latents = self.pipe._encode_video(vision).contiguous().float()
        unpadded: torch.Tensor = self.pipe._remove_action_video_padding_from_latent(latents, image_size)
        return unpadded

    def tokenize(self, job: DenoiseJob, canvas_h: int, canvas_w: int) -> tuple[list[int], list[int]]:
        """Token ids of the job's action caption and of the empty unconditional prompt.

        Cached: a session's settings recur every control tick. The caption is built by
        :func:`action_caption` and goes through the pipeline's chat template with its
        own metadata templates off (the caption carries that metadata already), exactly as diffusers does
        for an action mode.
        """
        key = (
            job.settings.prompt,
            job.prompt_format,
            job.horizon,
            canvas_h,
            canvas_w,
            job.settings.fps,
            job.settings.view_point,
            job.view_description,
        )

        def build() -> tuple[list[int], list[int]]:
            caption = action_caption(self.pipe, job, canvas_h, canvas_w)
            ids: tuple[list[int], list[int]] = self.pipe.tokenize_prompt(
                caption,
                None,
                num_frames=job.horizon + 1,
                height=canvas_h,
                width=canvas_w,
                fps=job.settings.fps,
                add_resolution_template=False,
                add_duration_template=False,
            )
            return ids

        return self._token_ids.get(key, build)

    # ------------------------------------------------------------------ the loop

    def run(self, job: DenoiseJob, clock: Clock) -> DenoiseOutput:
        """Condition, denoise and (for video) decode one job. ``clock()`` returns seconds."""
        return self.run_batch([job], clock)[0]

    def run_batch(
        self, jobs: list[DenoiseJob], clock: Clock, frames: list[ConditioningFrames | None] | None = None
    ) -> list[DenoiseOutput]:
        """Run jobs that share a schedule (equal :attr:`DenoiseJob.schedule_key`) through shared forwards.

        ``frames``: each job's :meth:`condition_frames` made ahead of time (None: made here)."""
        steps = self.iterate_batch(jobs, clock, frames)
        while True:
            try:
                next(steps)
            except StopIteration as finished:
                outputs: list[DenoiseOutput] = finished.value
                return outputs

    def iterate_batch(
        self, jobs: list[DenoiseJob], clock: Clock, frames: list[ConditioningFrames | None] | None = None
    ) -> Generator[int, None, list[DenoiseOutput]]:
        """:meth:`run_batch` as a generator that pauses after every denoising step.

        Yields the number of steps done; returns the outputs (``StopIteration.value``). Between steps
        the caller may run other jobs on this sampler: a job's state lives in its own items and
        schedulers, and the attention layout is set only for the duration of one forward. That is what
        lets a long video rollout give way to a robot after each step.
        """
        with torch.no_grad():
            items = self._start(jobs, clock, frames or [None] * len(jobs))
        timesteps = items[0].scheduler.timesteps
        t0, denoise_s = clock(), 0.0
        for i in range(len(timesteps)):
            with torch.no_grad():
                self._step(items, i)
            denoise_s += clock() - t0
            yield i + 1
            t0 = clock()
        with torch.no_grad():
            return self._finish(items, denoise_s, clock)

    def _start(self, jobs: list[DenoiseJob], clock: Clock, frames: list[ConditioningFrames | None]) -> list[_Item]:
        if len({job.schedule_key for job in jobs}) != 1:
            raise ValueError("a batch needs jobs with the same schedule (sigmas, steps, guidance, interval)")
        return [self._prepare(job, clock, prepared) for job, prepared in zip(jobs, frames)]

    def _step(self, items: list[_Item], i: int) -> None:
        """Denoising step ``i`` of every item: shared forwards, then each item's own scheduler step."""
        first = items[0]
        timesteps, sigmas = first.scheduler.timesteps, first.scheduler.sigmas
        t, sigma = timesteps[i], float(sigmas[i])
        use_cfg = first.job.settings.guidance_scale != 1.0
        names = ["cond"] + (["uncond"] if use_cfg and _inside(sigma, first.job.settings.guidance_interval) else [])
        for name in names:
            self._forward(items, name, t, i, sigma, len(timesteps))
        for item in items:
            job = item.job
            v_vision, v_action = item.velocities["cond"]
            if "uncond" in names:
                u_vision, u_action = item.velocities["uncond"]
                v_vision = u_vision + job.settings.guidance_scale * (v_vision - u_vision)
                v_action = u_action + job.settings.guidance_scale * (v_action - u_action)
            kwargs = {"generator": item.generator} if self._step_takes_generator else {}
            latents = item.scheduler.step(
                v_vision.unsqueeze(0), t, item.latents.unsqueeze(0), return_dict=False, **kwargs
            )[0].squeeze(0)
            item.latents = item.vision_mask * item.x0_vision + (1.0 - item.vision_mask) * latents
            if item.has_noisy_action:
                actions = item.action_scheduler.step(
                    v_action.unsqueeze(0), t, item.action_latents.unsqueeze(0), return_dict=False, **kwargs
                )[0].squeeze(0)
                actions = item.action_mask * item.x0_action + (1.0 - item.action_mask) * actions
                actions[:, job.raw_action_dim :] = 0
                item.action_latents = actions

    def _finish(self, items: list[_Item], denoise_s: float, clock: Clock) -> list[DenoiseOutput]:
        timesteps = items[0].scheduler.timesteps
        outputs = []
        for item in items:
            video, decode_s = None, 0.0
            if item.job.decode_video:
                t0 = clock()
                video = self._decode(item.latents)
                decode_s = clock() - t0
            actions = None
            if item.job.mode != "forward_dynamics":  # the chunk: the state rows in front are not the robot's to run
                actions = item.action_latents[item.job.leading_rows :, : item.job.raw_action_dim].float().cpu().numpy()
            outputs.append(
                DenoiseOutput(
                    actions,
                    video,
                    item.forwards,
                    len(timesteps),
                    item.preprocess_s,
                    item.encode_s,
                    denoise_s,
                    decode_s,
                    batch_size=len(items),
                )
            )
        return outputs

    def _prepare(self, job: DenoiseJob, clock: Clock, frames: ConditioningFrames | None = None) -> _Item:
        """Conditioning latents, initial noise, packed sequences and schedulers of one job."""
        pipe, device = self.pipe, self.device
        num_frames = job.horizon + 1
        latent_t = (num_frames - 1) // pipe.vae_scale_factor_temporal + 1

        frames = frames or self.condition_frames(job, clock)
        frames.await_on(device)
        vision, image_size, canvas_h, canvas_w = frames.vision, frames.image_size, frames.canvas_h, frames.canvas_w
        preprocess_s, t0 = frames.preprocess_s, clock()
        if job.mode == "inverse_dynamics":
            x0_vision = self.encode(vision, image_size)
            vision_condition_frames = list(range(latent_t))
        else:
            # Causal VAE: the first latent of the padded clip is the encoding of frame 0 alone
            # (condition_frames preprocessed frame 0 only).
            first = self.encode(vision, image_size)
            x0_vision = first.new_zeros((*first.shape[:2], latent_t, *first.shape[3:]))
            x0_vision[:, :, :1] = first
            vision_condition_frames = [0]
        encode_s = clock() - t0

        # Noise is drawn in the pipeline's order (vision, then action) from the job's own generator.
        generator = torch.Generator(device=device).manual_seed(job.seed)
        vision_mask = torch.zeros((latent_t, 1, 1), device=device)
        vision_mask[vision_condition_frames] = 1.0
        noise = randn_tensor(tuple(x0_vision.shape), generator=generator, device=device, dtype=torch.float32)
        latents = vision_mask * x0_vision + (1.0 - vision_mask) * noise

        action_dim, lead = self.transformer.config.action_dim, job.leading_rows
        rows = lead + job.horizon
        x0_action, action_mask, clean_frames = action_rows(job, action_dim, device)
        # Noise for the chunk's rows only, drawn as without state: a state row's noise would be masked
        # away, and not drawing it keeps a seed's chunk noise the same with and without state.
        action_noise = randn_tensor((job.horizon, action_dim), generator=generator, device=device, dtype=torch.float32)
        action_noise = torch.cat([action_noise.new_zeros((lead, action_dim)), action_noise])
        action_latents = action_mask * x0_action + (1.0 - action_mask) * action_noise
        action_latents[:, job.raw_action_dim :] = 0

        cond_ids, uncond_ids = self.tokenize(job, canvas_h, canvas_w)
        passes = {
            "cond": self.sequence_pass(cond_ids, latents, action_latents, vision_condition_frames, clean_frames, job)
        }
        if job.settings.guidance_scale != 1.0:
            passes["uncond"] = self.sequence_pass(
                uncond_ids, latents, action_latents, vision_condition_frames, clean_frames, job
            )

        scheduler = self.scheduler_for(job)
        return _Item(
            job=job,
            x0_vision=x0_vision,
            vision_mask=vision_mask,
            latents=latents,
            x0_action=x0_action,
            action_mask=action_mask,
            action_latents=action_latents,
            domain_id=torch.tensor([job.domain_id], dtype=torch.long, device=device),
            generator=generator,
            scheduler=scheduler,
            action_scheduler=self.scheduler_for(job),
            passes=passes,
            has_noisy_action=len(clean_frames) < rows,
            preprocess_s=preprocess_s,
            encode_s=encode_s,
        )

    def scheduler_for(self, job: DenoiseJob) -> Any:
        """A scheduler of its own for ``job``, its timesteps set: the pipeline's as loaded, or one built with the
        job's shift where it differs. Each (shift, steps) is set once and copied per job (a copy costs a third
        of setting it again), since a scheduler keeps its step index and, for multistep ones, past outputs."""
        shift = None if job.settings.shift is None or job.settings.shift == self.loaded_shift else job.settings.shift

        def build() -> Any:
            scheduled = copy.deepcopy(self.pipe.scheduler) if shift is None else build_scheduler(self.info, shift)
            set_schedule(scheduled, self.info, job.settings.num_steps, self.device)
            return scheduled

        scheduled = self._schedules.get((shift, job.settings.num_steps), build)
        return copy.deepcopy(scheduled)

    def sequence_pass(
        self,
        input_ids: list[int],
        latents: torch.Tensor,
        action_latents: torch.Tensor,
        vision_frames: list[int],
        clean_action_frames: list[int],
        job: DenoiseJob,
    ) -> SequencePass:
        """One pass of ``job`` (its packed sequence and cached text prefix); training builds its batches here too.

        The packed sequence holds indexes and positions only, which depend on the token ids, the latents'
        shapes, the clean frames, the fps and the state rows, never on the latents' values: it is built once
        per such shape and shared (read only) by every job of that shape.
        """
        key = tuple(input_ids)
        shape = (
            key,
            tuple(latents.shape),
            tuple(action_latents.shape),
            tuple(vision_frames),
            tuple(clean_action_frames),
            job.settings.fps,
            job.leading_rows,
        )
        full = self._packs.get(
            shape,
            lambda: pack_sequence(
                self.pipe, self.device, input_ids, latents, action_latents, vision_frames, clean_action_frames, job
            ),
        )
        entry = self.prefix_cache.get(key) if self.prefix_cache is not None else None
        return SequencePass(key, full, entry)

    def _forward(self, items: list[_Item], name: str, t: torch.Tensor, step: int, sigma: float, num_steps: int) -> None:
        """One transformer call for pass ``name`` of every item; stores each item's masked velocities."""
        preds_vision, preds_action = self.forward_passes(
            [it.passes[name] for it in items],
            [it.latents for it in items],
            [it.action_latents for it in items],
            [it.domain_id for it in items],
            t.item(),
            cache=(name, step, sigma, num_steps),
        )
        for it, pred_vision, pred_action in zip(items, preds_vision, preds_action):
            v_vision, _, v_action = self.pipe._mask_velocity_predictions(
                [pred_vision],
                None,
                vision_condition_mask=[it.vision_mask],
                preds_action=[pred_action],
                action_condition_mask=[it.action_mask],
                raw_action_dim=it.job.raw_action_dim,
            )
            it.velocities[name] = (v_vision.float(), v_action.float())
            it.forwards += 1

    def forward_passes(
        self,
        passes: list[SequencePass],
        vision_latents: list[torch.Tensor],
        action_latents: list[torch.Tensor],
        domain_ids: list[torch.Tensor],
        timestep: float | list[float],
        cache: tuple[str, int, float, int] = ("train", 0, 1.0, 1),
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The transformer's raw velocity predictions for ``passes``, joined into one call by
        :func:`~.sequence_packing.pack_batch`. Sampling and training (:mod:`cosmos3_runtime.training`, which
        calls this with gradients on and one timestep per sample) share it, so they cannot drift apart.

        ``cache``: the pass name, step index, sigma and step count the transformer's cache hooks are told.
        Records the text keys/values the call made into the prefix cache, when it is on.
        """
        batch = pack_batch(
            passes,
            vision_latents,
            action_latents,
            domain_ids,
            record=self.prefix_cache is not None,
            timestep=timestep,
            dtype=self.compute_dtype,
            device=self.device,
        )
        name, step, sigma, num_steps = cache
        self._attention.items = batch.layout
        try:
            with self.transformer.cache_context(name, step_index=step, sigma=sigma, num_inference_steps=num_steps):
                preds_vision, _, preds_action = self.transformer(**batch.arguments, return_dict=False)
        finally:
            self._attention.items = None
        for p, entry in batch.recording:  # recorded only with a prefix cache
            p.entry = entry
            if self.prefix_cache is not None:
                self.prefix_cache.put(p.key, entry)
        return list(preds_vision), list(preds_action)

    def _decode(self, latents: torch.Tensor) -> np.ndarray:
        """Denormalize and VAE-decode vision latents to uint8 frames (T, H, W, 3)."""
        pipe = self.pipe
        vae_dtype = pipe.vae.dtype
        mean = pipe._vae_latents_mean.to(device=latents.device, dtype=vae_dtype).view(1, -1, 1, 1, 1)
        inv_std = pipe._vae_latents_inv_std.to(device=latents.device, dtype=vae_dtype).view(1, -1, 1, 1, 1)
        decoded = pipe.vae.decode(latents.to(vae_dtype) / inv_std + mean).sample.float()
        frames = pipe.video_processor.postprocess_video(decoded, output_type="np")[0]
        video: np.ndarray = (np.clip(frames, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
        return video


def action_rows(job: DenoiseJob, action_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """A job's action rows, [robot state rows][the chunk], with their condition mask and clean row indexes.

    Clean frames (the state rows, a real-time-chunking prefix, forward-dynamics actions) hold their values
    in ``x0`` and are kept by the mask, as diffusers holds forward_dynamics's actions; every other row of
    ``x0`` is zero. Training (:mod:`cosmos3_runtime.training`) lays its samples out with this too.
    """
    lead = job.leading_rows
    rows = lead + job.horizon
    x0_action = torch.zeros((rows, action_dim), device=device)
    clean_frames: list[int] = list(range(lead))
    if lead:
        x0_action[:lead, : job.raw_action_dim] = torch.from_numpy(job.state_rows).to(device)
    if job.clean_actions is not None:
        k = job.clean_actions.shape[0]
        x0_action[lead : lead + k, : job.raw_action_dim] = torch.from_numpy(job.clean_actions).to(device)
        clean_frames += range(lead, lead + k)
    action_mask = torch.zeros((rows, 1), device=device)
    action_mask[clean_frames] = 1.0
    return x0_action, action_mask, clean_frames


def _inside(sigma: float, interval: tuple[float, float] | None) -> bool:
    return interval is None or interval[0] <= sigma <= interval[1]


# -- the caption -----------------------------------------------------------------------------------


def action_caption(pipe: Any, job: DenoiseJob, height: int, width: int) -> str:
    """The conditional caption of ``job`` in its checkpoint's prompt format, ``height`` x ``width`` being the
    padded canvas."""
    num_frames = job.horizon + 1
    if job.prompt_format == "prose":
        return _prose(pipe, job, num_frames, height, width)
    caption = pipe._build_action_json_prompt(
        job.settings.prompt,
        view_point=job.settings.view_point,
        num_frames=num_frames,
        fps=job.settings.fps,
        height=height,
        width=width,
    )
    if not job.view_description:
        return str(caption)
    data = json.loads(caption)
    framing = data.get("cinematography", {}).get("framing")
    # json.dumps of the parsed caption reproduces diffusers' text byte for byte, the framing aside.
    data.setdefault("cinematography", {})["framing"] = (
        _join(framing, job.view_description) if framing else job.view_description
    )
    return json.dumps(data)


def _prose(pipe: Any, job: DenoiseJob, num_frames: int, height: int, width: int) -> str:
    """cosmos-framework's default appenders: the task, then the view, duration/FPS and resolution sentences."""
    caption = job.settings.prompt.rstrip()
    if not caption:
        return ""
    view = _ACTION_VIEWPOINT_TEMPLATES.get(job.settings.view_point)
    if view:
        caption = _join(caption, _join(view, job.view_description) if job.view_description else view)
    seconds = int(num_frames / job.settings.fps)
    caption = _join(caption, pipe.duration_template.format(duration=seconds, fps=job.settings.fps))
    return _join(caption, pipe.video_resolution_template.format(height=height, width=width))


def _join(text: str, sentence: str) -> str:
    return text + (" " if text.endswith(".") else ". ") + sentence.rstrip()
