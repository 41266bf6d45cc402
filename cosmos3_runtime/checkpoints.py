"""A checkpoint: where it lives, what it is (read from its own files before any weight), and loaded into
diffusers' ``Cosmos3OmniPipeline`` component by component.

**Where it lives** (:class:`CheckpointSource`), in one of these forms:

- a local folder in diffusers layout (``/models/cosmos3-policy``);
- a Hub id, ``nvidia/Cosmos3-Policy``, optionally with a revision: ``nvidia/Cosmos3-Policy@v1.1``;
- a Hub id with a subfolder that holds the diffusers layout: ``nvidia/Cosmos3-Policy/distilled``.

Downloads go through ``huggingface_hub`` (its cache, its progress bars, its token handling). When the
Hub cannot be reached or offline mode is on and the files are not cached, the error names the id.

**Loading it** (:func:`load_pipeline`) builds the pipeline component by component rather than with
``DiffusionPipeline.from_pretrained``: that is what lets both ``_class_name`` spellings load, keeps
scheduler keys the scheduler class does not accept from breaking anything, and keeps the safety checker
(which needs the ``cosmos_guardrail`` package) off.

**What it is** (:func:`inspect_checkpoint`, :class:`CheckpointInfo`), read once from its own files.
Everything here comes from the checkpoint's config files and safetensors headers; no weights are loaded,
so inspecting a 30 GB checkpoint is as quick as a tiny one. A variant is recognised by exact values in
its config files, never by a substring of a name:

- Edge: ``transformer/config.json`` has ``backbone_type == "cosmos3_edge_nemotron_dense"`` or
  ``hidden_act == "relu2"`` (the squared-ReLU MLP only the Edge backbone uses).
- distilled: ``scheduler/scheduler_config.json`` is a ``FlowMatchEulerDiscreteScheduler`` with a
  non-empty ``fixed_step_sampler_config.t_list``, or ``modular_model_index.json`` carries
  ``distilled_sigmas`` (diffusers' own convention).
"""

from __future__ import annotations

import ctypes
import json
import logging
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import CheckpointError
from .quantization import Quantization, torchao_config

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


# -- what it is ------------------------------------------------------------------------------------

PIPELINE_CLASS_NAMES = ("Cosmos3OmniPipeline", "Cosmos3OmniDiffusersPipeline")
ALL_RESOLUTION_TIERS = (256, 480, 704, 720)
EDGE_RESOLUTION_TIERS = (256, 480)
EDGE_BACKBONE_TYPE = "cosmos3_edge_nemotron_dense"
EDGE_HIDDEN_ACT = "relu2"

_SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}


@dataclass
class WeightStats:
    """Parameter count and stored bytes of one component, from safetensors headers."""

    parameters: int = 0
    bytes: int = 0
    files: int = 0


@dataclass
class CheckpointInfo:
    """The facts about a checkpoint that the runtime decides things by."""

    path: str
    pipeline_class: str
    variant: str  # "base", "edge", "distilled" or "edge-distilled"
    is_edge: bool
    is_distilled: bool
    distilled_sigmas: list[float] | None
    scheduler_class: str
    scheduler_config: dict[str, Any]
    ignored_scheduler_keys: list[str]
    has_action_head: bool
    action_dim: int | None
    num_embodiment_domains: int
    resolution_tiers: tuple[int, ...]
    transformer_config: dict[str, Any]
    vae_config: dict[str, Any]
    has_profiles: bool
    weights: dict[str, WeightStats] = field(default_factory=dict)
    # model_index.json's use_native_flow_schedule: the pipeline spaces its sigmas itself (set_schedule).
    native_flow_schedule: bool = False

    @property
    def parameters(self) -> int:
        return sum(w.parameters for w in self.weights.values())

    @property
    def parameter_bytes(self) -> int:
        return sum(w.bytes for w in self.weights.values())

    def summary(self) -> dict[str, Any]:
        """A JSON-able digest for humans and the metadata endpoints."""
        data = asdict(self)
        for key in ("transformer_config", "vae_config", "scheduler_config"):
            data.pop(key)
        data["parameters"] = self.parameters
        data["parameter_bytes"] = self.parameter_bytes
        data["resolution_tiers"] = list(self.resolution_tiers)
        return data


def inspect_checkpoint(path: str | Path) -> CheckpointInfo:
    """Read a checkpoint folder in diffusers layout and classify it."""
    root = Path(path)
    model_index = _read_json(root / "model_index.json")
    pipeline_class = model_index.get("_class_name")
    if pipeline_class not in PIPELINE_CLASS_NAMES:
        raise CheckpointError(
            f"{root} is not a Cosmos3 checkpoint: model_index.json _class_name is {pipeline_class!r}, "
            f"expected one of {', '.join(PIPELINE_CLASS_NAMES)}"
        )
    transformer_config = _read_json(root / "transformer" / "config.json")
    vae_config = _read_json(root / "vae" / "config.json")
    scheduler_config = _read_json(root / "scheduler" / "scheduler_config.json")
    scheduler_class = scheduler_config.get("_class_name", "")

    is_edge = (
        transformer_config.get("backbone_type") == EDGE_BACKBONE_TYPE
        or transformer_config.get("hidden_act") == EDGE_HIDDEN_ACT
    )

    distilled_sigmas = _distilled_sigmas(root, scheduler_class, scheduler_config)
    is_distilled = distilled_sigmas is not None
    variant = {(False, False): "base", (True, False): "edge", (False, True): "distilled"}.get(
        (is_edge, is_distilled), "edge-distilled"
    )

    accepted = _accepted_scheduler_keys(scheduler_class)
    ignored = sorted(
        k for k in scheduler_config if not k.startswith("_") and accepted is not None and k not in accepted
    )

    has_action_head = bool(transformer_config.get("action_gen", False))
    weights = {
        name: _weight_stats(root / name) for name in ("transformer", "vae", "sound_tokenizer") if (root / name).is_dir()
    }
    return CheckpointInfo(
        path=str(root),
        pipeline_class=pipeline_class,
        variant=variant,
        is_edge=is_edge,
        is_distilled=is_distilled,
        distilled_sigmas=distilled_sigmas,
        scheduler_class=scheduler_class,
        scheduler_config=scheduler_config,
        ignored_scheduler_keys=ignored,
        has_action_head=has_action_head,
        action_dim=transformer_config.get("action_dim") if has_action_head else None,
        num_embodiment_domains=int(transformer_config.get("num_embodiment_domains", 32)),
        resolution_tiers=EDGE_RESOLUTION_TIERS if is_edge else ALL_RESOLUTION_TIERS,
        transformer_config=transformer_config,
        vae_config=vae_config,
        has_profiles=(root / "policy_profiles.json").is_file(),
        weights=weights,
        native_flow_schedule=_native_flow_schedule(root, model_index),
    )


def _native_flow_schedule(root: Path, model_index: dict[str, Any]) -> bool:
    """``use_native_flow_schedule`` from ``model_index.json``, or from ``modular_model_index.json``, where
    cosmos-framework's converter writes it: sigmas ``linspace(0.999, 0)`` as cosmos-framework samples them."""
    modular_index = root / "modular_model_index.json"
    modular = _read_json(modular_index) if modular_index.is_file() else {}
    return bool(model_index.get("use_native_flow_schedule", modular.get("use_native_flow_schedule", False)))


def _distilled_sigmas(root: Path, scheduler_class: str, scheduler_config: dict[str, Any]) -> list[float] | None:
    sigmas = None
    if scheduler_class == "FlowMatchEulerDiscreteScheduler":
        fixed = scheduler_config.get("fixed_step_sampler_config") or {}
        sigmas = fixed.get("t_list") or None
    modular_index = root / "modular_model_index.json"
    if sigmas is None and modular_index.is_file():
        sigmas = _read_json(modular_index).get("distilled_sigmas") or None
    if sigmas is None:
        return None
    values = [float(s) for s in sigmas]
    # Some exports write the list in timestep units (0..num_train_timesteps); the sampler wants sigmas.
    if max(values) > 1.0:
        scale = float(scheduler_config.get("num_train_timesteps", 1000))
        values = [v / scale for v in values]
    if any(not 0.0 < v <= 1.0 for v in values) or values != sorted(values, reverse=True):
        raise CheckpointError(f"distilled sigma list {sigmas} is not a decreasing list in (0, 1]")
    return values


def _accepted_scheduler_keys(scheduler_class: str) -> set[str] | None:
    import inspect

    try:
        import diffusers

        cls = getattr(diffusers, scheduler_class)
    except (ImportError, AttributeError):
        return None
    return set(inspect.signature(cls.__init__).parameters) - {"self"}


def _weight_stats(folder: Path) -> WeightStats:
    """Sum parameter counts and bytes over the safetensors headers in ``folder`` (weights not read)."""
    stats = WeightStats()
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(header_len))
        stats.files += 1
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in entry["shape"]:
                count *= dim
            stats.parameters += count
            stats.bytes += count * _SAFETENSORS_DTYPE_BYTES.get(entry["dtype"], 0)
    if stats.files == 0:
        # Only the index was fetched (config-only inspection of a Hub checkpoint): bytes, not counts.
        for index in folder.glob("*.safetensors.index.json"):
            stats.bytes += int(_read_json(index).get("metadata", {}).get("total_size", 0))
    return stats


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint file missing: {path}") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"checkpoint file {path} is not valid JSON: {exc}") from exc


# -- where it lives, and loading it ----------------------------------------------------------------


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


# Where each flow-matching scheduler keeps its shift: sigma' = shift * sigma / (1 + (shift - 1) * sigma).
SHIFT_KEYS = {"UniPCMultistepScheduler": "flow_shift", "FlowMatchEulerDiscreteScheduler": "shift"}


def configured_shift(info: CheckpointInfo) -> float | None:
    """The shift the checkpoint's scheduler applies, or None where none applies: a distilled checkpoint's
    fixed sigma list is used unshifted, and a scheduler not in :data:`SHIFT_KEYS` has no flow shift."""
    key = SHIFT_KEYS.get(info.scheduler_class)
    if info.is_distilled or key is None:
        return None
    import diffusers

    # The class default where the checkpoint's config leaves the key out.
    defaults = getattr(diffusers, info.scheduler_class).from_config({}).config
    return float(info.scheduler_config.get(key, defaults[key]))


def build_scheduler(info: CheckpointInfo, shift: float | None = None) -> Any:
    """The checkpoint's scheduler, from its own config (``shift``: in place of the configured one).

    A distilled checkpoint's shift is neutralised, once: its fixed sigma list is final, and
    ``set_timesteps(sigmas=...)`` would otherwise apply the configured shift on top of it.
    """
    import diffusers

    scheduler_cls = getattr(diffusers, info.scheduler_class, None)
    if scheduler_cls is None:
        raise CheckpointError(f"scheduler class {info.scheduler_class!r} is not in diffusers {diffusers.__version__}")
    accepted = {k: v for k, v in info.scheduler_config.items() if k not in info.ignored_scheduler_keys}
    if info.is_distilled:
        accepted["shift"] = 1.0
        accepted["use_dynamic_shifting"] = False
    elif shift is not None:
        key = SHIFT_KEYS.get(info.scheduler_class)
        if key is None:
            raise CheckpointError(f"{info.scheduler_class} has no flow shift to set")
        accepted[key] = float(shift)
    return scheduler_cls.from_config(accepted)


def set_schedule(scheduler: Any, info: CheckpointInfo, num_steps: int, device: Any = None) -> None:
    """Set ``scheduler``'s timesteps for ``num_steps`` the way diffusers' Cosmos3 pipeline does: the
    checkpoint's fixed list (distilled), the native flow schedule (``use_native_flow_schedule``), or the
    scheduler's own spacing."""
    if info.distilled_sigmas is not None:
        scheduler.set_timesteps(sigmas=list(info.distilled_sigmas), device=device)
    elif info.native_flow_schedule:
        sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, num_steps + 1)[:-1]
        scheduler.set_timesteps(num_steps, device=device, sigmas=sigmas)
    else:
        scheduler.set_timesteps(num_steps, device=device)


def schedule_fault(info: CheckpointInfo, num_steps: int, shift: float | None) -> str | None:
    """Why the checkpoint's scheduler, built and set as the engine builds and sets it, cannot run ``num_steps``
    steps at ``shift``; None when it can.

    diffusers' schedulers find their first step by its timestep and, where that timestep occurs twice, start
    at the second occurrence (``index_for_timestep``), so they run past the end of the schedule: UniPC fails
    its ``this_order > 0`` assertion. Timesteps are whole numbers in UniPC, so a large shift, which crowds the
    first sigmas against 1, repeats the first timestep once the steps are many. A schedule of another length
    than asked is refused too (a scheduler that drops steps would not run what was asked).
    """
    scheduler = build_scheduler(info, shift)
    set_schedule(scheduler, info, num_steps)
    timesteps = [float(t) for t in scheduler.timesteps]
    if len(timesteps) != num_steps:
        return f"{info.scheduler_class} sets {len(timesteps)} timesteps for {num_steps} steps"
    if timesteps.count(timesteps[0]) > 1:
        return (
            f"{info.scheduler_class} gives {num_steps} steps at shift {shift:g} the same first timestep "
            f"{timesteps[0]:g} twice, and cannot run them; use fewer steps or a smaller shift"
            if shift is not None
            else f"{info.scheduler_class} gives {num_steps} steps the same first timestep twice, and cannot run them"
        )
    return None


class ScheduleRule:
    """:func:`schedule_fault` of one checkpoint, remembered per (steps, shift): the rule keeper asks it at every
    ``configure`` and a schedule is built in about 2 ms. Plain attributes, so a description holding it pickles."""

    MAX_REMEMBERED = 4096

    def __init__(self, info: CheckpointInfo) -> None:
        self.info = info
        self._faults: dict[tuple[int, float | None], str | None] = {}

    def fault(self, num_steps: int, shift: float | None) -> str | None:
        key = (num_steps, shift)
        if key not in self._faults:
            if len(self._faults) >= self.MAX_REMEMBERED:
                self._faults.clear()
            self._faults[key] = schedule_fault(self.info, num_steps, shift)
        return self._faults[key]


def step_sigmas(info: CheckpointInfo, num_steps: int, shift: float | None) -> list[float]:
    """The sigma of each denoising step a request with these settings runs (what a guidance interval is
    compared with), from a scheduler built as the engine builds it."""
    scheduler = build_scheduler(info, shift)
    set_schedule(scheduler, info, num_steps)
    return [float(sigma) for sigma in scheduler.sigmas[: len(scheduler.timesteps)]]


# glibc's mallopt parameter for the size above which an allocation is its own mapping (freed straight back).
_M_MMAP_THRESHOLD = -3
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2


@contextmanager
def _freed_memory_returned() -> Iterator[None]:
    """While the transformer loads, every allocation of 64 KiB or more is a mapping of its own, returned to
    the system when freed; afterwards the threshold is glibc's largest default (32 MiB), a heap is trimmed
    only past 64 MiB free at its top (twice that, as glibc's own adjustment sets it), and 64 MiB is kept
    padded, which also keeps a thread's arena from deleting a heap that a request left wholly free.

    Setting the threshold stops glibc adjusting either of the first two, which left the trim threshold at its
    128 KiB: a served request's temporaries were then handed back to the system when freed and faulted in
    again by the next request, about 2,000 page faults a request of the tiny checkpoint. And the engine
    worker's arena unmapped its second heap after each request and mapped a new one for the next (about
    8,000 faults a request, in one start of the server of two) until the pad kept it.

    Loading casts each tensor to the serving dtype and, quantized, torchao makes temporaries of its size:
    glibc kept those freed blocks in its heap. An int8 load of Edge's shape held 6.5 GiB once loaded for
    4.0 GiB of tensors, and peaked at 9.9 GiB; with this, 4.3 and 7.1 GiB. Elsewhere than glibc: nothing.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, 64 * 1024)
    try:
        yield
    finally:
        libc.malloc_trim(0)
        libc.mallopt(_M_MMAP_THRESHOLD, 32 * 2**20)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 * 2**20)
        libc.mallopt(_M_TOP_PAD, 64 * 2**20)


def load_pipeline(
    info: CheckpointInfo, device: torch.device, dtype: torch.dtype, quantization: Quantization | None = None
) -> Any:
    """Load the transformer, VAE, tokenizer and scheduler of ``info`` and assemble the pipeline.

    With ``quantization`` the transformer's linear layers are quantized by diffusers' torchao config as
    each is read (:mod:`cosmos3_runtime.quantization`); on a GPU each tensor goes straight to it
    (``device_map``), so the full-precision transformer is held whole on neither the host nor the GPU.
    """
    from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer
    from transformers import AutoTokenizer

    root = info.path
    _check_scheduler_fits_schedule(info)
    quantized: dict[str, Any] = {}
    if quantization is not None:
        quantized["quantization_config"] = torchao_config(quantization)
        # Every shard is read whole to be quantized: mapped, its pages stayed counted in the process's resident
        # memory after its tensors were gone (Nano at int8: 22.3 GiB at peak, 17.1 GiB of it anonymous; read
        # whole, 20.4 GiB).
        quantized["disable_mmap"] = True
        if device.type != "cpu":
            quantized["device_map"] = str(device)
    try:
        with _freed_memory_returned():
            transformer = Cosmos3OmniTransformer.from_pretrained(
                root, subfolder="transformer", torch_dtype=dtype, **quantized
            )
        # The Wan VAE was trained without autocast; on CUDA it runs in the serving dtype like the
        # reference pipeline, on CPU in fp32.
        vae = AutoencoderKLWan.from_pretrained(root, subfolder="vae", torch_dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(root, subfolder="text_tokenizer")
    except OSError as exc:
        raise CheckpointError(f"cannot load checkpoint components from {root}: {exc}") from exc

    if info.ignored_scheduler_keys:
        logger.info(
            "scheduler keys not accepted by %s (kept for inspection only): %s",
            info.scheduler_class,
            ", ".join(info.ignored_scheduler_keys),
        )
    scheduler = build_scheduler(info)

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
        use_native_flow_schedule=info.native_flow_schedule,
    )
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    transformer.eval()
    vae.eval()
    return pipe
