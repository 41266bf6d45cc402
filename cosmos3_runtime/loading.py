"""Build a diffusers ``Cosmos3OmniPipeline`` from a checkpoint folder, component by component.

Loading the components one by one (rather than ``DiffusionPipeline.from_pretrained``) is what lets
both ``_class_name`` spellings load, keeps scheduler keys the scheduler class does not accept from
breaking anything, and keeps the safety checker (which needs the ``cosmos_guardrail`` package) off.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError
from .inspection import CheckpointInfo

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def resolve_device_and_dtype(device: str | None, dtype: str | None) -> tuple[torch.device, torch.dtype]:
    """bf16 on CUDA, fp32 elsewhere (bf16 is 5-6x slower than fp32 on CPUs), unless told otherwise."""
    import torch

    resolved_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dtype is None:
        resolved_dtype = torch.bfloat16 if resolved_device.type == "cuda" else torch.float32
    else:
        names = {
            "bf16": torch.bfloat16,
            "bfloat16": torch.bfloat16,
            "fp16": torch.float16,
            "float16": torch.float16,
            "fp32": torch.float32,
            "float32": torch.float32,
        }
        if dtype not in names:
            raise CheckpointError(f"unknown dtype {dtype!r}; expected one of {', '.join(names)}")
        resolved_dtype = names[dtype]
    return resolved_device, resolved_dtype


DISTILLED_SCHEDULER_CLASS = "FlowMatchEulerDiscreteScheduler"


def _check_scheduler_fits_schedule(info: CheckpointInfo) -> None:
    """Refuse a distilled sigma list paired with a scheduler that cannot run it, before any weight is read.

    A fixed sigma list is run by ``FlowMatchEulerDiscreteScheduler`` (the loader neutralises its shift so
    the list is used as given, and its stochastic step takes the request's generator). A multistep solver
    such as ``UniPCMultistepScheduler`` would apply its own ``flow_shift`` on top of the list and keep a
    history across steps the distilled model was not trained for; diffusers' UniPC even fails on a
    plain list, so such a checkpoint would load and then fail every request.
    """
    if info.is_distilled and info.scheduler_class != DISTILLED_SCHEDULER_CLASS:
        raise CheckpointError(
            f"{info.path}: the checkpoint carries a distilled sigma list {info.distilled_sigmas} but its scheduler "
            f"is {info.scheduler_class}; a distilled schedule runs on {DISTILLED_SCHEDULER_CLASS}. Fix "
            "scheduler/scheduler_config.json, or remove distilled_sigmas from modular_model_index.json if the "
            "checkpoint is not distilled."
        )


def load_pipeline(info: CheckpointInfo, device: torch.device, dtype: torch.dtype) -> Any:
    """Load the transformer, VAE, tokenizer and scheduler of ``info`` and assemble the pipeline."""
    import diffusers
    from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer
    from transformers import AutoTokenizer

    root = info.path
    _check_scheduler_fits_schedule(info)
    try:
        transformer = Cosmos3OmniTransformer.from_pretrained(root, subfolder="transformer", torch_dtype=dtype)
        # The Wan VAE was trained without autocast; on CUDA it runs in the serving dtype like the
        # reference pipeline, on CPU in fp32.
        vae = AutoencoderKLWan.from_pretrained(root, subfolder="vae", torch_dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(root, subfolder="text_tokenizer")
    except OSError as exc:
        raise CheckpointError(f"cannot load checkpoint components from {root}: {exc}") from exc

    scheduler_cls = getattr(diffusers, info.scheduler_class, None)
    if scheduler_cls is None:
        raise CheckpointError(f"scheduler class {info.scheduler_class!r} is not in diffusers {diffusers.__version__}")
    accepted = {k: v for k, v in info.scheduler_config.items() if k not in info.ignored_scheduler_keys}
    if info.ignored_scheduler_keys:
        logger.info(
            "scheduler keys not accepted by %s (kept for inspection only): %s",
            info.scheduler_class,
            ", ".join(info.ignored_scheduler_keys),
        )
    if info.is_distilled:
        # The fixed sigma list is final: set_timesteps(sigmas=...) would apply the configured shift
        # on top of it, so the shift is neutralised here, once.
        accepted["shift"] = 1.0
        accepted["use_dynamic_shifting"] = False
    scheduler = scheduler_cls.from_config(accepted)

    for missing in ("<|vision_start|>",):
        if tokenizer.convert_tokens_to_ids(missing) in (None, tokenizer.unk_token_id):
            raise CheckpointError(f"text_tokenizer lacks the special token {missing} the pipeline needs")
    if tokenizer.eos_token_id is None:
        raise CheckpointError("text_tokenizer has no EOS token")

    pipe = Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=tokenizer,
        vae=vae,
        scheduler=scheduler,
        enable_safety_checker=False,
    )
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    transformer.eval()
    vae.eval()
    return pipe
