"""A checkpoint from where it lives to a loaded diffusers ``Cosmos3OmniPipeline``.

Where it comes from (:class:`CheckpointSource`), in one of these forms:

- a local folder in diffusers layout (``/models/cosmos3-policy``);
- a Hub id, ``nvidia/Cosmos3-Policy``, optionally with a revision: ``nvidia/Cosmos3-Policy@v1.1``;
- a Hub id with a subfolder that holds the diffusers layout: ``nvidia/Cosmos3-Policy/distilled``.

Downloads go through ``huggingface_hub`` (its cache, its progress bars, its token handling). When the
Hub cannot be reached or offline mode is on and the files are not cached, the error names the id.

Loading it (:func:`load_pipeline`) builds the pipeline component by component rather than with
``DiffusionPipeline.from_pretrained``: that is what lets both ``_class_name`` spellings load, keeps
scheduler keys the scheduler class does not accept from breaking anything, and keeps the safety checker
(which needs the ``cosmos_guardrail`` package) off. What the checkpoint is, read from its files before any
weight, is :mod:`cosmos3_runtime.inspection`'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError
from .inspection import CheckpointInfo

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointSource:
    """A parsed checkpoint reference."""

    original: str
    local_path: Path | None = None
    repo_id: str | None = None
    subfolder: str | None = None
    revision: str | None = None

    @property
    def is_local(self) -> bool:
        return self.local_path is not None

    @classmethod
    def parse(cls, source: str | Path, revision: str | None = None) -> CheckpointSource:
        text = str(source)
        path = Path(text).expanduser()
        if path.exists():
            if not path.is_dir():
                raise CheckpointError(f"checkpoint {text!r} is a file; expected a folder in diffusers layout")
            return cls(original=text, local_path=path.resolve())
        if text.startswith((".", "/", "~")) or "\\" in text:
            raise CheckpointError(f"checkpoint folder {text!r} does not exist")
        if "@" in text:
            text, _, at_revision = text.partition("@")
            if revision is not None and revision != at_revision:
                raise CheckpointError(f"two revisions given for {source!r}: {at_revision!r} and {revision!r}")
            revision = at_revision or None
        parts = [p for p in text.split("/") if p]
        if len(parts) < 2:
            raise CheckpointError(
                f"{str(source)!r} is neither an existing folder nor a Hub id of the form 'namespace/repo'"
            )
        return cls(
            original=str(source),
            repo_id="/".join(parts[:2]),
            subfolder="/".join(parts[2:]) or None,
            revision=revision,
        )

    def resolve(self, config_only: bool = False) -> Path:
        """Return a local folder holding the checkpoint, downloading it from the Hub if needed.

        ``config_only`` fetches only the small files (configs, tokenizer, index files), which is all
        inspection needs.
        """
        if self.local_path is not None:
            return self.local_path
        assert self.repo_id is not None, "parse() sets a local path or a repository"
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

        prefix = f"{self.subfolder}/" if self.subfolder else ""
        allow = [f"{prefix}*.json", f"{prefix}**/*.json", f"{prefix}**/*.txt", f"{prefix}**/*.model"]
        if not config_only:
            allow = [f"{prefix}*", f"{prefix}**"]
        try:
            root = snapshot_download(self.repo_id, revision=self.revision, allow_patterns=allow)
        except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
            raise CheckpointError(
                f"checkpoint {self.original!r} is not in the local Hugging Face cache and the Hub cannot be "
                f"reached (offline mode or no network): download it first or pass a local folder ({exc})"
            ) from exc
        except Exception as exc:  # repository not found, gated, revision missing, HTTP errors
            raise CheckpointError(f"could not fetch checkpoint {self.original!r} from the Hub: {exc}") from exc
        path = Path(root) / self.subfolder if self.subfolder else Path(root)
        if not path.is_dir():
            raise CheckpointError(f"subfolder {self.subfolder!r} not found in Hub repository {self.repo_id!r}")
        return path


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
