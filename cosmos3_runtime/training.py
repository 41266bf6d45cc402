"""``cosmos3-train``: train or fine-tune a Cosmos3 policy checkpoint (diffusers layout) on a LeRobot dataset.

The recipe is cosmos-framework's flow matching for the omni model:

- ``x_t = t·ε + (1−t)·x0`` for every noisy token, the transformer fed ``t × 1000`` (the scheduler's
  timesteps), its target the velocity ``ε − x0`` (what the sampler's flow-matching scheduler integrates);
- mean squared error on noisy tokens only, actions sliced to the robot's width, the action loss weighted
  against the co-trained future video tokens;
- ``t`` logit-normal, shifted toward high noise by the resolution tier's shift;
- the conditioning frame, the robot's state row and a real-time-chunking prefix clean, held by the mask.

**Training-time real-time chunking**: with probability ``--prefix-prob`` a sample gets a clean prefix of
``d`` rows (``d`` uniform in 1..``--max-prefix``): the first ``d`` actions of its own chunk, conditioned
exactly as the server conditions a request's ``prefix_actions``, the loss on the other rows only.

**One path with serving.** Every sample is a request: :func:`~cosmos3_runtime.validation.job_for_actions`
turns its raw state and prefix into the job's normalised rows; the sampler lays out its action rows
(:func:`~cosmos3_runtime.sampling.action_rows`), packs its sequence
(:meth:`~cosmos3_runtime.sampling.Cosmos3Sampler.sequence_pass`) and runs the transformer
(:meth:`~cosmos3_runtime.sampling.Cosmos3Sampler.forward_passes`), the same calls a served chunk makes.

**Given prefixes** (``action.prefix_rows``, written by ``cosmos3-reach-demos --student-prefixes``): a frame
whose chunk label continues a prefix that is not the label's own (the rows an erring student was about to
execute, the label the expert's continuation from where they leave the arm) is always trained with exactly
that prefix, clean and without ``--prefix-noise``, the loss on the rows after it. The other frames keep the
random prefixes above. A prefix cut from the label itself shows the cube's true velocity in its slope, so a
model can learn to continue it without reading the camera; a given prefix's slope is the student's, wrong,
and only the camera tells how to correct it: what ``rtc`` asks of a policy whose previous chunk was off.

**Padding**: a demonstration's chunk that runs past its episode's end is padded with the last action, as
LeRobot pads. With ``--mask-padding`` those rows are left out of the loss (LeRobot's ``action_is_pad``):
a task whose world goes on after the recording stops (a moving cube) would otherwise teach the model to
halt near the end of every episode.

**Latents** come from the checkpoint's own VAE, one frame at a time (the conditioning frame's latent is the
encoding of that frame alone; a future latent frame's target is the encoding of the frame it ends on). When
the VAE was drawn here (``--tiny``), the latents' per-channel mean and std are written into
``vae/config.json`` so the served encoder normalises them the same way; a real checkpoint keeps its own.

The profile (``policy_profiles.json``) is written from the data: domain, action width, chunk, fps, state
conditioning, and mean/std statistics with a floor of :data:`STD_FLOOR` (a dimension that never moves
would otherwise blow up). Progress is a tqdm bar; runs are seeded and resume from ``training_state.pt``.

**The dataset** is read by :func:`~cosmos3_runtime.lerobot_dataset.read_dataset` (a LeRobot v3.0 dataset,
checked against :class:`~cosmos3_runtime.lerobot_dataset.DatasetBounds` before it is read). ``--horizon``
defaults to what the dataset supports: a recording's answered chunk, else 16. A recording's frames the
server dropped, failed or never answered are no sample and no part of the statistics (their chunks are
zeros), but they are still encoded: another sample's future frames may be among them. A dataset's
failure is one line from ``cosmos3-train``, and the checkpoint is built in a folder beside ``--out``,
renamed into it only when whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .errors import CheckpointError
from .lerobot_dataset import DatasetBounds, DatasetError, LeRobotDataset, read_dataset
from .lerobot_layout import ANSWERED_KIND, RESPONSE_KIND
from .requests import ActionRequest
from .sampling import action_rows
from .validation import DenoiseJob, job_for_actions

if TYPE_CHECKING:
    from .engine import Cosmos3Engine
    from .profiles import PolicyProfile
    from .sequence_packing import SequencePass


# -- training --------------------------------------------------------------------------------------

logger = logging.getLogger("cosmos3_runtime.training")

STD_FLOOR = 0.1
# The shift of the logit-normal t per resolution tier: more pixels keep more signal at a given noise, so
# larger canvases are trained noisier (the "shift" of rectified-flow schedules).
TIER_SHIFTS = {256: 3.0, 480: 5.0, 704: 5.0, 720: 5.0}
STATE_FILE = "training_state.pt"
LATENTS_FILE = "training_latents.pt"  # every frame's latent, kept beside the state so a resumed run skips encoding


@dataclass
class TrainConfig:
    dataset: Path
    out: Path
    base: Path | None = None  # a checkpoint to fine-tune; None with tiny: draw one here
    tiny: str | None = "distilled"
    hidden_size: int = 64
    layers: int = 2
    domain: str = "cosmos3_mujoco_arm"
    domain_id: int | None = None
    horizon: int | None = None  # None: what the dataset supports (a recording's chunk, else DEFAULT_HORIZON)
    tier: int = 256
    view_point: str = "third_person_view"
    prompt: str | None = None  # default: each episode's task
    steps: int = 3000
    batch_size: int = 16
    lr: float = 2e-3
    warmup: int = 100
    action_weight: float = 1.0
    video_weight: float = 0.1
    prefix_prob: float = 0.5
    max_prefix: int = 8
    prefix_noise: float = 0.0  # std of a prefix's offset from its chunk, in units of each action dimension's std
    ema_decay: float = 0.0  # the served weights are this exponential moving average of the trained ones (0: off)
    mask_padding: bool = False  # leave a chunk's rows past its episode's end out of the loss
    seed: int = 0
    save_every: int = 500
    resume: bool = False
    device: str = "cpu"
    dtype: str | None = None
    max_seconds: float | None = None
    bounds: DatasetBounds = dataclasses.field(default_factory=DatasetBounds)


DEFAULT_HORIZON = 16  # a demonstration dataset's chunk when --horizon is not given (any length can be cut from it)


def fit_to_dataset(cfg: TrainConfig, data: LeRobotDataset) -> TrainConfig:
    """``cfg`` with its horizon (and longest prefix) what ``data`` supports; :class:`DatasetError` if the
    data cannot train it."""
    if not any(len(e.target_frames) for e in data.episodes):
        raise DatasetError(
            f"data: the recording answered none of its {data.frames:,} observations with a chunk "
            f"({RESPONSE_KIND} is never {ANSWERED_KIND!r}): nothing to train on",
            RESPONSE_KIND,
        )
    chunk = data.recorded_chunk
    horizon = cfg.horizon if cfg.horizon is not None else (chunk or DEFAULT_HORIZON)
    if horizon < 1:
        raise DatasetError(f"--horizon {horizon}: a chunk has at least one row", "horizon")
    if chunk is not None and horizon > chunk:
        raise DatasetError(
            f"--horizon {horizon}: the recording answered chunks of {chunk} rows (meta/info.json: "
            f"features['action'].shape); train with --horizon {chunk} or less, or leave it out",
            "horizon",
        )
    longest_given = max(
        (int(e.prefix_rows.max(initial=0)) for e in data.episodes if e.prefix_rows is not None), default=0
    )
    max_prefix = min(cfg.max_prefix, horizon - 1)
    if longest_given > max_prefix:
        raise DatasetError(
            f"action.prefix_rows: a frame's chunk continues a given prefix of {longest_given} rows, longer than "
            f"the longest prefix trained ({max_prefix}); train with --max-prefix {longest_given} or more",
            "action.prefix_rows",
        )
    state = data.episodes[0].state
    if state is not None and state.shape[-1] != data.action_dim:
        raise DatasetError(
            f"meta/info.json: observation.state has {state.shape[-1]} values, the action {data.action_dim}: state rows "
            "are conditioned as action rows, so the state must be in action units",
            "observation.state",
        )
    return dataclasses.replace(cfg, horizon=horizon, max_prefix=max_prefix)


@dataclass
class Samples:
    """Every training sample's tensors, indexed by frame: latents and raw robot rows."""

    latents: torch.Tensor  # (N, C, h, w) normalised latents of every frame
    frame_of: np.ndarray  # (N, 1 + future) latent row of the conditioning frame and each future latent frame
    state: np.ndarray | None  # (N, D) raw
    chunks: np.ndarray  # (N, H, D) raw
    padded: np.ndarray  # (N, H) bool: the row repeats the episode's last action, past its end
    prompts: list[str]
    given_prefix: np.ndarray  # (N,) int: rows of each chunk that are a given prefix (action.prefix_rows), else 0


def write_profile(ckpt: Path, data: LeRobotDataset, cfg: TrainConfig, domain_id: int) -> dict[str, Any]:
    """``policy_profiles.json`` for the trained domain, its statistics computed from the data's training
    targets (a recording's answered chunks, not the zeros of the others)."""
    targets = [e.actions[e.target_frames] for e in data.episodes]
    actions = np.concatenate([a.reshape(-1, a.shape[-1]) for a in targets]).astype(np.float64)
    mean, std = actions.mean(0), np.maximum(actions.std(0), STD_FLOOR)
    first_state = data.episodes[0].state
    has_state = first_state is not None
    if first_state is not None and first_state.shape[-1] != data.action_dim:
        raise ValueError("state rows are conditioned as action rows: the state must have the action width")
    entry: dict[str, Any] = {
        "domain_id": domain_id,
        "raw_action_dim": data.action_dim,
        "default_horizon": cfg.horizon,
        "fps": data.fps,
        "resolution_tier": cfg.tier,
        "view_point": cfg.view_point,
        "use_state": has_state,
        "normalization": {"mean": mean.tolist(), "std": std.tolist()},
        # The longest prefix trained: a served request's longer one is clamped to it (PolicyProfile.max_prefix).
        "max_prefix": cfg.max_prefix if cfg.prefix_prob > 0 or _has_given_prefixes(data) else 0,
    }
    if has_state:
        entry["history_length"] = 1
    profiles = {"default_domain": cfg.domain, "domains": {cfg.domain: entry}}
    (ckpt / "policy_profiles.json").write_text(json.dumps(profiles, indent=2))
    return entry


def _has_given_prefixes(data: LeRobotDataset) -> bool:
    return any(e.prefix_rows is not None and bool(e.prefix_rows.any()) for e in data.episodes)


def free_domain_id(num_domains: int) -> int:
    """The highest domain id diffusers' table does not name (a new embodiment's head row)."""
    from diffusers.pipelines.cosmos import pipeline_cosmos3_omni as cosmos3

    used = set(cosmos3._EMBODIMENT_TO_DOMAIN_ID.values())
    free = [i for i in range(num_domains) if i not in used]
    if not free:
        raise ValueError("every domain id of this checkpoint is taken; pass --domain-id")
    return free[-1]


def encode_frames(
    engine: Cosmos3Engine, frames: np.ndarray, tier: int, batch: int = 32
) -> tuple[torch.Tensor, tuple[int, int]]:
    """Every frame's latent through the engine's own preprocessing and VAE (one frame per clip)."""
    sampler = engine.sampler
    out: list[torch.Tensor] = []
    canvas = (0, 0)
    with torch.no_grad():
        for start in range(0, len(frames), batch):
            prepared = [sampler.preprocess(frame[None], tier, 1) for frame in frames[start : start + batch]]
            _, image_size, canvas_h, canvas_w = prepared[-1]  # every frame of a dataset has one size
            canvas = (canvas_h, canvas_w)
            latents = sampler.encode(torch.cat([vision for vision, *_ in prepared]), image_size)  # (B, C, 1, h, w)
            out.append(latents[:, :, 0])
    return torch.cat(out), canvas


def renormalise_latents(ckpt: Path, engine: Cosmos3Engine, latents: torch.Tensor) -> torch.Tensor:
    """Write the latents' per-channel statistics into ``ckpt``'s VAE config, update the loaded pipeline
    to match, and return the latents as that VAE now normalises them."""
    pipe = engine.pipe
    mu = latents.transpose(0, 1).reshape(latents.shape[1], -1).double().mean(1)
    sigma = latents.transpose(0, 1).reshape(latents.shape[1], -1).double().std(1).clamp_min(1e-6)
    old_mean = pipe._vae_latents_mean.double()
    old_std = 1.0 / pipe._vae_latents_inv_std.double()
    new_mean, new_std = old_mean + mu * old_std, sigma * old_std
    config_path = ckpt / "vae" / "config.json"
    config = json.loads(config_path.read_text())
    config["latents_mean"], config["latents_std"] = new_mean.tolist(), new_std.tolist()
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    pipe.vae.register_to_config(latents_mean=new_mean.tolist(), latents_std=new_std.tolist())
    pipe._vae_latents_mean = new_mean.to(pipe.vae.dtype)
    pipe._vae_latents_inv_std = (1.0 / new_std).to(pipe.vae.dtype)
    shape = (1, -1, 1, 1)
    return ((latents.double() - mu.view(shape)) / sigma.view(shape)).float()


def build_samples(
    data: LeRobotDataset, latents: torch.Tensor, horizon: int, future: int, temporal: int, prompt: str | None
) -> Samples:
    """Every frame with a training target (:attr:`~cosmos3_runtime.lerobot_dataset.DatasetEpisode.target_frames`)
    as a sample: its chunk (the episode's next ``horizon`` actions, the last one repeated past the end, as
    LeRobot pads), its state, and the latent rows of its conditioning and future frames (any frames: a frame
    the server did not answer still shows what the camera saw)."""
    frame_of: list[list[int]] = []
    states: list[np.ndarray] = []
    chunks: list[np.ndarray] = []
    padded: list[np.ndarray] = []
    prompts: list[str] = []
    given: list[int] = []
    at = 0
    for episode in data.episodes:
        length = len(episode.images)
        for s in episode.target_frames.tolist():
            frame_of.append([at + min(s + temporal * j, length - 1) for j in range(future + 1)])
            if episode.actions.ndim == 3:  # a recording: the chunk the server answered
                chunk = episode.actions[s, :horizon]
                padded.append(np.zeros(horizon, bool))
            else:
                chunk = episode.actions[np.minimum(np.arange(s, s + horizon), length - 1)]
                padded.append(np.arange(s, s + horizon) >= length)
            chunks.append(chunk)
            if episode.state is not None:
                states.append(episode.state[s])
            prompts.append(prompt or episode.task)
            given.append(0 if episode.prefix_rows is None else int(episode.prefix_rows[s]))
        at += length
    return Samples(
        latents,
        np.asarray(frame_of),
        np.asarray(states, np.float32) if states else None,
        np.asarray(chunks, np.float32),
        np.asarray(padded, bool).reshape(len(chunks), horizon),
        prompts,
        np.asarray(given, np.int64),
    )


@dataclass
class TrainingInputs:
    """One noised sample as the transformer sees it, and its flow-matching targets."""

    job: DenoiseJob
    sequence: SequencePass
    latents: torch.Tensor  # (1, C, T, h, w): clean conditioning frame, noised future frames
    action_latents: torch.Tensor  # (rows, action_dim): clean state and prefix rows, noised chunk rows
    domain_id: torch.Tensor
    timestep: float  # t x 1000, as the scheduler's timesteps
    vision_target: torch.Tensor  # eps - x0
    vision_mask: torch.Tensor  # 1 on clean latent frames
    action_target: torch.Tensor
    action_mask: torch.Tensor  # 1 on clean rows
    action_weight: torch.Tensor  # (rows, 1): 0 on rows left out of the loss (padding, with --mask-padding)


class FlowMatchingTrainer:
    """Builds batches through the serving path and computes the flow-matching loss."""

    def __init__(
        self, engine: Cosmos3Engine, samples: Samples, cfg: TrainConfig, canvas: tuple[int, int], frame: np.ndarray
    ) -> None:
        self.engine = engine
        self.sampler = engine.sampler
        self.samples = samples
        self.cfg = cfg
        self.canvas = canvas
        self.frame = frame  # a frame of the dataset's size: a request needs one; its pixels are not used
        self.action_dim: int = engine.pipe.transformer.config.action_dim
        self.shift = TIER_SHIFTS.get(cfg.tier, 3.0)
        flat = samples.chunks.reshape(-1, samples.chunks.shape[-1]).astype(np.float64)
        self.action_std = np.maximum(flat.std(0), STD_FLOOR)  # the profile's std, for the prefix offsets
        self._passes: dict[tuple[str, int, int], SequencePass] = {}

    def job(
        self, index: int, prefix: int, seed: int, prefix_offset: np.ndarray | None = None
    ) -> tuple[DenoiseJob, PolicyProfile]:
        """Sample ``index`` as the job a served request with its state and prefix would be, and its profile.
        ``prefix_offset`` (raw units) is added to every prefix row."""
        s = self.samples
        prefix_actions = s.chunks[index, :prefix] if prefix else None
        if prefix_actions is not None and prefix_offset is not None:
            prefix_actions = prefix_actions + prefix_offset.astype(np.float32)
        request = ActionRequest(
            domain_name=self.cfg.domain,
            image=self.frame,
            action_horizon=self.cfg.horizon,
            prompt=s.prompts[index],
            resolution_tier=self.cfg.tier,
            seed=seed,
            state=None if s.state is None else s.state[index],
            prefix_actions=prefix_actions,
        )
        return job_for_actions(request, self.engine.description)

    def draw_prefixes(self, indexes: list[int], rng: np.random.Generator) -> list[int]:
        """Each sample's clean prefix rows: its given prefix where its frame has one (``action.prefix_rows``),
        else with probability ``prefix_prob`` a length uniform in 1..``max_prefix`` cut from its own chunk,
        else none."""
        cfg, given = self.cfg, self.samples.given_prefix
        prefixes = []
        for i in indexes:
            drawn = int(rng.integers(1, cfg.max_prefix + 1)) if cfg.max_prefix and rng.random() < cfg.prefix_prob else 0
            prefixes.append(int(given[i]) if given[i] else drawn)
        return prefixes

    def draw_t(self, generator: torch.Generator, n: int) -> torch.Tensor:
        t = torch.sigmoid(torch.randn(n, generator=generator))
        return self.shift * t / (1.0 + (self.shift - 1.0) * t)

    def sample_inputs(self, index: int, prefix: int, t: float, generator: torch.Generator) -> TrainingInputs:
        """Sample ``index`` noised to ``t``, with a clean prefix of ``prefix`` rows, laid out as the sampler
        lays out a served request's job."""
        device = self.sampler.device
        offset = None
        given = int(self.samples.given_prefix[index])
        if given and prefix != given:
            raise ValueError(f"sample {index} continues a given prefix of {given} rows, not {prefix}")
        if prefix and not given and self.cfg.prefix_noise > 0:
            # A served prefix is the policy's own previous chunk, off the demonstration by its error: trained on
            # the expert's exact actions, the model would learn to continue the prefix instead of reading the
            # camera. Offset it, and the loss still asks for the demonstration's rows after it.
            draw = torch.randn(self.action_std.shape, generator=generator).numpy()
            offset = self.cfg.prefix_noise * self.action_std * draw
        job, profile = self.job(index, prefix, seed=0, prefix_offset=offset)
        x0_action, action_mask, clean = action_rows(job, self.action_dim, device)
        chunk = torch.from_numpy(profile.to_model(self.samples.chunks[index])).to(device)
        # The rows after the prefix are the data's; the prefix rows keep what the job conditions on.
        x0_action[job.leading_rows + prefix :, : job.raw_action_dim] = chunk[prefix:]
        x0_vision = self.samples.latents[self.samples.frame_of[index]].permute(1, 0, 2, 3)[None].to(device)
        vision_mask = torch.zeros((x0_vision.shape[2], 1, 1), device=device)
        vision_mask[0] = 1.0  # the conditioning frame
        eps_v = torch.randn(x0_vision.shape, generator=generator).to(device)
        eps_a = torch.randn(x0_action.shape, generator=generator).to(device)
        eps_a[:, job.raw_action_dim :] = 0
        latents = vision_mask * x0_vision + (1 - vision_mask) * (t * eps_v + (1 - t) * x0_vision)
        action_latents = action_mask * x0_action + (1 - action_mask) * (t * eps_a + (1 - t) * x0_action)
        action_weight = torch.ones((x0_action.shape[0], 1), device=device)
        if self.cfg.mask_padding:
            padded = torch.from_numpy(self.samples.padded[index]).to(device)
            action_weight[job.leading_rows :] = (~padded).float()[:, None]
        key = (job.settings.prompt, job.leading_rows, prefix)
        if key not in self._passes:
            cond_ids, _ = self.sampler.tokenize(job, *self.canvas)
            self._passes[key] = self.sampler.sequence_pass(cond_ids, latents, action_latents, [0], clean, job)
        return TrainingInputs(
            job,
            self._passes[key],
            latents,
            action_latents,
            torch.tensor([job.domain_id], dtype=torch.long, device=device),
            1000.0 * t,
            eps_v - x0_vision,
            vision_mask,
            eps_a - x0_action,
            action_mask,
            action_weight,
        )

    def predict(self, inputs: list[TrainingInputs]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The transformer's velocities for a batch, through the sampler's own forward."""
        return self.sampler.forward_passes(
            [i.sequence for i in inputs],
            [i.latents for i in inputs],
            [i.action_latents for i in inputs],
            [i.domain_id for i in inputs],
            [i.timestep for i in inputs],
        )

    def batch_loss(
        self, indexes: list[int], prefixes: list[int], t: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, float, float]:
        """The weighted loss of one batch, and its action and video parts (floats)."""
        inputs = [self.sample_inputs(i, p, t_i, generator) for i, p, t_i in zip(indexes, prefixes, t.tolist())]
        preds_vision, preds_action = self.predict(inputs)
        terms = [self.sample_loss(pv, pa, x) for pv, pa, x in zip(preds_vision, preds_action, inputs)]
        action_loss = torch.stack([a for a, _ in terms]).mean()
        vision_loss = torch.stack([v for _, v in terms]).mean()
        loss = self.cfg.action_weight * action_loss + self.cfg.video_weight * vision_loss
        return loss, float(action_loss.detach()), float(vision_loss.detach())

    def sample_loss(
        self, pred_vision: torch.Tensor, pred_action: torch.Tensor, x: TrainingInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sample's action and video losses: the mean squared error on its noisy tokens, the action's
        sliced to the raw action width."""
        target_v, width = x.vision_target, x.job.raw_action_dim
        noisy_v = (1 - x.vision_mask).expand(target_v.shape[2:])
        err_v = (pred_vision.float().reshape(target_v.shape) - target_v) ** 2
        noisy_a = (1 - x.action_mask) * x.action_weight
        err_a = (pred_action.float()[:, :width] - x.action_target[:, :width]) ** 2
        # clamp: with padding masked, a last frame's chunk may have no noisy row left to learn from
        action = (err_a * noisy_a).sum() / (noisy_a.sum().clamp_min(1.0) * width)
        vision = (err_v * noisy_v).sum() / (noisy_v.sum() * target_v.shape[1])
        return action, vision


def work_folder(out: Path) -> Path:
    """Where a run builds its checkpoint: a folder beside ``out``, renamed into ``out`` once whole (an
    interrupted run leaves it for ``--resume``, and ``out`` as it was)."""
    return out.parent / f".{out.name}.training"


def prepare_checkpoint(cfg: TrainConfig) -> Path:
    """The run's checkpoint folder (:func:`work_folder`): a copy of the base (or a tiny one drawn here), or
    when resuming the interrupted run's, else a copy of ``--out``'s."""
    out = work_folder(cfg.out)
    if cfg.resume and (out / STATE_FILE).is_file():
        return out
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if cfg.resume and (cfg.out / STATE_FILE).is_file():
        shutil.copytree(cfg.out, out, symlinks=True)
        return out
    if cfg.base is not None:
        shutil.copytree(cfg.base, out)
    else:
        from .random_checkpoints import build_tiny_checkpoint

        build_tiny_checkpoint(
            out,
            cfg.tiny or "distilled",
            seed=cfg.seed,
            transformer_overrides={
                "hidden_size": cfg.hidden_size,
                "num_hidden_layers": cfg.layers,
                "intermediate_size": 2 * cfg.hidden_size,
            },
        )
    return out


@dataclass
class Preparation:
    """Everything a run needs before its first step: the checkpoint, the loaded engine and the samples."""

    ckpt: Path
    engine: Cosmos3Engine  # loaded from ckpt
    trainer: FlowMatchingTrainer
    resuming: bool
    encode_s: float
    episodes: int


def prepare_training(cfg: TrainConfig) -> Preparation:
    """Read the data, make the checkpoint (profile, VAE statistics), load it, and encode every frame."""
    from .engine import Cosmos3Engine

    data = read_dataset(cfg.dataset, bounds=cfg.bounds)
    cfg = fit_to_dataset(cfg, data)
    ckpt = prepare_checkpoint(cfg)
    resuming = cfg.resume and (ckpt / STATE_FILE).is_file()
    if not resuming:
        num_domains = json.loads((ckpt / "transformer" / "config.json").read_text())["num_embodiment_domains"]
        domain_id = cfg.domain_id if cfg.domain_id is not None else free_domain_id(num_domains)
        write_profile(ckpt, data, cfg, domain_id)
    engine = Cosmos3Engine.load(ckpt, device=cfg.device, dtype=cfg.dtype, prefix_cache_mb=0)
    frames = np.concatenate([e.images for e in data.episodes])
    t0 = time.monotonic()
    cached = torch.load(ckpt / LATENTS_FILE) if resuming and (ckpt / LATENTS_FILE).is_file() else None
    if cached is not None and cached["latents"].shape[0] == len(frames):
        latents, canvas = cached["latents"], (int(cached["canvas"][0]), int(cached["canvas"][1]))
    else:
        latents, canvas = encode_frames(engine, frames, cfg.tier)
        if cfg.base is None and not resuming:  # the VAE was drawn here: its statistics are the data's
            latents = renormalise_latents(ckpt, engine, latents)
        torch.save({"latents": latents, "canvas": list(canvas)}, ckpt / LATENTS_FILE)
    encode_s = time.monotonic() - t0
    pipe = engine.pipe
    horizon = cfg.horizon
    assert horizon is not None  # fit_to_dataset chose it
    future = horizon // pipe.vae_scale_factor_temporal
    samples = build_samples(data, latents, horizon, future, pipe.vae_scale_factor_temporal, cfg.prompt)
    trainer = FlowMatchingTrainer(engine, samples, cfg, canvas, data.episodes[0].images[0])
    return Preparation(ckpt, engine, trainer, resuming, encode_s, len(data.episodes))


def train(cfg: TrainConfig) -> dict[str, Any]:
    started = time.monotonic()
    torch.manual_seed(cfg.seed)
    prep = prepare_training(cfg)
    ckpt, trainer, resuming, encode_s = prep.ckpt, prep.trainer, prep.resuming, prep.encode_s
    cfg = trainer.cfg  # with the horizon and longest prefix the dataset supports
    samples, pipe = trainer.samples, prep.engine.pipe
    transformer = pipe.transformer
    transformer.train()
    transformer.requires_grad_(True)
    params = [p for p in transformer.parameters() if p.requires_grad]
    # The fused step: one kernel over every parameter instead of a dozen small ops each (9 % of a CPU step).
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01, fused=fused)
    generator = torch.Generator().manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    # The checkpoint holds what is served: the moving average when there is one. The trained weights then
    # live in the training state, so that a resumed run continues from them.
    ema = [p.detach().clone() for p in params] if cfg.ema_decay > 0 else None
    step = 0
    if resuming:
        state = torch.load(ckpt / STATE_FILE, weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        rng.bit_generator.state = state["rng"]
        step = state["step"]
        if ema is not None:
            with torch.no_grad():
                torch._foreach_copy_(params, state["trained_weights"])

    def lr_at(i: int) -> float:
        if i < cfg.warmup:
            return cfg.lr * (i + 1) / cfg.warmup
        progress = (i - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))

    def save(i: int) -> None:
        trained = [p.detach().clone() for p in params]
        if ema is not None:
            with torch.no_grad():
                torch._foreach_copy_(params, ema)
        transformer.save_pretrained(ckpt / "transformer")
        if ema is not None:
            with torch.no_grad():
                torch._foreach_copy_(params, trained)
        torch.save(
            {
                "step": i,
                "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(),
                "rng": rng.bit_generator.state,
                **({"trained_weights": trained} if ema is not None else {}),
            },
            ckpt / STATE_FILE,
        )

    from tqdm import tqdm

    n = len(samples.chunks)
    losses: list[float] = []
    train_started = time.monotonic()
    bar = tqdm(total=cfg.steps, initial=step, desc="cosmos3-train", unit="step", mininterval=2.0)
    while step < cfg.steps:
        if cfg.max_seconds is not None and time.monotonic() - started > cfg.max_seconds:
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        indexes = rng.integers(0, n, cfg.batch_size).tolist()
        prefixes = trainer.draw_prefixes(indexes, rng)
        t = trainer.draw_t(generator, cfg.batch_size)
        loss, action_loss, vision_loss = trainer.batch_loss(indexes, prefixes, t, generator)
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)  # loss.backward(), in the form torch annotates
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if ema is not None:
            # The usual warm-up of the decay: early weights are far from the data and soon forgotten.
            decay = min(cfg.ema_decay, (1 + step) / (10 + step))
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in params], 1.0 - decay)
        step += 1
        losses.append(action_loss)
        bar.update(1)
        bar.set_postfix(action=f"{np.mean(losses[-50:]):.4f}", video=f"{vision_loss:.3f}")
        if cfg.save_every and step % cfg.save_every == 0:
            save(step)
    bar.close()
    transformer.eval()
    save(step)
    summary = {
        "checkpoint": str(cfg.out),
        "steps": step,
        "frames": int(len(samples.latents)),  # every frame read and encoded
        "samples": int(n),  # those trained on: a recording's answered frames, else every frame
        "episodes": prep.episodes,
        "parameters": sum(p.numel() for p in transformer.parameters()),
        "action_loss_last50": float(np.mean(losses[-50:])) if losses else None,
        "encode_s": round(encode_s, 1),
        "train_s": round(time.monotonic() - train_started, 1),
        "total_s": round(time.monotonic() - started, 1),
    }
    (ckpt / "training_summary.json").write_text(json.dumps(summary, indent=2))
    publish(ckpt, cfg.out)
    return summary


def publish(work: Path, out: Path) -> None:
    """Rename the whole checkpoint ``work`` into ``out``, replacing what ``out`` held."""
    replaced = out.parent / f".{out.name}.replaced"
    if replaced.exists():
        shutil.rmtree(replaced)
    if out.exists():
        out.rename(replaced)
    work.rename(out)
    if replaced.exists():
        shutil.rmtree(replaced)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cosmos3-train", description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a LeRobot v3.0 dataset folder")
    parser.add_argument("--out", required=True, help="the trained checkpoint's folder")
    parser.add_argument("--base", default=None, help="a checkpoint folder to fine-tune (default: draw a tiny one)")
    parser.add_argument("--tiny", default="distilled", help="tiny variant drawn when there is no --base")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--domain", default="cosmos3_mujoco_arm")
    parser.add_argument("--domain-id", type=int, default=None)
    parser.add_argument(
        "--horizon",
        type=int,
        default=None,
        help=f"the chunk trained (default: a recording's answered chunk, else {DEFAULT_HORIZON})",
    )
    parser.add_argument("--tier", type=int, default=256)
    parser.add_argument("--view-point", default="third_person_view")
    parser.add_argument("--prompt", default=None, help="caption of every sample (default: the episode's task)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--action-weight", type=float, default=1.0)
    parser.add_argument("--video-weight", type=float, default=0.1)
    parser.add_argument("--prefix-prob", type=float, default=0.5, help="share of samples with a clean prefix")
    parser.add_argument("--max-prefix", type=int, default=8, help="longest clean prefix (0: no RTC training)")
    parser.add_argument(
        "--ema-decay", type=float, default=0.0, help="serve a moving average of the weights (e.g. 0.998; 0: off)"
    )
    parser.add_argument(
        "--mask-padding",
        action="store_true",
        help="leave a chunk's rows past its episode's end (padding) out of the loss",
    )
    parser.add_argument(
        "--prefix-noise", type=float, default=0.0, help="std of a prefix's offset, in action stds (0: exact prefixes)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-every", type=int, default=500)
    parser.add_argument("--resume", action="store_true", help="continue from --out's training_state.pt")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="e.g. bfloat16 on a GPU")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop (and save) after this long")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    defaults = DatasetBounds()
    parser.add_argument(
        "--max-image-side",
        type=int,
        default=defaults.max_image_side,
        help="refuse a dataset whose camera frames have a longer side (read from the PNG or MP4 header)",
    )
    parser.add_argument(
        "--max-frames-mib",
        type=int,
        default=defaults.max_frames_mib,
        help="refuse a dataset whose frames decode to more than this, all episodes together",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    values = vars(args)
    values.pop("threads")
    bounds = DatasetBounds(max_image_side=values.pop("max_image_side"), max_frames_mib=values.pop("max_frames_mib"))
    cfg = TrainConfig(
        **{
            **values,
            "dataset": Path(args.dataset),
            "out": Path(args.out),
            "base": Path(args.base) if args.base else None,
            "bounds": bounds,
        }
    )
    try:
        summary = train(cfg)
    except CheckpointError as exc:  # a DatasetError among them: what the dataset or checkpoint got wrong
        said = " ".join(str(exc).split())  # one line, whatever a library's message held
        where = f"dataset {args.dataset}: " if isinstance(exc, DatasetError) else ""
        print(f"cosmos3-train: {where}{said}", file=sys.stderr, flush=True)
        return 2
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
