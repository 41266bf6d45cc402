"""A request made ready for the device ahead of its turn: validated, its frames preprocessed into tensors.

:meth:`cosmos3_runtime.engine.Cosmos3Engine.predict_actions_batch` is two halves.
:meth:`~cosmos3_runtime.engine.Cosmos3Engine.prepare_actions` is the host's work on one request (validation,
defaults, the conditioning frames resized and normalised into the VAE's canvas) and touches no model
weight; :meth:`~cosmos3_runtime.engine.Cosmos3Engine.predict_prepared` is the model's work on a batch of
prepared requests (VAE encode, the transformer forwards, the chunk). A server prepares the next requests
on another thread while the current batch's forwards run, so the device does not wait for the host
between batches. Running the halves back to back is exactly ``predict_actions_batch``.

On CUDA the frames are copied and resized on a side stream; :attr:`ConditioningFrames.ready` is the event
the model's stream waits for before it reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .errors import RuntimeErrorBase
from .frame_preprocessing import PreparedFrames
from .profiles import PolicyProfile
from .requests import ActionRequest
from .validation import DenoiseJob


@dataclass
class ConditioningFrames:
    """A job's conditioning frames in the VAE's canvas, in [-1, 1], on the engine's device."""

    vision: torch.Tensor  # (1, 3, T, canvas_h, canvas_w) float32
    image_size: torch.Tensor  # [canvas_h, canvas_w, content_h, content_w]
    canvas_h: int
    canvas_w: int
    preprocess_s: float  # host seconds the preprocessing took
    ready: torch.cuda.Event | None = None  # recorded after the side stream's work; None on CPU

    def await_on(self, device: torch.device) -> None:
        """Make ``device``'s current stream wait for frames made on the side stream (nothing on CPU)."""
        if self.ready is None:
            return
        stream = torch.cuda.current_stream(device)
        stream.wait_event(self.ready)
        # The caching allocator must not give this memory back to the side stream while this one reads it.
        self.vision.record_stream(stream)
        self.image_size.record_stream(stream)


def condition_frames(
    preprocess: Callable[[np.ndarray, int, int], PreparedFrames],
    job: DenoiseJob,
    clock: Callable[[], float],
    stream: torch.cuda.Stream | None = None,
) -> ConditioningFrames:
    """``job``'s conditioning frames through ``preprocess(frames, tier, num_frames)``: the whole clip for
    ``inverse_dynamics``, else frame 0 alone (the VAE is causal: its first latent is frame 0's encoding).

    With a CUDA ``stream`` the copy and resize run on it and ``ready`` is recorded after them, so this
    work does not queue behind the forwards on the default stream.
    """
    frames, num_frames = (job.frames, job.horizon + 1) if job.mode == "inverse_dynamics" else (job.frames[:1], 1)
    t0 = clock()
    if stream is None:
        vision, image_size, canvas_h, canvas_w = preprocess(frames, job.resolution_tier, num_frames)
        return ConditioningFrames(vision, image_size, canvas_h, canvas_w, clock() - t0)
    with torch.cuda.stream(stream):
        vision, image_size, canvas_h, canvas_w = preprocess(frames, job.resolution_tier, num_frames)
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves its constructor unannotated
        ready.record(stream)
    return ConditioningFrames(vision, image_size, canvas_h, canvas_w, clock() - t0, ready)


@dataclass
class PreparedActions:
    """One action request after :meth:`~cosmos3_runtime.engine.Cosmos3Engine.prepare_actions`.

    Either ``job``, ``profile`` and ``frames`` are set, or ``error`` is: the typed error the request
    failed validation or preprocessing with, answered by ``predict_prepared`` in its place.
    """

    request: ActionRequest
    validate_s: float
    job: DenoiseJob | None = None
    profile: PolicyProfile | None = None
    frames: ConditioningFrames | None = None
    error: RuntimeErrorBase | None = None
