"""The engine: one loaded Cosmos3 checkpoint, answering action and video requests.

Synchronous by design: the server calls it from one worker thread that owns it. The variant, the
policy profiles and the defaults are resolved once at load from the checkpoint's own files; nothing
is re-read per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import poses
from .checkpoints import CheckpointInfo, CheckpointSource, inspect_checkpoint, load_pipeline, resolve_device_and_dtype
from .description import EngineLimits, EngineSpec, ModelDescription
from .errors import CheckpointError, EngineError, RuntimeErrorBase
from .frame_preprocessing import ConditioningFrames, PreparedActions
from .memory_plan import check_fits, dtype_name
from .profiles import PolicyProfile, profiles_for_checkpoint
from .quantization import Quantization, check_device
from .requests import ActionMode, ActionRequest, ActionResult, Timing, VideoRequest, VideoResult
from .sampling import Cosmos3Sampler, DenoiseOutput
from .served_weights import ServedWeights, checkpoint_sha256, hub_revision
from .validation import DenoiseJob, job_for_actions, job_for_video

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

# Text keys/values of one prompt on a ~4B model in bf16: ~130 tokens x 8 KV heads x 128 x 2 x 36 layers
# x 2 bytes, about 19 MB. 256 MB holds a dozen distinct prompts (cond and uncond).
DEFAULT_PREFIX_CACHE_MB = 256


@dataclass(frozen=True)
class WarmupShape:
    """A request shape to run once at warm-up: mode, horizon, image size, tier (None: the default)."""

    action_mode: ActionMode = "policy"
    action_horizon: int = 16
    height: int = 224
    width: int = 224
    resolution_tier: int | None = None
    domain_name: str | None = None


@contextmanager
def _engine_failures(jobs: list[DenoiseJob]) -> Iterator[None]:
    """Typed errors pass; any other failure inside torch/diffusers becomes an :class:`EngineError`."""
    try:
        yield
    except RuntimeErrorBase:
        raise
    except Exception as exc:  # a failure on requests that validated
        logger.exception("engine failure on %d %s request(s)", len(jobs), jobs[0].mode)
        raise EngineError(f"the model failed on this request ({type(exc).__name__})") from exc


def _provenance(job: DenoiseJob, profile: PolicyProfile, output: DenoiseOutput, timing: Timing) -> dict[str, Any]:
    """A result's :class:`~cosmos3_runtime.requests.Provenance` fields, to pass to ActionResult or VideoResult."""
    return dict(
        settings=job.settings,
        domain_id=profile.domain_id,
        transformer_forwards=output.transformer_forwards,
        timing=timing,
    )


@dataclass(frozen=True)
class _Ready:
    """A prepared request that passed validation, as :meth:`Cosmos3Engine.predict_prepared` runs it."""

    job: DenoiseJob
    profile: PolicyProfile
    frames: ConditioningFrames | None
    validate_s: float
    prefix: np.ndarray | None


class Cosmos3Engine:
    """A loaded Cosmos3 checkpoint. Build with :meth:`load`."""

    def __init__(
        self,
        source: str,
        pipe: Any,
        device: torch.device,
        dtype: torch.dtype,
        spec: EngineSpec,
        prefix_cache_mb: float = 0,
        weights: ServedWeights | None = None,
    ) -> None:
        self.source = source
        self.pipe = pipe
        self.device = device
        self.dtype = dtype
        self.spec = spec
        # The description keeps every request rule and default: validation asks it (built once, here).
        self.description = ModelDescription.of_spec(
            spec, source, device=str(device), dtype=dtype_name(dtype), weights=weights
        )
        self.sampler = Cosmos3Sampler(pipe, spec.info, device, prefix_cache_bytes=int(prefix_cache_mb * 2**20))
        self.warmed_up = False

    @property
    def info(self) -> CheckpointInfo:
        """What inspecting the checkpoint found (the spec was built from it, so it is kept there only)."""
        return self.spec.info

    @classmethod
    def load(
        cls,
        source: str | Path,
        *,
        device: str | None = None,
        dtype: str | None = None,
        profiles_path: str | Path | None = None,
        revision: str | None = None,
        limits: EngineLimits | None = None,
        prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
        compile: bool = False,
        quantization: Quantization | None = None,
        memory_check: bool = True,
    ) -> Cosmos3Engine:
        """Resolve ``source`` (folder or Hub id), inspect it once, and load it onto ``device``.

        ``prefix_cache_mb`` bounds the text prefix cache (0 turns it off). ``compile`` compiles the
        transformer's repeated decoder layers with ``torch.compile`` (regional compilation, dynamic
        shapes); follow it with :meth:`warmup` on the shapes you will serve so no robot waits for it.
        ``quantization`` quantizes the transformer's linear layers while they load
        (:mod:`cosmos3_runtime.quantization`).

        Before any weight is read, the memory plan (:func:`~cosmos3_runtime.memory_plan.plan_memory`) is
        held against the memory the device has, and a checkpoint that would not fit raises
        :class:`~cosmos3_runtime.memory_plan.InsufficientMemoryError` (``memory_check=False`` skips it).
        The checkpoint's SHA-256 is computed beside the load, on a thread of its own.
        """
        local = CheckpointSource.parse(source, revision=revision).resolve()
        info = inspect_checkpoint(local)
        torch_device, torch_dtype = resolve_device_and_dtype(device, dtype)
        check_device(quantization, torch_device)
        if memory_check:
            check_fits(info, torch_device, torch_dtype, quantization)
        started = time.perf_counter()
        digest: list[str] = []
        # A daemon: a load that fails does not wait for the hash of files it could not load.
        hashing = threading.Thread(
            target=lambda: digest.append(checkpoint_sha256(local)), name="checkpoint-sha256", daemon=True
        )
        hashing.start()
        pipe = load_pipeline(info, torch_device, torch_dtype, quantization)
        hashing.join()
        if not digest:
            raise CheckpointError(f"could not compute the SHA-256 of checkpoint {source}")
        weights = ServedWeights(quantization, digest[0], hub_revision(local))
        if compile:
            pipe.transformer.compile_repeated_blocks(dynamic=True)
        profiles = profiles_for_checkpoint(local, info, profiles_path, source=str(source))
        spec = EngineSpec.for_checkpoint(info, profiles, limits or EngineLimits())
        logger.info(
            "loaded %s (%s) on %s/%s%s in %.2f s",
            source,
            info.variant,
            torch_device,
            torch_dtype,
            f" with {quantization} weights" if quantization else "",
            time.perf_counter() - started,
        )
        return cls(str(source), pipe, torch_device, torch_dtype, spec, prefix_cache_mb=prefix_cache_mb, weights=weights)

    # ------------------------------------------------------------------ requests

    def predict_actions(self, request: ActionRequest) -> ActionResult:
        """Answer a ``policy`` or ``inverse_dynamics`` request with a chunk of raw actions."""
        result = self.predict_actions_batch([request])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def predict_actions_batch(self, requests: list[ActionRequest]) -> list[ActionResult | RuntimeErrorBase]:
        """Answer several requests, sharing transformer calls among those on the same schedule.

        Returns one entry per request, in order: its chunk, or the typed error it failed with (one bad
        request does not fail the others). Each chunk equals what :meth:`predict_actions` would return
        for it alone, up to float rounding. The same as :meth:`prepare_actions` on each request, then
        :meth:`predict_prepared` on them all.
        """
        return self.predict_prepared([self.prepare_actions(request) for request in requests])

    def prepare_actions(self, request: ActionRequest) -> PreparedActions:
        """The host's half of answering ``request``: validation, defaults and the conditioning frames
        preprocessed into the VAE's canvas (:mod:`cosmos3_runtime.frame_preprocessing`).

        Touches no weights and no state shared with :meth:`predict_prepared`, so a server may call it on
        another thread while a batch runs. A request that fails comes back with ``error`` set.
        """
        started = time.perf_counter()
        try:
            job, profile = job_for_actions(request, self.description)
        except RuntimeErrorBase as exc:
            return PreparedActions(request, time.perf_counter() - started, error=exc)
        validate_s = time.perf_counter() - started
        try:
            with _engine_failures([job]):
                frames = self.sampler.condition_frames(job, time.perf_counter)
        except RuntimeErrorBase as exc:
            return PreparedActions(request, validate_s, error=exc)
        return PreparedActions(request, validate_s, job, profile, frames)

    def predict_prepared(self, prepared: list[PreparedActions]) -> list[ActionResult | RuntimeErrorBase]:
        """The model's half: chunks for requests made ready by :meth:`prepare_actions`, one entry per
        request in order (its chunk or its typed error), sharing transformer calls as
        :meth:`predict_actions_batch` does. Call it on the engine's thread; each prepared request once."""
        results: dict[int, ActionResult | RuntimeErrorBase] = {}
        groups: dict[tuple[Any, ...], list[tuple[int, _Ready]]] = {}
        for index, ready in enumerate(prepared):
            if ready.error is not None:
                results[index] = ready.error
            else:
                assert ready.job is not None and ready.profile is not None, "prepared without error: both are set"
                member = _Ready(ready.job, ready.profile, ready.frames, ready.validate_s, ready.request.prefix_actions)
                groups.setdefault(ready.job.schedule_key, []).append((index, member))
        for members in groups.values():
            try:
                outputs = self._run([m.job for _, m in members], [m.frames for _, m in members])
            except RuntimeErrorBase as exc:
                for index, _ in members:
                    results[index] = exc
                continue
            for (index, m), output in zip(members, outputs):
                try:
                    results[index] = self._chunk(m.job, m.profile, output, m.validate_s, m.prefix)
                except RuntimeErrorBase as exc:
                    results[index] = exc
        return [results[index] for index in range(len(prepared))]

    def _chunk(
        self,
        job: DenoiseJob,
        profile: PolicyProfile,
        output: DenoiseOutput,
        validate_s: float,
        prefix: np.ndarray | None = None,
    ) -> ActionResult:
        post = time.perf_counter()
        assert output.actions is not None, "an action job's output has actions"
        actions = np.array(profile.to_robot(output.actions), dtype=np.float32, order="C")
        if not np.isfinite(actions).all():
            raise EngineError("the model produced non-finite actions")
        if job.pose_origin is not None:  # midtrain: the model's relative poses composed from the current pose
            actions = np.ascontiguousarray(poses.midtrain_absolute_actions(actions, job.pose_origin))
        if prefix is not None:
            # The robot executes these rows while the chunk is computed: hand them back exactly as given,
            # not as the model's round trip through normalization (which differs in the last bits).
            actions[: prefix.shape[0]] = prefix
        timing = self._timing(output, validate_s)
        timing.postprocess_ms = (time.perf_counter() - post) * 1000.0
        return ActionResult(
            actions=actions,
            raw_action_dim=profile.raw_action_dim,
            batch_size=output.batch_size,
            video=output.video,
            **_provenance(job, profile, output, timing),
        )

    def rollout_video(self, request: VideoRequest) -> VideoResult:
        """Answer a ``forward_dynamics`` request: a first frame plus raw actions in, frames out."""
        return self.start_video(request).run()

    def start_video(self, request: VideoRequest) -> VideoRollout:
        """Validate a ``forward_dynamics`` request and return it as a rollout to advance step by step.

        Between two :meth:`VideoRollout.step` calls the caller may run other requests on this engine
        (from the same thread): a server uses that to let robots go first after every denoising step.
        """
        started = time.perf_counter()
        job, profile = job_for_video(request, self.description)
        return VideoRollout(self, job, profile, time.perf_counter() - started)

    def _run(
        self, jobs: list[DenoiseJob], frames: list[ConditioningFrames | None] | None = None
    ) -> list[DenoiseOutput]:
        with _engine_failures(jobs):
            return self.sampler.run_batch(jobs, time.perf_counter, frames)

    @staticmethod
    def _timing(output: DenoiseOutput, validate_s: float) -> Timing:
        return Timing(
            preprocess_ms=(validate_s + output.preprocess_s) * 1000.0,
            encode_ms=output.encode_s * 1000.0,
            denoise_ms=output.denoise_s * 1000.0,
            decode_ms=output.decode_s * 1000.0,
        )

    # ------------------------------------------------------------------ lifecycle

    def warmup(self, shapes: list[WarmupShape] | None = None) -> None:
        """Run the request shapes the server will see once, so the first robot pays no one-time costs.

        One-time costs are allocator growth, kernel selection and, with ``compile=True``, compilation
        (per shape). By default: a 224x224 policy request and its inverse-dynamics clip at the default
        domain's horizon and the variant's default tier.
        """
        if not self.info.has_action_head:
            self.warmed_up = True
            return
        default = self.default_domain()
        assert default is not None, "a checkpoint with an action head has a default domain"
        if shapes is None:
            horizon = self.description.resolve({}).action_horizon  # the default domain's, as every request's
            shapes = [WarmupShape("policy", horizon), WarmupShape("inverse_dynamics", horizon)]
        for shape in shapes:
            domain = shape.domain_name or default
            frames = np.zeros((shape.action_horizon + 1, shape.height, shape.width, 3), dtype=np.uint8)
            media = dict(video=frames) if shape.action_mode == "inverse_dynamics" else dict(image=frames[0])
            profile = self.spec.profiles.get(domain)
            # The same sequence length as a robot's request (a domain with state history has a state width).
            if profile is not None and profile.history_length and profile.state_dim is not None:
                rows: np.ndarray = np.zeros((profile.history_length, profile.state_dim), np.float32)
                if profile.action_space == "midtrain":
                    rows[:, 6] = 1.0  # the identity rotation (qw = 1): a zero quaternion names none
                media["state"] = rows
            self.predict_actions(
                ActionRequest(
                    domain_name=domain,
                    action_mode=shape.action_mode,
                    action_horizon=shape.action_horizon,
                    resolution_tier=shape.resolution_tier,
                    seed=0,
                    **media,
                )
            )
        self.warmed_up = True

    def default_domain(self) -> str | None:
        """The domain to use when none is given: the one the profile files name, else the first the
        checkpoint ships statistics for, else the first by name (None without an action head)."""
        return self.spec.default_domain

    def describe(self) -> ModelDescription:
        """What this engine offers, read from the loaded checkpoint."""
        cache = self.sampler.prefix_cache
        return replace(self.description, prefix_cache=cache.stats() if cache is not None else None)


class VideoRollout:
    """A ``forward_dynamics`` rollout in progress: :meth:`step` advances it by one denoising step.

    The last :meth:`step` also decodes the video. ``progress`` goes from 0 to 1. Use from the
    engine's thread only.
    """

    def __init__(self, engine: Cosmos3Engine, job: DenoiseJob, profile: PolicyProfile, validate_s: float) -> None:
        self._engine = engine
        self._job = job
        self._profile = profile
        self._validate_s = validate_s
        self._steps = engine.sampler.iterate_batch([job], time.perf_counter)
        self.num_steps = len(job.sigmas) if job.sigmas is not None else job.settings.num_steps
        self.steps_done = 0
        self._output: DenoiseOutput | None = None

    @property
    def done(self) -> bool:
        return self._output is not None

    @property
    def progress(self) -> float:
        return 1.0 if self.done else self.steps_done / (self.num_steps + 1)  # + 1: the decode

    def step(self) -> bool:
        """Run the next denoising step (after the last one: the decode). True once the video is done."""
        if self._output is None:
            with _engine_failures([self._job]):
                try:
                    self.steps_done = next(self._steps)
                except StopIteration as finished:
                    (self._output,) = finished.value
        return self.done

    def run(self) -> VideoResult:
        """Run to the end and return the result."""
        while not self.step():
            pass
        return self.result()

    def result(self) -> VideoResult:
        if self._output is None:
            raise RuntimeError("the rollout is not finished: call step() until it returns True")
        output, job = self._output, self._job
        assert output.video is not None, "a video job decodes its frames"
        return VideoResult(
            frames=output.video,
            fps=job.settings.fps,
            **_provenance(job, self._profile, output, Cosmos3Engine._timing(output, self._validate_s)),
        )
