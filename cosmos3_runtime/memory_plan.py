"""The memory a checkpoint needs, before any weight is read: bytes per component at a dtype and a
quantization, against a device's memory.

One function (:func:`plan_memory`) does the arithmetic; ``cosmos3-inspect`` prints it and
:meth:`~cosmos3_runtime.engine.Cosmos3Engine.load` refuses with it, so a model that cannot fit is refused
in one line instead of being killed half-way through loading.

The shapes come from the checkpoint's own config files: diffusers' ``Cosmos3OmniTransformer`` and
``AutoencoderKLWan`` are built on the meta device (no memory), so every parameter's shape and module type
is exact, with no weight read; a checkpoint with only its config files and shard index (a Hub checkpoint
inspected before download) is planned the same way. Each parameter counts at the serving dtype, except:

- a quantized linear weight, at what torchao stores (:func:`~cosmos3_runtime.quantization.quantized_weight_bytes`);
- the timestep embedder, which diffusers keeps in float32 whatever the dtype.

Loading needs more than the loaded model for a moment, and the plan's ``need`` is the largest of three
phases on the device the weights go to:

1. the transformer loading: all of it, plus, on CPU, one shard as read from disk (twice when quantized: its
   bytes, read whole rather than mapped, and the tensors made of them), plus the largest tensor
   three times at the serving dtype when quantized (diffusers casts it, torchao's quantization makes
   temporaries of its size), once otherwise (the cast). Measured on CPU, int8: Edge's shape peaked at 7.1
   GiB where this says 8.9; Nano's at fp32 was killed for memory at 22.2 GiB with its last shards (its 2.3 GiB
   lm_head among them) still loading, where this said 21.6 before it counted three and two times, and says 25.3;
2. the VAE loading after it: both, plus, on CPU, the VAE's largest shard;
3. serving: the three components plus :data:`WORKING_RESERVE_BYTES` for activations and the runtime.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError
from .quantization import Quantization, is_quantized_linear, quantized_weight_bytes

if TYPE_CHECKING:
    import torch

    from .checkpoints import CheckpointInfo

GIB = 1 << 30
# Activations of a policy chunk at the 256 tier and the runtime's own memory (torch, diffusers, the
# tokenizer): what serving needs beyond the weights. Edge at its published size, served on CPU at fp32, peaked
# at 16.0 GiB for 15.2 GiB of weights (docs/benchmarks.md, benchmarks/real_size_cpu.py).
WORKING_RESERVE_BYTES = 1 * GIB


class InsufficientMemoryError(CheckpointError):
    """The checkpoint would not fit the device's memory at the chosen dtype and quantization."""

    code = "insufficient_memory"


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class ComponentBytes:
    """One component's resident bytes once loaded, and the most it needs on top while it loads."""

    name: str  # "transformer", "vae" or "tokenizer"
    parameters: int
    bytes: int
    quantized_bytes: int  # of ``bytes``: the quantized linear weights (0 at full precision)
    largest_shard_bytes: int  # the largest of its weight files as stored on disk
    largest_tensor_bytes: int  # its largest tensor at the serving dtype (before it is quantized)


@dataclass(frozen=True)
class MemoryPlan:
    """What loading and serving a checkpoint needs on a device (see the module docstring)."""

    dtype: str
    quantization: Quantization | None
    device_type: str  # "cpu" or "cuda": on CPU the shards being read count too
    components: tuple[ComponentBytes, ...]
    reserve_bytes: int
    device_memory_bytes: int | None  # what the device has (None: not known)

    @property
    def weight_bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    @property
    def need_bytes(self) -> int:
        parts = {c.name: c for c in self.components}
        transformer, vae = parts["transformer"], parts["vae"]
        on_cpu = self.device_type == "cpu"
        phases = [
            transformer.bytes
            + (transformer.largest_shard_bytes * (2 if self.quantization else 1) if on_cpu else 0)
            + transformer.largest_tensor_bytes * (3 if self.quantization else 1),
            transformer.bytes + vae.bytes + (vae.largest_shard_bytes if on_cpu else 0),
            self.weight_bytes + self.reserve_bytes,
        ]
        return max(phases)

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory_bytes is None else self.need_bytes <= self.device_memory_bytes

    def refusal(self, where: str) -> str:
        """One line: what loading needs, what ``where`` has, and what would help."""
        assert self.device_memory_bytes is not None, "a refusal compares with a known amount"
        parts = ", ".join(f"{c.name} {c.bytes / GIB:.1f}" for c in self.components if c.name != "tokenizer")
        advice = " (try --quantization int8)" if self.quantization is None else ""
        return (
            f"not enough memory to load this checkpoint at {self.precision}: it needs {self.need_bytes / GIB:.1f} GiB "
            f"({parts} GiB, plus loading and serving headroom), {where} has {self.device_memory_bytes / GIB:.1f} GiB"
            f" available{advice}"
        )

    @property
    def precision(self) -> str:
        return self.dtype if self.quantization is None else f"{self.quantization} ({self.dtype} elsewhere)"

    def as_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "quantization": self.quantization or "none",
            "device_type": self.device_type,
            "components": {
                c.name: {"parameters": c.parameters, "bytes": c.bytes, "quantized_bytes": c.quantized_bytes}
                for c in self.components
            },
            "weight_bytes": self.weight_bytes,
            "reserve_bytes": self.reserve_bytes,
            "need_bytes": self.need_bytes,
            "device_memory_bytes": self.device_memory_bytes,
            "fits": self.fits,
        }


def plan_memory(
    info: CheckpointInfo,
    *,
    dtype: str,
    quantization: Quantization | None,
    device_type: str,
    device_memory_bytes: int | None = None,
) -> MemoryPlan:
    """The memory plan of the checkpoint ``info`` describes, loaded at ``dtype`` (``float32``,
    ``bfloat16`` or ``float16``) with ``quantization`` onto a ``device_type`` device."""
    if dtype not in _DTYPE_BYTES:
        raise CheckpointError(f"no memory plan for dtype {dtype!r}; expected one of {', '.join(_DTYPE_BYTES)}")
    root = Path(info.path)
    transformer = _component_bytes(
        "transformer", _transformer_on_meta(info.transformer_config), root / "transformer", dtype, quantization
    )
    vae = _component_bytes("vae", _vae_on_meta(info.vae_config), root / "vae", dtype, None)
    tokenizer_folder = root / "text_tokenizer"
    tokenizer_bytes = sum(f.stat().st_size for f in tokenizer_folder.rglob("*") if f.is_file())
    tokenizer = ComponentBytes("tokenizer", 0, tokenizer_bytes, 0, 0, 0)
    return MemoryPlan(
        dtype, quantization, device_type, (transformer, vae, tokenizer), WORKING_RESERVE_BYTES, device_memory_bytes
    )


def check_fits(
    info: CheckpointInfo, device: torch.device, dtype: torch.dtype, quantization: Quantization | None
) -> MemoryPlan:
    """The plan of loading ``info`` onto ``device``, held against the memory it has now: raises
    :class:`InsufficientMemoryError` (one line: what it needs, what there is) where it would not fit."""
    plan = plan_memory(info, dtype=dtype_name(dtype), quantization=quantization, device_type=device.type)
    room, where = available_memory(device)
    plan = replace(plan, device_memory_bytes=room)
    if not plan.fits:
        raise InsufficientMemoryError(plan.refusal(where))
    return plan


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` as the plan names it: ``float32``."""
    return str(dtype).replace("torch.", "")


def parse_size(text: str) -> int:
    """``24GiB``, ``24 GB``, ``80G`` or ``1024`` as bytes (``GB`` is 10^9, ``GiB`` and ``G`` are 2^30)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size such as 24GiB, 24GB or 80G")
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    powers = {"K": 1, "M": 2, "G": 3, "T": 4}
    if unit == "B":
        return int(number)
    base = 1000 if unit.endswith("B") and not unit.endswith("IB") else 1024
    return int(number * base ** powers[unit[0]])


def available_memory(device: torch.device) -> tuple[int, str]:
    """The bytes a load on ``device`` can use now, and how to name where they are.

    CPU: the kernel's ``MemAvailable``, or less where a cgroup limit leaves less. CUDA: the GPU's free memory.
    """
    if device.type == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free), f"{torch.cuda.get_device_name(device)} ({device})"
    available = _meminfo_available()
    limit = _cgroup_room()
    return (min(available, limit) if limit is not None else available), "this machine's memory"


def _meminfo_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise CheckpointError("cannot read MemAvailable from /proc/meminfo")


def _cgroup_room() -> int | None:
    """What this process's cgroup (v2) still allows, or None without a limit."""
    try:
        group = Path("/proc/self/cgroup").read_text().strip().split("::", 1)[-1]
        folder = Path("/sys/fs/cgroup") / group.lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((folder / "memory.current").read_text())
    except (OSError, ValueError):
        return None


# -- the arithmetic ------------------------------------------------------------------------------


def _transformer_on_meta(config: dict[str, Any]) -> Any:
    from diffusers import Cosmos3OmniTransformer

    return _on_meta(Cosmos3OmniTransformer, config)


def _vae_on_meta(config: dict[str, Any]) -> Any:
    from diffusers import AutoencoderKLWan

    return _on_meta(AutoencoderKLWan, config)


def _on_meta(cls: Any, config: dict[str, Any]) -> Any:
    import inspect

    import torch

    accepted = inspect.signature(cls.__init__).parameters
    with torch.device("meta"):
        return cls(**{k: v for k, v in config.items() if k in accepted})


def _component_bytes(
    name: str, model: Any, folder: Path, dtype: str, quantization: Quantization | None
) -> ComponentBytes:
    import torch

    serving = _DTYPE_BYTES[dtype]
    keep_fp32 = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    total = quantized = parameters = largest = 0
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            count = param.numel()
            parameters += count
            full = count * serving
            if serving < 4 and any(part in module_name.split(".") for part in keep_fp32):
                full = count * 4
            largest = max(largest, full)
            if (
                quantization is not None
                and isinstance(module, torch.nn.Linear)
                and param_name == "weight"
                and is_quantized_linear(module_name)
            ):
                size = quantized_weight_bytes(quantization, *param.shape)
                quantized += size
                total += size
            else:
                total += full
        for _buffer_name, buffer in module.named_buffers(recurse=False):
            total += buffer.numel() * buffer.element_size()
    sizes = {key: tensor.numel() for key, tensor in model.state_dict().items()}
    return ComponentBytes(name, parameters, total, quantized, _largest_shard(folder, sizes), largest)


def _largest_shard(folder: Path, sizes: dict[str, int]) -> int:
    """The largest weight file in ``folder``; where only the shard index is there (a Hub checkpoint inspected
    before download), the largest shard's elements at the index's bytes per element (``total_size``)."""
    files = list(folder.glob("*.safetensors"))
    if files:
        return max(f.stat().st_size for f in files)
    for index in folder.glob("*.safetensors.index.json"):
        data = json.loads(index.read_text())
        weight_map: dict[str, str] = data.get("weight_map", {})
        total = int(data.get("metadata", {}).get("total_size", 0))
        elements = sum(sizes.get(key, 0) for key in weight_map)
        if not elements:
            return total
        shards: dict[str, int] = {}
        for key, file in weight_map.items():
            shards[file] = shards.get(file, 0) + sizes.get(key, 0)
        return total * max(shards.values()) // elements
    return 0
